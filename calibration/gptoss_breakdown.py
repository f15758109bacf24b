"""Where the predicted time of the Megatron-Bridge GPT-OSS 120B rows goes, op by op, and how
much time per token and layer the measurement leaves unexplained (docs/accuracy-gptoss.md).

    python calibration/gptoss_breakdown.py [--set FIELD=VALUE,...] [--json out.json]
    python calibration/gptoss_breakdown.py --model deepseek-v3,qwen3-235b-a22b --precision bf16
                                         (the same columns for other models' rows: controls)

Per row, for one micro-batch on the critical pipeline stage (default efficiencies of the
row's system, the row's `set` facts, no fitting), forward + backward milliseconds of:
proj (QKV and output projection GEMMs), router, experts (the routed expert GEMMs), attn
(attention core), elem (norms, activation, permutation: memory-bound), ep (exposed expert
all-to-all), head (output layer GEMM and loss, last stage only); GEMMs at each pass's own
precision (MXFP8 rows: FP8; their quantization kernels are in pred/mb, not in a column), the
pipeline bubble, DP and optimizer in pred/mb only (so are the dense MLP GEMMs of a dense
model or of DeepSeek-V3's first layers, and the shared experts, with --model); then the
measured time per micro-batch (step / m) and the unexplained time per token per layer

    gap_us = (step_meas - step_pred) / (m n_layers_stage T) x 1e6,   T = b s tokens
Reading: a cost that grows with s (the full-attention layers) would make gap_us of the
s = 8192 rows (25.11 GB200 / GB300) larger than that of the s = 4096 rows on the same system.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

COLS = ("proj", "router", "experts", "attn", "elem", "ep", "head")


def row_parts(model, parallel, system, training):
    """(ms per micro-batch of each of COLS on the critical stage, layers on that stage, T)."""
    from diffperf.costs.compute import (attention_by_kind_time_s, layer_pass_gemm_times_s,
                                        layer_times_s)
    from diffperf.predict import _head_parts, _layer_parts
    from diffperf.workload.flops import attention_by_kind, attention_io_bytes, layer_ops
    from diffperf.workload.stages import pipeline_stages

    ops = layer_ops(model, parallel, training)
    # fprop + dgrad + wgrad of each GEMM row, each at its own precision (MXFP8 rows: FP8)
    g = np.asarray(sum(layer_pass_gemm_times_s(ops, system, training)))
    parts, _, _ = _layer_parts(model, parallel, system, training, None)
    _, last = _head_parts(model, parallel, system, training, None)
    stages = pipeline_stages(model, parallel)
    n = float(np.max(np.asarray(stages.layers)))
    io = attention_io_bytes(model, parallel, training)
    _, attn, other = layer_times_s(ops, system, training, io)
    if float(training.attn_tile) > 0:
        attn = attention_by_kind_time_s(attention_by_kind(model, parallel, training), system,
                                        training, io)
    # forward + backward (2 x, + 0.5 x recomputed scores under flash), as predict does, + the
    # sinks' gradient in the backward (costs.compute.attention_sink_backward_s)
    from diffperf.costs.compute import attention_sink_backward_s
    from diffperf.workload.flops import query_rows
    attn_fb = (3.0 + 0.5 * float(training.flash_attention)) * float(attn) + float(
        attention_sink_backward_s(query_rows(model, parallel), model.attention_sinks, system,
                                  training))
    ms = dict(proj=float(g[0] + g[1]), router=float(g[4]), experts=float(g[5] + g[6]),
              attn=attn_fb, elem=3 * float(other),
              ep=float(parts["ep_exposed_s"]))
    out = {k: 1e3 * n * v for k, v in ms.items()}
    out["head"] = 1e3 * float(last["compute_s"])  # on the last stage, the critical one here
    T = float(parallel.micro_batch * model.seq_len / parallel.cp)
    return out, n, T


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--set", default="", help="training / parallel fields f=v,... for the rows")
    p.add_argument("--json")
    p.add_argument("--model", default="gpt-oss-120b",
                   help="models of the rows, comma-separated (default gpt-oss-120b)")
    p.add_argument("--precision", default="",
                   help="only rows of these precisions (comma-separated)")
    args = p.parse_args(argv)
    from diffperf import load_runs
    from diffperf.api import _as_float, _normalize
    from diffperf.cli.validate_cmd import load_systems
    from diffperf.predict import FEATURES
    from diffperf.specs.batch import stack
    from diffperf.validation import _predict_rows
    from calibration.bridge import CSV, _subset

    runs = load_runs(CSV)
    models, precisions = set(args.model.split(",")), set(filter(None, args.precision.split(",")))
    runs = _subset(runs, [i for i, r in enumerate(runs.rows) if r["model"] in models
                          and (not precisions or r["precision"] in precisions)])
    systems = load_systems(runs, None, None)
    if args.set:
        kv = dict(x.split("=") for x in args.set.split(","))
        runs.trainings[:] = [t.replace(**{k: float(v) for k, v in kv.items()
                                          if hasattr(t, k)}) for t in runs.trainings]
    a = _as_float((stack(runs.models), _normalize(stack(runs.parallels)),
                   stack([systems[s] for s in runs.systems]), stack(runs.trainings)))
    step = np.asarray(_predict_rows(*a, temperature=None, features=FEATURES).step_time_s)
    rows = []
    print(f"{'row':44s} {'err%':>6s} " + " ".join(f"{c:>8s}" for c in COLS)
          + f" {'pred/mb':>8s} {'meas/mb':>8s} {'gap_us':>7s}")
    for i, r in enumerate(runs.rows):
        m, par, sy, tr = _as_float((runs.models[i], _normalize(runs.parallels[i]),
                                    systems[runs.systems[i]], runs.trainings[i]))
        ms, n, T = row_parts(m, par, sy, tr)
        mb = float(par.n_microbatches)
        meas, pred = float(runs.step_time_s[i]), float(step[i])
        gap = (meas - pred) / (mb * n * T) * 1e6
        err = 100.0 * (meas / pred - 1.0)
        rows.append(dict(id=r["id"], err_pct=err, gap_us_per_token_layer=gap,
                         pred_ms_per_mb=1e3 * pred / mb, meas_ms_per_mb=1e3 * meas / mb,
                         layers=n, tokens=T, **{f"{k}_ms": v for k, v in ms.items()}))
        print(f"{r['id'][3:47]:44s} {err:+6.1f} " + " ".join(f"{ms[c]:8.1f}" for c in COLS)
              + f" {1e3 * pred / mb:8.1f} {1e3 * meas / mb:8.1f} {gap:7.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
