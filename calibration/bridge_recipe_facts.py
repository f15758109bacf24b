"""The Megatron-Bridge MoE rows with two recipe facts the CSV does not carry, as a `set` column
(`diffperf validate`'s per-row FIELD=VALUE facts): an experiment, not the shipped CSV
(docs/accuracy-bridge.md, section "MoE physics", says why and what it measured).

    python calibration/bridge_recipe_facts.py OUT.csv [--facts overlap,layout,attn]
    python calibration/bridge_moe_rows.py --csv OUT.csv          # per-row effect

1. `ep_overlap=1` where the row's performance recipe sets Megatron-Core's
   `overlap_moe_expert_parallel_comm = True` (the EP all-to-all of one micro-batch runs behind
   the computation of another; Megatron-Bridge `src/megatron/bridge/perf_recipes/`, snapshot
   067f987d): DeepSeek-V3 MXFP8 on DGX-B200 (`deepseek_v3_pretrain_256gpu_b200_fp8mx_config`),
   DGX-B300 / GB200 / GB300 (`_enable_deepseek_full_iteration_mxfp8`, deepseek/common.py);
   GPT-OSS 120B GB200 BF16 (`gpt_oss_120b_pretrain_64gpu_gb200_bf16_config`) and GB200 / GB300
   MXFP8 (`_apply_gpt_oss_120b_full_iter_fp8mx_configs`, gpt_oss/common.py); Qwen3 235B-A22B
   DGX-H100 FP8-CS (`qwen3_235b_a22b_pretrain_256gpu_h100_fp8cs_config`) and the MXFP8 recipes
   that call `_enable_hybridep_full_iteration_mxfp8` (qwen/common.py: GB200 / GB300 at 64 and
   256 GPUs, DGX-B200 / B300 at 256 GPUs; Qwen3 30B-A3B DGX-B300 / GB200 / GB300 at 8 GPUs), and
   Qwen3 30B-A3B DGX-B200 MXFP8 (`qwen3_30b_a3b_pretrain_8gpu_b200_fp8mx_config`). diffperf's
   `Parallel.ep_overlap` = 1 lets the all-to-alls hide behind the layer's GEMM time
   (`predict._ep_parts`).
2. DeepSeek-V3's pipeline layout (`pp_first_layers`, `pp_last_layers`: decoder layers on the
   first and the last device) from Megatron-Bridge's `_get_deepseek_v3_pipeline_layout`
   (recipes/deepseek/h100/deepseek_v3.py), which every DeepSeek-V3 performance recipe applies:
   (pp, vp) = (16, 1): [embedding + 4], 14 x [4], [1 + MTP + loss] -> first 4, last 1;
   (8, 2) and (8, 1): [E + 8 per device], last device 5 + MTP + loss -> 8, 5;
   (4, 4) and (4, 2): 16, 13; DGX-H100 (pp 8, vp 4) with the recipe's explicit layout
   "Et|(tt|)*30mL" (32 virtual stages: E + 1, 30 x 2, MTP + loss) -> 7, 6. Other (pp, vp)
   (GB300's (2, 8) and (2, 4), GB200's (8, 4) of 25.11) have no layout in the map and keep
   diffperf's automatic split.
3. `attn_tile=128` on the GPT-OSS 120B rows (the one model with sliding-window layers): its
   attention runs as Transformer Engine's FusedAttention (cuDNN F16_arbitrary_seqlen), which
   is the only fused backend for `softmax_type = learnable` (TE `attention/dot_product_
   attention/utils.py` get_attention_backend, v2.9 to v2.16: FlashAttention disabled for
   sinks; FusedAttention needs cuDNN >= 9.13.1, `common/fused_attn/fused_attn.cpp`), and every
   container of these rows ships cuDNN >= 9.13.1 (Megatron-Bridge docs/releases/software-
   versions.md: 25.11 9.13.1.26, 26.02 9.18.0.50, 26.04 9.20.0.48, 26.06 9.21.1.3). Megatron-
   Bridge's GPT-OSS bridge sets `window_size = (127, 0)`, `window_attn_skip_freq = 2`,
   `softmax_type = "learnable"` (models/gpt_oss/gpt_oss_bridge.py). A fused kernel skips only
   the score tiles no query of a row block sees (cuDNN's own sliding-window backward timings:
   cudnn-frontend PR #505); `workload.flops.attention_tile_kappas` counts them, 128 x 128
   tiles (flash-attention's head_dim-64 forward). docs/accuracy-gptoss.md.
"""

from __future__ import annotations

import argparse
import csv
import io
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CSV = ROOT / "data" / "megatron_bridge.csv"

# (model, system, precision, GPUs or None) of the recipes that set overlap_moe_expert_parallel_comm
A2A_OVERLAP = [
    ("deepseek-v3", "dgx-b200", "mxfp8", None), ("deepseek-v3", "dgx-b300", "mxfp8", None),
    ("deepseek-v3", "gb200-nvl72", "mxfp8", None), ("deepseek-v3", "gb300-nvl72", "mxfp8", None),
    ("gpt-oss-120b", "gb200-nvl72", "bf16", None), ("gpt-oss-120b", "gb200-nvl72", "mxfp8", None),
    ("gpt-oss-120b", "gb300-nvl72", "mxfp8", None),
    ("qwen3-235b-a22b", "h100-sxm-80gb", "fp8-current", None),
    ("qwen3-235b-a22b", "gb200-nvl72", "mxfp8", None),
    ("qwen3-235b-a22b", "gb300-nvl72", "mxfp8", None),
    ("qwen3-235b-a22b", "dgx-b200", "mxfp8", "256"), ("qwen3-235b-a22b", "dgx-b300", "mxfp8", "256"),
    ("qwen3-30b-a3b", "dgx-b200", "mxfp8", None), ("qwen3-30b-a3b", "dgx-b300", "mxfp8", None),
    ("qwen3-30b-a3b", "gb200-nvl72", "mxfp8", None), ("qwen3-30b-a3b", "gb300-nvl72", "mxfp8", None),
]
# Models of the CSV with sliding-window layers, and the fused kernel's score tile (fact 3)
SLIDING_WINDOW_MODELS = ("gpt-oss-120b",)
ATTN_TILE = 128
# DeepSeek-V3 (pp, vp) -> (decoder layers on the first device, on the last device)
DSV3_LAYOUT = {("16", "1"): (4, 1), ("8", "2"): (8, 5), ("8", "1"): (8, 5),
               ("4", "4"): (16, 13), ("4", "2"): (16, 13)}
# DGX-H100's recipe passes its own layout "Et|(tt|)*30mL" (perf_recipes/deepseek/h100)
DSV3_H100_LAYOUT = (7, 6)


def row_facts(row, facts) -> list[str]:
    """The FIELD=VALUE facts of one CSV row (a dict of its columns)."""
    out = []
    if "overlap" in facts and any(
            (row["model"], row["system"], row["precision"]) == (m, s, p)
            and (g is None or row["num_gpus"] == g) for m, s, p, g in A2A_OVERLAP):
        out.append("ep_overlap=1")
    if "attn" in facts and row["model"] in SLIDING_WINDOW_MODELS:
        out.append(f"attn_tile={ATTN_TILE}")
    if "layout" in facts and row["model"] == "deepseek-v3":
        lay = (DSV3_H100_LAYOUT if row["system"] == "h100-sxm-80gb"
               else DSV3_LAYOUT.get((row["pp"], row["vp"])))
        if lay:
            out += [f"pp_first_layers={lay[0]}", f"pp_last_layers={lay[1]}"]
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--facts", default="overlap,layout,attn")
    args = p.parse_args(argv)
    facts = set(args.facts.split(","))
    rows = list(csv.reader(CSV.open(newline="")))
    # the shipped CSV carries a `set` column already: rewrite it (same result when rerun)
    keep = [i for i, c in enumerate(rows[0]) if c != "set"]
    header = [rows[0][i] for i in keep] + ["set"]
    n = 0
    for r in rows[1:]:
        f = row_facts(dict(zip(rows[0], r)), facts)
        r[:] = [r[i] for i in keep] + [";".join(f)]
        n += bool(f)
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows([header] + rows[1:])
    Path(args.out).write_text(buf.getvalue())
    print(f"{n} of {len(rows) - 1} rows with facts -> {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
