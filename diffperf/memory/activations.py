"""Activation memory per layer and per stage (Korthikanti et al. 2022, Section 4, Table 2).

PAPERS.md section 5.6: per layer per micro-batch, 16-bit activations, 1-byte dropout masks,
  no parallelism        s b h (34 + 5 a s / h)
  TP                    s b h (10 + 24/t + 5 a s / (h t))
  TP + SP               s b h (34/t + 5 a s / (h t))
  + selective recompute drops the 5 a s / h term;   full recompute keeps 2 s b h.
Generalised per stored tensor [D]: replicated 2 q_r + 2 q_a + 2 dropout (in s b h; q_r the
residual stream's bytes, the inputs of the two norms), TP-sharded
q_a (1 + 2 a_kv/a + 1 + (2 + gated) f / h), scores a s^2 b (q_a + dropout (1 + q_a)) / t.
"""

from __future__ import annotations

import functools

import jax.numpy as jnp

from diffperf.workload.cp import cp_kv_bytes, cp_torch_elements
from diffperf.workload.flops import (head_shards, is_mla, layer_ops, moe_layer_fraction,
                                     qk_norm_forms, quantized_elem_bytes, score_elements,
                                     shared_expert_width, softmax_fallback,
                                     softmax_fallback_costs, tokens_per_device, v_dim,
                                     vocab_rows_per_rank)
from diffperf.workload.params import active_ffn_width, residual_shards
from diffperf.workload.recompute import (full_frac, megatron_module_fracs,
                                         megatron_selective_frac, none_frac, op_sac_frac,
                                         sac_recompute_fracs, separate_norms)


def layer_activation_parts(model, parallel, training):
    """(bytes one layer keeps for its backward, bytes it rebuilds while its backward runs
    under full recompute, per-op SAC or Megatron's recompute_modules), one micro-batch, on
    one device:

        A = s b h [ (2 q_r + 2 q_a + 2 m_d) / t_sp + q_a (2 + 2 a_kv/a + (2 + g) f/h) / t ]
            (Q, K, V, O in general: s b q_a ((a + a_kv) d_qk + (a_kv + a) d_v) / t; MLA adds
             s b q_a 2 (r_q + r_kv + d_R), its latents and their normed copies)
            + b a (s/c) s (q_a + m_d (1 + q_a)) / t     (scores: no flash, no recompute)
            + 4 b a (s/c) s / t x fallback              (fp32 softmax output of Megatron's
                                                         unfused softmax, `softmax_fallback`;
                                                         16-bit activations)
            + 4 b a (s/c) / t                          (flash softmax statistics, fp32)
            + `qk_norm_saved_bytes`                    (QK-norm inputs and rstd)
    s here is the device's sequence shard s/c; t_sp = t with SP, else 1; m_d = dropout.
    Full recompute keeps only the layer input: q_r s b h / t_sp.
    AxoNN grid (PAPERS.md section 4.2): t = G_y (heads and FFN width) and t_sp = G_x (the
    residual stream's width is split over X) [D].
    Example (GPT-3 175B, s 2048, b 1, t 1, q_a 2, dropout, no flash): s b h (34 + 5 a s/h).
    """
    t, q, md = head_shards(parallel), training.activation_bytes, training.dropout
    sbh = tokens_per_device(model, parallel) * model.hidden
    t_sp = residual_shards(parallel)
    a, akv = model.n_heads, model.n_kv_heads
    ffn = active_ffn_width(model)  # f, or the routed width k C_f f_e (+ shared) of MoE
    replicated = sbh * (2.0 * training.residual_bytes + 2.0 * q + 2.0 * md) / t_sp
    T = tokens_per_device(model, parallel)
    # Q, K, V and the attention output: (a + a_kv) d_qk + (a_kv + a) d_v (= 2 h + 2 a_kv/a h
    # when d_h = h / a)
    qkvo = (a + akv) * model.head_dim + (akv + a) * v_dim(model)
    # MLA keeps both latents and their normed copies (inputs of the up-projections),
    # replicated over TP like the down projections that make them (DeepSeek-V2 eqs. (9)-(14))
    latents = is_mla(model) * 2.0 * (model.q_lora_rank + model.kv_lora_rank
                                     + model.qk_rope_head_dim)
    sharded = T * q * (qkvo + (2.0 + model.gated_mlp) * ffn) / t + T * q * latents
    scores = score_elements(model, parallel) * (
        (1.0 - training.flash_attention) * (q + md * (1.0 + q))
        + softmax_fallback(model, parallel, training) * softmax_fallback_costs(training)[2])
    stats = training.flash_attention * 4.0 * parallel.micro_batch * a * model.seq_len / (
        parallel.cp * t)
    full = training.residual_bytes * sbh / t_sp
    whole = (replicated + sharded + stats  # + scores, which recompute (1, 2) does not keep
             + qk_norm_saved_bytes(model, parallel, training)
             - lowp_saved_input_saving(model, parallel, training))
    sac = op_sac_kept_bytes(model, parallel, training)
    # The mean layer (workload.recompute): a share phi_full of the layers checkpointed whole,
    # the rest keeping everything; Megatron's selective or TorchTitan's per-op SAC.
    # Megatron's selective recompute keeps the scores unless core_attn re-runs them, less
    # what its other recompute_modules discard (megatron_dropped_bytes).
    sel = megatron_selective_frac(parallel)
    dropped = megatron_dropped_bytes(model, parallel, training)
    kept = (full_frac(parallel) * full
            + sel * (whole + (1.0 - parallel.recompute_core_attn) * scores)
            - dropped
            + op_sac_frac(parallel) * sac + none_frac(parallel) * (whole + scores))
    # What the layer in its backward holds again: the whole layer under full recompute, the
    # SAC-recomputed tensors, and the outputs Megatron's recompute_modules rebuild before
    # their consumer's backward (megatron_dropped_bytes; Megatron-Core
    # CheckpointWithoutOutput.discard_output_and_register_recompute refills them in place).
    rebuilt = (jnp.where(parallel.recompute == 2, whole + scores, 0.0)
               + op_sac_frac(parallel) * jnp.maximum(whole - sac, 0.0)
               + dropped)
    return kept, rebuilt


def qk_norm_saved_bytes(model, parallel, training):
    """Bytes a layer's QK-norm keeps for its backward (one micro-batch, one device; 0 without
    Model.qk_norm): the inputs of the two RMSNorms and their fp32 reciprocal RMS per row,

        A = [qk] T [ q_a (a + a_kv) d_qk / t + 4 R ]
        R = (a + a_kv) / t rows per token per head (per-head form), 2 (whole projection)
    beside the normed (and rotated) Q and K the attention keeps (`layer_activation_parts`).
    Transformer Engine's RMSNorm saves its (contiguous) input and rstdevs
    (`ctx.save_for_backward(x, rstdevs)`, TE v2.7 / v2.12 pytorch/ops/basic/rmsnorm.py
    `op_forward`), the module Megatron-Core's TENorm builds for q_layernorm / k_layernorm.
    Megatron's selective recompute does not re-run it: recompute_modules "layernorm" is the
    input_layernorm and pre_mlp_layernorm, "core_attn" the attention core after the norms
    (core_v0.14.0 / core_v0.16.0 transformer_config.py `recompute_modules`), so it is kept
    under every mode but full recompute (which keeps the layer input alone) [S].
    Example (Qwen3 30B-A3B, b 1, s 4096, t 1, bf16): 4096 x (2 x 36 x 128 + 4 x 36)
    = 38.3e6 B per layer.
    """
    on, _, whole = qk_norm_forms(model)
    t = head_shards(parallel)
    T = tokens_per_device(model, parallel)
    heads = model.n_heads + model.n_kv_heads
    rows = (1.0 - whole) * heads / t + whole * 2.0
    return on * T * (training.activation_bytes * heads * model.head_dim / t + 4.0 * rows)


def megatron_dropped_bytes(model, parallel, training):
    """Bytes of one layer's activations that Megatron's selective recompute modules
    (`workload.recompute.megatron_module_fracs`) no longer keep for the backward, one
    micro-batch, on one device (the terms of `layer_activation_parts` that each module's
    checkpoint discards):

        mlp:            (1 - phi) [ T f ((1 + g) q_a + r) / t + r T_sp h ]
                        (fc1 output, activation output, and the fused pre-MLP norm's output
                         inside TE's LayerNormMLP / LayerNormLinear)
        moe_act:        phi r T k C_f f_e / t          (the activation output, fc2's input)
        shared_experts: phi T E_s f_s ((1 + g) q_a + r) / t
        layernorm:      n_norm r T_sp h                (`separate_norms`' outputs)
        mla_up_proj:    mla q_a T [ (2 a d_qk + a d_v) / t + r_q + r_kv ]
                        (Q, K, V after RoPE, and the normed latents the up-projections read)
    r = q_a - lambda w (q_a - e_q): the bytes the model counts for a linear's saved input
    (`lowp_saved_input_saving`); T = b s / c, T_sp = T / t_sp, phi = moe_layer_fraction.
    The output-discarding modules (moe_act, layernorm, mla_up_proj) free their output after
    its consumer's forward and rebuild it before that consumer's backward, and under FP8 /
    FP4 make the consumer save the 16-bit input instead of its quantized copy
    (set_save_original_input / set_for_recompute_input_layernorm), so nothing of it stays;
    mlp and shared_experts keep only their input. core_attn: the scores, in
    `layer_activation_parts`. Source: Megatron-Core core_v0.16.0 tensor_parallel/random.py
    CheckpointWithoutOutput, transformer/moe/experts.py TEGroupedMLP, transformer/
    transformer_layer.py, transformer/multi_latent_attention.py (as in
    `workload.recompute.megatron_recompute_rows`) [D for the byte counts].
    Example (DeepSeek-V3, b 1, s 4096, t 1, bf16, mla_up_proj; a 128, d_qk 192, d_v 128,
    r_q 1536, r_kv 512): 2 x 4096 x (128 x (384 + 128) + 2048) = 553.6e6 B per layer.
    """
    f = megatron_module_fracs(parallel)
    t, q = head_shards(parallel), training.activation_bytes
    T = tokens_per_device(model, parallel)
    T_sp_h = T * model.hidden / residual_shards(parallel)
    phi, g = moe_layer_fraction(model), model.gated_mlp
    lowp = training.lowp_layer_frac * training.lowp_wgrad
    r = q - lowp * (q - quantized_elem_bytes(training))
    a = model.n_heads
    mla = is_mla(model) * q * T * ((2.0 * a * model.head_dim + a * v_dim(model)) / t
                                   + model.q_lora_rank + model.kv_lora_rank)
    return (f["mlp"] * (1.0 - phi) * (T * model.ffn_hidden * ((1.0 + g) * q + r) / t
                                      + r * T_sp_h)
            + f["moe_act"] * phi * r * T * model.moe_topk * model.capacity_factor
            * model.moe_ffn_hidden / t
            + f["shared_experts"] * phi * T * model.n_shared_experts
            * shared_expert_width(model) * ((1.0 + g) * q + r) / t
            + f["layernorm"] * separate_norms(model) * r * T_sp_h
            + f["mla_up_proj"] * mla)


def op_sac_kept_bytes(model, parallel, training):
    """Bytes one layer keeps for its backward under TorchTitan's per-op SAC, one micro-batch,
    on one device: the checkpoint's input, the saved GEMM outputs, the attention output with
    its softmax statistics, and the sequence-parallel reduce-scatter outputs:

        A = q_r s b h / t_sp + q_a sum_r (1 - rho_r) m_r n_r count_r + q_a s b a d_v / t
            + 4 b a s / t + [t > 1, SP] 2 q_a s b h / t
    rho_r = `workload.recompute.sac_recompute_fracs` (1 - rho_r: the saved share of each GEMM
    row's output: wq and wv of the fused QKV row, w1, w2 of a gated Llama block; w2's output
    is the row-parallel partial sum, b s h per rank). The sum runs over every row: the
    router, expert and MLA rows, which that policy takes as saved (rho = 0, no recompute
    time), keep their outputs. Source: pytorch/torchtitan
    parallelize_llama.py `_save_list` at 9dec370 (mm, SDPA, reduce_scatter_tensor saved).
    Example (Llama 3 8B, b 1, s 8192, t 1, bf16): 2 x 8192 x (4096 + 4096 + 1024 + 14336
    + 4096 + 4096) + 4 x 32 x 8192 = 521.1e6 B (1141.9e6 B without recompute).
    """
    t, q = head_shards(parallel), training.activation_bytes
    T = tokens_per_device(model, parallel)
    dense = layer_ops(model, parallel, training).dense
    saved = 1.0 - sac_recompute_fracs(model, parallel)
    # rows first; each factor's batch dims (a layout table's) after them, aligned
    parts = (saved, dense.m, dense.n, dense.count)
    nd = max(jnp.ndim(x) for x in parts)
    prod = functools.reduce(jnp.multiply, [jnp.reshape(x, jnp.shape(x) + (1,) * (nd - jnp.ndim(x)))
                                           for x in parts])
    gemm_out = q * jnp.sum(prod, axis=0)  # over the rows
    attn_out = q * T * model.n_heads * v_dim(model) / t
    stats = 4.0 * parallel.micro_batch * model.n_heads * model.seq_len / (parallel.cp * t)
    rs = jnp.where((parallel.tp > 1) & (parallel.sequence_parallel > 0),
                   2.0 * q * T * model.hidden / t, 0.0)
    return (training.residual_bytes * T * model.hidden / residual_shards(parallel) + gemm_out
            + attn_out + stats + rs)


def lowp_saved_input_saving(model, parallel, training):
    """Bytes a layer no longer keeps because its linears save their inputs quantized, one
    micro-batch, on one device (0 for 16-bit presets):

        dA = lambda w [ 2 s b h / t_sp + s b f' / t ] (q_a - e_q)
    the inputs that only a linear's weight-gradient GEMM reads: the two norm outputs (QKV and
    MLP-up inputs, in the replicated 2 q_a term of `layer_activation_parts`) and the MLP-down
    input (f' = f, or the routed width of MoE, `params.active_ffn_width`). Transformer Engine
    saves the quantized column-wise copy that wgrad uses (e_q bytes,
    `workload.flops.quantized_elem_bytes`) instead of the 16-bit tensor. The attention output
    (the projection's input) stays 16-bit: flash attention's backward reads it. lambda =
    lowp_layer_frac, w = lowp_wgrad. Source: Transformer Engine Linear / LayerNormLinear /
    LayerNormMLP forward (the quantized input is what ctx saves when the recipe is on) [B].
    Example: Llama 3 70B, s 8192, b 1, t 4 with SP, FP8: (2 x 8192 x 8192 / 4 + 8192 x 28672
    / 4) x (2 - 1) = 92.3 MB per layer (of ~1 GB).
    """
    t = head_shards(parallel)
    sbh = tokens_per_device(model, parallel) * model.hidden
    inputs = 2.0 * sbh / residual_shards(parallel) + (
        tokens_per_device(model, parallel) * active_ffn_width(model) / t)
    return (training.lowp_layer_frac * training.lowp_wgrad * inputs
            * (training.activation_bytes - quantized_elem_bytes(training)))


def layer_activation_bytes(model, parallel, training):
    """Bytes one layer keeps for its backward (`layer_activation_parts`, first part)."""
    return layer_activation_parts(model, parallel, training)[0]


def layers_in_flight(layers, stage, parallel):
    """Layer activations a pipeline stage holds at its peak, in units of one layer:

        1F1B (v = 1):         n_i min(p - i, m)
        interleaved (v > 1):  (n_i / v) min(2 (p - i - 1) + (v - 1) p + 1, v m)
    for stage i (0 = first) holding n_i layers in v chunks of n_i / v: 1F1B keeps p - i
    micro-batches in flight on stage i (Narayanan et al. SC21 2.2.1; PAPERS.md section 5.4);
    the interleaved schedule's warm-up runs 2 (p - i - 1) + (v - 1) p chunks before the
    first backward (Megatron-LM `get_forward_backward_func`, interleaved warm-up count), one
    more is live, so stage 0 keeps n_0 (1 + (p - 1)/(p v)) p, the factor of
    `theoretical_memory_usage.py` [C], and the last stage n (v - 1) p / v + n / v.
    Examples: n = 12, p = 8, m = 64, v = 1: stage 0 -> 96, stage 7 -> 12; v = 2, stage 0 ->
    6 x (14 + 8 + 1) = 138 = 12 x 8 x (1 + 7/16).
    """
    p, v, m = parallel.pp, parallel.vp, parallel.n_microbatches
    one_f_one_b = layers * jnp.minimum(p - stage, m)
    chunks = jnp.minimum(2.0 * (p - stage - 1.0) + (v - 1.0) * p + 1.0, v * m)
    return jnp.where(v > 1, layers / v * chunks, one_f_one_b)


def working_layer_bytes(model, parallel, training):
    """Extra memory while one layer runs its backward under full recompute: the layer's full
    activations, rebuilt (one layer, one micro-batch; `layer_activation_parts`)."""
    return layer_activation_parts(model, parallel, training)[1]


def cp_kv_buffer_bytes(model, parallel, training):
    """Working K/V buffers of context parallelism while one layer's attention runs (one
    micro-batch; 0 for c = 1):

        all-gather form (cp_ring 0):  (c - 1)/c S    the other ranks' K and V, gathered
        ring form (cp_ring 1):        2 S / c        the block being received and the block
                                                     being sent (double buffering)
    S = `workload.cp.cp_kv_bytes` (2 b s a_kv d_h q_a / t). Source: PAPERS.md section 5.7
    (ring attention passes K/V blocks; NERSC 2D-seqp gathers K/V) [D].
    Under `Training.cp_torch` (PyTorch's experimental context parallel) S carries the a query
    heads, and the backward holds fp32 dQ, dK, dV accumulators plus the fp32 dK, dV block
    being sent and the one received: + 4 (E_q + 3 E_kv) (`workload.cp.cp_torch_elements`;
    pytorch _attention.py `_templated_ring_attention_backward`, convert_to_f32).
    """
    c, ring = parallel.cp, parallel.cp_ring
    S = cp_kv_bytes(model, parallel, training)
    on = jnp.where(c > 1, 1.0, 0.0)
    E_q, _, E_kv = cp_torch_elements(model, parallel, training)
    fp32 = jnp.where(training.cp_torch > 0, 4.0 * (E_q + 3.0 * E_kv), 0.0)
    return on * (ring * 2.0 * S / c + (1.0 - ring) * (c - 1.0) / c * S + fp32)


def logits_bytes(model, parallel, training):
    """Output-layer memory at the loss on the last stage, per element of the b (s/c) x V/t
    logits: the q_a-byte logits, their fp32 log-softmax kept for the backward (4 B), the fp32
    gradient allocated while both still live (4 B) and its cast back to q_a bytes:

        (2 q_a + 8) b (s/c) V_t      V_t = flops.vocab_rows_per_rank (V / t, padded as the
                                     framework pads it)
    Korthikanti et al. 2022 Section 4 count about 4 s b V / t for the fp32 logits [S]; the
    gradient buffer is what makes the loss the memory peak of small-model, large-vocabulary
    runs [D].
    """
    T = tokens_per_device(model, parallel)
    rows = vocab_rows_per_rank(model, parallel, training)  # V / t, with the framework's padding
    return (2.0 * training.activation_bytes + 8.0) * T * rows
