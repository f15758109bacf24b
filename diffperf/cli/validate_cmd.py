"""`diffperf validate RUNS.csv`: predict measured runs and report the error."""

from __future__ import annotations

import csv
import io

import numpy as np

from diffperf.cli.output import check_writable, console, fmt, print_json, table, write_atomic
from diffperf.errors import SpecError


def add_runs_options(p) -> None:
    """Options that say how to read a runs CSV, shared by validate and calibrate."""
    p.add_argument("--system", help="system for every row (default: each row's system column)")
    p.add_argument("--precision", help="precision preset for every row, overriding the CSV's "
                   "column (e.g. amp-bf16 for fp32 weights under autocast)")
    p.add_argument("--set", action="append", metavar="FIELD=VALUE", help=(
        "framework fact for every row, not in the CSV: a Parallel or Training field "
        "(e.g. dp_overlap=0, grad_bytes=4); repeatable"))


def add_parser(sub):
    p = sub.add_parser("validate", help="prediction error against measured runs")
    p.add_argument("runs", help="measured-runs CSV (schema: data/README.md), or a shipped "
                   "dataset by name (diffperf list datasets)")
    add_runs_options(p)
    p.add_argument("--calibration", help="efficiency overlay: a shipped name (diffperf list "
                   "calibrations) or a YAML path; the framework facts it was fitted under "
                   "(its fitted_on.set) are applied, with a note")
    p.add_argument("--out", help="write one row per run with the predictions")
    p.add_argument("--force", action="store_true", help="overwrite --out if it exists")
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=run)
    return p


def load_systems(runs, system, calibration) -> dict:
    """System name -> System for the runs (or '*' -> the --system override)."""
    from diffperf import load_system

    if system:
        return {"*": load_system(system, calibration)}
    names = sorted(set(runs.systems))
    if "" in names:
        blank = [i for i, s in zip(runs.ids, runs.systems) if s == ""]
        raise SpecError(f"{len(blank)} run(s) of the runs CSV have a blank 'system' cell "
                        f"(first: id {blank[0]}); pass --system (allowed: a name under "
                        f"configs/systems or a YAML file)")
    return {n: load_system(n, calibration) for n in names}


def summarize(runs, step, mem, fits) -> dict:
    """Error per source (the CSV's `source` column) and overall; memory and feasibility."""
    from diffperf.validation import error_summary

    sources = [r.get("source") or "all" for r in runs.rows]
    out = {"all": error_summary(step, runs.step_time_s)}
    for s in sorted(set(sources)):
        idx = np.array([x == s for x in sources])
        out[s] = error_summary(step[idx], runs.step_time_s[idx])
    mem_rows = np.isfinite(runs.peak_memory_GB)
    if mem_rows.any():
        out["peak_memory"] = error_summary(mem[mem_rows], runs.peak_memory_GB[mem_rows])
    has_status = any("status" in r for r in runs.rows)
    if has_status:
        out["feasibility"] = dict(n=len(runs), agree=int(np.sum(fits == runs.ran)),
                                  ran_predicted_oom=int(np.sum(runs.ran & ~fits)),
                                  oom_predicted_fit=int(np.sum(~runs.ran & fits)))
    return out


def _csv_text(runs, step, mem, fits) -> str:
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["id", "step_time_s", "predicted_step_time_s", "predicted_peak_memory_GB",
                "predicted_fits"])
    for i, rid in enumerate(runs.ids):
        w.writerow([rid, "" if np.isnan(runs.step_time_s[i]) else f"{runs.step_time_s[i]:.6g}",
                    f"{step[i]:.6g}", f"{mem[i]:.4g}", int(fits[i])])
    return buf.getvalue()


def run(args) -> int:
    from diffperf import load_runs
    from diffperf.validation import predict_runs

    if args.out:
        check_writable(args.out, args.force)
    from diffperf.cli.options import framework_facts, print_notes

    items, notes = framework_facts(args)
    runs = load_runs(args.runs, args.precision, items)
    systems = load_systems(runs, args.system, args.calibration)
    step, mem, fits = predict_runs(runs, systems)
    summary = summarize(runs, step, mem, fits)
    if args.out:
        write_atomic(args.out, _csv_text(runs, step, mem, fits), args.force)
    if args.json:
        print_json(dict(runs=args.runs, notes=notes, summary=summary))
        return 0
    print_notes(notes)
    rows = [(k, v["n"], fmt(v["mape_pct"], 3), fmt(v["median_pct"], 3), fmt(v["max_pct"], 3))
            for k, v in summary.items() if "mape_pct" in v and k != "peak_memory"]
    console.print(table(f"step time error: {args.runs}", ("rows", "n", "MAPE_%", "median_%",
                                                         "max_%"), rows))
    if "peak_memory" in summary:
        v = summary["peak_memory"]
        console.print(f"peak memory: n {v['n']}  MAPE {fmt(v['mape_pct'], 3)} %  "
                      f"max {fmt(v['max_pct'], 3)} %")
    if "feasibility" in summary:
        v = summary["feasibility"]
        console.print(f"fits agreement: {v['agree']}/{v['n']}  (ran but predicted OOM: "
                      f"{v['ran_predicted_oom']}, OOM but predicted to fit: "
                      f"{v['oom_predicted_fit']})")
    return 0
