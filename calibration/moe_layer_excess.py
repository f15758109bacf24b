"""Measured minus predicted step of the Megatron-Bridge MoE rows, per MoE layer pass and
micro-batch, beside the local-expert count and the tokens of the pass (the diagnostic behind
docs/accuracy-bridge.md, section "Session 13: Qwen3 30B-A3B on NVLink racks").

    python calibration/moe_layer_excess.py [--model qwen3-30b-a3b,...] [--containers 26.02,...]
                                           [--what-if-tau-s 28e-6]

For each row (default efficiencies of its system, no fitting):

    excess = (measured step - predicted step) / (m_eff L_moe)   [ms per MoE layer pass
             (forward + backward) and micro-batch, one GPU]
    m_eff  = m + (p - 1) / v      micro-batches per step plus the pipeline fill, in layer
                                  passes of one stage (the 1F1B bubble, an approximation)
    L_moe  = MoE layers per pipeline stage (DeepSeek-V3: 58 of 61)
    E_l    = routed experts per GPU (E / ep);  tokens = b s of one micro-batch
    per_call = excess / (6 (E_l - 1))   the excess as time per extra per-expert GEMM call
                                  (3 passes x 2 grouped GEMMs, each E_l cuBLASLt calls in
                                  Transformer Engine's multi-stream loop: Training.moe_expert_loop)

`--what-if-tau-s T` is an EXPERIMENT, not a diffperf term: it adds T x 6 (E_l - 1) x m_eff x
L_moe to the predicted step of the rows that carry `moe_expert_loop=1` and prints the tokens/s
MAPE per model before and after (docs/accuracy-bridge.md, Session 13, explains why it is not
shipped).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MOE = ("deepseek-v3", "gpt-oss-120b", "qwen3-235b-a22b", "qwen3-30b-a3b")
GRACE = ("gb200-nvl72", "gb300-nvl72")  # Grace (Arm) hosts; the DGX systems have x86 hosts


def predicted_rows(models, containers=()):
    """(runs, systems, predicted step times) of the Bridge rows (data/megatron_bridge.csv) of
    `models` (and of `containers`, every one when empty), at the default efficiencies, every
    feature traced (as `calibration/bridge.py --only default`)."""
    from diffperf import load_runs
    from diffperf.api import _as_float, _normalize
    from diffperf.cli.validate_cmd import load_systems
    from diffperf.predict import FEATURES
    from diffperf.specs.batch import stack
    from diffperf.validation import _predict_rows
    from calibration.bridge import CSV, _subset

    runs = load_runs(CSV)
    idx = [i for i, r in enumerate(runs.rows)
           if r["model"] in models and (not containers or r["container"] in containers)]
    runs = _subset(runs, idx)
    systems = load_systems(runs, None, None)
    a = _as_float((stack(runs.models), _normalize(stack(runs.parallels)),
                   stack([systems[s] for s in runs.systems]), stack(runs.trainings)))
    res = _predict_rows(*a, temperature=None, features=FEATURES)
    return runs, systems, np.asarray(res.step_time_s)


def layer_passes(model, par, row) -> tuple:
    """(m_eff, L_moe, E_l) of one Bridge row: MoE layer passes per stage and step = m_eff x
    L_moe, m_eff = m + (pp - 1) / vp micro-batches (m = GBS / (MBS dp), the pipeline's fill
    and drain), L_moe = (layers - dense layers) / pp; E_l = experts / ep local experts."""
    pp, vp = float(par.pp), max(float(par.vp), 1.0)
    m = float(row["global_batch"]) / (float(row["micro_batch"]) * float(row["dp"]))
    m_eff = m + (pp - 1.0) / vp
    L_moe = (float(model.n_layers) - float(model.moe_dense_layers)) / pp
    return m_eff, L_moe, float(model.n_experts) / float(par.ep)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=",".join(MOE))
    p.add_argument("--containers", default="",
                   help="comma-separated container releases (default: all)")
    p.add_argument("--what-if-tau-s", type=float, default=0.0,
                   help="experiment: serial seconds per extra per-expert GEMM call (see doc)")
    args = p.parse_args(argv)
    want = set(args.model.split(","))
    conts = set(c for c in args.containers.split(",") if c)
    runs, _, step = predicted_rows(want, conts)
    rows = []
    for i, r in enumerate(runs.rows):
        m_eff, L_moe, E_l = layer_passes(runs.models[i], runs.parallels[i], r)
        gap = float(runs.step_time_s[i] - step[i])
        excess = gap / (m_eff * L_moe)
        calls = 6.0 * max(E_l - 1.0, 0.0)
        loop = "moe_expert_loop=1" in r.get("set", "")
        extra = args.what_if_tau_s * calls * m_eff * L_moe if loop else 0.0
        rows.append(dict(id=r["id"], model=r["model"], system=r["system"],
                         err=100.0 * (runs.step_time_s[i] / step[i] - 1.0),
                         err_if=100.0 * (runs.step_time_s[i] / (step[i] + extra) - 1.0),
                         excess_ms=1e3 * excess, E_l=E_l, loop=loop,
                         tokens=float(r["micro_batch"]) * float(r["seq_len"]),
                         per_call_us=1e6 * excess / calls if calls > 0 else float("nan")))
    print(f"{'id':56s} {'err%':>6s} {'E_l':>4s} {'tokens':>6s} {'loop':>4s} "
          f"{'excess ms':>9s} {'us/call':>7s}" + ("  err% what-if" if args.what_if_tau_s else ""))
    for x in sorted(rows, key=lambda x: (x["model"], x["id"])):
        line = (f"{x['id'][3:]:56s} {x['err']:+6.1f} {x['E_l']:4.0f} {x['tokens']:6.0f} "
                f"{'y' if x['loop'] else '-':>4s} {x['excess_ms']:9.3f} {x['per_call_us']:7.1f}")
        if args.what_if_tau_s:
            line += f"  {x['err_if']:+6.1f}"
        print(line)
    print("\n# expert-loop rows: excess per MoE layer pass and micro-batch (ms), by model, host, E_l")
    for mdl in sorted(want):
        for host in ("Grace", "x86"):
            for E_l in sorted({x["E_l"] for x in rows}):
                sel = [x for x in rows if x["loop"] and x["model"] == mdl and x["E_l"] == E_l
                       and ((x["system"] in GRACE) == (host == "Grace"))]
                if sel:
                    ex = [x["excess_ms"] for x in sel]
                    tok = sorted({int(x["tokens"]) for x in sel})
                    print(f"  {mdl:16s} {host:5s} E_l {E_l:3.0f}: {len(sel):2d} rows, tokens "
                          f"{','.join(map(str, tok)):>11s}, median {np.median(ex):6.3f}, "
                          f"range {min(ex):6.3f} .. {max(ex):6.3f}")
    if args.what_if_tau_s:
        print(f"\n# what-if (experiment): + {args.what_if_tau_s * 1e6:.1f} us x 6 (E_l - 1) per MoE "
              "layer pass on the expert-loop rows; tokens/s MAPE (bias) per model")
        for mdl in sorted(want):
            e0 = np.array([x["err"] for x in rows if x["model"] == mdl])
            e1 = np.array([x["err_if"] for x in rows if x["model"] == mdl])
            if len(e0):
                print(f"  {mdl:18s} {len(e0):3d} rows: {np.mean(np.abs(e0)):5.1f} ({e0.mean():+5.1f})"
                      f" -> {np.mean(np.abs(e1)):5.1f} ({e1.mean():+5.1f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
