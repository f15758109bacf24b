"""Write data/published_fsdp.csv and data/published_fsdp_fp8.csv from the published tables
(see data/published_fsdp.md for every source, commit and ambiguity). Run from the repository root:

    python calibration/make_published_fsdp.py

step_time_s = global_batch x seq_len / (tokens/s/GPU x num_gpus): each table gives tokens per
second per GPU (TorchTitan: "WPS" / "TPS/GPU"; fms-fsdp: "tokens/sec/GPU"), i.e. the job's
tokens per second divided by its GPUs, and global_batch = local batch x data-parallel ranks.
"""

import csv
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent / "data"
COLUMNS = ["id", "source", "system", "num_gpus", "gpus_per_node", "model", "num_layers",
           "hidden", "ffn_hidden", "num_heads", "num_kv_heads", "vocab", "seq_len", "gated_mlp",
           "moe_experts", "moe_topk", "tp", "pp", "dp", "cp", "ep", "vp", "sequence_parallel",
           "zero_stage", "zero_shard", "recompute", "global_batch", "micro_batch", "precision", "step_time_s",
           "tokens_per_s_per_gpu", "torch_compile", "fields_exact", "set", "notes"]
# Framework facts per row (the CSV's `set` column, diffperf.load.RUN_FACTS):
#   FSDP (both): checkpoint inside the FSDP unit, so the backward's one all-gather serves the
#     recomputed forward (zero3_regather=0); no vocabulary padding (vocab_pad_to=0); PyTorch's
#     F.cross_entropy (loss_bytes_per_logit=40, Training docs).
#   FSDP's root unit (both; Parallel.zero3_root_unit=1, schedule.overlap.zero3_root_unit_s):
#     the blocks are wrapped one by one and the model itself last, so the embedding, final
#     norm and output form the root unit, gathered before the embedding lookup and
#     reduce-scattered after the embedding's gradient, nothing left to hide behind: TorchTitan
#     parallelize_llama.apply_fsdp (fully_shard per TransformerBlock, then fully_shard(model))
#     at 1ea476e9f, 3faaa1a, 9dec370 and 820504e; fms-fsdp main_training.py FSDP(model,
#     auto_wrap_policy=transformer_auto_wrap_policy({LLaMABlock})) (fms_fsdp/policies/
#     wrapping.py).
#   TorchTitan FSDP2: MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=float32)
#     (torchtitan config_manager.py --training.mixed_precision_reduce, default and only choice
#     "float32"; parallelize_llama.apply_fsdp): the gradient reduce-scatter moves fp32,
#     grad_bytes=4, the all-gather bf16 (weight_bytes=2 of the bf16 preset); FSDP2 copies each
#     gathered parameter out of the all-gather buffer (zero3_copy_out=1, workload.dp).
#   fms-fsdp FSDP1: MixedPrecision(param_dtype=reduce_dtype=bf16) (fms_fsdp/policies/
#     mixed_precision.py bfSixteen): grad_bytes=2 (the preset's).
#   Activation checkpointing beyond diffperf's none / selective / full (workload.recompute):
#     TorchTitan "selective op" AC = recompute_policy=1 (parallelize_llama.py `_save_list`: saves
#     every 2nd mm and SDPA, recomputes the rest), with Float8 linears the same policy 1:
#     torchao's Float8Linear (eab345c, the benchmark's pin) calls torch.mm on Float8Tensor
#     operands, and SAC's _CachingTorchDispatchMode (a TorchDispatchMode: modes run before a
#     subclass's __torch_dispatch__) sees aten.mm.default, counts it and tags what the
#     subclass then runs (torch._scaled_mm, bf16 output) MUST_SAVE on the odd calls
#     (docs/accuracy-hopper.md "Session 14: low-precision activations in memory");
#     fms-fsdp "Selective AC" checkpoints a fraction p of the blocks (fms_fsdp/policies/
#     ac_handler.py): recompute_layer_frac=p, p from the README's own HFU / MFU table (the
#     PyTorch FLOP counter counts the recomputed forward, 1/3 of the step's model FLOPs per
#     checkpointed block: HFU / MFU = 1 + p / 3, p = 3 (HFU / MFU - 1), at most 1; the 7B
#     row without AC has HFU = MFU, so the two counts agree without recompute).
#   Eager element-wise kernels (workload.flops.eager_pointwise_bytes): TorchTitan without
#     torch.compile runs the Meta Llama reference's fp32 complex rotary, repeat_kv copies and
#     SiLU apart (llama_eager_pointwise=1), and with norm_type "rmsnorm" (train_configs
#     llama3_8b.toml at 9dec370, llama3_70b.toml at 1ea476e9f, llama_70b.toml at 395a526) an
#     eager fp32 RMSNorm (norm_extra_bytes=32); "fused_rmsnorm" (llama3_8b.toml at 1ea476e9f,
#     llama_13b.toml at 395a526) is one Triton kernel (0). torch.compile fuses them (both 0).
#   Attention kernel (Training.attention_fa2, costs.compute.attention_kernel_factor): every row
#     below but the 405B one ran FlashAttention-2 (PyTorch SDPA's flash backend; on Hopper FA2
#     plateaus near a third of the peak, the H100 set's curve is cuDNN's):
#     - fms-fsdp: README @3b1ce15 "SDPA implementation of Flash attention v2";
#     - TorchTitan A100 (2024-04): torch of April 2024, cuDNN SDPA only behind the
#       TORCH_CUDNN_SDPA_ENABLED=1 opt-in (pytorch PR 125343, which removed it, landed later
#       and was reverted, PR 128539); on A100 FA2 is the set's own kernel (no change);
#     - TorchTitan H100 2024-12 (torch 1963fc8, torchtitan 9dec370: plain F.scaled_dot_product_
#       attention): pytorch PR 138522 (2024-10-22, cherry-picked to 2.5.1) put cuDNN last in
#       the SDPA priority ("Make CuDNN Attention Opt in"); pytorch issue 142132 (nightly
#       2.6.0.dev20241204, H100): SDPA ran at 329 TFLOP/s, cuDNN 631 ("This is expected");
#       the CP rows: torchtitan utils.get_train_context at 9dec370 forces
#       sdpa_kernel([FLASH_ATTENTION, EFFICIENT_ATTENTION]) under context parallelism;
#     - TorchTitan asyncTP 2025-06 (820504e): models/attention.py ScaledDotProductAttention
#       sets sdpa_kernel([FLASH, EFFICIENT, MATH], set_priority=True), cuDNN first only on
#       compute capability 10.0 (B200).
#     405B (2024-08, torchtitan 3faaa1a, torch version not stated): between the revert of
#     June 2024 and PR 138522 the nightlies tried cuDNN first on H100 (PyTorch 2.5 release
#     notes; torchtune issue 1652, 2024-09-22, nightly on H100 runs cuDNN SDPA); the date of
#     that re-land was not found: no fact, the set's (cuDNN) curve.
FA2 = "attention_fa2=1"
FSDP_FACTS = "zero3_regather=0;vocab_pad_to=0;loss_bytes_per_logit=40;zero3_root_unit=1"
TITAN_FACTS = FSDP_FACTS + ";grad_bytes=4;zero3_copy_out=1"
OP_SAC = "recompute_policy=1"
#   torchao Float8 linears (every published_fsdp_fp8 row): no quantized weight copy held across
#     the step (TE's is_first_microbatch cache): Float8Linear casts the weight inside each
#     forward (torchao eab345c float8_linear.py Float8Linear.forward, cast_weight_to_float8_t),
#     or FSDP2's fsdp_pre_all_gather casts the local shard before the all-gather
#     (fsdp_utils.py WeightWithDynamicFloat8CastTensor); either copy is freed with the layer:
#     lowp_weight_cache=0 (memory.weights.lowp_weight_cache_bytes).
TORCHAO = "lowp_weight_cache=0"
EAGER = "llama_eager_pointwise=1"
#   Compiled rows (torch.compile; TorchTitan 9dec370 / 3faaa1a / 820504e, fms-fsdp with fms
#     83267f4): the rotary of Q and K and the K / V expansion to the query heads stay as
#     fused passes in front of SDPA, an extern kernel that takes a-head K and V (TorchTitan
#     `repeat_kv` then F.scaled_dot_product_attention without enable_gqa; fms
#     `adjusted_qk`, then `expand(...).flatten(1, 2)` when a_kv < a): rope_kv_pass=1
#     (workload.flops.rope_kv_pass_bytes). The eager rows hold them in llama_eager_pointwise.
COMPILED = "rope_kv_pass=1"
EAGER_NORM = EAGER + ";norm_extra_bytes=32"
#   GEMMs beside NCCL on Hopper (Training.gemm_wave_split, schedule.overlap.overlap_sigma):
#     PyTorch's matmuls (and Float8's torch._scaled_mm) call cuBLAS, whose Hopper kernels are
#     persistent, one CTA per SM; beside an FSDP all-gather / reduce-scatter kernel a GEMM
#     runs as two waves (pytorch issue 143988, FSDP on H100, 2024-12-30). The SM carve-out
#     that avoids it (pytorch PR 147966, 2025) is opt-in and none of these runs set it. Every
#     H100 row; A100's cuBLAS kernels are not persistent (no fact).
WAVE_SPLIT = "gemm_wave_split=1"
HOPPER = ("grand-teton-h100", "h100-80gb-800gbps-node")


def fms_p(hfu, mfu):
    """fms-fsdp's fraction of checkpointed blocks from its published HFU and MFU."""
    return round(min(3.0 * (hfu / mfu - 1.0), 1.0), 2)
# Shapes: configs/models/*.yaml (Llama 3) and fms-fsdp fms_fsdp/utils/config_utils.py (Llama 2).
SHAPES = {
    "llama3-8b": (32, 4096, 14336, 32, 8, 128256),
    "llama3-70b": (80, 8192, 28672, 64, 8, 128256),
    "llama3-405b": (126, 16384, 53248, 128, 8, 128256),
    "llama2-7b": (32, 4096, 11008, 32, 32, 32000),
    # TorchTitan's Llama 2 (torchtitan/models/llama/__init__.py at 395a526: 13B dim 5120,
    # 40 layers, 40 heads; 70B dim 8192, 80 layers, 64 heads, 8 KV heads, ffn multiplier 1.3,
    # multiple_of 4096), the 32000-token Llama 2 tokenizer: the same shapes as fms-fsdp's.
    "llama2-13b": (40, 5120, 13824, 40, 40, 32000),
    "llama2-34b": (48, 8192, 22016, 64, 8, 32000),
    "llama2-70b": (80, 8192, 28672, 64, 8, 32000),
}


def row(rid, source, system, model, n, tp, dp, seq, local_batch, recompute, tps, compile_,
        exact, notes, pp=1, cp=1, precision="bf16", zero_shard=0, facts=(), fa2=True):
    L, h, f, a, kv, V = SHAPES[model]
    gb = local_batch * dp
    step = gb * seq / (tps * n)
    return dict(id=rid, source=source, system=system, num_gpus=n, gpus_per_node=8, model=model,
                num_layers=L, hidden=h, ffn_hidden=f, num_heads=a, num_kv_heads=kv, vocab=V,
                seq_len=seq, gated_mlp=1, moe_experts=0, moe_topk=0, tp=tp, pp=pp, dp=dp,
                cp=cp, ep=1, vp=1, sequence_parallel=int(tp > 1), zero_stage=3,
                zero_shard=zero_shard,
                set=";".join([TITAN_FACTS if source.startswith("torchtitan") else FSDP_FACTS,
                              *facts, *((FA2,) if fa2 else ()),
                              *((COMPILED,) if compile_ else ()),
                              *((WAVE_SPLIT,) if system in HOPPER else ())]),
                recompute=recompute, global_batch=gb, micro_batch=local_batch,
                precision=precision, step_time_s=f"{step:.6g}", tokens_per_s_per_gpu=tps,
                torch_compile=int(compile_), fields_exact=int(exact), notes=notes)


TT_A100_L2 = ("TorchTitan docs/performance.md @395a52627 (2024-04-18, unchanged at 1ea476e9f), "
              "Llama 2 table, 64 A100 80GB, FSDP2")
TT_A100 = "TorchTitan docs/performance.md @1ea476e9f (2024-04-24), Llama 3 table, 64 A100 80GB, FSDP2"
TT_H100 = ("TorchTitan docs/performance.md @d4c86e375 (2025-01-30) = benchmarks/"
           "llama3_h100_202412_torchtitan.md, Grand Teton H100 96GB HBM2e 500 W, torch 1963fc8")
TT_405 = "TorchTitan docs/performance.md @3faaa1a0d (2024-08-23), Llama 3.1 405B on 128 H100 (94GB)"
TT_ATP = ("TorchTitan benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md @820504e "
          "(2025-06-13), Grand Teton H100, vanilla TP (async TP off)")
FMS = "fms-fsdp README.md @5a296af (2025-07-10; table since 3b1ce15, 2024-05-09), FSDP1 bf16"

bf16 = [
    row("tt-a100-l3-8b-sac-layer", "torchtitan-a100", "a100-sxm-80gb", "llama3-8b", 64, 1, 64,
        8192, 1, "full", 2904, False, False,
        f"{TT_A100}; selective LAYER AC (every k-th block fully checkpointed); k not stated: "
        "read as config_manager.py's default selective_ac_option '2' ('checkpoint every "
        "other layer'), recompute_layer_frac=0.5; fused_rmsnorm; MFU 56.8 %",
        facts=("recompute_layer_frac=0.5", EAGER)),
    row("tt-a100-l3-8b-sac-op", "torchtitan-a100", "a100-sxm-80gb", "llama3-8b", 64, 1, 64,
        8192, 1, "selective", 2973, False, True,
        f"{TT_A100}; selective OP AC (saves mm outputs except every 2nd mm, and SDPA: "
        "recompute_policy=1); fused_rmsnorm; MFU 58.2 %", facts=(OP_SAC, EAGER)),
    row("tt-a100-l3-70b-full", "torchtitan-a100", "a100-sxm-80gb", "llama3-70b", 64, 1, 64,
        8192, 1, "full", 331, False, True, f"{TT_A100}; full AC; eager rmsnorm; MFU 51.7 %",
        facts=(EAGER_NORM,)),
    row("tt-a100-l2-13b-none", "torchtitan-a100", "a100-sxm-80gb", "llama2-13b", 64, 1, 64,
        4096, 2, "none", 2162, False, True,
        f"{TT_A100_L2}; no AC; train_configs/llama_13b.toml @395a526: fused_rmsnorm, "
        "compile false; MFU 61.1 %", facts=(EAGER,)),
    row("tt-a100-l2-13b-sac-op", "torchtitan-a100", "a100-sxm-80gb", "llama2-13b", 64, 1, 64,
        4096, 2, "selective", 1904, False, True,
        f"{TT_A100_L2}; selective op AC (recompute_policy=1); fused_rmsnorm; MFU 53.8 %",
        facts=(OP_SAC, EAGER)),
    row("tt-a100-l2-70b-sac-op", "torchtitan-a100", "a100-sxm-80gb", "llama2-70b", 64, 1, 64,
        4096, 1, "selective", 355, False, True,
        f"{TT_A100_L2}; local batch 1, selective op AC (recompute_policy=1); "
        "train_configs/llama_70b.toml @395a526: rmsnorm (eager), compile false; MFU 50.8 %",
        facts=(OP_SAC, EAGER_NORM)),
    row("tt-a100-l2-70b-full", "torchtitan-a100", "a100-sxm-80gb", "llama2-70b", 64, 1, 64,
        4096, 2, "full", 353, False, True,
        f"{TT_A100_L2}; local batch 2, full AC; eager rmsnorm; MFU 50.5 %",
        facts=(EAGER_NORM,)),
    row("tt-h100-l3-8b-n8-eager", "torchtitan-h100", "grand-teton-h100", "llama3-8b", 8, 1, 8,
        8192, 2, "selective", 5762, False, True,
        f"{TT_H100}; Table 1; selective op AC (train_configs default; recompute_policy=1), "
        "eager rmsnorm", facts=(OP_SAC, EAGER_NORM)),
    row("tt-h100-l3-8b-n8-compile", "torchtitan-h100", "grand-teton-h100", "llama3-8b", 8, 1,
        8, 8192, 2, "selective", 6667, True, True,
        f"{TT_H100}; Table 1; selective op AC (recompute_policy=1)", facts=(OP_SAC,)),
    row("tt-h100-l3-8b-n128-eager", "torchtitan-h100", "grand-teton-h100", "llama3-8b", 128,
        1, 128, 8192, 2, "selective", 5605, False, True,
        f"{TT_H100}; Table 3; selective op AC (recompute_policy=1), eager rmsnorm",
        facts=(OP_SAC, EAGER_NORM)),
    row("tt-h100-l3-8b-n128-compile", "torchtitan-h100", "grand-teton-h100", "llama3-8b", 128,
        1, 128, 8192, 2, "selective", 6514, True, True,
        f"{TT_H100}; Table 3; selective op AC (recompute_policy=1)", facts=(OP_SAC,)),
    row("tt-h100-l31-405b-n128-tp8", "torchtitan-h100", "grand-teton-h100", "llama3-405b",
        128, 8, 16, 8192, 2, "full", 109, True, True,
        f"{TT_405}; FSDP 16 x TP 8 (sequence parallel), full AC, compile=true in "
        "train_configs/llama3_405b.toml; MFU 29.0 % of the SXM peak; attention kernel not "
        "determined (torch nightly of August 2024 not stated)", fa2=False),
    row("tt-h100-l3-70b-n256-tp8", "torchtitan-h100", "grand-teton-h100", "llama3-70b", 256,
        8, 32, 8192, 16, "full", 597.3, True, True,
        f"{TT_ATP}; FSDP 32 x TP 8, full AC, local batch 16"),
    row("tt-h100-l3-8b-n64-tp8", "torchtitan-h100", "grand-teton-h100", "llama3-8b", 64, 8, 8,
        8192, 12, "selective", 4378, True, True,
        f"{TT_ATP}; FSDP 8 x TP 8, per-op SAC (recompute_policy=1), local batch 12",
        facts=(OP_SAC,)),
    row("fms-a100-l2-7b-hsdp", "fms-fsdp-a100", "a100-80gb-400gbps-node", "llama2-7b", 128, 1,
        128, 4096, 2, "none", 4550, True, True,
        f"{FMS}; HSDP (shard in the node of 8, replicate across 16 nodes: zero_shard=8), no AC;"
        " MFU 0.68", zero_shard=8),
    row("fms-a100-l2-13b", "fms-fsdp-a100", "a100-80gb-400gbps-node", "llama2-13b", 128, 1, 128,
        4096, 2, "full", 2150, True, False,
        f"{FMS}; FSDP, 'Selective AC' = a fraction p of blocks checkpointed, p not stated; "
        "HFU/MFU 0.69/0.61: p = 3 (HFU/MFU - 1) = 0.39", facts=(
            f"recompute_layer_frac={fms_p(0.69, 0.61)}",)),
    row("fms-a100-l2-34b", "fms-fsdp-a100", "a100-80gb-400gbps-node", "llama2-34b", 128, 1, 128,
        4096, 2, "full", 820, True, False,
        f"{FMS}; FSDP, selective AC, p not stated; HFU/MFU 0.74/0.55: p = 1 (every block)",
        facts=(f"recompute_layer_frac={fms_p(0.74, 0.55)}",)),
    row("fms-a100-l2-70b", "fms-fsdp-a100", "a100-80gb-400gbps-node", "llama2-70b", 128, 1, 128,
        4096, 2, "full", 410, True, False,
        f"{FMS}; FSDP, selective AC, p not stated; HFU/MFU 0.74/0.55: p = 1 (every block)",
        facts=(f"recompute_layer_frac={fms_p(0.74, 0.55)}",)),
    row("fms-h100-l2-7b-hsdp", "fms-fsdp-h100", "h100-80gb-800gbps-node", "llama2-7b", 96, 1, 96,
        4096, 2, "none", 9600, True, True,
        f"{FMS}; HSDP (zero_shard=8, 12 nodes), no AC; MFU 0.46", zero_shard=8),
    row("fms-h100-l2-13b", "fms-fsdp-h100", "h100-80gb-800gbps-node", "llama2-13b", 96, 1, 96,
        4096, 2, "full", 4850, True, False,
        f"{FMS}; FSDP, selective AC, p not stated; HFU/MFU 0.46/0.43: p = 0.21",
        facts=(f"recompute_layer_frac={fms_p(0.46, 0.43)}",)),
    row("fms-h100-l2-34b", "fms-fsdp-h100", "h100-80gb-800gbps-node", "llama2-34b", 96, 1, 96,
        4096, 2, "full", 1830, True, False,
        f"{FMS}; FSDP, selective AC, p not stated; HFU/MFU 0.49/0.38: p = 0.87",
        facts=(f"recompute_layer_frac={fms_p(0.49, 0.38)}",)),
    row("fms-h100-l2-70b", "fms-fsdp-h100", "h100-80gb-800gbps-node", "llama2-70b", 96, 1, 96,
        4096, 2, "full", 890, True, False,
        f"{FMS}; FSDP, selective AC, p not stated; HFU/MFU 0.47/0.38: p = 0.71",
        facts=(f"recompute_layer_frac={fms_p(0.47, 0.38)}",)),
]

FP8 = "fp8-current"  # torchao float8 tensorwise dynamic scaling (SHARED_NAMES: fp8-current)
fp8 = [
    row("tt-h100-l3-8b-n8-fp8", "torchtitan-h100", "grand-teton-h100", "llama3-8b", 8, 1, 8,
        8192, 2, "selective", 8532, True, True, f"{TT_H100}; Table 1; Float8 linears, op SAC "
        "(recompute_policy=1: the SAC policy counts and saves torchao's Float8Tensor mm like "
        "aten.mm)", precision=FP8, facts=(OP_SAC, TORCHAO)),
    row("tt-h100-l3-8b-n128-fp8", "torchtitan-h100", "grand-teton-h100", "llama3-8b", 128, 1,
        128, 8192, 2, "selective", 8380, True, True, f"{TT_H100}; Table 3; Float8 linears, op "
        "SAC (recompute_policy=1: the SAC policy counts and saves torchao's Float8Tensor mm "
        "like aten.mm)", precision=FP8, facts=(OP_SAC, TORCHAO)),
    *[row(f"tt-h100-l3-8b-n8-cp{c}-fp8", "torchtitan-h100", "grand-teton-h100", "llama3-8b", 8,
          1, 8 // c, s, 1, "full", t, True, False,
          f"{TT_H100}; Table 2; FSDP {8 // c} x CP {c}, full AC, Float8; TPS counts each "
          "sequence once (train.py at 9dec370 adds labels.numel() before the CP context "
          "shards the buffers and divides by non_data_parallel_size = cp tp pp)"
          + ("; K/V exchange: --experimental.context_parallel_rotate_method not stated, its "
             "default 'allgather' (config_manager.py at 9dec370): cp_ring=0; CP is PyTorch's "
             "experimental context_parallel() (utils.py create_context_parallel_ctx at "
             "9dec370; torch _attention.py: a-head K/V after repeat_kv, fp32 dK/dV ring and "
             "merges): cp_torch=1" if c > 1 else "; CP 1: no K/V exchange, so neither cp_ring "
             "nor cp_torch is set (validate refuses a CP fact at cp 1)"),
          cp=c, precision=FP8,
          facts=(TORCHAO, *(("cp_ring=0", "cp_torch=1") if c > 1 else ())))
      for c, s, t in ((1, 32768, 3890), (2, 65536, 2540), (4, 131072, 1071),
                      (8, 262144, 548))],
    row("tt-h100-l3-70b-n256-tp8-fp8", "torchtitan-h100", "grand-teton-h100", "llama3-70b", 256,
        8, 32, 8192, 16, "full", 829, True, True, f"{TT_H100}; Table 4; Float8, TP not async",
        precision=FP8, facts=(TORCHAO,)),
]
# Left out: async-TP rows (overlap not modelled), PP rows of 405B (FSDP x TP x PP x Float8 with
# a schedule diffperf's layout would need vp=... stated only as "interleaved"), TorchTitan's
# Llama 2 13B "selective layer" A100 row (k not stated), 405B Float8 on 128 H100.


def write(path, rows):
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, COLUMNS)
        w.writeheader()
        w.writerows(rows)


if __name__ == "__main__":
    write(HERE / "published_fsdp.csv", bf16)
    write(HERE / "published_fsdp_fp8.csv", fp8)
    print(f"{len(bf16)} bf16 rows, {len(fp8)} fp8 rows")
