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
measured on the same shapes (the ratio cancels the GPU's clock / power state), bf16
reproducibility against data/kernels/h100_gemm.csv (another day, event timing) on shared shapes,
the measured cost of split accumulation, the best grid GEMM against the large cubes, a linear's
three GEMMs as Transformer Engine runs them in FP8 (fprop fast, dgrad / wgrad split), burst
vs sustained throughput (data/kernels/h100_gemm_sustained.csv: the first replay's and the last
second's TFLOP/s at the 700 W cap, beside the model's rate), a per-kind
fit of the model's saturation form (does FP8 saturate later?) and the roofline corner (hard max
vs p-norm where the memory term nears the compute term). Figures: docs/kernels-h100.md.

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


def model_times_s(m, n, k, system, precision: str, temperature=None):
    """(roofline seconds, kernel_fixed_s) of GEMMs [m,k] @ [k,n], one each, in `precision`
    ('bf16': gemm_times_s; 'fp8-current': lowp_gemm_times_s); temperature: the roofline's
    smooth max (None: the hard max of predictions)."""
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
    t = fn(g, system, tr, e.mm_max, e.mm_half_dim, temperature)
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


# The measured kinds: (name, dtype, fast_accum, the diffperf precision that prices it).
KINDS = (("bf16", "bf16", 0, "bf16"), ("fp8-fast", "fp8", 1, "fp8-current"),
         ("fp8-split", "fp8", 0, "fp8-current"))


def kind_masks(d: dict):
    """(name, precision, row mask) of each of KINDS."""
    for kind, dt, fa, prec in KINDS:
        yield kind, prec, (d["dtype"] == dt) & (d["fast_accum"] == fa)


def gemm_memory_s(m, n, k, kind: str, system):
    """The roofline's memory term of one GEMM [m,k] @ [k,n] as the model prices it:
    (q_in (m k + k n) + 2 m n) / (BW eta_mem), q_in = 2 B (bf16) or 1 B (FP8 inputs), a 16-bit
    output."""
    q_in = 2.0 if kind == "bf16" else 1.0
    return ((q_in * (m * k + k * n) + 2.0 * m * n)
            / (float(system.hbm_bandwidth_Bps) * float(system.eff.mem_eff)))


def groups(d: dict):
    """(label, mask) of dtype x accumulation x class, and x pass for model / expert shapes."""
    cls, pas = size_class(d), passes(d)
    for kname, _, kmask in kind_masks(d):
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
    out["accumulation"] = accumulation(d)
    out["best_of_grid"] = best_of_grid(d)
    out["corner"] = corner(d, systems()["h100-default"])
    out["saturation"] = saturation(d, systems()["h100-default"])
    out["te_mix"] = te_mix(d, predict_all(d, systems()["h100-default"])[0])
    out["sustained"] = sustained()
    return out


SUSTAINED_CSV = ROOT / "data" / "kernels" / "h100_gemm_sustained.csv"


def sustained(path=SUSTAINED_CSV) -> dict:
    """Burst vs sustained (data/kernels/h100_gemm_sustained.csv: 3 s of back-to-back CUDA-graph
    replays after a 3 s rest, calibration/device_h100_sustained.py): per GEMM and kind, TFLOP/s of
    the first replay (the GPU at its boost clock) and the median of the last 1 s (at the 700 W
    cap), the sustained FP8 / bf16 ratio, and the model's rate 2 m n k / roofline time at that
    shape with each efficiency set."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    runs = {}
    for r in rows:
        runs.setdefault((r["shape"], r["dtype"], int(r["fast_accum"])), []).append(
            (float(r["t_s"]), float(r["tflops"]), int(r["m"]), int(r["n"]), int(r["k"])))
    sets = systems()
    out = {}
    for (shape, dt, fa), v in runs.items():
        end = v[-1][0]
        m, n, k = v[0][2:]
        model = {}
        for name, system in sets.items():
            t, _ = model_times_s(np.array([m], float), np.array([n], float), np.array([k], float),
                                 system, "bf16" if dt == "bf16" else "fp8-current")
            model[name] = float(2.0 * m * n * k / t[0] / 1e12)
        out[f"{shape} {dt}{'-fast' if fa else ('-split' if dt == 'fp8' else '')}"] = dict(
            m=m, n=n, k=k, first_TFLOPs=v[0][1],
            sustained_TFLOPs=float(np.median([x[1] for x in v if x[0] >= end - 1.0])),
            model_TFLOPs=model)
    for key in list(out):
        if key.endswith(" bf16"):
            shape = key[:-5]
            for kind in ("fp8-split", "fp8-fast"):
                if f"{shape} {kind}" in out:
                    out[f"{shape} {kind}"]["sustained_ratio_to_bf16"] = (
                        out[f"{shape} {kind}"]["sustained_TFLOPs"] / out[key]["sustained_TFLOPs"])
                    out[f"{shape} {kind}"]["first_ratio_to_bf16"] = (
                        out[f"{shape} {kind}"]["first_TFLOPs"] / out[key]["first_TFLOPs"])
    return out


def te_mix(d: dict, t_pred: np.ndarray) -> dict:
    """A linear's three GEMMs as Transformer Engine runs them in FP8 (fprop with fast
    accumulation, dgrad and wgrad split) against the same three in bf16: per linear and token
    count, (t_fwd + t_dgrad + t_wgrad)_bf16 / (t_fwd,fast + t_dgrad,split + t_wgrad,split)_fp8,
    measured and predicted (the model's one FP8 rate), median over the Bridge linears ('model')
    and the routed experts ('expert'); and the predicted / measured FP8 time of the three."""
    t = {}
    for i in range(len(d["m"])):
        if d["shape"][i] == "grid":
            continue
        lin, pas = d["shape"][i].rsplit(".", 1)
        tokens = d["k"][i] if pas == "wgrad" else d["m"][i]
        kind = "bf16" if d["dtype"][i] == "bf16" else ("fast" if d["fast_accum"][i] else "split")
        t[(lin, tokens, pas, kind)] = (d["gpu_time_s"][i], t_pred[i])
    out = {}
    for cls in ("model", "expert"):
        meas, pred, err = [], [], []
        for lin, tokens in sorted({(k[0], k[1]) for k in t}):
            if lin.startswith("llama") != (cls == "model"):
                continue
            b = [t[(lin, tokens, p, "bf16")] for p in ("fwd", "dgrad", "wgrad")]
            f = [t[(lin, tokens, "fwd", "fast")], t[(lin, tokens, "dgrad", "split")],
                 t[(lin, tokens, "wgrad", "split")]]
            meas.append(sum(x[0] for x in b) / sum(x[0] for x in f))
            pred.append(sum(x[1] for x in b) / sum(x[1] for x in f))
            err.append(sum(x[1] for x in f) / sum(x[0] for x in f) - 1)
        meas, pred = np.array(meas), np.array(pred)
        out[cls] = dict(n=int(meas.size), measured_median=float(np.median(meas)),
                        predicted_median=float(np.median(pred)),
                        ratio_err=stats(pred / meas - 1), fp8_time_err=stats(np.array(err)))
    return out


def saturation(d: dict, system, gamma: float | None = None) -> dict:
    """Does FP8 saturate at larger GEMMs than bf16 (a larger mm_half_dim)? Per kind, the grid
    GEMMs' gpu_time_s fitted (least squares in log time, a grid search: eta_max 0.50-0.90,
    d_half 8-512 log-spaced, t0 0-6 us) by the model's own form with the hard max,

        t = max(2 m n k / (F eta_max / (1 + (d_half / d)^gamma)), bytes / (BW mem_eff)) + t0
    d = gemm_size (soft-min), F = matmul_rate / lowp_rate, gamma = the h100-default set's
    mm_exponent, t0 a fixed GPU time per GEMM (graph replay: no launch)."""
    import jax.numpy as jnp

    from diffperf import training
    from diffperf.costs.compute import lowp_rate, matmul_rate
    from diffperf.costs.roofline import gemm_size

    e = system.eff
    gamma = float(e.mm_exponent) if gamma is None else gamma
    emax = np.linspace(0.50, 0.90, 41)[:, None, None, None]
    half = np.geomspace(8.0, 512.0, 49)[None, :, None, None]
    t0 = np.linspace(0.0, 6e-6, 31)[None, None, :, None]
    out = {}
    for kind, prec, s in kind_masks(d):
        tr = training(prec)
        s = s & (d["shape"] == "grid")
        m, n, k, t = (d[c][s] for c in ("m", "n", "k", "gpu_time_s"))
        size = np.asarray(gemm_size(*(jnp.asarray(x) for x in (m, n, k))), dtype=np.float64)
        rate = float(matmul_rate(system, tr) if kind == "bf16" else lowp_rate(system, tr))
        mem = gemm_memory_s(m, n, k, kind, system)
        def pred(a):  # a: eta_max values [:, None, None, None] -> times [a, half, t0, row]
            comp = 2.0 * m * n * k / rate * (1.0 + (half / size) ** gamma) / a
            return np.maximum(comp, mem) + t0

        # one eta_max at a time: the whole 4-d table would hold ~1 GB
        loss = np.concatenate([np.mean(np.log(pred(a[None]) / t) ** 2, axis=-1) for a in emax])
        i, j, l = np.unravel_index(np.argmin(loss), loss.shape)
        err = pred(emax[i:i + 1])[0, j, l] / t - 1
        out[kind] = dict(eta_max=float(emax[i, 0, 0, 0]), half_dim=float(half[0, j, 0, 0]),
                         t0_s=float(t0[0, 0, l, 0]), gamma=gamma, n=int(s.sum()),
                         fit=stats(err))
    return out


def accumulation(d: dict) -> dict:
    """Measured cost of split accumulation: median t_split / t_fast of the FP8 rows of one
    shape, by class and pass. The model has one FP8 rate, from MAMF's torch._scaled_mm run
    with its default use_fast_accum=False (configs/systems/h100-sxm-80gb.yaml,
    matmul_fp8_sustained_frac): the split rate; Transformer Engine's Float8CurrentScaling /
    DelayedScaling run fprop with fast accumulation (recipe fp8_gemm_fprop
    use_split_accumulator=False; module/base.py _2X_ACC_FPROP = False), dgrad / wgrad split."""
    fast = {_key(d, i): i for i in np.flatnonzero((d["dtype"] == "fp8") & (d["fast_accum"] == 1))}
    split = {_key(d, i): i for i in np.flatnonzero((d["dtype"] == "fp8") & (d["fast_accum"] == 0))}
    keys = [k for k in fast if k in split]
    g = np.array([d["gpu_time_s"][split[k]] / d["gpu_time_s"][fast[k]] for k in keys])
    i = np.array([fast[k] for k in keys])
    cls, pas = size_class(d)[i], passes(d)[i]
    out = {}
    for c in ("grid-large", "grid-medium", "grid-small", "model", "expert"):
        for p in ("all", "fwd", "dgrad", "wgrad"):
            s = (cls == c) & ((pas == p) if p != "all" else True)
            if s.any() and (p == "all" or not c.startswith("grid")):
                q = np.percentile(g[s], [25, 50, 75])
                out[f"{c} {p}"] = dict(n=int(s.sum()), p25=float(q[0]), median=float(q[1]),
                                       p75=float(q[2]))
    return out


def best_of_grid(d: dict) -> dict:
    """The fastest grid GEMM of each kind (TFLOP/s from gpu_time_s) and the 8192^3 and 16384^3
    cubes: the best-of-sweep figure a MAMF-style benchmark reports against the large cubes'
    (longer, power-bound) rate."""
    out = {}
    for kind, _, sel in kind_masks(d):
        sel = sel & (d["shape"] == "grid")
        tf = 2 * d["m"] * d["n"] * d["k"] / d["gpu_time_s"] / 1e12
        i = np.flatnonzero(sel)[np.argmax(tf[sel])]
        cubes = {int(x): float(tf[sel & (d["m"] == x) & (d["n"] == x) & (d["k"] == x)][0])
                 for x in (4096, 8192, 16384)}
        out[kind] = dict(best_TFLOPs=float(tf[i]), at=[int(d[c][i]) for c in "mnk"],
                         cubes_TFLOPs=cubes)
    return out


def corner(d: dict, system) -> dict:
    """Error of the roofline near its corner: GEMMs of >= 20 us GPU time (the fixed per-kernel
    time a small part) binned by r = memory term / compute term of the model (HBM bytes at
    BW x mem_eff over FLOPs at F x eta), err of the hard max (what predictions use) and of the
    library's smooth max at temperature 1/3 (p-norm, p = 3), roofline alone, h100-default set."""
    import jax.numpy as jnp

    from diffperf import training
    from diffperf.costs.compute import lowp_rate, matmul_rate
    from diffperf.costs.roofline import gemm_size, saturating_efficiency

    e = system.eff
    out = {}
    for kind, prec, s in kind_masks(d):
        tr = training(prec)
        s = s & (d["gpu_time_s"] >= 20e-6)
        m, n, k, t = (d[c][s] for c in ("m", "n", "k", "gpu_time_s"))
        hard, _ = model_times_s(m, n, k, system, prec)
        p3, _ = model_times_s(m, n, k, system, prec, temperature=1.0 / 3.0)
        eta = np.asarray(saturating_efficiency(gemm_size(jnp.asarray(m), jnp.asarray(n),
                                                         jnp.asarray(k)),
                                               e.mm_max, e.mm_half_dim, e.mm_exponent))
        rate = float(matmul_rate(system, tr) if kind == "bf16" else lowp_rate(system, tr))
        r = gemm_memory_s(m, n, k, kind, system) / (2.0 * m * n * k / (rate * eta))
        for lo, hi in ((0.0, 0.25), (0.25, 0.5), (0.5, 1.0), (1.0, np.inf)):
            w = (r >= lo) & (r < hi)
            if w.any():
                out[f"{kind} r in [{lo:g}, {hi:g})"] = dict(
                    n=int(w.sum()), max=stats(hard[w] / t[w] - 1), p3=stats(p3[w] / t[w] - 1))
    return out


def report(out: dict) -> None:
    for name, res in out.items():
        if name in ("reproducibility", "accumulation", "best_of_grid", "corner", "saturation", "te_mix", "sustained"):
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
    print("== FP8 split accumulation cost: t_split / t_fast of the same shape (model: one FP8 rate,"
          " MAMF's split-accumulation figure)")
    for label, a in out["accumulation"].items():
        print(f"  {label:18s} n {a['n']:4d}  p25 {a['p25']:.3f}  median {a['median']:.3f}  p75 {a['p75']:.3f}")
    print("== best grid GEMM vs the large cubes (TFLOP/s from gpu_time_s)")
    for kind, b in out["best_of_grid"].items():
        cubes = "  ".join(f"{x}^3 {v:.0f}" for x, v in b["cubes_TFLOPs"].items())
        print(f"  {kind:10s} best {b['best_TFLOPs']:7.1f} at {'x'.join(map(str, b['at']))}   {cubes}")
    print("== a linear's three GEMMs as TE runs FP8 (fprop fast, dgrad / wgrad split) vs bf16;"
          " h100-default set, roofline alone")
    for cls, x in out["te_mix"].items():
        print(f"  {cls:7s} n {x['n']:3d}  speed-up measured {x['measured_median']:.3f}  predicted "
              f"{x['predicted_median']:.3f} (ratio err median {x['ratio_err']['median_signed_pct']:+.1f} %,"
              f" MAPE {x['ratio_err']['mape_pct']:.1f} %);  FP8 time err median "
              f"{x['fp8_time_err']['median_signed_pct']:+.1f} %, MAPE {x['fp8_time_err']['mape_pct']:.1f} %")
    print("== burst vs sustained (h100_gemm_sustained.csv): TFLOP/s of the first replay and the last 1 s"
          " (700 W cap); model = 2mnk / roofline time")
    for key, x in out["sustained"].items():
        ratio = (f"  FP8/bf16 first {x['first_ratio_to_bf16']:.3f} sustained {x['sustained_ratio_to_bf16']:.3f}"
                 if "sustained_ratio_to_bf16" in x else "")
        model = "  ".join(f"{n} {v:.0f}" for n, v in x["model_TFLOPs"].items())
        print(f"  {key:36s} first {x['first_TFLOPs']:7.1f}  sustained {x['sustained_TFLOPs']:7.1f}   "
              f"model: {model}{ratio}")
    print("== saturation per kind: the model's form fitted to the grid's gpu_time_s (mm_exponent fixed),"
          " fixed GPU time t0 per GEMM")
    for kind, f in out["saturation"].items():
        print(f"  {kind:10s} n {f['n']:4d}  eta_max {f['eta_max']:.2f}  d_half {f['half_dim']:6.1f}  "
              f"t0 {f['t0_s'] * 1e6:.1f} us  (gamma {f['gamma']:.3f}; fit MAPE {f['fit']['mape_pct']:.1f} %, "
              f"median {f['fit']['median_signed_pct']:+.1f} %)")
    print("== roofline corner (GEMMs >= 20 us, h100-default set, roofline alone): r = memory / compute"
          " term; hard max vs p-norm p = 3")
    for label, c in out["corner"].items():
        a, b = c["max"], c["p3"]
        print(f"  {label:28s} n {c['n']:4d}  max: MAPE {a['mape_pct']:5.1f} % median {a['median_signed_pct']:+6.1f} %"
              f"   p3: MAPE {b['mape_pct']:5.1f} % median {b['median_signed_pct']:+6.1f} %")


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
