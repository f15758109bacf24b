"""GB300 NVL72 rows of the Megatron-Bridge CSV and their GB200 NVL72 twins: measured vs predicted.

Prints (default efficiencies, the shipped systems):
  1. every GB300 row per precision: measured and predicted step, tokens/s error, the compute
     share of the predicted step, and two probes of what the compute is made of -- the step
     with every GEMM at infinite rate (s_noGEMM: the matmul peaks x 1e6) and with HBM at
     infinite bandwidth (s_noHBM) -- so the GEMM-bound and memory-bound parts can be read;
  2. the GB300 / GB200 pairs: rows identical in every layout and recipe column (container,
     model, precision, GPUs, sequence, batch, TP/PP/CP/VP/EP/ETP/DP, FSDP, recompute, dispatcher,
     token drop, MTP, `set`), with the measured and predicted tokens/s ratio GB300 / GB200.

No fitting; the probes are diagnostics only (docs/accuracy-bridge.md, section 'Session 11:
GB300's GEMM rate'). Run from the repository root:

    python calibration/bridge_gb300_pairs.py [--set-gb300 field=value,...]

--set-gb300 replaces System fields of gb300-nvl72 for an experiment (e.g. the FP8 fraction
before / after a change: --set-gb300 matmul_fp8_sustained_frac=0.566).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SYSTEMS = ("gb300-nvl72", "gb200-nvl72")
KEY = ("container", "model", "precision", "num_gpus", "seq_len", "global_batch", "micro_batch",
       "tp", "pp", "cp", "vp", "ep", "etp", "dp", "fsdp", "zero_stage", "recompute",
       "ep_dispatch", "moe_token_drop", "mtp", "set")
BIG = 1e6   # the probes' rate multiplier


def _predict(runs, systems):
    from diffperf.api import _as_float, _normalize
    from diffperf.predict import FEATURES
    from diffperf.specs.batch import stack
    from diffperf.validation import _predict_rows

    a = _as_float((stack(runs.models), _normalize(stack(runs.parallels)),
                   stack([systems[s] for s in runs.systems]), stack(runs.trainings)))
    res = _predict_rows(*a, temperature=None, features=FEATURES)
    return np.asarray(res.step_time_s), np.asarray(res.breakdown.compute_s)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--set-gb300", default="", help="System fields f=v,... for gb300-nvl72")
    args = p.parse_args(argv)
    from diffperf import load_runs
    from diffperf.cli.validate_cmd import load_systems
    from calibration.bridge import CSV, _subset

    runs = load_runs(CSV)
    runs = _subset(runs, [i for i, s in enumerate(runs.systems) if s in SYSTEMS])
    systems = load_systems(runs, None, None)
    if args.set_gb300:
        kv = dict(x.split("=") for x in args.set_gb300.split(","))
        systems["gb300-nvl72"] = systems["gb300-nvl72"].replace(
            **{k: float(v) for k, v in kv.items()})
    t0 = time.time()
    step, comp = _predict(runs, systems)
    no_gemm = {k: v.replace(matmul_flops_per_s=v.matmul_flops_per_s * BIG,
                            matmul_fp8_flops_per_s=v.matmul_fp8_flops_per_s * BIG,
                            matmul_fp4_flops_per_s=v.matmul_fp4_flops_per_s * BIG)
               for k, v in systems.items()}
    step_ng, _ = _predict(runs, no_gemm)
    no_hbm = {k: v.replace(hbm_bandwidth_Bps=v.hbm_bandwidth_Bps * BIG)
              for k, v in systems.items()}
    step_nh, _ = _predict(runs, no_hbm)
    print(f"# {len(runs)} rows, {time.time() - t0:.0f} s", file=sys.stderr)
    meas = runs.step_time_s
    err = 100.0 * (meas / step - 1.0)
    rows = runs.rows
    gb3 = [i for i, r in enumerate(rows) if r["system"] == "gb300-nvl72"]
    print("== GB300 NVL72 rows (default efficiencies); shares are of the predicted step")
    print(f"{'id':52s} {'err%':>6s} {'meas':>7s} {'pred':>7s} {'comp%':>6s} "
          f"{'GEMM%':>6s} {'HBM%':>6s}")
    for prec in sorted({rows[i]["precision"] for i in gb3}):
        sel = [i for i in gb3 if rows[i]["precision"] == prec]
        e = err[sel]
        print(f"-- {prec}: n {len(sel)}  MAPE {np.mean(np.abs(e)):.1f} %  bias {np.mean(e):+.1f} %")
        for i in sel:
            print(f"{rows[i]['id'][3:55]:52s} {err[i]:+6.1f} {meas[i]:7.3f} {step[i]:7.3f} "
                  f"{100 * comp[i] / step[i]:6.1f} {100 * (1 - step_ng[i] / step[i]):6.1f} "
                  f"{100 * (1 - step_nh[i] / step[i]):6.1f}")
    for m in sorted({rows[i]["model"] for i in gb3}):
        e = err[[i for i in gb3 if rows[i]["model"] == m]]
        print(f"   model {m:20s} n {len(e):3d}  MAPE {np.mean(np.abs(e)):5.1f} %  "
              f"bias {np.mean(e):+6.1f} %")
    print("== GB300 / GB200 pairs (same layout and recipe columns): tokens/s ratio GB300/GB200")
    by_key = {}
    for i, r in enumerate(rows):
        by_key.setdefault(tuple(r[k] for k in KEY), {})[r["system"]] = i
    n = 0
    for key, d in sorted(by_key.items()):
        if len(d) < 2:
            continue
        a, b = d["gb300-nvl72"], d["gb200-nvl72"]
        n += 1
        print(f"   {key[0]:9s} {key[1]:16s} {key[2]:12s} {key[3]:>4s} GPUs  measured "
              f"{meas[b] / meas[a]:.3f}  predicted {step[b] / step[a]:.3f}  "
              f"(GB300 err {err[a]:+5.1f} %, GB200 err {err[b]:+5.1f} %)")
    print(f"   {n} pairs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
