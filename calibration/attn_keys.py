"""Attention efficiency by keys per query row: does a per-query-tile overhead explain the
sliding-window kernels' deficit? (docs/accuracy-gptoss.md, "Session 15: attention by keys per
query row (branch `attnwin`)").

A flash kernel (FlashAttention-2, Dao 2023, arXiv:2307.08691, section 3.1, Algorithm 1; FA3,
arXiv:2407.08608, section 3.1) gives each thread block one tile of B_r query rows; it loads
Q_i, then loops over the key / value tiles that tile sees (a full causal layer: ~s/2 keys on
average, a w-key window: ~w + B_c), then rescales and writes O_i and the log-sum-exp. The
backward (Algorithm 2) loops the other way: one key tile per block, its dK_j dV_j accumulated
over the query tiles that see it and written at the end (and dQ accumulated atomically). Per
tile, then,

    t_tile = n_kv t_kv + t_0     (n_kv key tiles; t_0 the prologue / epilogue)

so the rate relative to a long loop is n_kv / (n_kv + t_0 / t_kv) = kv / (kv + k_half), kv =
keys per query row = s_kv kappa (the keys the kernel computes, tile-rounded as priced), k_half =
(t_0 / t_kv) B_c: the keys whose streaming costs what the fixed part of a tile costs. Priced:

    t' = t (1 + k_half / kv)      (t = diffperf's price now; one k_half per pass)

This script prices every H100 cuDNN kernel this project measured (full causal:
data/kernels/h100_attention.csv, forward and forward+backward, priced as calibrate's bench
does, exact kappa; GPT-OSS shapes, 128-key window and full, forward and backward, no sink:
data/kernels/h100_gptoss_attention.csv and h100_sink_heads.csv, attn_tile 128 as the Bridge rows)
at the H100 physics defaults, fits k_half for the forward and the backward by a grid search on
the mean squared log error of these H100 rows only, and reports the errors before / after per
group; then applies the fitted k_half, unchanged, to cuDNN's published GB200 / GB300 / H200
window timings (data/kernels/cudnn_fe_gptoss_sdpa.csv: held out, not fitted).

--min-rows: fit only on kernels with at least N query rows b a s (the small ones sit where the
work term `attention_efficiency` prices a time that grows as work falls, gamma > 1: see the docs).

Second part (the form the data do support): the work term W = R kv (R = b a s_q query rows,
kv keys per row) conflates the kernel's parallelism (R / B_r query tiles over the SMs: waves)
with its loop length (kv: the per-tile overhead above). Split:

    eta = eta_max / [ (1 + R_half / R) (1 + d_half / d_h) ] x kv / (kv + k_pass)

(the wave factor with exponent 1: a kernel of one partial wave takes one tile's time, so the
time floors as R falls; the W form's gamma > 1 prices a time that grows as work falls). Fitted
(eta_max, R_half, d_half, k_fwd, k_bwd; one eta for both passes, as predict prices the
backward) on the same H100 kernels by least squares on log time (jax BFGS on log-parameters);
new price = price now x eta_now / eta_new. Held out as above. --fit-on all-host adds a fitted
t_h per eager call to the PyTorch SDPA microbench rows (h100_attention.csv is wall time of eager
calls; the cudnn-frontend rows are GPU time with the host apart): with it one set of constants
fits the MHA microbench and the GQA kernels alike (t_h ~43 us, the machine's Python dispatch).

    python calibration/attn_keys.py [--min-rows N] [--fit-on all|gqa|all-host] [--extra-csv F]
"""
from __future__ import annotations

import argparse
import csv
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from calibration.gptoss_attention import SYSTEMS, priced_ms  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
K = ROOT / "data" / "kernels"


def keys_per_row(s, window, tile):
    """s_kv kappa: the keys per query row the price computes (workload.flops.
    attention_tile_kappas; tile 0: the exact causal half, as calibrate's bench)."""
    if tile <= 0:
        return s * 0.5
    n = math.ceil(s / tile - 1e-6)
    n_full = 0.5 * n * (n + 1)
    if window and window < s:
        c = math.ceil((window - 1) / tile - 1e-6)
        n_win = n + 0.5 * c * (c + 1) + c * (n - 1 - c) if n - 1 >= c else n_full
        return s * min(n_win * tile * tile / (s * s), 1.0)
    return s * min(n_full * tile * tile / (s * s), 1.0)


def h100_rows(extra=()):
    """(group, b, s, hq, hkv, d, window, pass, measured_ms, tile) of the H100 cuDNN kernels
    (`extra`: more CSVs of h100_gptoss_attention.csv's columns, e.g. the group sweep of
    calibration/device_h100_attn_group.py)."""
    out = []
    for r in csv.DictReader(open(K / "h100_attention.csv")):
        if r["causal"] != "1":
            continue
        b, s, a, d = (int(r[k]) for k in ("batch", "seq", "heads", "head_dim"))
        out.append(("full-mb", b, s, a, a, d, 0, "fwd", 1e3 * float(r["fwd_s"]), 0.0))
        out.append(("full-mb", b, s, a, a, d, 0, "fwd+bwd", 1e3 * float(r["fwd_bwd_s"]), 0.0))
    for name in ("h100_gptoss_attention.csv", "h100_sink_heads.csv", *extra):
        for r in csv.DictReader(open(name if Path(name).exists() else K / name)):
            if r["impl"] != "cudnn_fe" or r["sink"] != "0":
                continue
            w = int(r["window_left"]) + 1 if r["window_left"] else 0
            kind = "window" if w else "full"
            group = "mha" if r["hq"] == r["hkv"] else f"g{int(r['hq']) // int(r['hkv'])}"
            if name in ("h100_gptoss_attention.csv", "h100_sink_heads.csv"):
                kind = kind if w else "full-gptoss"
            else:
                kind = f"{kind}-{group}-d{r['d']}"
            out.append((kind, int(r["b"]), int(r["s"]),
                        int(r["hq"]), int(r["hkv"]), int(r["d"]), w, r["pass"],
                        float(r["gpu_ms"]), 128.0))
    return out


def priced(system, b, s, hq, hkv, d, w, tile):
    return (priced_ms(system, b, s, hq, hkv, d, w, "fwd", tile),
            priced_ms(system, b, s, hq, hkv, d, w, "bwd", tile))


def repriced(pf, pb, kv, which, kf, kb):
    f, bw = pf * (1 + kf / kv), pb * (1 + kb / kv)
    return {"fwd": f, "bwd": bw, "fwd+bwd": f + bw}[which]


def table(rows, kf, kb):
    """{group/pass: (MAPE before, MAPE after, mean ratio before, after)} in %."""
    acc = {}
    for g, b, s, hq, hkv, d, w, p, ms, tile, pf, pb, kv in rows:
        key = f"{g} {p}"
        acc.setdefault(key, []).append((ms / repriced(pf, pb, kv, p, 0, 0),
                                        ms / repriced(pf, pb, kv, p, kf, kb)))
    out = {}
    for key, v in acc.items():
        n = len(v)
        out[key] = (n, 100 * sum(abs(1 / a - 1) for a, _ in v) / n,
                    100 * sum(abs(1 / c - 1) for _, c in v) / n,
                    sum(a for a, _ in v) / n, sum(c for _, c in v) / n)
    return out


def published():
    """cuDNN's published GPT-OSS SDPA timings (cudnn_fe_gptoss_sdpa.csv; bf16, non-deterministic,
    cudnn backend: held out, never fitted), each as (row, (b, s, hq, hkv, d, w), forward and
    backward price now, keys per query row, measured ms), at attn_tile 128 as the Bridge rows."""
    for r in csv.DictReader(open(K / "cudnn_fe_gptoss_sdpa.csv")):
        if r["dtype"] != "bfloat16" or r["deterministic"] != "False" or r["backend"] != "cudnn":
            continue
        shape = b, s, hq, hkv, d, w = tuple(int(r[k]) for k in (
            "batch", "seq", "q_heads", "kv_heads", "head_dim", "window"))
        pf, pb = priced(SYSTEMS[r["gpu"]], b, s, hq, hkv, d, w, 128.0)
        yield r, shape, pf, pb, keys_per_row(s, w, 128.0), float(r["time_ms"])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--min-rows", type=float, default=0.0)
    ap.add_argument("--extra-csv", action="append", default=[],
                    help="another kernel CSV (h100_gptoss_attention.csv's columns), added to "
                         "the H100 kernels")
    ap.add_argument("--heldout-csv", action="append", default=[],
                    help="a kernel CSV priced and reported (groups prefixed held-) but not "
                         "fitted, e.g. data/kernels/h100_attn_group.csv")
    ap.add_argument("--fit-on", choices=("all", "gqa", "all-host"), default="all",
                    help="two-factor fit on all H100 kernels, on the GQA (GPT-OSS-shape) ones "
                         "only, or on all with a fitted per-call host time t_h on the PyTorch "
                         "SDPA microbench rows (h100_attention.csv: wall time of eager calls, "
                         "fwd 1 call, fwd+bwd 2; the cudnn-frontend rows are GPU time); the "
                         "errors are reported on all")
    args = ap.parse_args(argv)
    rows = []
    for g, b, s, hq, hkv, d, w, p, ms, tile in h100_rows(args.extra_csv):
        pf, pb = priced("h100-sxm-80gb", b, s, hq, hkv, d, w, tile)
        rows.append((g, b, s, hq, hkv, d, w, p, ms, tile, pf, pb, keys_per_row(s, w, tile)))
    for g, b, s, hq, hkv, d, w, p, ms, tile in h100_rows(args.heldout_csv):
        if g in ("full-mb", "window", "full-gptoss") or g.startswith("held-"):
            continue
        pf, pb = priced("h100-sxm-80gb", b, s, hq, hkv, d, w, tile)
        rows.append(("held-" + g, b, s, hq, hkv, d, w, p, ms, tile, pf, pb,
                     keys_per_row(s, w, tile)))
    fit = [r for r in rows if r[1] * r[3] * r[2] >= args.min_rows
           and not r[0].startswith("held-")]
    grid = [0.0] + [2 ** (i / 8) for i in range(0, 8 * 12 + 1)]  # 1 .. 4096 keys

    def loss(kf, kb):
        return sum(math.log(r[8] / repriced(r[10], r[11], r[12], r[7], kf, kb)) ** 2
                   for r in fit) / len(fit)

    best = min(((loss(kf, kb), kf, kb) for kf in grid for kb in grid))
    l0 = loss(0.0, 0.0)
    _, kf, kb = best
    print(f"fit on {len(fit)} H100 kernels (min rows {args.min_rows:g}): k_half fwd {kf:.1f} "
          f"keys, bwd {kb:.1f} keys; rms log error {math.sqrt(l0):.3f} -> {math.sqrt(best[0]):.3f}")
    print(f"\n{'H100 group / pass':26s} {'n':>3s} {'MAPE now':>9s} {'after':>7s} "
          f"{'meas/price now':>15s} {'after':>6s}")
    for key, (n, m0, m1, r0, r1) in sorted(table(rows, kf, kb).items()):
        print(f"{key:26s} {n:3d} {m0:8.1f}% {m1:6.1f}% {r0:15.2f} {r1:6.2f}")
    print("\nwindow kernels by query rows b a s (meas / price now -> after)")
    for g, b, s, hq, hkv, d, w, p, ms, tile, pf, pb, kv in rows:
        if g == "window":
            print(f"  b{b} s{s} {hq:2d}/{hkv} heads rows {b * hq * s:8d} kv {kv:5.0f} {p:4s} "
                  f"{ms:7.4f} ms  {ms / repriced(pf, pb, kv, p, 0, 0):5.2f} -> "
                  f"{ms / repriced(pf, pb, kv, p, kf, kb):5.2f}")
    print("\nheld out: cuDNN's published timings (cudnn_fe_gptoss_sdpa.csv, bf16, "
          "non-deterministic, cudnn backend; not fitted)")
    print(f"{'gpu':6s} {'cuDNN':>6s} {'s':>6s} {'win':>5s} {'kv':>6s} {'pass':4s} "
          f"{'meas_ms':>8s} {'now':>6s} {'after':>6s}")
    e0 = e1 = 0.0
    n = 0
    for r, (b, s, hq, hkv, d, w), pf, pb, kv, ms in published():
        a0 = ms / repriced(pf, pb, kv, r["pass"], 0, 0)
        a1 = ms / repriced(pf, pb, kv, r["pass"], kf, kb)
        e0, e1, n = e0 + abs(1 / a0 - 1), e1 + abs(1 / a1 - 1), n + 1
        print(f"{r['gpu']:6s} {r['cudnn_backend']:>6s} {s:6d} {w:5d} {kv:6.0f} {r['pass']:4s} "
              f"{ms:8.3f} {a0:6.2f} {a1:6.2f}")
    print(f"held-out MAPE (price vs measured) {100 * e0 / n:.1f} % -> {100 * e1 / n:.1f} % "
          f"({n} kernels)")
    two_factor(rows, args.fit_on)
    return 0


def _eta_now(R, kv, d):
    from diffperf import load_system
    from diffperf.costs.compute import attention_efficiency
    return float(attention_efficiency(R * kv, d, load_system("h100-sxm-80gb").eff))


def _eta_new(th, R, kv, d, which):
    eta_max, r_half, d_half, k_f, k_b = th[:5]
    k = k_f if which == "fwd" else k_b
    return eta_max / ((1 + r_half / R) * (1 + d_half / d)) * kv / (kv + k)


def _new(th, pf, pb, R, kv, d, which, harness=False):
    """price now x eta_now / eta_new, per pass (+ t_h per eager call on the harness rows)."""
    e0 = _eta_now(R, kv, d)
    h = 1e3 * th[5] if (harness and len(th) > 5) else 0.0
    f = pf * e0 / _eta_new(th, R, kv, d, "fwd")
    b = pb * e0 / _eta_new(th, R, kv, d, "bwd")
    return {"fwd": f + h, "bwd": b + h, "fwd+bwd": f + b + 2 * h}[which]


def fit_two_factor(rows, host=False):
    import jax
    import jax.numpy as jnp
    from jax.scipy.optimize import minimize

    e0 = jnp.asarray([_eta_now(r[1] * r[3] * r[2], r[12], r[5]) for r in rows])
    R = jnp.asarray([float(r[1] * r[3] * r[2]) for r in rows])
    kv = jnp.asarray([r[12] for r in rows])
    d = jnp.asarray([float(r[5]) for r in rows])
    pf = jnp.asarray([r[10] for r in rows])
    pb = jnp.asarray([r[11] for r in rows])
    ms = jnp.asarray([r[8] for r in rows])
    wf = jnp.asarray([1.0 if r[7] in ("fwd", "fwd+bwd") else 0.0 for r in rows])
    wb = jnp.asarray([1.0 if r[7] in ("bwd", "fwd+bwd") else 0.0 for r in rows])
    calls = jnp.asarray([(2.0 if r[7] == "fwd+bwd" else 1.0) if (host and r[0] == "full-mb")
                         else 0.0 for r in rows])

    def loss(x):
        eta_max, r_half, d_half, k_f, k_b, h_s = jnp.exp(x)
        base = eta_max / ((1 + r_half / R) * (1 + d_half / d))
        t = (wf * pf * e0 / (base * kv / (kv + k_f)) + wb * pb * e0 / (base * kv / (kv + k_b))
             + calls * 1e3 * h_s)
        return jnp.mean(jnp.log(t / ms) ** 2)

    x0 = jnp.log(jnp.asarray([0.75, 5e4, 40.0, 200.0, 500.0, 2e-5]))
    res = minimize(jax.jit(loss), x0, method="BFGS")
    th = [float(v) for v in jnp.exp(res.x)]
    return (th if host else th[:5]), float(jnp.sqrt(loss(res.x)))


def two_factor(rows, fit_on="all"):
    fit = [r for r in rows if not r[0].startswith("held-")]
    fit = fit if fit_on != "gqa" else [r for r in fit if r[3] != r[4]]
    th, rms = fit_two_factor(fit, fit_on == "all-host")
    rms0 = math.sqrt(sum(math.log(r[8] / repriced(r[10], r[11], r[12], r[7], 0, 0)) ** 2
                         for r in fit) / len(fit))
    print(f"\ntwo-factor form fitted on {len(fit)} H100 kernels ({fit_on}): eta_max "
          f"{th[0]:.4f}, R_half {th[1]:.4g} query rows, d_half {th[2]:.2f}, k_fwd "
          f"{th[3]:.1f} keys, k_bwd {th[4]:.1f} keys"
          f"{f', t_h {1e6 * th[5]:.1f} us per eager call' if len(th) > 5 else ''}; "
          f"rms log error {rms0:.3f} -> {rms:.3f}")
    acc = {}
    for g, b, s, hq, hkv, d, w, p, ms, tile, pf, pb, kv in rows:
        R = b * hq * s
        new = _new(th, pf, pb, R, kv, d, p, g == "full-mb")
        acc.setdefault(f"{g} {p}", []).append(
            (abs(repriced(pf, pb, kv, p, 0, 0) / ms - 1), abs(new / ms - 1),
             ms / repriced(pf, pb, kv, p, 0, 0), ms / new))
    print(f"{'H100 group / pass':26s} {'n':>3s} {'MAPE now':>9s} {'after':>7s} "
          f"{'meas/price now':>15s} {'after':>6s}")
    for key, v in sorted(acc.items()):
        n = len(v)
        print(f"{key:26s} {n:3d} {100 * sum(x[0] for x in v) / n:8.1f}% "
              f"{100 * sum(x[1] for x in v) / n:6.1f}% {sum(x[2] for x in v) / n:15.2f} "
              f"{sum(x[3] for x in v) / n:6.2f}")
    print("window / full GPT-OSS-shape kernels (meas / price now -> after)")
    for g, b, s, hq, hkv, d, w, p, ms, tile, pf, pb, kv in rows:
        if g != "full-mb":
            R = b * hq * s
            new = _new(th, pf, pb, R, kv, d, p)
            print(f"  {g:11s} b{b} s{s} {hq:2d}/{hkv} rows {R:8d} kv {kv:5.0f} {p:4s} "
                  f"{ms / repriced(pf, pb, kv, p, 0, 0):5.2f} -> {ms / new:5.2f}")
    print("held out: cuDNN's published timings, price x eta_now / eta_new (H100 constants)")
    e0 = e1 = 0.0
    n = 0
    for r, (b, s, hq, hkv, d, w), pf, pb, kv, ms in published():
        old = repriced(pf, pb, kv, r["pass"], 0, 0)
        new = _new(th, pf, pb, b * hq * s, kv, d, r["pass"])
        e0, e1, n = e0 + abs(old / ms - 1), e1 + abs(new / ms - 1), n + 1
        print(f"  {r['gpu']:6s} {r['cudnn_backend']:>6s} s{s:6d} w{w:5d} {r['pass']:4s} "
              f"{ms / old:5.2f} -> {ms / new:5.2f}")
    print(f"held-out MAPE {100 * e0 / n:.1f} % -> {100 * e1 / n:.1f} % ({n} kernels)")


if __name__ == "__main__":
    raise SystemExit(main())
