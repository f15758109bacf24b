"""Held-out check of diffperf on NVIDIA's published long-sequence FP8 runs with context
parallelism (data/published_longseq.csv; sources in data/published_longseq.md). Nothing is
fitted here: every row is predicted with

    physics   the physics defaults (specs.system.Efficiency; `--calibration none`)
    shipped   the shipped efficiency set of each row's GPU (configs/efficiency/GPU.yaml: the
              H100 rows take the `h100` set; B200 has no measured set, so its rows keep the
              physics defaults, as `diffperf validate` does)
    h100-set  the shipped H100 set on every row, the B200 rows included (a transfer check)

and the script prints, per efficiency set, MAPE and bias of tokens/s/GPU (positive bias =
diffperf predicts faster than measured), the per-row errors, and the breakdown of each
predicted step: the share of the attention core (forward + backward, causal, as diffperf
counts it), the CP K/V exchange exposed and hidden, TP and DP exposed, the host floor, the
attention TFLOP/s predicted and implied by the measurement, and the predicted memory ('!':
predicted not to fit, though the run ran).

    python calibration/check_longseq.py [--json out.json]

The CLI equivalent of the first two: `python -m diffperf.cli.main validate
data/published_longseq.csv --calibration none` and `... validate data/published_longseq.csv`
(those print the step-time error; this script prints the tokens/s error and the breakdown).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CSV = ROOT / "data" / "published_longseq.csv"
SETS = ("physics", "shipped", "h100-set")


def systems_for(runs, which):
    """{system name: System} for the efficiency set `which` (see the module docstring)."""
    from diffperf import load_system
    from diffperf.trust import default_set, resolve

    names = sorted(set(runs.systems))
    if which == "physics":
        return {n: resolve(load_system(n), "none")[0] for n in names}
    if which == "shipped":
        return {n: resolve(load_system(n), None)[0] for n in names}
    h100 = default_set("h100")["path"]
    return {n: resolve(load_system(n), str(h100))[0] for n in names}


def attention_step_s(runs, systems):
    """(seconds, model FLOPs) of the attention core per step and GPU on the critical stage,
    as diffperf costs it: (forward kernel time + (2 + 0.5 flash) x the backward kernel's time
    per unit of forward work) x layers per stage x micro-batches (predict._layer_parts:
    backward 2 x forward + the recomputed scores, at the backward's rate, which differs from
    the forward's under Training.attention_fa2 and where the exponential floor binds:
    costs.compute.attention_exp_floor_s); the FLOPs are 3 x the forward's
    (causal, this rank's 1/c share: workload.flops.layer_ops), i.e. without the recomputed
    scores, as model FLOPs count them."""
    import jax

    from diffperf.costs.compute import attention_time_s
    from diffperf.workload.flops import attention_io_bytes, layer_ops

    out, flops = np.zeros(len(runs)), np.zeros(len(runs))
    for i in range(len(runs)):
        m, p, t = runs.models[i], runs.parallels[i], runs.trainings[i]
        s = systems[runs.systems[i]]
        ops = layer_ops(m, p, t)
        io = attention_io_bytes(m, p, t)
        fwd = float(jax.device_get(attention_time_s(ops.attention, s, t, io)))
        bwd1 = float(jax.device_get(attention_time_s(ops.attention, s, t, io, backward=True)))
        per_layer = fwd + bwd1 * (2.0 + 0.5 * float(t.flash_attention))
        layers = float(m.n_layers) / float(p.pp) * float(p.n_microbatches)
        out[i] = per_layer * layers
        flops[i] = 3.0 * float(jax.device_get(ops.attention.flops.sum())) * layers
    return out, flops


def two_term_factors(measured, step, attn):
    """Diagnostic only (no prediction uses it): least-squares (a, b) of
    measured ~ a (step - attn) + b attn, i.e. how much slower than predicted the
    non-attention part (a) and the attention core with its CP exchange (b) must be to
    explain the rows. 2 numbers per system from 8-11 rows: a description, not a fit."""
    X = np.stack([step - attn, attn], axis=1)
    (a, b), *_ = np.linalg.lstsq(X, measured, rcond=None)
    return float(a), float(b)


def predict_all(runs, systems):
    """Step time and breakdown (seconds per step) of every row, one vmap per system."""
    from diffperf.api import predict_batch
    from diffperf.specs.batch import stack

    step = np.full(len(runs), np.nan)
    parts = {}
    for name in sorted(set(runs.systems)):
        idx = [i for i, s in enumerate(runs.systems) if s == name]
        res = predict_batch(stack([runs.models[i] for i in idx]),
                            stack([runs.parallels[i] for i in idx]), systems[name],
                            stack([runs.trainings[i] for i in idx]))
        step[idx] = np.asarray(res.step_time_s)
        parts.setdefault("memory_GB", np.full(len(runs), np.nan))[idx] = np.asarray(
            res.memory.total_bytes) / 1e9
        parts.setdefault("fits", np.full(len(runs), np.nan))[idx] = np.asarray(res.fits)
        for k in ("compute_s", "cp_exposed_s", "cp_hidden_s", "tp_exposed_s", "dp_exposed_s",
                  "pp_exposed_s", "bubble_s", "optimizer_s", "overhead_s"):
            parts.setdefault(k, np.full(len(runs), np.nan))[idx] = np.asarray(
                getattr(res.breakdown, k))
    return step, parts


def summary(err, mask):
    e = err[mask]
    return dict(n=int(mask.sum()), mape_pct=float(np.mean(np.abs(e))),
                bias_pct=float(np.mean(e)), max_pct=float(np.max(np.abs(e))))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write every figure as JSON")
    args = ap.parse_args(argv)

    from diffperf import load_runs

    runs = load_runs(CSV)
    sysname = np.array(runs.systems)
    seq = np.array([float(r["seq_len"]) for r in runs.rows])
    cp = np.array([float(r["cp"]) for r in runs.rows])
    measured_tok = np.array([float(r["tokens_per_s_per_gpu"]) for r in runs.rows])
    out = {}
    for which in SETS:
        systems = systems_for(runs, which)
        step, parts = predict_all(runs, systems)
        attn, attn_flops = attention_step_s(runs, systems)
        err = 100.0 * (runs.step_time_s / step - 1.0)   # tokens/s: measured step / predicted
        groups = {"all": np.ones(len(runs), bool), "seq >= 16K": seq >= 16384,
                  "cp > 1": cp > 1}
        for name in sorted(set(sysname)):
            groups[name] = sysname == name
            groups[f"{name} cp > 1"] = (sysname == name) & (cp > 1)
        out[which] = dict(groups={k: summary(err, v) for k, v in groups.items()}, rows=[])
        print(f"== {which}: tokens/s/GPU error (+ = predicted faster than measured)")
        for k, v in out[which]["groups"].items():
            print(f"  {k:26s} n {v['n']:2d}  MAPE {v['mape_pct']:5.1f} %  "
                  f"bias {v['bias_pct']:+6.1f} %  max {v['max_pct']:5.1f} %")
        out[which]["two_term"] = {}
        for name in sorted(set(sysname)):
            k = sysname == name
            a, b = two_term_factors(runs.step_time_s[k], step[k], attn[k])
            desc = a * (step[k] - attn[k]) + b * attn[k]
            resid = float(np.mean(np.abs(runs.step_time_s[k] / desc - 1.0)) * 100.0)
            out[which]["two_term"][name] = dict(non_attention=a, attention=b,
                                                residual_mape_pct=resid)
            print(f"  diagnostic {name}: measured ~ {a:.2f} x predicted non-attention + "
                  f"{b:.2f} x predicted attention (residual MAPE {resid:.1f} %)")
        print(f"  {'row':44s} {'meas tok/s':>10s} {'pred':>8s} {'err%':>6s} {'attn%':>6s} "
              f"{'cpExp%':>6s} {'cpHid%':>6s} {'tpExp%':>6s} {'dpExp%':>6s} {'ovh%':>5s} "
              f"{'attnTF':>6s} {'implTF':>6s} {'memGB':>6s}")
        for i, rid in enumerate(runs.ids):
            pred_tok = measured_tok[i] * runs.step_time_s[i] / step[i]
            sh = {k: 100.0 * parts[k][i] / step[i] for k in parts
                  if k not in ("memory_GB", "fits")}
            # attention TFLOP/s (model FLOPs, causal) as predicted, and as implied by the
            # measured step if everything but the attention core were predicted right
            attn_tf = attn_flops[i] / attn[i] / 1e12
            rest = runs.step_time_s[i] - (step[i] - attn[i])
            impl_tf = attn_flops[i] / rest / 1e12 if rest > 0 else float("nan")
            row = dict(id=rid, measured_tokens_per_s_per_gpu=measured_tok[i],
                       attention_tflops_predicted=float(attn_tf),
                       attention_tflops_implied=float(impl_tf),
                       predicted_tokens_per_s_per_gpu=float(pred_tok),
                       error_pct=float(err[i]), step_s=float(step[i]),
                       attention_share_pct=float(100.0 * attn[i] / step[i]),
                       predicted_memory_GB=float(parts["memory_GB"][i]),
                       predicted_fits=bool(parts["fits"][i]),
                       **{f"{k}_share_pct": float(v) for k, v in sh.items()})
            out[which]["rows"].append(row)
            print(f"  {rid:44s} {measured_tok[i]:10.0f} {pred_tok:8.0f} {err[i]:+6.1f} "
                  f"{row['attention_share_pct']:6.1f} {sh['cp_exposed_s']:6.1f} "
                  f"{sh['cp_hidden_s']:6.1f} {sh['tp_exposed_s']:6.1f} "
                  f"{sh['dp_exposed_s']:6.1f} {sh['overhead_s']:5.1f} {attn_tf:6.0f} "
                  f"{impl_tf:6.0f} {parts['memory_GB'][i]:5.1f}{'' if parts['fits'][i] else '!'}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
