"""diffperf's price of every GEMM measured on one H100 (data/kernels/h100_gemm_lowp.csv) against
the GPU's time (`gpu_time_s`: CUDA-graph replay, host dispatch out; data/README.md, section
"Measured on one NVIDIA H100: low precision and expert loops"). Nothing of that file was ever
fitted: this is a held-out check of the GEMM pricing (docs/kernels-h100.md).

Model of one measured GEMM [m,k] @ [k,n] (diffperf.costs.compute):

    bf16   t = gemm_times_s(m, n, k)       (16-bit roofline, shape efficiency eta(d))
    fp8    t = lowp_gemm_times_s(m, n, k)  (precision 'fp8-current': per-tensor scales, 1 B
                                             per input element, BF16 output, F = FP8 peak x
                                             sustained_scale(matmul_fp8_sustained_frac))
    + kernel_fixed_s                       (eager: Efficiency.kernel_s, the GPU-side fixed time
                                             per kernel that layer_times_s / predict add for
                                             every kernel of ops.n_kernels, GEMMs included)

on System h100-sxm-80gb with two efficiency sets: `h100-default` (configs/efficiency/h100.yaml,
what `diffperf validate` resolves for H100 rows) and `physics` (the System's own Efficiency
defaults: what calibration/bridge.py's split (i) 'default' uses, load_system without a set).
The per-kernel fixed time is reported apart (the roofline alone, and roofline + kernel_s): the
measured GPU time has no launch in it, while kernel_s of the shipped set was fitted on
event-timed single launches (data/kernels/h100_gemm.csv, ~20 us host floor).

Printed: MAPE and median signed error (pred / measured - 1: + = predicted slower) by dtype x
accumulation x size class (grid by min(m, n, k): large >= 4096, medium 1024-2048, small <= 512;
'model' = the dense Llama linears of the DGX-H100 Bridge rows, 'expert' = the routed experts'
fc1 / fc2, each also by pass fwd / dgrad / wgrad), the FP8 / bf16 time ratio predicted vs
measured on the same shapes (the ratio cancels the GPU's clock / power state), and bf16
reproducibility against data/kernels/h100_gemm.csv (another day, event timing) on shared shapes.

Run from the repository root:  python calibration/check_h100_kernels.py [--json out.json]
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

LOWP_CSV = ROOT / "data" / "kernels" / "h100_gemm_lowp.csv"
OLD_CSV = ROOT / "data" / "kernels" / "h100_gemm.csv"
COLUMNS = ("shape", "dtype", "fast_accum", "m", "n", "k", "time_s", "gpu_time_s")
SYSTEM = "h100-sxm-80gb"


def load(path=LOWP_CSV) -> dict:
    """The measured GEMMs as numpy columns (shape labels as strings)."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    missing = [c for c in COLUMNS if c not in rows[0]]
    if missing:
        raise SystemExit(f"{path}: missing columns {missing} (need {COLUMNS})")
    out = {c: np.array([r[c] for r in rows]) for c in ("shape", "dtype")}
    out |= {c: np.array([float(r[c]) for r in rows]) for c in COLUMNS[2:]}
    return out


def size_class(d: dict) -> np.ndarray:
    """'grid-large' / 'grid-medium' / 'grid-small' (by min(m, n, k)), 'model', 'expert'."""
    lo = np.minimum(np.minimum(d["m"], d["n"]), d["k"])
    grid = np.where(lo >= 4096, "grid-large", np.where(lo >= 1024, "grid-medium", "grid-small"))
    fam = np.array([s.split(".")[0] for s in d["shape"]])
    return np.where(d["shape"] == "grid", grid, np.where(np.char.startswith(fam, "llama"),
                                                         "model", "expert"))


def passes(d: dict) -> np.ndarray:
    return np.array([s.split(".")[-1] if s != "grid" else "grid" for s in d["shape"]])


def systems() -> dict:
    """Efficiency-set name -> System h100-sxm-80gb with it."""
    from diffperf import load_system
    from diffperf.trust import resolve

    base = load_system(SYSTEM)
    shipped, rec = resolve(load_system(SYSTEM), None)
    return {rec["name"]: shipped, "physics": base}


def model_times_s(m, n, k, system, precision: str):
    """(roofline seconds, kernel_fixed_s) of GEMMs [m,k] @ [k,n], one each, in `precision`
    ('bf16': gemm_times_s; 'fp8-current': lowp_gemm_times_s)."""
    import jax.numpy as jnp

    from diffperf import training
    from diffperf.costs.compute import gemm_times_s, lowp_gemm_times_s
    from diffperf.costs.xla import kernel_fixed_s
    from diffperf.workload.ops import Gemms

    tr = training(precision)
    f = lambda x: jnp.asarray(x, jnp.float32)  # noqa: E731
    g = Gemms(m=f(m), n=f(n), k=f(k), count=jnp.ones(len(m), jnp.float32))
    e = system.eff
    fn = lowp_gemm_times_s if precision != "bf16" else gemm_times_s
    t = fn(g, system, tr, e.mm_max, e.mm_half_dim)
    return np.asarray(t, np.float64), float(kernel_fixed_s(system, tr))


def predict_all(d: dict, system) -> tuple[np.ndarray, float]:
    """Roofline seconds of every row (bf16 rows as bf16, fp8 rows as fp8-current; the model
    has no accumulation mode: fast and split FP8 get the same price), and kernel_fixed_s."""
    t = np.empty(len(d["m"]))
    ks = 0.0
    for dt, prec in (("bf16", "bf16"), ("fp8", "fp8-current")):
        sel = d["dtype"] == dt
        t[sel], ks = model_times_s(d["m"][sel], d["n"][sel], d["k"][sel], system, prec)
    return t, ks


def stats(err: np.ndarray) -> dict:
    return dict(n=int(err.size), mape_pct=float(100 * np.mean(np.abs(err))),
                median_signed_pct=float(100 * np.median(err)),
                max_abs_pct=float(100 * np.max(np.abs(err))))


def groups(d: dict):
    """(label, mask) of dtype x accumulation x class, and x pass for model / expert shapes."""
    cls, pas = size_class(d), passes(d)
    kinds = (("bf16", d["dtype"] == "bf16"),
             ("fp8-fast", (d["dtype"] == "fp8") & (d["fast_accum"] == 1)),
             ("fp8-split", (d["dtype"] == "fp8") & (d["fast_accum"] == 0)))
    for kname, kmask in kinds:
        yield f"{kname} all", kmask
        for c in ("grid-large", "grid-medium", "grid-small", "model", "expert"):
            yield f"{kname} {c}", kmask & (cls == c)
            if c in ("model", "expert"):
                for p in ("fwd", "dgrad", "wgrad"):
                    yield f"{kname} {c}.{p}", kmask & (cls == c) & (pas == p)


def _key(d, i):
    return (d["shape"][i], int(d["m"][i]), int(d["n"][i]), int(d["k"][i]))


def pair_ratio(d: dict, t_pred: np.ndarray, fast: int):
    """Per shape (bf16 row, fp8 row of accumulation `fast`): measured and predicted
    t_bf16 / t_fp8 (the FP8 speed-up), and the class of the shape."""
    bf = {_key(d, i): i for i in np.flatnonzero(d["dtype"] == "bf16")}
    fp = {_key(d, i): i for i in np.flatnonzero((d["dtype"] == "fp8") & (d["fast_accum"] == fast))}
    keys = [k for k in bf if k in fp]
    ib = np.array([bf[k] for k in keys])
    ifp = np.array([fp[k] for k in keys])
    meas = d["gpu_time_s"][ib] / d["gpu_time_s"][ifp]
    pred = t_pred[ib] / t_pred[ifp]
    return meas, pred, size_class(d)[ib], ib


def reproducibility(d: dict) -> dict:
    """bf16 of this file vs data/kernels/h100_gemm.csv (another day, bf16 [m,k] @ [k,n], CUDA
    events around one eager call) on the shapes both have: event time vs event time (both
    host-floored below ~40 us) and this file's graph time vs the old event time, for GEMMs of
    >= 1e11 FLOP (>= ~150 us: the launch is a small part)."""
    with open(OLD_CSV, newline="") as f:
        old = {(int(r["m"]), int(r["n"]), int(r["k"])): float(r["time_s"])
               for r in csv.DictReader(f) if r["dtype"] == "bfloat16"}
    sel = np.flatnonzero((d["dtype"] == "bf16") & (d["shape"] == "grid"))
    both = [(i, old[(int(d["m"][i]), int(d["n"][i]), int(d["k"][i]))]) for i in sel
            if (int(d["m"][i]), int(d["n"][i]), int(d["k"][i])) in old]
    i = np.array([b[0] for b in both])
    t_old = np.array([b[1] for b in both])
    flops = 2 * d["m"][i] * d["n"][i] * d["k"][i]
    big = flops >= 1e11
    ev = d["time_s"][i] / t_old - 1
    gr = d["gpu_time_s"][i] / t_old - 1
    return {"shared_shapes": int(i.size), "big_shapes": int(big.sum()),
            "event_vs_old_all": stats(ev), "event_vs_old_big": stats(ev[big]),
            "graph_vs_old_big": stats(gr[big])}


def check(d: dict | None = None) -> dict:
    d = load() if d is None else d
    out = {}
    for name, system in systems().items():
        t, ks = predict_all(d, system)
        meas = d["gpu_time_s"]
        res = {"kernel_fixed_s": ks, "groups": {}, "ratio": {}}
        for label, mask in groups(d):
            if mask.any():
                res["groups"][label] = {
                    "roofline": stats(t[mask] / meas[mask] - 1),
                    "roofline+kernel": stats((t[mask] + ks) / meas[mask] - 1)}
        for fast in (1, 0):
            mr, pr, cls, _ = pair_ratio(d, t, fast)
            pk = pair_ratio(d, t + ks, fast)[1]
            tag = "fast" if fast else "split"
            for c in ("grid-large", "grid-medium", "grid-small", "model", "expert"):
                s = cls == c
                res["ratio"][f"{tag} {c}"] = dict(
                    n=int(s.sum()), measured_median=float(np.median(mr[s])),
                    predicted_median=float(np.median(pr[s])),
                    predicted_kernel_median=float(np.median(pk[s])),
                    err_pct=stats(pr[s] / mr[s] - 1))
        out[name] = res
    out["reproducibility"] = reproducibility(d)
    return out


def report(out: dict) -> None:
    for name, res in out.items():
        if name == "reproducibility":
            continue
        print(f"== efficiency set {name} (System {SYSTEM}; kernel_fixed_s "
              f"{res['kernel_fixed_s'] * 1e6:.1f} us); err = predicted / gpu_time_s - 1")
        print(f"  {'group':28s} {'n':>4s}  {'roofline MAPE':>13s} {'median':>8s}"
              f"   {'+kernel MAPE':>12s} {'median':>8s}")
        for label, g in res["groups"].items():
            a, b = g["roofline"], g["roofline+kernel"]
            print(f"  {label:28s} {a['n']:4d}  {a['mape_pct']:12.1f}% {a['median_signed_pct']:+7.1f}%"
                  f"   {b['mape_pct']:11.1f}% {b['median_signed_pct']:+7.1f}%")
        print("  FP8 speed-up t_bf16 / t_fp8 (medians; err of predicted roofline ratio vs measured)")
        for label, r in res["ratio"].items():
            print(f"  {label:20s} n {r['n']:4d}  measured {r['measured_median']:.3f}  predicted "
                  f"{r['predicted_median']:.3f} (+kernel {r['predicted_kernel_median']:.3f})  "
                  f"MAPE {r['err_pct']['mape_pct']:5.1f} %  median {r['err_pct']['median_signed_pct']:+5.1f} %")
    rp = out["reproducibility"]
    print(f"== bf16 reproducibility vs {OLD_CSV.name} ({rp['shared_shapes']} shared grid shapes, "
          f"{rp['big_shapes']} of >= 1e11 FLOP); err = new / old - 1")
    for k in ("event_vs_old_all", "event_vs_old_big", "graph_vs_old_big"):
        s = rp[k]
        print(f"  {k:18s} n {s['n']:4d}  MAPE {s['mape_pct']:5.1f} %  median {s['median_signed_pct']:+5.1f} %"
              f"  max {s['max_abs_pct']:5.1f} %")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", help="write the figures as JSON")
    args = p.parse_args(argv)
    out = check()
    report(out)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
