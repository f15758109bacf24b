"""Write data/published_longseq.csv from NVIDIA NeMo's published long-sequence tables (see
data/published_longseq.md for the sources, commits and every assumption). Run from the
repository root:

    python calibration/make_published_longseq.py

A held-out check set: no fit reads it (calibration/check_longseq.py predicts it).

Two tables, both FP8 pre-training with context parallelism (CP) at 4K to 1M tokens:

- DGX-H100, Llama 2 7B, NeMo 24.03.01: NeMo's docs/source/performance/performance_summary.md
  at commit 35029a0c (2024-10-08), which prints GBS, MBS, TP, PP, CP, VP, DP, tokens/s/GPU
  and model TFLOP/s/GPU (the same runs as performance_long_sequence.md, which prints the
  layout and TFLOP/s only). step_time_s = GBS x seq / (tokens/s/GPU x GPUs).
- DGX-B200, Llama 3 8B, NeMo 25.04.rc2: performance_long_sequence.md (commits 14d427f5 and
  19fadb67), which prints GBS, TP, (PP,) CP, DP and model TFLOP/s/GPU only. tokens/s/GPU is
  derived with NeMo's own count of model FLOPs at that commit (nemo/utils/flops_formulas.py,
  llama3): F = GBS s L h^2 (12 + 12 g / a + 18 f / h + 12 s / h + 6 V / (L h)) per step, i.e.
  NON-causal attention (12 s / h: the full s x s score matrix, twice what a causal kernel
  does); tokens/s/GPU = TFLOP/s/GPU x 1e12 / (F / (GBS s)).

"K" is 1024 tokens: the H100 rows' printed tokens/s and TFLOP/s agree only with s = 1024 K
(1M row: 318 tokens/s x 1.689e12 FLOP/token = 537 TFLOP/s, printed 536).
"""

import csv
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent / "data"
COLUMNS = ["id", "source", "source_page", "page_commit", "container", "system", "system_page",
           "num_gpus", "gpus_per_node", "model", "model_config", "num_layers", "hidden",
           "ffn_hidden", "num_heads", "num_kv_heads", "vocab", "seq_len", "gated_mlp",
           "moe_experts", "moe_topk", "tp", "pp", "dp", "cp", "ep", "vp", "sequence_parallel",
           "zero_stage", "recompute", "global_batch", "micro_batch", "precision",
           "precision_page", "tokens_per_s_per_gpu", "model_tflops_per_gpu", "throughput_printed",
           "step_time_s", "set", "notes"]
NEMO = "https://github.com/NVIDIA/NeMo/blob/{commit}/docs/source/performance/{page}"
# Architectures: Llama 2 7B from meta-llama/Llama-2-7b-hf config.json (32 layers, hidden 4096,
# intermediate 11008, 32 heads, 32 KV heads, vocab 32000; NeMo's LLM_VOCAB_SIZE_MAP llama2 =
# 32000 too); Llama 3 8B from configs/models/llama3-8b.yaml (its config.json).
SHAPES = {
    "llama2-7b": (32, 4096, 11008, 32, 32, 32000),
    "llama3-8b": (32, 4096, 14336, 32, 8, 128256),
    "llama3-70b": (80, 8192, 28672, 64, 8, 128256),
}


def nemo_flops_per_token(model, seq):
    """NeMo's model FLOPs per token (flops_formulas.llama2 / llama3 at the commits read):
    L h^2 (12 + 12 g / a + 18 f / h + 12 s / h + 6 V / (L h)); non-causal attention."""
    L, h, f, a, g, V = SHAPES[model]
    return L * h * h * (12 + 12 * g / a + 18 * f / h + 12 * seq / h + 6 * V / (L * h))


def row(rid, container, system, system_page, model, seq_k, gbs, tp, pp, cp, dp, tflops,
        tokens, page, commit, notes, mbs=1, precision="fp8-delayed", vp=1, kind="longseq",
        facts=""):
    L, h, f, a, g, V = SHAPES[model]
    seq = seq_k * 1024
    n = tp * pp * cp * dp
    printed = "tokens" if tokens is not None else "tflops"
    if tokens is None:
        tokens = tflops * 1e12 / nemo_flops_per_token(model, seq)
    step = gbs * seq / (tokens * n)
    return dict(id=rid, source=f"nemo-{container}-{kind}", source_page=NEMO.format(
                    commit=commit, page=page), page_commit=commit, container=container,
                system=system, system_page=system_page, num_gpus=n, gpus_per_node=8,
                model=model, model_config=model if model.startswith("llama3") else "",
                num_layers=L, hidden=h, ffn_hidden=f, num_heads=a, num_kv_heads=g, vocab=V,
                seq_len=seq, gated_mlp=1, moe_experts=0, moe_topk=0, tp=tp, pp=pp, dp=dp,
                cp=cp, ep=1, vp=vp, sequence_parallel=int(tp > 1), zero_stage=1,
                recompute="none", global_batch=gbs, micro_batch=mbs, precision=precision,
                precision_page="FP8", tokens_per_s_per_gpu=f"{tokens:.6g}",
                model_tflops_per_gpu=tflops, throughput_printed=printed,
                step_time_s=f"{step:.6g}", set=facts, notes=notes)


# Attention kernel of the DGX-H100 rows (Training.attention_fa2 -> the H100's FlashAttention-2
# rate, costs.compute.attention_kernel_factor; data/published_longseq.md "Attention kernel"):
#   - Transformer Engine v1.2 ... v1.8 (NeMo 24.03: TE 1.3; 24.07: TE 1.8.0.dev0)
#     DotProductAttention.forward, transformer_engine/pytorch/attention.py: both backends on
#     by default (NVTE_FLASH_ATTN / NVTE_FUSED_ATTN default "1"); "Select FusedAttention on sm90
#     and FlashAttention on others for performance" -> cuDNN on H100 unless NVTE_FUSED_ATTN=0,
#     then flash-attn 2 (also under CP: AttnFuncWithCP takes either, TE >= 1.3);
#   - NeMo Framework Launcher, launcher_scripts/conf/config.yaml env_vars at tags 24.01,
#     24.03, 24.03.01, 24.05 and 24.07: `NVTE_FUSED_ATTN: 0 # Disable cudnn FA until we've
#     tested it more` (added 562dcb45, 2024-02-13 "fix TE issue"; removed on the 24.09 branch
#     only, a6490ffe / 04b8d098, 2024-07-31 / 2024-08-29 "enable fused attention"), exported
#     into every job the launcher writes (nemo_launcher/core/stages.py get_env_vars);
#   - the 24.07 rows are the launcher's examples/training/llama/h100/llama3_8b_fp8.sh and
#     llama3_70b_fp8.sh at tag 24.07 (1 / 8 nodes, GBS 128, fp8_hybrid; llama3_8b.yaml TP 1
#     PP 1 CP 2 MBS 1 seq 8192, llama3_70b.yaml TP 4 PP 4 CP 2), whose examples/README.md
#     prints the same table (11879 and 1444 tokens/s/GPU; the page's 12273 / 1524 are
#     re-runs committed 2024-08-26, before the launcher dropped NVTE_FUSED_ATTN=0 on 08-29);
#   - the 24.03.01 long-sequence runs: launcher of that release, same default; the launch
#     configuration of these runs is not published (no Llama 2 long-sequence config in the
#     launcher): the fact is the release's default, not a printed setting of the runs.
# Not on the B200 rows: NeMo 25.04 scripts/performance/utils.py (at 19fadb67) exports
# NVTE_FUSED_ATTN=1 and TE 2.x prefers FusedAttention on Hopper+ (cuDNN).
FA2 = "attention_fa2=1"
H100_COMMIT = "35029a0c84e7c9f2c56e2b2256746654a5084432"
H100_NOTE = ("performance_summary.md long-sequence table (GBS, MBS, TP, PP, CP, VP, DP, "
             "tokens/s/GPU printed); FP8 recipe not printed: TE delayed scaling, NeMo 1.0's "
             "default (fp8_hybrid, amax history); recompute, SP, optimizer not printed; "
             "attention_fa2=1: NeMo Framework Launcher 24.03.01 config.yaml exports "
             "NVTE_FUSED_ATTN=0, so TE 1.3 runs flash-attn 2 (launch config of these runs not "
             "published)")
# (seq K, GBS, TP, PP, CP, DP, tokens/s/GPU, TFLOP/s/GPU); MBS 1 and VP 1 printed in every row.
H100_TABLE = [
    (4, 1024, 1, 1, 1, 4, 16671, 768),
    (8, 512, 1, 2, 1, 4, 13907, 730),
    (16, 256, 2, 1, 1, 8, 10082, 660),
    (32, 128, 2, 1, 2, 8, 6687, 610),
    (64, 64, 4, 1, 2, 8, 4021, 574),
    (128, 32, 4, 1, 4, 8, 2260, 555),
    (256, 16, 4, 1, 8, 8, 1214, 549),
    (512, 8, 8, 1, 16, 4, 635, 549),
    (1024, 4, 8, 1, 32, 4, 318, 536),
]
B200_COMMIT = "19fadb67b09ba94c55094d34df119d6f9c565068"
B200_NOTE = ("performance_long_sequence.md 'With CP' columns (GBS, TP, PP, DP, CP, TFLOP/s/GPU "
             "printed); tokens/s/GPU derived from TFLOP/s with NeMo's llama3 FLOP count "
             "(non-causal attention); GPUs = TP x PP x CP x DP as in commit 14d427f5 (the "
             "later page's '# of GPUs' column repeats SeqLen); MBS not printed (1 assumed: "
             "GBS x seq = 4M tokens = DP ranks x 1 sequence at 1M); FP8 recipe not printed: "
             "delayed scaling, the default of NeMo 25.04's scripts/performance (--fp8_recipe "
             "ds)")
# (seq K, GBS, TP, PP, CP, DP, TFLOP/s/GPU)
B200_TABLE = [
    (8, 512, 1, 1, 1, 2, 1671),
    (16, 256, 1, 1, 1, 4, 1717),
    (32, 128, 1, 1, 2, 4, 1624),
    (64, 64, 1, 1, 4, 4, 1600),
    (128, 32, 2, 1, 4, 4, 1588),
    (256, 16, 4, 1, 4, 4, 1590),
    (512, 8, 4, 1, 8, 4, 1619),
    (1024, 4, 4, 1, 16, 4, 1608),
]

rows = [row(f"nemo-24_03_01-dgx-h100-llama2-7b-fp8-{s}k", "24.03.01", "h100-sxm-80gb",
            "DGX-H100", "llama2-7b", s, gbs, tp, pp, cp, dp, tf, tok, "performance_summary.md",
            H100_COMMIT, H100_NOTE, facts=FA2)
        for s, gbs, tp, pp, cp, dp, tok, tf in H100_TABLE]
rows += [row(f"nemo-25_04_rc2-dgx-b200-llama3-8b-fp8-{s}k", "25.04.rc2", "dgx-b200", "DGX-B200",
             "llama3-8b", s, gbs, tp, pp, cp, dp, tf, None, "performance_long_sequence.md",
             B200_COMMIT, B200_NOTE)
         for s, gbs, tp, pp, cp, dp, tf in B200_TABLE]

# NeMo 24.07 on DGX-H100, the pre-training table of performance_summary.md (FP8), its last
# version (commit 0b8a80ee, 2024-12-11; the 24.07 figures since 8e3d65dc, 2024-09-09): the
# two Llama 3 rows run CP 2 at 8K. Every layout field and tokens/s/GPU printed.
H100_2407_COMMIT = "0b8a80ee066472c96fcb1e317b8aa071277b9aa7"
H100_2407_NOTE = ("performance_summary.md pre-training table, 24.07 (GBS, MBS, seq, TP, PP, "
                  "CP, VP, tokens/s/GPU printed); FP8 recipe not printed: delayed scaling, "
                  "NeMo's default; recompute, SP, optimizer not printed; attention_fa2=1: "
                  "NeMo Framework Launcher 24.07 examples/training/llama/h100 scripts of "
                  "these rows, config.yaml exports NVTE_FUSED_ATTN=0, so TE 1.8 runs "
                  "flash-attn 2")
# TP overlap of the 70B row (Parallel.tp_userbuffers = 2; docs/accuracy-longseq.md "Session 13:
# TP overlap of the 70B row"): NeMo Framework Launcher tag 24.07 examples/training/llama/h100/
# llama3_70b_fp8.sh passes training/tp_overlap@training.model.ub_tp_comm_overlap_cfg=
# ub_cfg_h100_fp8_h8192_tp4_mbs1_seqlen8192 (launcher_scripts/conf/training/tp_overlap/, same
# tag; llama3_70b.yaml: ub_tp_comm_overlap true, sequence_parallel true): qkv_fprop, fc1_fprop,
# proj_dgrad, fc2_dgrad ring_exchange (aggregate 0); proj_fprop, fc2_fprop pipeline (num_sm
# 24 / 16, cga_size 2, num_splits 4, set_sm_margin 1, fp8_buf 1); qkv_dgrad, qkv_wgrad,
# fc1_dgrad, fc1_wgrad bulk (num_sm 4 / 24 / 2 / 4, set_sm_margin 0). TE 1.8 (24.07's
# container) runs pipeline as UbufCommOverlap::split_overlap_rs (pytorch/csrc/
# comm_gemm_overlap.h, gemm_overlap=True): schedule.overlap.tp_pipeline_rs_s. The 8B row has
# TP 1: no TP overlap.
UB_70B = "tp_userbuffers=2"
UB_70B_NOTE = ("; tp_userbuffers=2: NeMo Framework Launcher 24.07 llama3_70b_fp8.sh runs TE 1.8 "
               "userbuffers with ub_cfg_h100_fp8_h8192_tp4_mbs1_seqlen8192 (ring exchange "
               "fprop/dgrad all-gathers, pipelined fprop reduce-scatters with num_splits 4, "
               "num_sm 24/16, set_sm_margin, fp8_buf; bulk backward)")
rows += [row("nemo-24_07-dgx-h100-llama3-8b-fp8-8k", "24.07", "h100-sxm-80gb", "DGX-H100",
             "llama3-8b", 8, 128, 1, 1, 2, 4, 711, 12273, "performance_summary.md",
             H100_2407_COMMIT, H100_2407_NOTE, kind="summary", facts=FA2),
         row("nemo-24_07-dgx-h100-llama3-70b-fp8-8k", "24.07", "h100-sxm-80gb", "DGX-H100",
             "llama3-70b", 8, 128, 4, 4, 2, 2, 734, 1524, "performance_summary.md",
             H100_2407_COMMIT, H100_2407_NOTE + UB_70B_NOTE, vp=5, kind="summary",
             facts=FA2 + ";" + UB_70B)]


def write(path, out):
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, COLUMNS)
        w.writeheader()
        w.writerows(out)


if __name__ == "__main__":
    write(HERE / "published_longseq.csv", rows)
    print(f"{len(rows)} rows -> data/published_longseq.csv")
