"""`diffperf calibrate RUNS.csv`: fit efficiency parameters, report fitted and held-out error."""

from __future__ import annotations

import contextlib
import datetime

import numpy as np

from diffperf.cli.output import (check_writable, console, err_console, fmt, print_json, table,
                                 write_atomic)
from diffperf.cli.validate_cmd import add_runs_options
from diffperf.errors import SpecError

GEMM_COLUMNS = ("m", "n", "k", "time_s")
ATTENTION_COLUMNS = ("batch", "seq", "heads", "head_dim", "causal", "fwd_bwd_s")
MEMBW_COLUMNS = ("bytes_moved", "time_s")


def add_parser(sub):
    p = sub.add_parser("calibrate", help="fit efficiencies to measured runs (held-out error)")
    p.add_argument("runs", help="measured-runs CSV, or a shipped dataset by name "
                   "(diffperf list datasets)")
    add_runs_options(p)
    p.add_argument("--calibration", help="overlay to start from (a shipped name or a YAML)")
    p.add_argument("--microbench", nargs=3, metavar=("GEMM.csv", "ATTENTION.csv", "MEMBW.csv"),
                   help="kernel measurements to fit the operator models to as well")
    p.add_argument("--holdout-frac", type=float, default=0.2,
                   help="fraction of the fitted rows held out at random (default 0.2)")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the random held-out split (a whole number >= 0; default 0)")
    p.add_argument("--fit-only", metavar="COLUMN=VALUE",
                   help="fit only rows whose COLUMN equals VALUE; all others are held out")
    p.add_argument("--folds", type=int, default=0,
                   help="K-fold cross-validation instead of one split (reports held-out error)")
    p.add_argument("--steps", type=int, default=400, help="optimizer steps per start")
    p.add_argument("--out", help="overlay YAML to write (efficiency parameters only)")
    p.add_argument("--force", action="store_true")
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=run)
    return p


def benches(paths, system):
    """(Microbench, System) terms from the three kernel CSVs (schema: data/README.md)."""
    from diffperf import calibrate as cal
    from diffperf.load import load_table

    g = load_table(paths[0], GEMM_COLUMNS)
    a = load_table(paths[1], ATTENTION_COLUMNS)
    mb = load_table(paths[2], MEMBW_COLUMNS)
    from diffperf.api import _as_float
    from diffperf.specs.batch import anonymous

    system = _as_float(anonymous(system))
    return ((cal.gemm_bench(g["m"], g["n"], g["k"], g["time_s"]), system),
            (cal.attention_bench(a["batch"], a["seq"], a["heads"], a["head_dim"], a["causal"],
                                 a["fwd_bwd_s"]), system),
            (cal.memory_bench(mb["bytes_moved"], mb["time_s"]), system))


def _runs_label(runs) -> str:
    """How an overlay's description names its runs: a shipped dataset by name and file."""
    from diffperf import resources

    shipped = resources.dataset_files()
    if runs in shipped and not resources._is_path(runs, (".csv",)):
        return f"the shipped dataset {runs} (data/{shipped[runs][1].name})"
    return str(runs)


def _candidates(runs, fit_only):
    """Rows that may be fitted (a measured step time, or a measured out-of-memory), per
    --fit-only."""
    ok = np.isfinite(runs.step_time_s) | ~runs.ran
    if not fit_only:
        return ok
    if "=" not in fit_only:
        raise SpecError(f"--fit-only={fit_only!r} must look like COLUMN=VALUE")
    col, val = fit_only.split("=", 1)
    if col not in runs.rows[0]:
        raise SpecError(f"--fit-only: no column '{col}' in the runs CSV")
    sel = np.array([r.get(col, "").strip() == val for r in runs.rows])
    if not (sel & ok).any():
        raise SpecError(f"--fit-only: no row with {col}={val!r} and a measurement")
    return ok & sel


def _splits(cand, args):
    """(fit mask, held-out mask) pairs: one random split, or K folds."""
    if not 0 <= args.holdout_frac < 1:
        raise SpecError(f"--holdout-frac={args.holdout_frac} must be in [0, 1)")
    rng = np.random.default_rng(args.seed)
    idx = np.flatnonzero(cand)
    if args.folds:
        if args.folds < 2 or args.folds > len(idx):
            raise SpecError(f"--folds={args.folds} must be in 2..{len(idx)} (fittable rows)")
        fold = rng.permutation(len(idx)) % args.folds
        for k in range(args.folds):
            fit = np.zeros_like(cand)
            fit[idx[fold != k]] = True
            yield fit, ~fit
        return
    fit = np.zeros_like(cand)
    fit[idx[rng.random(len(idx)) >= args.holdout_frac]] = True
    if len(idx) and not fit.any():  # the random split held out every row: nothing to fit
        raise SpecError(f"--holdout-frac={args.holdout_frac} held out all {len(idx)} fittable "
                        f"rows (--seed {args.seed}): none left to fit; allowed: a smaller "
                        f"--holdout-frac, another --seed or more rows")
    yield fit, ~fit


def _coverage(covered, measured_s, heldout_pred_s) -> float:
    """Fraction of the held-out runs with a measured step time (a run that went out of memory
    has none: NaN) whose 95 % interval covers it (`covered`); NaN with no such run. Was
    `isfinite(measured) & isnan(pred) == False`, i.e. `(a & b) == False`: every OOM row
    counted as held out and uncovered (H100 PyTorch 17 of 19 = 89.5 %, JAX 20 of 25 = 80.0 %,
    the OOM rows' 2 and 5 the difference), and 0 % printed when nothing was held out."""
    measured_held = np.isfinite(measured_s) & ~np.isnan(heldout_pred_s)
    return float(np.mean(covered[measured_held])) if measured_held.any() else float("nan")


def _undefined_to_none(report) -> list:
    """Each error statistic of `report` over no row (n = 0: nothing held out, or no measured
    row in a source) set to None in place, as the interval coverage with no held-out run: they
    are undefined, not NaN (the table prints '-', --json and the overlay null). The names of
    the statistics so set."""
    empty = []
    for key, v in report.items():
        if isinstance(v, dict) and v.get("n") == 0:
            v.update(mape_pct=None, median_pct=None, max_pct=None)
            empty.append(key)
    if not np.isfinite(report.get("heldout_interval_coverage", 0.0)):
        report["heldout_interval_coverage"] = None
    return empty


def _summary(pred, runs, mask):
    from diffperf.validation import error_summary

    return error_summary(pred[mask], runs.step_time_s[mask])


@contextlib.contextmanager
def fit_progress(fits, steps):  # steps: of every fit, over all of calibrate_folds' batches
    """Progress of the optimizer steps on stderr (stdout stays the report, --json included):
    a rich progress bar redrawn in place where stderr is a terminal; where it is a file or a
    pipe (rich draws live bars on terminals only), a line when compilation starts and at each
    tenth of the steps. Yields `advance(steps)`, the `progress` of calibrate.fit_many."""
    import time

    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                               TimeElapsedColumn)

    from diffperf.cli.output import err_console

    label = f"fitting {fits} fit{'s' if fits != 1 else ''} x {steps} steps"
    if err_console.is_terminal:
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), console=err_console, transient=True) as bar:
            task = bar.add_task(label, total=steps)
            yield lambda n: bar.advance(task, n)
        return
    start, done, shown = time.perf_counter(), [0], [0]

    def line(text):
        err_console.print(f"{label}: {text}", highlight=False, markup=False, soft_wrap=True)

    def advance(n):
        done[0] += n
        if 10 * done[0] // steps > shown[0]:
            shown[0] = 10 * done[0] // steps
            line(f"{done[0]}/{steps} steps, {time.perf_counter() - start:.1f} s")

    line("compiling ...")
    yield advance


def run(args) -> int:
    from diffperf import calibrate as cal
    from diffperf import load_runs
    from diffperf.cli.validate_cmd import load_systems
    from diffperf.validation import error_summary

    if args.out:
        check_writable(args.out, args.force)
    if args.steps < 1:
        raise SpecError(f"--steps={args.steps} must be >= 1")
    if args.seed < 0:  # numpy's default_rng raised ValueError (a traceback)
        raise SpecError(f"--seed={args.seed} must be a whole number >= 0")
    runs = load_runs(args.runs, args.precision, args.set)
    from diffperf.cli.options import precision_override_notes, print_notes, row_fact_notes

    print_notes(precision_override_notes(args.precision, runs.rows)
                + row_fact_notes(args.set, runs.rows))
    systems = load_systems(runs, args.system, args.calibration)
    if args.out is None and not args.json and not args.folds:
        console.print("note: no --out given; the fitted overlay is not written")
    cand = _candidates(runs, args.fit_only)
    first_system = next(iter(systems.values()))
    terms = benches(args.microbench, first_system) if args.microbench else ()
    splits = list(_splits(cand, args))
    heldout_pred = np.full(len(runs), np.nan)
    heldout_mem = np.full(len(runs), np.nan)
    heldout_fits = np.zeros(len(runs), bool)
    covered = np.zeros(len(runs), bool)
    masks = [fit for fit, _ in splits] + ([cand] if args.folds else [])
    batches = len({cal.default_fields(runs, m) for m in masks})  # fit_many calls
    with fit_progress(len(masks), args.steps * batches) as advance:
        cals = cal.calibrate_folds(runs, systems, masks, benches=terms, steps=args.steps,
                                   progress=advance)
    for (fit_mask, held), c in zip(splits, cals):
        heldout_pred[held] = c.step_time_s[held]
        heldout_mem[held], heldout_fits[held] = c.memory_GB[held], c.fits[held]
        err = np.abs(np.log(c.step_time_s) - np.log(runs.step_time_s))
        covered[held] = err[held] <= c.half_width_log[held]
    fit_mask, c = splits[-1][0], cals[-1]
    if args.folds:  # the shipped overlay is fitted on every fittable row; CV gave the error
        fit_mask = cand
    report = dict(
        fitted=_summary(c.step_time_s, runs, fit_mask),
        heldout=error_summary(heldout_pred, runs.step_time_s),
        heldout_interval_coverage=_coverage(covered, runs.step_time_s, heldout_pred),
        folds=len(splits), rows=len(runs), fitted_rows=int(fit_mask.sum()))
    sources = np.array([r.get("source") or "" for r in runs.rows])
    for src in sorted(set(sources) - {""}):
        report[f"heldout {src}"] = error_summary(np.where(sources == src, heldout_pred, np.nan),
                                                 runs.step_time_s)
    mem = np.isfinite(runs.peak_memory_GB)
    if mem.any():
        report["peak_memory"] = error_summary(c.memory_GB[mem], runs.peak_memory_GB[mem])
        report["heldout_peak_memory"] = error_summary(heldout_mem, runs.peak_memory_GB)
        report["feasibility_agree"] = f"{int(np.sum(c.fits == runs.ran))}/{len(runs)}"
        held_any = ~np.isnan(heldout_mem)
        report["heldout_feasibility_agree"] = (
            f"{int(np.sum((heldout_fits == runs.ran)[held_any]))}/{int(held_any.sum())}")
    if "heldout" in _undefined_to_none(report):
        print_notes([f"no run was held out ({int(fit_mask.sum())} fitted of {len(runs)} rows, "
                     f"--holdout-frac {args.holdout_frac}): the held-out error is undefined "
                     f"('-'; null in --json and the overlay); give --folds K or a larger "
                     f"--holdout-frac for one"])
    eff = {f: float(getattr(c.fit.eff, f)) for f in c.fit.fields}
    if args.out:
        from diffperf.cli.options import fitted_under

        precision, facts = fitted_under(args.precision, args.set, runs, fit_mask)
        overlay = dict(
            description=f"efficiencies fitted by diffperf calibrate on {_runs_label(args.runs)}",
            created_by=f"diffperf calibrate {datetime.date.today().isoformat()}",
            fitted_on=dict(runs=str(args.runs), rows=int(fit_mask.sum()), seed=args.seed,
                           holdout_frac=args.holdout_frac, fit_only=args.fit_only,
                           folds=args.folds, steps=args.steps,
                           microbench=list(args.microbench or []),
                           # framework facts the runs were fitted under (--precision /
                           # --set, or what every row's own columns say): pass the same to
                           # predict / validate with this overlay
                           precision=precision, set=facts),
            heldout={k: v for k, v in report.items() if k != "fitted"} | {
                "fitted": report["fitted"]},
            efficiency=eff)
        from diffperf.load import dump_yaml

        write_atomic(args.out, dump_yaml(overlay), args.force)
    if args.json:
        print_json(dict(report=report, efficiency=eff))
        return 0
    num = lambda x: "-" if x is None else fmt(x, 3)  # noqa: E731  (None: over no row)
    rows = [(k, v["n"], num(v["mape_pct"]), num(v["median_pct"]), num(v["max_pct"]))
            for k, v in report.items() if isinstance(v, dict)]
    console.print(table(f"calibration on {args.runs}", ("rows", "n", "MAPE_%", "median_%",
                                                       "max_%"), rows))
    coverage = report["heldout_interval_coverage"]
    console.print("95 % interval coverage on held-out runs: " + (
        "- (none held out)" if coverage is None else f"{100 * coverage:.1f} %"))
    if "feasibility_agree" in report:
        console.print(f"fits agreement: {report['feasibility_agree']} (fitted), "
                      f"{report['heldout_feasibility_agree']} (held out)")
    return 0
