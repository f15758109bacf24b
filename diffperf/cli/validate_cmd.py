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
                   "(its fitted_on.set) are applied, with a note (default: the shipped set of "
                   "each system's GPU, configs/efficiency, docs/trust.md; 'none': the physics "
                   "defaults)")
    p.add_argument("--out", help="write one row per run with the predictions")
    p.add_argument("--force", action="store_true", help="overwrite --out if it exists")
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=run)
    return p


def load_systems(runs, system, calibration, sets=None) -> dict:
    """System name -> System for the runs (or '*' -> the --system override). With a dict
    `sets` (validate), a system without --calibration takes the shipped efficiency set of its
    GPU (diffperf.trust.resolve) and `sets` receives {name: the set's record}; without it
    (calibrate) the physics defaults are the start."""
    from diffperf import load_system
    from diffperf.trust import resolve

    def one(name):
        if sets is None:
            return load_system(name, None if calibration in ("none", "physics")
                               else calibration)
        s, rec = resolve(load_system(name), calibration)
        sets[name] = rec
        return s

    if system:
        return {"*": one(system)}
    names = sorted(set(runs.systems))
    if "" in names:
        blank = [i for i, s in zip(runs.ids, runs.systems) if s == ""]
        raise SpecError(f"{len(blank)} run(s) of the runs CSV have a blank 'system' cell "
                        f"(first: id {blank[0]}); pass --system (allowed: a name under "
                        f"configs/systems or a YAML file)")
    return {n: one(n) for n in names}


EAGER_HOST_FIELDS = ("kernel_s", "host_kernel_s", "host_layer_s", "host_recompute_s")


def xla_set_notes(runs, systems, sets) -> list:
    """Notes on what the efficiency set of each system means for its rows that are one
    XLA-compiled step (Training.xla_compiled = 1, the xla-* presets): the GPU's set is their
    default as for any row, but its eager terms do not act on them -- the fixed time per
    kernel is eff.queued_kernel_s (costs/xla.py: the program is enqueued as a whole) and the
    host terms are multiplied by 1 - xla_compiled (predict.py) -- while its GEMM, attention
    and memory-bound efficiencies (kernel properties of the GPU), micro-batch and step times
    and memory overheads do. Says whether the rows' precision lies inside the set's fitted
    envelope. [] when no row is XLA-compiled."""
    xla = [float(t.xla_compiled) > 0 for t in runs.trainings]
    out = []
    for name, rec in sets.items():
        idx = [i for i, s in enumerate(runs.systems) if xla[i] and name in ("*", s)]
        if not idx:
            continue
        q_us = 1e6 * float(systems[name].eff.queued_kernel_s)
        own = "queued_kernel_s" in (rec.get("efficiency") or {})
        src = "the set's value" if own else ("the physics default, specs.system.Efficiency: "
                                             "a kernel queued in a CUDA graph")
        precs = sorted({runs.trainings[i].name for i in idx})
        line = (f"{len(idx)} row(s) on {'all systems' if name == '*' else name} are one "
                f"XLA-compiled step (precision {', '.join(precs)}): efficiency set "
                f"{rec.get('name')} applies with its eager terms off "
                f"({', '.join(EAGER_HOST_FIELDS)} do not act on them; fixed time per kernel "
                f"queued_kernel_s = {q_us:.3g} us, {src}); its GEMM, attention and "
                f"memory-bound efficiencies, micro-batch and step times and memory overheads "
                f"do")
        regimes = rec.get("regimes") or []
        env = (regimes[0].get("envelope") or {}).get("precision") if regimes else None
        outside = [p for p in precs if env is not None and p not in env]
        if outside:
            line += (f"; precision {', '.join(outside)} is outside the set's fitted envelope "
                     f"({', '.join(env)}): its held-out error does not cover these rows")
        out.append(line)
    return out


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


def _undefined_as_null(summary) -> dict:
    """Error statistics of a group with no measured row (n = 0: every run of it is oom) are
    undefined: None (JSON null) with a note, never NaN."""
    out = {}
    for k, v in summary.items():
        v = dict(v)
        if v.get("n") == 0 and "mape_pct" in v:
            v.update(mape_pct=None, median_pct=None, max_pct=None,
                     note="no row with a measured step time (every run is oom): errors "
                          "undefined")
        out[k] = v
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
    from diffperf.cli.options import (framework_facts, print_notes, row_fact_notes,
                                      row_precision_note)

    items, notes = framework_facts(args)
    runs = load_runs(args.runs, args.precision, items)
    notes += row_precision_note(args, [t.name for t in runs.trainings])
    notes += row_fact_notes(items, runs.rows)
    sets = {}
    systems = load_systems(runs, args.system, args.calibration, sets)
    notes += xla_set_notes(runs, systems, sets)
    step, mem, fits = predict_runs(runs, systems)
    summary = summarize(runs, step, mem, fits)
    if args.out:
        write_atomic(args.out, _csv_text(runs, step, mem, fits), args.force)
    summary = _undefined_as_null(summary)
    if args.json:
        from diffperf.trust import describe

        print_json(dict(runs=args.runs, notes=notes, summary=summary,
                        efficiency_sets={k: describe(v) for k, v in sets.items()}))
        return 0
    print_notes(notes)
    num = lambda x: "n/a" if x is None else fmt(x, 3)  # noqa: E731
    rows = [(k, v["n"], num(v["mape_pct"]), num(v["median_pct"]), num(v["max_pct"]))
            for k, v in summary.items() if "mape_pct" in v and k != "peak_memory"]
    console.print(table(f"step time error: {args.runs}", ("rows", "n", "MAPE_%", "median_%",
                                                         "max_%"), rows))
    from diffperf.trust import describe_text

    for name, rec in sets.items():
        console.print(f"{'all rows' if name == '*' else name}: {describe_text(rec)}")
    if "peak_memory" in summary:
        v = summary["peak_memory"]
        console.print(f"peak memory: n {v['n']}  MAPE {num(v['mape_pct'])} %  "
                      f"max {num(v['max_pct'])} %")
    for k, v in summary.items():
        if "note" in v:
            console.print(f"{k}: {v['note']}", highlight=False)
    if "feasibility" in summary:
        v = summary["feasibility"]
        console.print(f"fits agreement: {v['agree']}/{v['n']}  (ran but predicted OOM: "
                      f"{v['ran_predicted_oom']}, OOM but predicted to fit: "
                      f"{v['oom_predicted_fit']})")
    return 0
