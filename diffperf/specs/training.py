"""Numerical precision of training: bytes per weight, gradient, optimizer state, activation."""

from __future__ import annotations

from typing import Any

from flax import struct


class Training(struct.PyTreeNode):
    """Bytes per element of each kind of state, and the run's checkpoint interval (all leaves).

    Mixed precision after Micikevicius et al. 2018 and Rajbhandari et al. 2020 (Section 3.1):
    16-bit weights and gradients, fp32 master weights and Adam moments, K = 12 bytes.
    """

    weight_bytes: Any = 2.0      # q_w: bytes of the weights the matmuls read
    grad_bytes: Any = 2.0        # q_g: bytes per gradient element (4 when accumulated in fp32)
    master_bytes: Any = 4.0      # fp32 master copy (0 when the weights are the master)
    cast_weight_bytes: Any = 0.0  # 16-bit copies of fp32 weights kept for fwd/bwd (autocast)
    grad_buffers_persist: Any = 1.0  # 1: gradient buffers live all step (Megatron contiguous
                                     # buffers); 0: allocated during the backward (set_to_none)
    optimizer_bytes: Any = 8.0   # Adam m and v in fp32
    activation_bytes: Any = 2.0  # q_a: bytes per activation element
    residual_bytes: Any = 2.0    # bytes of the residual stream (4 under autocast: fp32 params
                                 # and fp32 norms promote the residual sum to fp32)
    matmul_fp32: Any = 0.0       # 1: matmuls run at the fp32/TF32 peak instead of 16-bit
    flash_attention: Any = 1.0   # 1: fused attention, no s^2 score storage or traffic
    fused_softmax_max_seq: Any = 0.0  # unfused attention (flash_attention = 0) in Megatron:
                                 # its fused scale-mask-softmax kernel takes key lengths up to
                                 # this (Megatron-DeepSpeed 2023: 2048) and other shapes fall
                                 # back to PyTorch ops (flops.softmax_fallback); 0: no such
                                 # constraint, the softmax is one pass at any shape
    dropout: Any = 0.0           # 1: dropout after attention and MLP (1-byte masks kept),
                                 # on unfused attention's probabilities too; its HBM
                                 # traffic: workload.flops.dropout_bytes
    loss_bytes_per_logit: Any = 52.0  # HBM bytes per logit element of the fp32 cross-entropy,
                                 # forward + backward (Megatron's vocab-parallel CE: 52;
                                 # PyTorch's fused F.cross_entropy: ~40; see flops.head_ops)
    vocab_pad_to: Any = 128.0    # the framework pads the vocabulary to a multiple of this x t
                                 # (Megatron-LM --make-vocab-size-divisible-by, default 128);
                                 # 0: no padding, each rank takes floor(V / t) rows
    norm_extra_bytes: Any = 0.0  # HBM bytes per element that each norm's forward moves beyond
                                 # one fused kernel's read + write (2 q_a): eager fp32 RMSNorm
                                 # as TorchTitan's `RMSNorm` (7 kernels): 32
                                 # (workload.flops.eager_pointwise_bytes)
    llama_eager_pointwise: Any = 0.0  # 1: the Meta Llama reference attention / MLP element-wise
                                 # ops run as separate eager kernels (fp32 complex rotary on Q
                                 # and K, repeat_kv copies of K and V, SiLU and the product
                                 # apart); 0: fused (torch.compile) or not counted
    rope_kv_pass: Any = 0.0      # 1: rotary on Q and K, and with GQA the expansion of K and V
                                 # to the a query heads, run as fused memory-bound passes in
                                 # front of an attention kernel that takes a-head K and V
                                 # (torch.compile'd TorchTitan / fms Llama code: repeat_kv, then
                                 # F.scaled_dot_product_attention without enable_gqa;
                                 # workload.flops.rope_kv_pass_bytes); counted only where
                                 # llama_eager_pointwise = 0 (that term holds the eager forms);
                                 # 0: not counted (the default)
    attention_fa2: Any = 0.0     # 1: the run's fused attention was FlashAttention-2 (PyTorch
                                 # SDPA's flash backend, the flash-attn 2 package), timed at
                                 # the GPU's published FA2 rate (System.attn_fa2_*_frac;
                                 # costs.compute.attention_kernel_factor); 0: the kernel the
                                 # efficiency set's attention curve describes (on Hopper
                                 # cuDNN / FA3-class, data/kernels/h100_attention.csv)
    gemm_wave_split: Any = 0.0   # 1: the run's GEMMs are statically scheduled persistent
                                 # kernels (one CTA per SM: cuBLAS on Hopper) launched with no
                                 # SM carve-out, so a GEMM that runs beside an NCCL kernel
                                 # runs as two waves, twice its time (pytorch issue 143988,
                                 # PR 144974; schedule.overlap.overlap_sigma); 0: the hidden
                                 # communication costs Efficiency.overlap_slowdown only
    attn_tile: Any = 0.0         # B > 0: the fused attention kernel computes the score matrix
                                 # in B x B tiles (every tile that one query of its row block
                                 # sees, whole), and a sliding-window layer and a full layer are
                                 # each timed as its own kernel (workload.flops.attention_by_kind,
                                 # costs.compute.attention_by_kind_time_s); 0: the exact band of
                                 # scores, one kernel for the mean layer (the default)
    moe_eager_clamp_bias: Any = 0.0  # 1: the MoE expert MLP clamps its fc1 output (two clamps
                                 # and a cat) and adds its fc2 bias (per local expert: bias x
                                 # prob, add, then one cat) as separate eager kernels, as
                                 # Megatron-Core 0.15-0.17's TEGroupedMLP does for GPT-OSS
                                 # (workload.flops.moe_eager_clamp_bias_bytes); 0: fused or
                                 # absent (the default)
    moe_quant_pad: Any = 0.0     # 1: the dropless MoE expert MLP copies its routed tokens into
                                 # a buffer padded per local expert to the FP8 / MXFP8 GEMM
                                 # alignment and copies the fc2 output back (Transformer Engine
                                 # Fp8Padding / Fp8Unpadding in Megatron-Core 0.14-0.17's
                                 # TEGroupedMLP; workload.flops.moe_quant_pad_bytes); 0: no
                                 # copy (16-bit GEMMs, token counts already aligned: drop-and-pad
                                 # at capacity, HybridEP, router padding; the default)
    moe_expert_loop: Any = 0.0   # 1: the MoE layer's grouped GEMMs and their quantization run
                                 # one kernel per local expert, as Transformer Engine 2.7-2.16's
                                 # GroupedLinear does (multi_stream_cublas_gemm: one cuBLASLt
                                 # GEMM per expert, round-robin over 4 streams; split_quantize:
                                 # one MXFP8 / FP8-current quantize per expert; FP8 delayed
                                 # scaling's inputs stay one fused kernel): E/ep - 1 more
                                 # launches per grouped GEMM and per quantized tensor
                                 # (workload.flops.moe_expert_loop_kernels); 0: one kernel each
                                 # (a single-launch grouped GEMM; the default)
    moe_host_sync: Any = 0.0     # 1: the MoE layer's forward blocks the host once, before the
                                 # token dispatch (Megatron-Core 0.14-0.17's dropless
                                 # dispatchers: alltoall's d2h_event.synchronize(), DeepEP's and
                                 # HybridEP's wait for the received-token counts), so the
                                 # dispatch and the routed experts form a region the host cannot
                                 # run ahead into (schedule.overlap.host_sync_regions_s); 0: the
                                 # host runs ahead across the layer (drop-and-pad, sync-free
                                 # dispatch, CUDA-graphed layers; the default)
    cp_torch: Any = 0.0          # 1: context parallelism as PyTorch's experimental
                                 # context_parallel() runs it (torch.distributed.tensor.
                                 # experimental._attention, TorchTitan 2024-12): K and V
                                 # exchanged with the a query heads (SDPA after repeat_kv),
                                 # the all-gather hidden behind the first block's SDPA only,
                                 # the fp32 dK / dV passed rank to rank every backward step,
                                 # partial outputs and gradients merged in fp32
                                 # (workload.cp.cp_torch_merge_bytes, predict._cp_parts); 0:
                                 # the forms of Parallel.cp_ring alone (the default)
    checkpoint_interval_s: Any = 0.0  # run choice: training seconds between checkpoints
                                 # (tau); 0: the optimum of Daly (2006), schedule.goodput
    xla_compiled: Any = 0.0      # 1: the whole step is one XLA program (JAX jit): memory is
                                 # what XLA keeps live (memory/xla.py), kernels are fused and
                                 # issued back to back; 0: an eager / Megatron framework
    # Low-precision GEMMs (Transformer Engine recipes; PRECISIONS below, docs/precision.md).
    # All 0 (the default): every GEMM at the 16-bit peak, no quantization work.
    lowp_fprop: Any = 0.0        # 1: the forward GEMM of each linear layer (QKV, proj, MLP,
                                 # experts) runs in the low-precision format
    lowp_dgrad: Any = 0.0        # 1: its data-gradient GEMM (dY W) does
    lowp_wgrad: Any = 0.0        # 1: its weight-gradient GEMM (X^T dY) does
    lowp_fp4: Any = 0.0          # 1: those GEMMs run at the FP4 peak (NVFP4), 0: the FP8 peak
    lowp_bytes: Any = 1.0        # bytes per quantized element (1: FP8, 0.5: FP4)
    lowp_block: Any = 0.0        # elements per scale factor (0: one scale per tensor)
    lowp_scale_bytes: Any = 0.0  # bytes per scale factor (E8M0 / E4M3: 1, fp32: 4)
    lowp_amax_pass: Any = 0.0    # 1: a separate amax read of each 16-bit tensor before its
                                 # cast (current scaling; NVFP4's per-tensor fp32 scale)
    lowp_layer_frac: Any = 1.0   # fraction of the transformer layers whose linears run in low
                                 # precision (NVFP4 keeps some layers in BF16)
    lowp_weight_cache: Any = 1.0  # 1: the quantized weights (row- and column-wise) are cast
                                 # once per step and kept for all micro-batches (TE's
                                 # is_first_microbatch cache: memory); 0: cast per micro-batch
    lowp_param_gather: Any = 0.0  # 1: ZeRO-3 / FSDP parameter all-gathers move the quantized
                                 # weights (Megatron --fp8-param-gather), 0: 16-bit weights
    lowp_te_quantizer: Any = 0.0  # 1: the linears quantize as Transformer Engine 2.7-2.16 under
                                 # Megatron-Core 0.14-0.18 does: a per-tensor FP8 current-
                                 # scaling quantize is 4 kernels (zero amax, amax, scale, cast),
                                 # 3 behind a LayerNormLinear's norm (amax in the norm kernel,
                                 # no amax read); linear_proj's input (and the shared experts'
                                 # fc1, the routed fc2 under "moe_act" recompute) is kept in
                                 # 16 bits and quantized again in the backward (recipes other
                                 # than delayed: set_save_original_input)
                                 # (workload.flops.te_quantize_rows); 0: one cast (+ one amax
                                 # pass) per tensor (the default; e.g. torchao Float8)
    te_cudnn_norm: Any = 0.0      # 1: Transformer Engine's norms run on cuDNN
                                 # (NVTE_NORM_FWD_USE_CUDNN=1): a LayerNormLinear's FP8
                                 # current-scaling input is quantized after the norm like any
                                 # other (4 kernels, amax read: TE normalization.cpp picks
                                 # FUSED_NORM_AMAX_FP8 only without the variable); acts only
                                 # with lowp_te_quantizer = 1 under FP8 current scaling
                                 # (workload.flops.te_quantize_rows); 0: TE's own norm kernel
    te_scale_swizzle: Any = 0.0   # MXFP8 scale-swizzle kernels before Transformer Engine's GEMMs
                                 # (read under lowp_te_quantizer): 1 = TE 2.7 / 2.9, both
                                 # operands of every GEMM (gemm.cpp swizzle_scaling_factors);
                                 # 2 = TE 2.12-2.16, the weights and the tensors gathered under
                                 # sequence parallelism only (the other quantizers write
                                 # GEMM-ready scales, optimize_for_gemm); 0: none counted
                                 # (workload.flops.te_quantize_rows)
    name: str = struct.field(pytree_node=False, default="bf16")


_MEGATRON_MIXED = dict(weight_bytes=2.0, grad_bytes=2.0, master_bytes=4.0, optimizer_bytes=8.0,
                      activation_bytes=2.0, matmul_fp32=0.0)
_LINEARS_LOWP = dict(lowp_fprop=1.0, lowp_dgrad=1.0, lowp_wgrad=1.0)

PRECISIONS = {
    # Megatron-style mixed precision: 16-bit weights and grads, fp32 master + Adam (16 B/param).
    "bf16": dict(weight_bytes=2.0, grad_bytes=2.0, master_bytes=4.0, optimizer_bytes=8.0,
                 activation_bytes=2.0, matmul_fp32=0.0),
    "fp16": dict(weight_bytes=2.0, grad_bytes=2.0, master_bytes=4.0, optimizer_bytes=8.0,
                 activation_bytes=2.0, matmul_fp32=0.0),
    # PyTorch autocast / JAX fp32 params with bf16 matmuls: fp32 weights and grads (16 B/param).
    # The bf16 casts of the weights live from the forward until the backward has used them
    # (PyTorch autocast's weight cache; XLA's converted operands).
    "amp-bf16": dict(weight_bytes=4.0, grad_bytes=4.0, master_bytes=0.0, optimizer_bytes=8.0,
                     activation_bytes=2.0, matmul_fp32=0.0, cast_weight_bytes=2.0,
                     grad_buffers_persist=0.0, residual_bytes=4.0, loss_bytes_per_logit=40.0),
    # One XLA-compiled JAX step with fp32 params and AdamW states and bf16 matmul inputs
    # (data/README.md, H100 JAX section): memory by XLA's live sets (memory/xla.py),
    # where the bf16 casts of the weights are stacked scan residuals, not a separate copy;
    # bf16 residual stream (the carry that jax.checkpoint stacks is 2 B per element in the
    # measured peaks); the cross-entropy fused (14 B per logit, flops.head_ops).
    "xla-amp-bf16": dict(weight_bytes=4.0, grad_bytes=4.0, master_bytes=0.0,
                         optimizer_bytes=8.0, activation_bytes=2.0, matmul_fp32=0.0,
                         cast_weight_bytes=0.0, grad_buffers_persist=0.0, residual_bytes=2.0,
                         loss_bytes_per_logit=14.0, xla_compiled=1.0),
    # Pure bf16 (weights, grads and Adam states in bf16: 8 B/param).
    "bf16-pure": dict(weight_bytes=2.0, grad_bytes=2.0, master_bytes=0.0, optimizer_bytes=4.0,
                      activation_bytes=2.0, matmul_fp32=0.0),
    "fp32": dict(weight_bytes=4.0, grad_bytes=4.0, master_bytes=0.0, optimizer_bytes=8.0,
                 activation_bytes=4.0, matmul_fp32=1.0, grad_buffers_persist=0.0,
                 residual_bytes=4.0),
    # ---- Low precision as Transformer Engine runs it (docs/precision.md has every source).
    # Megatron-style mixed precision underneath (bf16 weights and grads, fp32 master + Adam);
    # the three GEMMs of every linear layer (fprop, dgrad, wgrad) in the low format; attention
    # (softmax(QK^T) V), the output layer, embeddings, norms and the router stay in BF16.
    # TE DelayedScaling: one fp32 scale per tensor from the amax history of earlier steps; the
    # amax of the current tensor is taken inside the cast kernel (no extra pass).
    "fp8-delayed": _MEGATRON_MIXED | _LINEARS_LOWP | dict(
        lowp_bytes=1.0, lowp_block=0.0, lowp_scale_bytes=0.0, lowp_amax_pass=0.0),
    # TE Float8CurrentScaling: the scale of each tensor from its own amax, computed by a
    # separate reduction before the cast (one more read of the 16-bit tensor).
    "fp8-current": _MEGATRON_MIXED | _LINEARS_LOWP | dict(
        lowp_bytes=1.0, lowp_block=0.0, lowp_scale_bytes=0.0, lowp_amax_pass=1.0),
    # TE Float8BlockScaling (DeepSeek-V3 report, Section 3.3.1): 1 x 128 tiles of activations
    # and gradients, 128 x 128 blocks of weights, fp32 scales (4 B per 128 elements counted
    # on every tensor: the weights' 4 B per 16384 is an over-count of < 0.03 B per element).
    "fp8-blockwise": _MEGATRON_MIXED | _LINEARS_LOWP | dict(
        lowp_bytes=1.0, lowp_block=128.0, lowp_scale_bytes=4.0, lowp_amax_pass=0.0),
    # TE MXFP8BlockScaling (OCP MX v1.0): 1 x 32 blocks, E8M0 (1 B) scales; Blackwell.
    "mxfp8": _MEGATRON_MIXED | _LINEARS_LOWP | dict(
        lowp_bytes=1.0, lowp_block=32.0, lowp_scale_bytes=1.0, lowp_amax_pass=0.0),
    # TE NVFP4BlockScaling: E2M1 (0.5 B), 1 x 16 blocks with E4M3 (1 B) scales, plus one fp32
    # scale per tensor from its amax (a separate pass); the GEMMs at the FP4 peak; Blackwell.
    "nvfp4": _MEGATRON_MIXED | _LINEARS_LOWP | dict(
        lowp_bytes=0.5, lowp_block=16.0, lowp_scale_bytes=1.0, lowp_amax_pass=1.0,
        lowp_fp4=1.0),
}

PRECISIONS["fp8"] = PRECISIONS["fp8-current"]  # alias (SHARED_NAMES.md): Megatron-Bridge "FP8-CS"
# Precisions whose GEMMs need FP8 tensor cores (System.matmul_fp8_flops_per_s > 0), and those
# that need Blackwell's block-scaled MMA (MX / NVFP4: System.matmul_fp4_flops_per_s > 0).
NEEDS_FP8 = ("fp8-delayed", "fp8-current", "fp8-blockwise", "mxfp8", "nvfp4", "fp8")
NEEDS_BLOCK_SCALED_MMA = ("mxfp8", "nvfp4")
