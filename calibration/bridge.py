"""Tokens/s/GPU error of diffperf on the Megatron-Bridge runs (data/megatron_bridge.csv).

Three figures, each per system and precision, per model and overall (MAPE of tokens/s/GPU,
|predicted / measured - 1|; tokens/s/GPU = GBS x seq / (step time x GPUs)):

    default   every row with the shipped efficiencies of each system (no fitting)
    h100      efficiencies fitted (`diffperf calibrate`'s calibrate_runs) on the DGX-H100 rows
              only, predicting every Blackwell row (DGX-B200/B300, GB200/GB300 NVL72)
    lomo      leave one model out: fitted on the rows of the other six models (all systems),
              predicting the rows of the model left out

Run from the repository root (python -m calibration.bridge is not needed; a plain script):

    python calibration/bridge.py --steps 100 [--json out.json] [--only default,h100,lomo]

The CLI equivalents: (i) `diffperf validate data/megatron_bridge.csv`; (ii) `diffperf calibrate
data/megatron_bridge.csv --fit-only system=h100-sxm-80gb --holdout-frac 0 --steps N` (held-out
rows = every Blackwell row). Both print step-time errors; this script prints tokens/s errors.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CSV = ROOT / "data" / "megatron_bridge.csv"


def tokens_ape(step_pred, runs):
    """Percentage error of tokens/s/GPU per row (signed): measured step / predicted - 1."""
    return 100.0 * (runs.step_time_s / np.asarray(step_pred) - 1.0)


def table(err, runs, mask=None) -> dict:
    """{group: (n, MAPE, mean signed error)} by (system, precision), by model, and all."""
    groups = defaultdict(list)
    for i, r in enumerate(runs.rows):
        if mask is not None and not mask[i]:
            continue
        e = err[i]
        groups[f"{r['system']} {r['precision']}"].append(e)
        groups[f"model {r['model']}"].append(e)
        groups["all"].append(e)
    return {k: dict(n=len(v), mape_pct=float(np.mean(np.abs(v))),
                    bias_pct=float(np.mean(v)), max_pct=float(np.max(np.abs(v))))
            for k, v in sorted(groups.items())}


def fit_and_predict(runs, systems, fit_mask, steps, fit_systems=None):
    """Efficiencies fitted as `diffperf calibrate` fits them (calibrate.fit from each of
    calibrate.starting_points over the default fields, the lowest final loss kept), on the
    rows of fit_mask; then every row predicted with them (each system's datasheet, the fitted
    efficiencies). The interval machinery of calibrate_runs (Jacobians) is skipped: it does not
    change the predictions and costs a compilation per system on 2 shared cores.
    fit_systems: build the fitting RunSets for these systems only (the H100-only fit need not
    trace the Blackwell systems)."""
    from diffperf import calibrate as cal
    from diffperf.validation import predict_runs

    fit_mask = np.asarray(fit_mask, bool)
    keep = [i for i, s in enumerate(runs.systems) if fit_systems is None or s in fit_systems]
    sub = _subset(runs, keep)
    sets = [rs for _, rs in cal.run_sets(sub, systems, fit_mask[keep].astype(float))]
    fields = cal.default_fields(sub, fit_mask[keep])
    base = sets[0].system.eff
    best = best_start = None
    for start in cal.starting_points(base, fields):
        f = cal.fit(start, sets, fields, steps=steps)
        if best is None or f.loss_history[-1] < best.loss_history[-1]:
            best, best_start = f, start
    best = cal._unfitted_to_base(best, best_start, base)
    fitted = {k: v.replace(eff=best.eff) for k, v in systems.items()}
    step, _, _ = predict_runs(runs, fitted)
    return step, best


def _subset(runs, idx):
    from diffperf.load import Runs

    pick = lambda xs: [xs[i] for i in idx]  # noqa: E731
    return Runs(pick(runs.ids), pick(runs.rows), pick(runs.models), pick(runs.parallels),
                pick(runs.trainings), pick(runs.systems), runs.step_time_s[idx],
                runs.peak_memory_GB[idx], runs.ran[idx])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=100, help="optimizer steps per start")
    p.add_argument("--only", default="default,h100,lomo")
    p.add_argument("--json", help="write the tables as JSON")
    args = p.parse_args(argv)

    from diffperf import load_runs
    from diffperf.cli.validate_cmd import load_systems
    from diffperf.validation import predict_runs

    runs = load_runs(CSV)
    systems = load_systems(runs, None, None)
    systems_arr = np.array(runs.systems)
    models = np.array([r["model"] for r in runs.rows])
    out = {}
    todo = args.only.split(",")
    if "default" in todo:
        t = time.time()
        step, _, _ = predict_runs(runs, systems)
        out["default"] = table(tokens_ape(step, runs), runs)
        out["default"]["seconds"] = time.time() - t
        print(f"default: {time.time() - t:.0f} s", flush=True)
        report({"default": out["default"]})
    if "h100" in todo:
        t = time.time()
        fit = systems_arr == "h100-sxm-80gb"
        step, best = fit_and_predict(runs, systems, fit, args.steps, {"h100-sxm-80gb"})
        err = tokens_ape(step, runs)
        out["h100_fitted"] = table(err, runs, fit)
        out["h100_to_blackwell"] = table(err, runs, ~fit)
        out["h100_to_blackwell"]["seconds"] = time.time() - t
        out["h100_to_blackwell"]["efficiencies"] = {
            f: float(getattr(best.eff, f)) for f in best.fields}
        print(f"h100: {time.time() - t:.0f} s", flush=True)
        report({k: out[k] for k in ("h100_fitted", "h100_to_blackwell")})
    if "lomo" in todo:
        t = time.time()
        err = np.full(len(runs), np.nan)
        for m in sorted(set(models)):
            step, _ = fit_and_predict(runs, systems, models != m, args.steps)
            held = models == m
            err[held] = tokens_ape(step, runs)[held]
            print(f"lomo {m}: MAPE {np.mean(np.abs(err[held])):.1f} % "
                  f"({time.time() - t:.0f} s)", flush=True)
        out["lomo"] = table(err, runs)
        out["lomo"]["seconds"] = time.time() - t
    print("== all tables")
    report(out, args.json)
    return 0


def report(out, path=None):
    """Print the tables (and write them as JSON to path)."""
    for name, tab in out.items():
        print(f"== {name}")
        for k, v in tab.items():
            if isinstance(v, dict) and "n" in v:
                print(f"  {k:32s} n {v['n']:3d}  MAPE {v['mape_pct']:6.1f} %  "
                      f"bias {v['bias_pct']:+6.1f} %  max {v['max_pct']:6.1f} %")
    if path:
        Path(path).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    raise SystemExit(main())
