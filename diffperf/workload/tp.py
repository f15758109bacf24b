"""Megatron 1D tensor parallelism: collectives per layer and per micro-batch.

Source: Shoeybi et al. 2019 (Megatron-LM, Section 3); Korthikanti et al. 2022 Section 4.2.2
(sequence parallelism); PAPERS.md section 5.3.
"""

from __future__ import annotations

import jax.numpy as jnp

from diffperf.workload.flops import tokens_per_device
from diffperf.workload.recompute import full_frac, op_sac_frac


def tp_message_bytes(model, parallel, training):
    """S = b (s / c) h q_a: the activation each TP collective moves (NCCL convention)."""
    return tokens_per_device(model, parallel) * model.hidden * training.activation_bytes


def tp_collectives_per_layer(parallel):
    """(forward, backward) count of all-reduce equivalents per layer per micro-batch:

        forward 2, backward 2 + 2 phi_full + phi_sac
    phi_full: the share of the layers under full recompute (their recomputed forward's
    collectives, `workload.recompute.full_frac`). phi_sac = 1 under TorchTitan's per-op SAC:
    the recompute re-runs the all-gather of each sequence-parallel input (attention and MLP:
    two all-gathers, one all-reduce equivalent; the reduce-scatters are in its save list;
    without SP the output all-reduce of the recomputed wo). With sequence parallelism each
    all-reduce is a reduce-scatter + all-gather pair of the same ring cost (PAPERS.md
    section 5.3). Megatron's selective recompute adds none with its default ["core_attn"];
    with "mlp" in its recompute_modules the dense layers' MLP pair is re-run, one more
    backward all-reduce equivalent per dense layer (added in predict._layer_parts, which
    knows the model's share of dense layers).
    """
    return 2.0, 2.0 + 2.0 * full_frac(parallel) + op_sac_frac(parallel)


def tp_calls_per_all_reduce(parallel):
    """NCCL calls per all-reduce equivalent: 1, or 2 with sequence parallelism (the
    reduce-scatter and the all-gather that replace it are separate calls, each with its
    launch, its fixed cost and its barrier of the t ranks; Korthikanti et al. 2022 4.2.2).
    Not counted: Megatron's backward under SP all-gathers the column-parallel input once
    more for the weight gradient (PAPERS.md section 5.3), one more call and half an
    all-reduce of volume per such linear."""
    return 1.0 + (parallel.sequence_parallel > 0)


def tp_ub_message_bytes(model, parallel, training):
    """(S_ag,f, S_ag,b, S_rs): the gathered sizes of one TP block's all-gathers and the
    un-scattered size of its reduce-scatters as Transformer Engine's userbuffers moves them
    (Parallel.tp_userbuffers; NCCL's size convention, as `tp_message_bytes`):

        S_ag,f = T h q_f     (the norm output gathered for the column-parallel GEMM; also the
                              input re-gathered for its weight gradient in the backward)
        S_ag,b = T h q_b     (the output gradient gathered for the row-parallel dgrad GEMM)
        S_rs   = T h q_a     (the row-parallel GEMM's partial output, the column-parallel
                              dgrad GEMM's partial input gradient)
        q_f = f q_l + (1 - f) q_a   where the forward GEMMs run in low precision (lowp_fprop),
        q_b = the same with lowp_dgrad, q_a otherwise;  q_l = lowp_bytes (the quantized data
        only), f = lowp_layer_frac
    T = b s / c tokens (`workload.flops.tokens_per_device`). Why: TE registers the all-gather
    userbuffers (qkv_fprop, fc1_fprop, proj_dgrad, fc2_dgrad, qkv_dgrad, fc1_dgrad) as uint8
    when the run quantizes (`initialize_ub`, pytorch/module/base.py: `fp8_buf = name in
    layers_all_gather_overlap`, buffer dtype uint8 under UserBufferQuantizationMode.FP8) and
    copies the quantized data into them before the exchange (`fill_userbuffers_buffer_for_
    all_gather`: `comm.copy_into_buffer(local_data)`, FP8 data or one MXFP8 data tensor;
    block scales do not go through the buffer, `tp_ub_scale_bytes`); the reduce-scatter
    buffers (proj_fprop, fc2_fprop, qkv_wgrad, fc1_wgrad) stay in the activation dtype (BF16),
    Megatron-Bridge's FP8 configurations leaving fp8_buf False (comm_overlap.py). TE v2.7 to
    v2.16 [S].
    Example: T = 4096, h = 16384, FP8 or MXFP8 (q_l = 1), q_a = 2: S_ag = 67.1 MB, S_rs =
    134.2 MB.
    """
    T = tokens_per_device(model, parallel)
    ql = training.lowp_bytes
    f = training.lowp_layer_frac
    qa = training.activation_bytes

    def q(on):
        return jnp.where(on > 0, f * ql + (1.0 - f) * qa, qa)

    th = T * model.hidden
    return th * q(training.lowp_fprop), th * q(training.lowp_dgrad), th * qa


def tp_ub_scale_bytes(model, parallel, training):
    """Gathered bytes of the block scales of one block-scaled tensor that TE's userbuffers
    all-gathers (one quantized layer):

        S_sc = T h s / B      (B = lowp_block > 0);   0 for per-tensor scaling (B = 0)
    s = lowp_scale_bytes, T = b s / c tokens. Why: userbuffers carries only the quantized data;
    `fill_userbuffers_buffer_for_all_gather` (pytorch/module/base.py, TE v2.7 to v2.16) gathers
    an MXFP8 tensor's scale-inverses with a separate, blocking NCCL all-gather
    (`torch.distributed.all_gather_into_tensor(global_scale_inv, local_scale_inv,
    group=process_group)`) before the userbuffers exchange starts; an FP8 tensor's one
    scale-inverse is not gathered [S].
    Example: T = 4096, h = 16384, MXFP8 (s = 1, B = 32): 2,097,152 B.
    """
    T = tokens_per_device(model, parallel)
    block = training.lowp_block
    return jnp.where(block > 0, T * model.hidden * training.lowp_scale_bytes
                     / jnp.maximum(block, 1.0), 0.0)


def tp_ub_reduce_bytes(model, parallel, training, s_rs=None):
    """HBM bytes of the reduction kernel that ends one ring-exchange reduce-scatter of TE's
    userbuffers (per row-parallel forward GEMM):

        B = (t + 1) S_rs / t
    it reads the t partial chunks of S_rs / t (its own and the t - 1 received) and writes the
    reduced one (TE `CommOverlapP2PBase::split_overlap_rs`, common/comm_gemm_overlap/
    comm_gemm_overlap.cpp v2.7-v2.16: `reduce_bf16(..., _tp_size, ...)` on the main stream
    after every chunk has arrived) [S]; 0 for t = 1. `s_rs`: S_rs where the caller has it
    (`tp_ub_message_bytes`' third value), computed here otherwise.
    Example: t = 8, S_rs = 134.2 MB: 151.0 MB.
    """
    if s_rs is None:
        s_rs = tp_ub_message_bytes(model, parallel, training)[2]
    t = parallel.tp
    return jnp.where(t > 1, (t + 1.0) * s_rs / jnp.maximum(t, 1.0), 0.0)
