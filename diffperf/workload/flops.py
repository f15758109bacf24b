"""FLOPs and HBM traffic of one transformer layer and of the embedding / output layer.

Source: PAPERS.md section 5.1 (per-op FLOP rows; Narayanan et al. SC21 Section 5.1;
Megatron-LM `num_floating_point_operations`), section 5.2 (arithmetic intensity).
All counts are per device: the TP shard (t) of the heads and the FFN, the CP shard (c) of the
sequence, one micro-batch of b sequences.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax.numpy as jnp

from diffperf.workload.ops import Gemms, HeadOps, LayerOps

# Kernels of a pre-norm layer's forward besides the GEMMs and attention: two norms, two
# residual adds, the activation (and the gate product when gated). Framework-typical count.
_ELEMENTWISE_KERNELS = 5.0
# Unfused attention runs scores GEMM, scale-mask-softmax, dropout and the AV GEMM (plus
# layout copies) where flash attention runs one kernel.
_UNFUSED_ATTENTION_EXTRA_KERNELS = 4.0
# MLA adds three GEMMs (W^DQ, W^DKV;W^KR, W^UK;W^UV) and the two latent RMSNorms.
_MLA_EXTRA_KERNELS = 5.0


def v_dim(model):
    """d_v: the value / attention-output width of a head (model.v_head_dim, or head_dim
    when 0; MLA models set it: DeepSeek-V3 d_v 128 against d_qk = 192)."""
    return jnp.where(model.v_head_dim > 0, model.v_head_dim, model.head_dim)


def is_mla(model):
    """1 for multi-head latent attention (kv_lora_rank > 0), else 0."""
    return jnp.where(model.kv_lora_rank > 0, 1.0, 0.0)


def moe_layer_fraction(model):
    """phi = fraction of the L layers whose MLP is MoE:

        phi = [E > 0] (1 - L_dense / L)
    L_dense = model.moe_dense_layers: DeepSeek-V2/V3 `first_k_dense_replace` (V3: 3 of 61),
    Qwen-MoE `mlp_only_layers` / `decoder_sparse_step`. Per-layer costs are the mean layer:
    (1 - phi) x dense MLP + phi x MoE MLP, exact for totals over the model (parameters, FLOPs,
    bytes) [D]; a pipeline stage's share of the dense layers is the mean, not where they sit
    (the first stage of a real pipeline holds DeepSeek-V3's 3 dense layers).
    Example: DeepSeek-V3 (L 61, 3 dense): 58/61 = 0.951; Mixtral (no dense layer): 1.
    """
    is_moe = jnp.where(model.n_experts > 0, 1.0, 0.0)
    return is_moe * (1.0 - model.moe_dense_layers / model.n_layers)


def shared_expert_width(model):
    """f_s = width of one shared expert: shared_expert_ffn_hidden (Qwen2-MoE's
    `shared_expert_intermediate_size`, 20480 in Qwen2-57B-A14B), else the routed expert
    width f_e (DeepSeek: `moe_intermediate_size` x `n_shared_experts`)."""
    return jnp.where(model.shared_expert_ffn_hidden > 0, model.shared_expert_ffn_hidden,
                     model.moe_ffn_hidden)


def attention_kappa(model, training):
    """Fraction of the s x s score square the attention kernel computes, mean over layers.

        kappa_full = 1 - causal / 2   (flash attention skips masked blocks: ~ (s+1)/(2s) -> 1/2)
        kappa_win  = flash (w s - w (w - 1) / 2) / s^2 + (1 - flash)     (w < s, causal)
        kappa      = (1 - L_w / L) kappa_full + (L_w / L) kappa_win
    Full attention (encoder) and a causal kernel without block skipping compute all of it.
    A sliding-window layer (window w, L_w of the L layers; Mistral, Gemma 2/3, GPT-OSS) lets
    query i see keys max(0, i - w + 1)..i: sum_i min(i + 1, w) = w s - w (w - 1)/2 scores,
    so its FLOPs scale with s w, not s^2 / 2 (Beltagy et al. 2020, Longformer Section 3.1;
    flash attention's window_size skips the blocks outside the band). Without flash the
    scores are computed whole and masked (kappa_win = 1). A window w >= s is full causal.
    Source: PAPERS.md section 5.1 [D]; current Megatron-LM uses 1/2 for causal.
    Example: GPT-OSS (w 128, s 4096, half the layers sliding, flash): 0.5 x 0.5 + 0.5 x
    0.0308 = 0.265.
    """
    full = 1.0 - 0.5 * model.causal * training.flash_attention
    s = model.seq_len
    w = jnp.clip(model.sliding_window, 1.0, s)
    band = (w * s - 0.5 * w * (w - 1.0)) / (s * s)
    windowed = jnp.where((model.sliding_window > 0) & (model.sliding_window < s)
                         & (model.causal > 0),
                         training.flash_attention * band + (1.0 - training.flash_attention),
                         full)
    frac = model.sliding_layers / model.n_layers
    return (1.0 - frac) * full + frac * windowed


def attention_tile_kappas(model, training):
    """(kappa_full, kappa_win, f_win): the fraction of the s x s score square that a fused
    attention kernel working in B x B tiles (B = training.attn_tile > 0) computes in a
    full-attention layer and in a sliding-window layer, and the share of window layers.

        n = ceil(s / B) row blocks of queries (and column blocks of keys)
        N_full = n (n + 1) / 2  (causal)  or  n^2
        N_win  = sum_{i<n} (min(i, c) + 1) = n + c (c + 1) / 2 + c (n - 1 - c)   (n > c),
                 c = ceil((w - 1) / B)                  (query i sees keys i - w + 1 .. i)
        kappa  = min(N B^2 / s^2, 1),     f_win = L_w / L  (w < s, causal; else 0)
    The kernel skips a tile only when no query of its row block sees any key of it and
    computes the others whole, masking element by element (FlashAttention-2, Dao 2023,
    Section 3.1.1: blocks above the causal diagonal are skipped, the diagonal blocks masked;
    the window's left edge the same way, flash-attention `flash_fwd_kernel.h`
    n_block_min from window_size_left). B = 128: flash-attention's forward for head_dim 64
    (`run_mha_fwd_hdim64`, Flash_fwd_kernel_traits<64, 128, 128, ...>). Without flash
    attention the whole square is computed (kappa = 1, as `attention_kappa`).
    Checked against cuDNN's own backward timings (cudnn-frontend PR #505, B1 H16 d64 causal,
    s 4096, cudnn column): window 511 / full = 171.0 / 558.2 = 0.306 measured, N_win / N_full
    = 150 / 528 = 0.284 here; window 1023: 0.496 measured, 252 / 528 = 0.477.
    Example: GPT-OSS (s 4096, w 128, B 128): n = 32, c = 1, N_full = 528, N_win = 63:
    kappa_full = 0.5156, kappa_win = 0.0615 (the exact band: 0.5, 0.0308), f_win = 0.5.
    A property of the integer shape, constant in every System leaf.
    """
    s = model.seq_len
    # a tile is at least one score and at most the whole square (keeps n^2 and B^2 / s^2
    # finite in float32 for any attn_tile a user may --set)
    B = jnp.clip(training.attn_tile, 1.0, s)
    n = jnp.maximum(jnp.ceil(s / B - 1e-6), 1.0)
    causal = model.causal > 0
    n_full = jnp.where(causal, 0.5 * n * (n + 1.0), n * n)
    w = jnp.clip(model.sliding_window, 1.0, s)
    c = jnp.ceil((w - 1.0) / B - 1e-6)
    n_win = jnp.where(n - 1.0 >= c, n + 0.5 * c * (c + 1.0) + c * (n - 1.0 - c), n_full)
    area = B * B / (s * s)
    flash = training.flash_attention
    k_full = flash * jnp.minimum(n_full * area, 1.0) + (1.0 - flash)
    k_win = flash * jnp.minimum(jnp.minimum(n_win, n_full) * area, 1.0) + (1.0 - flash)
    windowed = (model.sliding_window > 0) & (model.sliding_window < s) & causal
    f_win = jnp.where(windowed, model.sliding_layers / model.n_layers, 0.0)
    return k_full, k_win, f_win


def attention_by_kind(model, parallel, training):
    """(full, window, f_win): the attention core of one full-attention layer and of one
    sliding-window layer as `layer_ops` builds it (QK^T and AV, count = b (a/t) kappa), each
    at its tile kappa (`attention_tile_kappas`), and the share f_win of window layers. The
    mean layer's attention time is (1 - f_win) t(full) + f_win t(window) with each kernel at
    its own work (`costs.compute.attention_by_kind_time_s`)."""
    k_full, k_win, f_win = attention_tile_kappas(model, training)
    s_q, s_kv = model.seq_len / parallel.cp, model.seq_len
    heads = parallel.micro_batch * model.n_heads / head_shards(parallel)
    dh, dv = model.head_dim, v_dim(model)

    def core(kappa):
        return Gemms(m=_rows([s_q, s_q]), n=_rows([s_kv, dv]), k=_rows([dh, s_kv]),
                     count=_rows([heads * kappa, heads * kappa]))

    return core(k_full), core(k_win), f_win


def query_rows(model, parallel):
    """Query rows of one device's attention, one micro-batch, one layer: b (a / t) (s / c),
    the rows of its (s/c) x s score matrices (`score_elements` / s)."""
    return parallel.micro_batch * (model.n_heads / head_shards(parallel)) * (
        model.seq_len / parallel.cp)


def score_elements(model, parallel):
    """Elements of the (s/c) x s score matrices of one device's heads, one micro-batch:
    b (a / t) (s / c) s = `query_rows` x s."""
    return query_rows(model, parallel) * model.seq_len


def softmax_fallback(model, parallel, training):
    """1 where unfused attention's scale-mask-softmax runs as separate PyTorch ops because
    Megatron's fused kernel does not take the shape, else 0:

        fused  <=>  16 < s_kv <= S_max,  s_q = 0 (mod 4),  b a / t = 0 (mod 4),  16-bit input
    S_max = training.fused_softmax_max_seq: Megatron's fused-softmax limit, a framework fact
    (Megatron-DeepSpeed 2023: 2048); 0 (the default) means no such constraint: the softmax
    is one pass at any shape (an XLA fusion, or flash attention, which has no separate pass).
    The kernel gives each warp one row batch and runs 4 warps per 128-thread block, so the
    b a / t attention batches must fill whole blocks. Otherwise Megatron runs x.float(),
    x * scale, masked_fill_, softmax, .half() (`softmax_fallback_costs`).
    Source: Megatron-DeepSpeed `megatron/model/fused_softmax.py`, FusedScaleMaskSoftmax.forward
    (custom_kernel_constraint, input_in_float16) [B]. The vTrain runs where b a / t is not a
    multiple of 4 (16 heads, t = 8, b = 1: 32 single-node rows; 48 heads, t = 16, b = 2: one
    multi-node row) are 14-18 % slower than their neighbours predict without it [D].
    Example: a = 16, t = 8, S_max = 2048: b = 1 -> 1 (2 batches), b = 2 -> 0 (4 batches).
    A property of the integer shape, constant in every System leaf.
    """
    s_kv = model.seq_len
    as_int = lambda x: jnp.round(x).astype(jnp.int32)  # noqa: E731
    batches = as_int(parallel.micro_batch * model.n_heads / head_shards(parallel))
    # both multiples of 4: the low two bits of (batches | s_q) are 0 (integer ops: this
    # runs in every layout of a search)
    fours = jnp.bitwise_and(jnp.bitwise_or(batches, as_int(s_kv / parallel.cp)), 3) == 0
    fused = ((s_kv > 16) & (s_kv <= training.fused_softmax_max_seq) & fours
             & (training.activation_bytes < 4))
    megatron = jnp.where(training.fused_softmax_max_seq > 0, 1.0, 0.0)
    return (1.0 - training.flash_attention) * megatron * jnp.where(fused, 0.0, 1.0)


def softmax_fallback_costs(training):
    """(kernels, HBM bytes per score element, bytes kept per score element) that Megatron's
    softmax fallback adds to a layer's forward, against one softmax pass (r q w q):

        kernels  2 + 2 c          (scale, masked_fill_, softmax for one; + the two casts)
        bytes    24 + 2 (q + 4) c - 2 q      (r 4 w 4 three times; x.float() r q w 4 and
                                             .half() r 4 w q; fp16: 32 B against 4 B)
        kept     4 c              (softmax keeps its fp32 output for the backward; the AV
                                   GEMM keeps the 16-bit copy, counted with the scores)
    c = 1 for 16-bit activations (the casts run), 0 in fp32 (q = 4). The layer's backward
    memory-bound time is modelled as 2 x the forward's, so the backward is charged 2 x these
    bytes (64 B in fp16 where PyTorch's backward chain moves 2 q + 36 - 3 q = 34 B more than
    the fused kernel's): an over-count of ~1 % of the vTrain tp 8 layer time.
    """
    cast = jnp.where(training.activation_bytes < 4, 1.0, 0.0)
    q = training.activation_bytes
    return 2.0 + 2.0 * cast, 24.0 + 2.0 * (q + 4.0) * cast - 2.0 * q, 4.0 * cast


def tokens_per_device(model, parallel):
    """T = b s / c: tokens of one micro-batch that one device's layers process."""
    return parallel.micro_batch * model.seq_len / parallel.cp


def head_shards(parallel):
    """Ranks that split the heads and the FFN width: t (Megatron TP) x G_y (AxoNN, whose first
    and third linears shard their outputs over Y; PAPERS.md section 4.2)."""
    return parallel.tp * parallel.gy


def hidden_shards(parallel):
    """Ranks that split the model width h of the residual stream and of the weights' h side:
    G_x (AxoNN's inner dimension; 1 for Megatron TP, where h is never split)."""
    return parallel.gx


def _moe_weights(model):
    """(dense MLP multiplicity, MoE multiplicity) of the mean layer: 1 - phi, phi
    (`moe_layer_fraction`); a dense model runs one dense MLP per token."""
    phi = moe_layer_fraction(model)
    return 1.0 - phi, phi


def _rows(xs):
    """jnp.stack of a GEMM table's rows, each broadcast to the common batch shape first (a
    row that depends only on the model is a scalar beside rows that vary with a batched
    layout, when the memory functions are called on a whole layout table)."""
    return jnp.stack(jnp.broadcast_arrays(*xs))


# Blocks [start, stop) of layer_ops(...).dense rows, each with the predict feature without
# which its count is exactly 0 (None: always there): the MoE rows 4-8 carry phi =
# moe_layer_fraction (0 without experts), the MLA rows 9-11 carry is_mla (0 without a
# kv_lora_rank). costs.compute times only the rows a caller's features keep.
DENSE_ROW_BLOCKS = ((0, 4, None), (4, 9, "experts"), (9, 12, "mla"))


def layer_ops(model, parallel, training) -> LayerOps:
    """Forward GEMMs, attention and elementwise traffic of one (mean) layer on one device.

    GEMMs (m = T tokens; PAPERS.md section 5.1 rows, divided by t), rows in this order:
        0 QKV     n = (a d_qk + a_kv (d_qk + d_v)) / t, k = h     (MLA: W^UQ;W^QR, k = r_q)
        1 out     n = h, k = a d_v / t
        2 MLP up  n = (1 + gated) f / t, k = h           x (1 - phi)  (dense layers)
        3 MLP down n = h, k = f / t                      x (1 - phi)
        4 router  n = E, k = h                           x phi
        5,6 experts m = T (t_e/t) k C_f e / E, count = phi E / e, n and k split by t_e (not t):
                  the routed tokens on a rank's local experts (t_e = `workload.ep.expert_tp`;
                  the per-expert m is the grouped GEMM's shape, so its efficiency falls at
                  small m as each expert's own GEMM does)
        7,8 shared  n = (1 + gated) f_s / t, h; count phi E_s
        9  MLA W^DQ    n = r_q, k = h             (replicated over TP; 0 without q_lora_rank)
        10 MLA W^DKV;W^KR  n = r_kv + d_R, k = h  (replicated over TP)
        11 MLA W^UK;W^UV   n = a (d_qk - d_R + d_v) / t, k = r_kv
    Attention core per head (count = b a / t): QK^T (s/c x d_qk)(d_qk x s), AV (s/c x s)
    (s x d_v), 2 (s/c) s d kappa FLOP each (kappa: `attention_kappa`).
    phi = `moe_layer_fraction` (the mean of dense and MoE layers); d_v = `v_dim`.
    MLA (DeepSeek-V2 arXiv:2405.04434 Section 2.1, eqs. (9)-(14)): training runs the
    up-projections explicitly (the absorbed form is an inference optimisation), so one
    token's forward in the projections is 2 x the parameters of `params.attention_matrix_params`
    and `params.mla_down_params` (less the norms), and its core is 2 s kappa a (d_qk + d_v):
    DeepSeek-V3, s 4096, causal: 2 x 187.1e6 + 2 x 4096 x 0.5 x 128 x 320 = 0.542 GFLOP.
    AxoNN grid (PAPERS.md section 4.2): t = G_y (`head_shards`) and the h side of the four
    attention / MLP GEMMs is split over G_x (`hidden_shards`); the attention core is split over
    G_y only (it is replicated across the X group).
    """
    t, h = head_shards(parallel), model.hidden
    hx = h / hidden_shards(parallel)
    T = tokens_per_device(model, parallel)
    a, akv, dh, f = model.n_heads, model.n_kv_heads, model.head_dim, model.ffn_hidden
    dv = v_dim(model)
    mla = is_mla(model)
    dense_w, moe_w = _moe_weights(model)
    fe, E, ep = model.moe_ffn_hidden, jnp.maximum(model.n_experts, 1.0), parallel.ep
    fs = shared_expert_width(model)
    gate = 1.0 + model.gated_mlp
    t_e = jnp.where(parallel.etp > 0, parallel.etp, t)  # workload.ep.expert_tp
    tokens_per_expert = T * (t_e / t) * model.moe_topk * model.capacity_factor * ep / E
    r_q, r_kv, d_r = model.q_lora_rank, model.kv_lora_rank, model.qk_rope_head_dim
    qkv_n = jnp.where(mla > 0, a * dh, a * dh + akv * (dh + dv)) / t
    qkv_k = jnp.where((mla > 0) & (r_q > 0), r_q, hx)
    q_down = mla * jnp.where(r_q > 0, 1.0, 0.0)
    dense = Gemms(
        m=_rows([T, T, T, T, T, tokens_per_expert, tokens_per_expert, T, T, T, T, T]),
        n=_rows([qkv_n, hx, gate * f / t, hx, E, gate * fe / t_e, h, gate * fs / t, h,
                     r_q, r_kv + d_r, a * (dh - d_r + dv) / t]),
        k=_rows([qkv_k, a * dv / t, hx, f / t, h, h, fe / t_e, h, fs / t, h, h, r_kv]),
        count=_rows([1.0, 1.0, dense_w, dense_w, moe_w, moe_w * E / ep, moe_w * E / ep,
                         moe_w * model.n_shared_experts, moe_w * model.n_shared_experts,
                         q_down, mla, mla]),
    )
    kappa = attention_kappa(model, training)
    fallback = softmax_fallback(model, parallel, training)
    loop_serial, loop_launches = moe_expert_loop_kernels(model, parallel, training)
    s_q, s_kv = model.seq_len / parallel.cp, model.seq_len
    heads = parallel.micro_batch * a / t
    attention = Gemms(m=_rows([s_q, s_q]), n=_rows([s_kv, dv]), k=_rows([dh, s_kv]),
                      count=_rows([heads * kappa, heads * kappa]))
    return LayerOps(
        dense=dense,
        attention=attention,
        elementwise_bytes=elementwise_bytes(model, parallel, training, fallback),
        # MoE: router, 2 grouped GEMMs; permute, unpermute and (e > 1) the two chunk sorts
        # (`moe_permute_bytes`).
        n_kernels=(4.0 + dense_w + moe_w * (5.0 + 2.0 * (parallel.ep > 1))
                   + _ELEMENTWISE_KERNELS + model.gated_mlp
                   + _MLA_EXTRA_KERNELS * mla
                   + (1.0 - training.flash_attention) * _UNFUSED_ATTENTION_EXTRA_KERNELS
                   + fallback * softmax_fallback_costs(training)[0]
                   + eager_pointwise_kernels(model, training)
                   + moe_eager_clamp_bias_kernels(model, parallel, training)
                   + moe_quant_pad_kernels(model, training)
                   + qk_norm_kernels(model, parallel)
                   + loop_serial),
        vector_flops=vector_flops(model, parallel, training),
        # TE's per-expert loop: the host launches every expert's GEMM (predict's host side)
        extra_launches=loop_launches - loop_serial,
    )


def _elementwise_shapes(model, parallel, training, fallback=None):
    """The sizes `elementwise_bytes` and `ep_chunk_elementwise_bytes` share: head shards t,
    hidden h, activation bytes q, tokens per device T, sequence-parallel tokens T_sp, the
    activated FFN width f_act (dense and routed + shared expert widths), the unfused score
    bytes per element (`scores`, 0 with flash attention unless the softmax falls back) and
    MLA's latent bytes."""
    t, h, q = head_shards(parallel), model.hidden, training.activation_bytes
    T = tokens_per_device(model, parallel)
    T_sp = T / jnp.where(parallel.sequence_parallel > 0, parallel.tp, 1.0) / hidden_shards(
        parallel)
    if fallback is None:
        fallback = softmax_fallback(model, parallel, training)
    dense_w, moe_w = _moe_weights(model)
    f_act = dense_w * model.ffn_hidden + moe_w * (
        model.moe_topk * model.capacity_factor * model.moe_ffn_hidden
        + model.n_shared_experts * shared_expert_width(model))
    scores = score_elements(model, parallel) * (
        (1.0 - training.flash_attention) * 4.0 * q
        + fallback * softmax_fallback_costs(training)[1])
    latents = is_mla(model) * 4.0 * T * (model.q_lora_rank + model.kv_lora_rank)
    return t, h, q, T, T_sp, f_act, scores, latents


def elementwise_bytes(model, parallel, training, fallback=None):
    """HBM traffic (bytes) of a layer's forward memory-bound ops on one device:

        q_a [ T_sp h (2 x 2 norms + 2 x 3 residual adds) + T f' (2 + gated) / t ]
        + (1 - flash) x 4 q_a b (a/t) (s/c) s        (materialised scores: write, softmax r/w, read)
        + fallback x B_f b (a/t) (s/c) s              (softmax as PyTorch ops: `softmax_fallback`,
                                                       B_f = 32 in fp16, `softmax_fallback_costs`)

    T_sp = T / t with sequence parallelism (norms and residuals on a sequence shard), else T
    (AxoNN: T / G_x, the residual stream's width is split over X);
    f' = f for dense MLPs, k C_f f_e + E_s f_s for MoE (activations of routed tokens and of
    the shared experts), mean over dense and MoE layers (`moe_layer_fraction`);
    + q_a 4 T (r_q + r_kv) with MLA (the two latent RMSNorms read and write their latents).
    Source: PAPERS.md section 5.2 (elementwise ops, intensity <~ 1 FLOP/B) [D].
    + `qk_norm_bytes` (the RMSNorm of Q and K, Model.qk_norm).
    Flash-attention's own Q, K, V, O traffic is in `attention_io_bytes`; the MoE token
    permutation in `moe_permute_bytes`; eager kernels a framework adds in
    `eager_pointwise_bytes`, `moe_eager_clamp_bias_bytes` and `moe_quant_pad_bytes` (all 0
    by default); dropout's own traffic in `dropout_bytes` (0 without Training.dropout).
    """
    t, h, q, T, T_sp, f_act, scores, latents = _elementwise_shapes(
        model, parallel, training, fallback)
    return (q * (T_sp * h * 10.0 + T * f_act * (2.0 + model.gated_mlp) / t + latents) + scores
            + moe_permute_bytes(model, parallel, training)
            + eager_pointwise_bytes(model, parallel, training, T_sp, f_act)
            + rope_kv_pass_bytes(model, parallel, training)
            + moe_eager_clamp_bias_bytes(model, parallel, training)
            + moe_quant_pad_bytes(model, parallel, training)
            + qk_norm_bytes(model, parallel, training)
            + sum(dropout_bytes(model, parallel, training)))


def qk_norm_forms(model):
    """(on, per_head, whole): 1 where Model.qk_norm is not "none", 1 for the per-head form,
    1 for the whole-projection form (specs.model.QK_NORM_FORMS: leaf values 0, 1, 2); the one
    reading of the field for the QK-norm's traffic, kernels, kept bytes and weights."""
    on = jnp.where(model.qk_norm > 0, 1.0, 0.0)
    return on, jnp.where(model.qk_norm == 1, 1.0, 0.0), jnp.where(model.qk_norm == 2, 1.0, 0.0)


def qk_norm_bytes(model, parallel, training):
    """HBM traffic of a layer's QK-norm forward (one device, one micro-batch; 0 without):

        B = [qk] q_a T / t [ 2 (a + a_kv) d_qk                     (RMSNorm of Q and K: read
                                                                     x, write y)
                           + [head] 2 (a_kv + [a_kv <= t] a) d_qk ] (contiguous copies of the
                                                                     split K, and Q, views)
    Megatron-Core `SelfAttention.get_query_key_value_tensors` (core_v0.14.0, core_v0.16.0,
    core_v0.18.0 megatron/core/transformer/attention.py) splits the fused QKV output
    [s, b, n_g, (a/a_kv + 2) d_h] into views (TE `SplitAlongDim` = torch.split), reshapes the
    query to [s, b, a/t, d_h] (a copy when a rank holds n_g = a_kv/t > 1 groups, a strided
    view at n_g <= 1) and calls q_layernorm(query), k_layernorm(key): TENorm ->
    transformer_engine.pytorch.RMSNorm over d_h (hidden_size_per_attention_head), one
    kernel each for Q and K on [s, b, heads, d_h] (TE v2.7, v2.12 pytorch/ops/basic/
    rmsnorm.py `op_forward`: `input_.contiguous()` then `rmsnorm_fwd`): the key view, and the
    query view at n_g <= 1, are copied first. Nothing fuses it: core_v0.16.0's fused
    QKV-RoPE path needs q_layernorm and k_layernorm to be IdentityOp (`split_qkv`). The
    whole-projection form (OLMo 2, transformers `Olmo2Attention`: q_norm over a d_h on the
    contiguous q_proj output) has the norms only. The 4-byte rstd per row is left out
    (4 / (2 q_a d_h) = 0.8 % at d_h 128). The backward is not the element-wise 2 x: TE's
    `rmsnorm_bwd` reads dy and x and writes dx (1.5 B_norm) and the copies' backward is a
    pass-through (0): `qk_norm_backward_excess_bytes` takes the rest off [D].
    Example (Qwen3 30B-A3B, b 1, s 4096, t 1, bf16; a 32, a_kv 4, d_h 128): norms 2 x 2 x
    4096 x 36 x 128 = 75.5e6 B, K copy 2 x 2 x 4096 x 4 x 128 = 8.4e6 B: 83.9e6 B.
    """
    return sum(_qk_norm_parts(model, parallel, training))


def _qk_norm_parts(model, parallel, training):
    """(B_norm, B_copy): the two RMSNorms' and the contiguous copies' shares of
    `qk_norm_bytes` (forward)."""
    on, head, _ = qk_norm_forms(model)
    t, q = head_shards(parallel), training.activation_bytes
    T = tokens_per_device(model, parallel)
    a, akv, dqk = model.n_heads, model.n_kv_heads, model.head_dim
    copies = head * (akv + jnp.where(akv <= t, a, 0.0))
    per = on * q * T * 2.0 * dqk / t
    return per * (a + akv), per * copies


def qk_norm_backward_excess_bytes(model, parallel, training):
    """Bytes by which the element-wise 2 x backward (PAPERS.md 5.2) over-counts the QK-norm's
    backward (one device, one micro-batch; 0 without Model.qk_norm):

        X = 2 (B_norm + B_copy) - 1.5 B_norm = 0.5 B_norm + 2 B_copy
    B_norm, B_copy: the norms' and the copies' forward bytes (`qk_norm_bytes`). TE's
    RMSNorm `op_backward` runs one `rmsnorm_bwd(dy, x, rstdevs, w)`: read dy, read x, write dx,
    3 passes of q_a per element where the forward's read x, write y are 2 (the rstd and the
    dgamma partials are per row / per CTA: left out as in the forward); the `contiguous()`
    copies run inside `op_forward`, so their backward is the op's own dx, with no kernel
    (TE v2.12 5671fd36 transformer_engine/pytorch/ops/basic/rmsnorm.py `op_forward`,
    `op_backward`). In `elementwise_backward_once_bytes`, which predict takes off once.
    Example (Qwen3 30B-A3B, b 1, s 4096, t 1, bf16): 0.5 x 75.5e6 + 2 x 8.4e6 = 54.5e6 B
    (the backward 167.8e6 -> 113.2e6 B).
    """
    norms, copies = _qk_norm_parts(model, parallel, training)
    return 0.5 * norms + 2.0 * copies


def qk_norm_kernels(model, parallel):
    """Kernels `qk_norm_bytes` adds to a layer's forward: 2 RMSNorms (Q, K) and, per head, the
    copy of the key view and (a_kv <= t) of the query view (`qk_norm_bytes`):

        K = [qk] (2 + [head] (1 + [a_kv <= t]))
    The backward takes 2 x the forward's kernels (predict): TE's `rmsnorm_bwd` launches its
    main kernel and the dgamma finalize kernel per norm (TE v2.12 transformer_engine/common/
    normalization/rmsnorm/rmsnorm_bwd_semi_cuda_kernel.cu: `kernel`, then `kernel_f`), 4 for
    the two norms; the copies have none (`qk_norm_backward_excess_kernels` takes their 2 x
    off). Example: Qwen3 30B-A3B at t 1: 3; at t 4: 4."""
    on, _, _ = qk_norm_forms(model)
    return 2.0 * on + 0.5 * qk_norm_backward_excess_kernels(model, parallel)


def qk_norm_backward_excess_kernels(model, parallel):
    """Kernels by which predict's 2 x forward kernels over-count the QK-norm's backward
    (GPU fixed time and host launches): the copies', which have no backward (TE's RMSNorm
    copies inside `op_forward`; `qk_norm_backward_excess_bytes`), launched twice:

        X_k = [qk] [head] 2 (1 + [a_kv <= t])
    The norms' 2 x 2 is exact (`rmsnorm_bwd`: the main kernel and the dgamma finalize
    kernel per norm, `qk_norm_kernels`). Example: Qwen3 30B-A3B at t 1: 2; at t 4: 4."""
    on, head, _ = qk_norm_forms(model)
    q_copy = jnp.where(model.n_kv_heads <= head_shards(parallel), 1.0, 0.0)
    return on * head * 2.0 * (1.0 + q_copy)


def eager_pointwise_bytes(model, parallel, training, T_sp, f_act):
    """HBM traffic of a layer's forward element-wise ops that an eager framework runs as
    separate kernels, beyond the fused forms `elementwise_bytes` counts (one device):

        E = 2 n_x T_sp h                                  (two norms, n_x = norm_extra_bytes)
          + lambda [ (2 q_a + 16) T (a + a_kv) d_qk / t    (rotary in fp32 complex: cast in,
                                                           r q_a w 4; product r 4 w 4; cast
                                                           out r 4 w q_a; on Q and K)
                   + [a_kv < a] q_a T (a_kv + a)(d_qk + d_v) / t   (repeat_kv: read K and V
                                                           of a_kv heads, write them for a)
                   + gated 2 q_a T f' / t ]               (SiLU apart from the product: its
                                                           output written and read again)
    lambda = llama_eager_pointwise. Eager fp32 RMSNorm (TorchTitan `RMSNorm`: x.float(),
    pow, mean, x * rsqrt, type_as, * weight) moves 6 + 8 + 4 + 8 + 6 + 4 = 36 B per element
    against a fused kernel's 2 q_a = 4: n_x = 32. Sources: pytorch/torchtitan
    torchtitan/models/norms.py `RMSNorm` and torchtitan/models/llama/model.py
    `apply_rotary_emb`, `repeat_kv`, `FeedForward.forward` at 9dec370 (2024-12-26; the same
    code at 1ea476e9f); norm_type "rmsnorm" in train_configs/llama3_8b.toml at 9dec370.
    The backward is taken as 2 x these bytes, as for every element-wise op (PAPERS.md 5.2):
    about right for the norms (their autograd backward moves ~72 B per element) and the SiLU;
    the rotary and repeat_kv move their bytes once back (`elementwise_backward_once_bytes`,
    which predict takes off). torch.compile fuses all of them (set both to 0; what stays in
    front of SDPA: `rope_kv_pass_bytes`).
    Example (Llama 3 8B, b 2, s 8192, t 1, bf16): norms 2 x 32 x 16384 x 4096 = 4.295e9 B;
    rotary 20 x 16384 x 40 x 128 = 1.678e9, repeat_kv 2 x 16384 x 40 x 256 = 0.336e9, SiLU
    2 x 2 x 16384 x 14336 = 0.940e9: 7.248e9 B per layer forward.
    """
    t, q = head_shards(parallel), training.activation_bytes
    T = tokens_per_device(model, parallel)
    rope, repeat = _eager_rope_repeat_bytes(model, parallel, training)
    glu = model.gated_mlp * 2.0 * q * T * f_act / t
    return (2.0 * training.norm_extra_bytes * T_sp * model.hidden
            + training.llama_eager_pointwise * (rope + repeat + glu))


def _eager_rope_repeat_bytes(model, parallel, training):
    """(rotary, repeat_kv) forward bytes of `eager_pointwise_bytes`, before lambda."""
    t, q = head_shards(parallel), training.activation_bytes
    T = tokens_per_device(model, parallel)
    a, akv, dqk, dv = model.n_heads, model.n_kv_heads, model.head_dim, v_dim(model)
    rope = (2.0 * q + 16.0) * T * (a + akv) * dqk / t
    repeat = jnp.where(akv < a, 1.0, 0.0) * q * T * (akv + a) * (dqk + dv) / t
    return rope, repeat


def elementwise_backward_once_bytes(model, parallel, training):
    """Forward bytes, inside `elementwise_bytes`, of the element-wise ops whose backward moves
    the same bytes once, where the element-wise convention (PAPERS.md 5.2) takes 2 x:

        B_once = lambda (rotary + repeat_kv) + `rope_kv_pass_bytes` + `moe_quant_pad_bytes`
                 + `dropout_bytes` (probabilities and masks)
                 + `qk_norm_backward_excess_bytes` (0.5 B_norm + 2 B_copy of `qk_norm_bytes`)
    The rotary's autograd backward is its forward in reverse (grad cast to fp32 r q_a w 4,
    complex product with conj(freqs) r 4 w 4, cast back r 4 w q_a: 2 q_a + 16 per element,
    as the forward; freqs_cis is a buffer, no gradient); repeat_kv's backward sums the
    a-head gradient back to a_kv heads (read a, write a_kv: the forward's bytes); the
    compiled pass likewise (dQ rotated back; dK, dV summed over their copies). The norms
    (~72 B per element back for 36 forward) and the SiLU apart from its product (two more
    writes and reads back) keep 2 x. Sources: torchtitan/models/llama/model.py at 9dec370
    (`apply_rotary_emb`, `repeat_kv`), PyTorch autograd formulas (derivatives.yaml:
    `_to_copy`, `mul`, `expand` -> sum_to_size). The quantization padding of a dropless MoE
    layer copies once back too (Transformer Engine `_Fp8Unpadding.backward` pads the output
    gradient, `_Fp8Padding.backward` strips the input gradient: `moe_quant_pad_bytes`).
    Dropout's backward reads the gradient and the mask and writes once (`dropout_bytes`).
    The QK-norm's backward moves 1.5 x its norms' forward bytes and none of its copies'
    (`qk_norm_backward_excess_bytes`: the excess itself, not a forward share, is added).
    `predict._layer_parts` takes one pass of these bytes off the backward.
    Example (Llama 3 8B, b 2, s 8192, t 1, bf16, eager): 1.678e9 + 0.336e9 = 2.013e9 B.
    """
    rope, repeat = _eager_rope_repeat_bytes(model, parallel, training)
    return (training.llama_eager_pointwise * (rope + repeat)
            + rope_kv_pass_bytes(model, parallel, training)
            + moe_quant_pad_bytes(model, parallel, training)
            + sum(dropout_bytes(model, parallel, training))
            + qk_norm_backward_excess_bytes(model, parallel, training))


def rope_kv_pass_bytes(model, parallel, training):
    """HBM traffic of the rotary and K/V-expansion passes that stay in front of the attention
    kernel when the Llama code is compiled (torch.compile) but the attention is an extern
    kernel taking K and V of all a query heads (one device, forward):

        B = rho (1 - lambda) q_a T / t [ 2 a d_qk                   (rotate Q: read, write)
                                       + (a_kv + a') d_qk           (rotate K: read a_kv heads,
                                                                     write a' = a with GQA,
                                                                     a_kv without: the
                                                                     expansion fused in)
                                       + [a_kv < a] (a_kv + a) d_v ] (expand V: read, write)
    rho = rope_kv_pass, lambda = llama_eager_pointwise (the eager term already holds these
    ops in their eager form). Inductor fuses each element-wise chain into one kernel, but
    `F.scaled_dot_product_attention` (and the flash kernel under it) is an extern call whose
    inputs must exist in HBM: TorchTitan's `Attention.forward` (torchtitan/models/llama/
    model.py at 9dec370 and 3faaa1a, torchtitan/models/llama3/model.py at 820504e) applies
    `apply_rotary_emb` to xq and xk, then `repeat_kv` to K and V, then SDPA without
    enable_gqa; fms (foundation-model-stack fms/modules/attention.py at 83267f4, 2024-05,
    the model of fms-fsdp) rotates Q and K (`adjusted_qk`) and expands K and V
    (`unsqueeze(2).expand(...).flatten(1, 2)`) when a_kv < a. `elementwise_bytes` has no
    rotary pass otherwise (Megatron's fused rotary is not counted either). The backward
    moves the same bytes (dQ rotated back; the expanded dK, dV summed over their copies and
    dK rotated back): one pass back (`elementwise_backward_once_bytes`), not the 2 x of the
    element-wise convention.
    Example (Llama 3 8B, b 2, s 8192, t 1, bf16): 2 x 16384 x (2 x 32 x 128 + 40 x 128
    + 40 x 128) = 603,979,776 B per layer forward (the eager form, `eager_pointwise_bytes`:
    rotary 1.678e9 + repeat_kv 0.336e9).
    """
    t, q = head_shards(parallel), training.activation_bytes
    T = tokens_per_device(model, parallel)
    a, akv, dqk, dv = model.n_heads, model.n_kv_heads, model.head_dim, v_dim(model)
    gqa = jnp.where(akv < a, 1.0, 0.0)
    a_k = gqa * a + (1.0 - gqa) * akv
    per_token = 2.0 * a * dqk + (akv + a_k) * dqk + gqa * (akv + a) * dv
    return (training.rope_kv_pass * (1.0 - training.llama_eager_pointwise)
            * q * T * per_token / t)


def dropout_bytes(model, parallel, training):
    """(B_probs, B_hidden): HBM bytes that dropout adds to a layer's forward on one device, on
    the attention probabilities and in the two bias-dropout-adds; each moves the same bytes
    once back (`elementwise_backward_once_bytes`), not the 2 x of the element-wise convention:

        B_probs  = m_d (1 - flash) (2 q_a + 1) b (a/t) (s/c) s   (read P, write P', write mask)
        B_hidden = m_d 2 T_sp h                                  (write the 1-byte mask, twice)
    m_d = training.dropout (0/1), T_sp as `elementwise_bytes`. Unfused attention applies
    `torch.nn.Dropout` to the softmax output as its own kernel: PyTorch's CUDA dropout
    (`native_dropout`, `dropout_cuda<mask_t>`; `_fused_dropout` before it) reads the input,
    writes the output and a 1-byte mask (bool; uint8), and its backward (`masked_scale`)
    reads the gradient and the mask and writes the input gradient: 2 q_a + 1 each way
    (pytorch/pytorch aten/src/ATen/native/cuda/Dropout.cu, e.g. at 029ba61d,
    fused_dropout_cuda / masked_scale_cuda). Megatron's hidden dropouts run inside
    `bias_dropout_add_fused_train` (TorchScript, nvfuser from PyTorch 1.10, the legacy fuser
    before it; on by default, --no-bias-dropout-fusion turns it off): one kernel whose x + b,
    residual read and sum write `elementwise_bytes` counts as a residual add (3 q_a); dropout
    adds its mask (`rand_like(x) < 1 - p`, bool: torch/csrc/jit/runtime/symbolic_script.cpp
    `dropout`), written forward and read back. Sources: microsoft/Megatron-DeepSpeed
    megatron/model/transformer.py at f4157bea (CoreAttention.forward: attention_dropout on
    attention_probs; ParallelTransformerLayer: bias_dropout_add_fused_train after attention
    and MLP), megatron/initialize.py `set_jit_fusion_options`; vTrain's copy of the model
    (VIA-Research/vTrain src/model/gpt_modeling.py at f8dda847: the same two dropouts, p 0.1).
    Flash attention draws its dropout inside the kernel (no mask in HBM): B_probs = 0. The
    dropout kernel's launch is already in `_UNFUSED_ATTENTION_EXTRA_KERNELS`; the embedding
    dropout (once per micro-batch, first stage) is not counted.
    Example (vTrain GPT h 1024, a 16, s 1024, b 1, t 1, fp16, no flash): B_probs = 5 x 16 x
    1024 x 1024 = 83,886,080 B, B_hidden = 2 x 1024 x 1024 = 2,097,152 B per layer forward.
    """
    _, h, q, _, T_sp, _, _, _ = _elementwise_shapes(model, parallel, training, 0.0)
    m_d = training.dropout
    probs = m_d * (1.0 - training.flash_attention) * (2.0 * q + 1.0) * score_elements(
        model, parallel)
    return probs, m_d * 2.0 * T_sp * h


def unfused_core_attention_bytes(model, parallel, training):
    """B_core: the element-wise HBM bytes of the attention core's forward on one device, one
    layer, one micro-batch, that Megatron's selective recompute of core_attn re-runs:

        B_core = scores + B_probs
    scores: `elementwise_bytes`' score term ((1 - flash) 4 q_a + fallback B_f per score
    element: the materialised scores and their softmax), B_probs: `dropout_bytes`' attention-
    probs dropout; both 0 under flash attention (its kernel is the attention time).
    Source: NVIDIA/Megatron-LM megatron/core/transformer/attention.py at d98e8a64
    (`_checkpointed_attention_forward` re-runs `core_attention` under
    tensor_parallel.checkpoint), dot_product_attention.py there (DotProductAttention.forward:
    scale_mask_softmax, then attention_dropout); Korthikanti et al. 2022, Section 5 (the
    recomputed part: QK^T, softmax, softmax dropout, attention over V).
    Example (vTrain GPT h 1024, a 16, s 1024, b 1, t 1, fp16, dropout, no flash):
    4 x 2 x 16 x 1024^2 + 83,886,080 = 218,103,808 B.
    """
    scores = _elementwise_shapes(model, parallel, training)[6]
    return scores + dropout_bytes(model, parallel, training)[0]


def eager_pointwise_kernels(model, training):
    """Kernels `eager_pointwise_bytes` adds to a layer's forward: 6 per unfused norm (7 in
    place of 1), 6 for the rotary (cast, product, cast back, on Q and K) and 2 for
    repeat_kv (a_kv < a) under llama_eager_pointwise (SiLU and the product are already
    counted apart in layer_ops' n_kernels); under rope_kv_pass without it, 2 (Q, K) + 1 (V,
    a_kv < a) fused kernels (`rope_kv_pass_bytes`)."""
    norms = 2.0 * 6.0 * jnp.where(training.norm_extra_bytes > 0, 1.0, 0.0)
    repeat = 2.0 * jnp.where(model.n_kv_heads < model.n_heads, 1.0, 0.0)
    # rope_kv_pass (compiled): one fused kernel each for Q and K, one for V with GQA
    fused = (training.rope_kv_pass * (1.0 - training.llama_eager_pointwise)
             * (2.0 + 0.5 * repeat))
    return norms + training.llama_eager_pointwise * (6.0 + repeat) + fused


def flex_rank_copies(model, parallel):
    """r = e p_g: the copies of a routed token that DeepEP / HybridEP move, one per EP rank
    holding at least one of its k experts (the flex dispatcher sends a token once per target
    rank, `is_token_in_rank`, and combines one partial sum per rank), where the pairwise
    all-to-all dispatcher moves k C_f (one per expert):

        p_g = 1 - C(E - E/e, k) / C(E, k)     (`workload.ep.domain_hit_fraction` with
                                               one rank as the domain of its E / e experts)
        r   = e p_g                           (self included; 0 for e = 1)
    Force-balanced routing, experts spread evenly over the e ranks. Source: DeepEP README and
    `deep_ep/buffer.py` (`get_dispatch_layout`: num_tokens_per_rank, is_token_in_rank);
    deepseek-ai/DeepEP branch hybrid-ep, `Hybrid-EP_Implementation.md` sections 2, 4.2 and 5
    (the intra-node token buffer holds one slot per source token and rank; dispatch_with_permute
    = dispatch kernel, then a permute kernel to the local experts; combine_with_unpermute =
    unpermute kernel, then the combine kernel); Megatron-Core `token_dispatcher.py`,
    `_DeepepManager` (core_v0.15.0), `_HybridEPManager` (core_v0.16.0) [S].
    The NVLink volume of the dispatch itself keeps its k-copy form in
    `costs.collectives.hierarchical_all_to_all_s` (scaling it by r / k was measured: its
    reverse-mode gradient disagreed with finite differences under predict's quick XLA:CPU
    compile options, docs/accuracy-bridge.md, change 3), so only the permutation uses r.
    Example (Qwen3 30B-A3B, E 128, k 8, e 8): p_g = 1 - C(112, 8) / C(128, 8) = 0.6674,
    r = 5.339 copies against k = 8; DeepSeek-V3 (E 256, e 64): r = 7.676.
    """
    from diffperf.workload.ep import domain_hit_fraction

    return parallel.ep * domain_hit_fraction(model.moe_topk, jnp.maximum(model.n_experts, 1.0),
                                             parallel.ep)


def _expert_tokens(model, parallel):
    """(t_e, T_e): the expert-TP degree (etp, or the head shards t when etp is 0) and the
    tokens a rank's experts serve, T_e = T t_e / t (`moe_permute_bytes`)."""
    t = head_shards(parallel)
    t_e = jnp.where(parallel.etp > 0, parallel.etp, t)
    return t_e, tokens_per_device(model, parallel) * t_e / t


def moe_permute_bytes(model, parallel, training):
    """HBM traffic of an MoE layer's token permutation (forward, one device, one micro-batch):

        alltoall (ep_dispatch = 0):  q_a h T_e [ 2 (1 + k C_f) + 4 k C_f [e > 1] ]
        flex (ep_dispatch = 1, e > 1): q_a h T_e 2 (r + k C_f),   r = `flex_rank_copies`
    T_e = T t_e / t. alltoall: permute (read the T_e tokens, write their k C_f copies grouped
    by expert) and unpermute (read the k C_f expert outputs, write the T_e probability-weighted
    sums): 2 (1 + k C_f); with e > 1 the received tokens are sorted by local expert after the
    dispatch all-to-all and back before the combine (read + write k C_f T_e each): 4 k C_f.
    flex (DeepEP / HybridEP): the tokens are dispatched unpermuted, one copy per target rank
    (r T_e received per rank on average), then permuted to the rank's local experts (read r,
    write k C_f) and unpermuted before the combine (read k C_f, write r): no chunk sorts.
    T_e: the tokens a rank's experts serve (`workload.ep.expert_token_share`: T / t routed
    from the sequence shard when t_e = 1 < t, T after the TP gather when t_e = t). Fused or not
    (TE's fused permute kernels move the same bytes), these are memory-bound copies (PAPERS.md
    section 5.2).
    Source: Megatron-Core MoE token dispatchers (megatron/core/transformer/moe/
    token_dispatcher.py: MoEAlltoAllTokenDispatcher: permute -> all-to-all ->
    sort_chunks_by_idxs -> experts -> sort_chunks_by_idxs -> all-to-all -> unpermute;
    MoEFlexTokenDispatcher: fused dispatch -> permute (get_permuted_hidden_states_by_experts)
    -> experts -> unpermute -> fused combine; moe_utils.permute / unpermute) [S]. 0 for a
    dense model; x phi (`moe_layer_fraction`) for the mean layer of a model with dense layers.
    Example (Qwen3-30B-A3B: h 2048, k 8, C_f 1; b 4, s 4096, t = t_e = 1, e = 8, bf16):
    alltoall 2 x 2048 x 16384 x (2 x 9 + 32) = 3.36e9 B; flex 2 x 2048 x 16384 x 2 x (5.339
    + 8) = 1.79e9 B.
    """
    is_moe = moe_layer_fraction(model)
    _, T_e = _expert_tokens(model, parallel)
    kc = model.moe_topk * model.capacity_factor
    sort = jnp.where(parallel.ep > 1, 4.0 * kc, 0.0)
    alltoall = 2.0 * (1.0 + kc) + sort
    flex = 2.0 * (flex_rank_copies(model, parallel) + kc)
    copies = jnp.where((parallel.ep_dispatch > 0) & (parallel.ep > 1), flex, alltoall)
    return is_moe * training.activation_bytes * model.hidden * T_e * copies


def moe_eager_clamp_bias_bytes(model, parallel, training):
    """HBM traffic of an MoE layer's expert-MLP element-wise ops that Megatron-Core runs as
    separate eager kernels around its fused activation (forward, one device, one micro-batch;
    0 unless training.moe_eager_clamp_bias = 1):

        E = phi q_a R (8 f_e / t_e + 6 h),      R = k C_f T_e,  T_e = T t_e / t

    R routed token copies on the rank's local experts (`moe_permute_bytes`' T_e), fc1 output
    2 f_e / t_e wide, fc2 output h wide.
    Clamp (8 f_e / t_e elements per copy, 3 kernels): `weighted_bias_quick_geglu_impl` with
    activation_func_clamp_value set chunks the fc1 output, clamps the gate half (max = 7) and
    the linear half (+-7), each read + written, and torch.cat's the two halves back (read +
    write 2 f_e) before the torch.compile'd fused quick-GeGLU (whose own read 2 f_e + write
    f_e `elementwise_bytes` already counts).
    fc2 bias (6 h elements per copy, 2 E_loc + 1 kernels, E_loc = E / e): TEGroupedMLP builds
    linear_fc2 with skip_bias_add = True and adds its bias in `_apply_bias`: for each local
    expert b * p (write h per token), t + b p (read 2 h, write h), then one torch.cat of the
    experts' outputs (read h, write h); the probabilities are the router's dtype (bf16:
    moe_router_dtype unset in the GPT-OSS recipes), so the final .to(dtype) copies nothing.
    The fc1 bias is not here: linear_fc1 has skip_bias_add = False, so Transformer Engine's
    GroupedLinear adds it in its grouped GEMM.
    Sources: NVIDIA/Megatron-LM megatron/core/fusions/fused_bias_geglu.py
    `weighted_bias_quick_geglu_impl` and megatron/core/transformer/moe/experts.py
    `TEGroupedMLP.__init__` / `_apply_bias` / `bias_act_func`, the same at core_v0.15.0,
    core_v0.16.0 and core_v0.17.0 (the Megatron Core of NeMo 25.11, 26.02, 26.04:
    Megatron-Bridge docs/releases/software-versions.md); the GPT-OSS provider's
    add_bias_linear = True, bias_activation_fusion = True, activation_func = quick_gelu,
    glu_linear_offset = 1.0, activation_func_clamp_value = 7.0 (Megatron-Bridge
    models/gpt_oss/gpt_oss_provider.py). From core_v0.18.0 a recipe that sets
    use_transformer_engine_op_fuser runs clamp, activation and both biases in Transformer
    Engine's fused grouped-MLP ops instead (set 0 for such runs).
    The backward is 2 x these bytes by the element-wise convention (PAPERS.md 5.2); counted
    from autograd it is 10 f_e / t_e (two clamp backwards read grad and input, write grad;
    the chunk's backward concatenates) + 8 h (the two MulBackward products and their
    reductions, the split's backward cat) per copy, i.e. the convention over-counts by
    6 f_e / t_e + 4 h, about what the recipes' `moe_act` recompute adds back (the clamp and
    cat once more, 8 f_e / t_e), which diffperf does not price apart.
    Example (GPT-OSS 120B: h = f_e = 2880, k 4, C_f 1; b 1, s 4096, t = t_e = 1, bf16):
    R = 16384, E = 2 x 16384 x 14 x 2880 = 1.3212e9 B per layer forward.
    """
    t_e, T_e = _expert_tokens(model, parallel)
    R = model.moe_topk * model.capacity_factor * T_e
    return (training.moe_eager_clamp_bias * moe_layer_fraction(model)
            * training.activation_bytes * R
            * (8.0 * model.moe_ffn_hidden / t_e + 6.0 * model.hidden))


def moe_eager_clamp_bias_kernels(model, parallel, training):
    """Kernels `moe_eager_clamp_bias_bytes` adds to a layer's forward: 3 for the clamp (two
    clamps, one cat) and 2 E / e + 1 for the fc2 bias (bias x prob and the add per local
    expert, one cat), x phi."""
    E_loc = jnp.maximum(model.n_experts, 1.0) / parallel.ep
    return (training.moe_eager_clamp_bias * moe_layer_fraction(model)
            * (3.0 + 2.0 * E_loc + 1.0))


def moe_quant_pad_bytes(model, parallel, training):
    """HBM traffic of the copies that pad a dropless MoE layer's routed tokens to the FP8 /
    MXFP8 grouped-GEMM alignment and strip the padding from the expert output (forward, one
    device, one micro-batch; 0 unless training.moe_quant_pad = 1):

        E = phi 4 q_a h R,      R = k C_f T_e   (routed copies on the rank's local experts,
                                                 T_e = T t_e / t as in `moe_permute_bytes`)
    Megatron-Core's TEGroupedMLP.forward, whenever the run quantizes (config.fp8; fp8 or fp4
    from core 0.16), passes the permuted tokens and their probabilities through Transformer
    Engine's Fp8Padding with the host list of tokens per local expert, and the fc2 output
    through Fp8Unpadding. Fp8Padding rounds every expert's row count up to the alignment
    (16 rows; 32 for MXFP8) and returns its input untouched when every count is already a
    multiple ("no padding needed"); otherwise `tex.fused_multi_row_padding` copies all R rows
    into a new padded buffer (read R h q_a, write R h q_a plus the pad rows) and
    `fused_multi_row_unpadding` copies the h-wide fc2 output back (the same again): 4 q_a h R.
    Dropless routing leaves the counts unaligned (force-balanced random routing gives each of
    the E / e local experts about R e / E rows, a multiple of 16 for all of them with
    probability ~16^(-E/e)); drop-and-pad at capacity gives every expert capacity x e x t_e
    rows (Megatron-Core `MoEAlltoAllTokenDispatcher.preprocess`, `drop_and_pad`), aligned for
    these runs, and HybridEP (core 0.16+) pads inside its dispatch (`pad_multiple`), so
    neither copies: the fact is set only where the run's own path copies.
    Not counted: the pad rows themselves (at most E / e x (A - 1) rows per pass, A = 16 or 32:
    under 1.5 % of R for Qwen3 30B-A3B at b 1) and the [R, 1] probabilities' pad (2 R x <= 4 B
    against 4 q_a h R: < 0.1 % at h >= 2048).
    The backward moves these bytes once (Fp8Unpadding.backward pads the output gradient,
    Fp8Padding.backward strips the input gradient: 4 q_a h R), not the 2 x of the element-wise
    convention (PAPERS.md 5.2): `elementwise_backward_once_bytes` counts them, and
    `predict._layer_parts` takes one pass off the backward.
    Sources: NVIDIA/Megatron-LM megatron/core/transformer/moe/experts.py
    `TEGroupedMLP.__init__` / `forward` (fp8_padding / fp8_unpadding at core_v0.14.0 and
    core_v0.15.0, quantization_padding / quantization_unpadding at core_v0.16.0 and
    core_v0.17.0, and at the commits Megatron-Bridge v0.2.0 / v0.3.0 / v0.4.0 / v0.4.2 pin in
    3rdparty/Megatron-LM: 0d8e0714, b0cc2706, d7288711, 2edffadb) and its MoE README
    (core_v0.16.0, "MoE-Specific FP8 Optimizations": router padding "avoiding per-tensor
    padding overhead"); NVIDIA/TransformerEngine transformer_engine/pytorch/module/fp8_padding.py
    and fp8_unpadding.py (`Fp8Padding.forward`'s aligned early return, the same at v2.7, v2.9,
    v2.12, v2.14) and common/util/padding.cu (one multi-tensor kernel per call) [S].
    Example (Qwen3 30B-A3B: h 2048, k 8, C_f 1; b 1, s 4096, t = t_e = 1, e 8, bf16 tokens):
    R = 32768, E = 4 x 2 x 2048 x 32768 = 536,870,912 B per layer forward.
    """
    _, T_e = _expert_tokens(model, parallel)
    R = model.moe_topk * model.capacity_factor * T_e
    return (training.moe_quant_pad * moe_layer_fraction(model)
            * 4.0 * training.activation_bytes * model.hidden * R)


def ep_chunk_elementwise_bytes(model, parallel, training, fallback=None):
    """(A, M, A_once, M_once): the forward HBM bytes of a layer's memory-bound kernels that
    Megatron-Core's merged EP schedule (`overlap_moe_expert_parallel_comm`) runs on its
    compute stream in the pre-dispatch chunk (A) and in the expert chunk (M), and of those the
    bytes whose backward moves them once (`elementwise_backward_once_bytes`' share of each):

        A = q_a [7 T_sp h + 4 T (r_q + r_kv)] + scores + P_A + 2 n_x T_sp h
            + lambda (rotary + repeat_kv) + `rope_kv_pass_bytes` + `qk_norm_bytes` + D_A
        M = q_a T f' (2 + gated) / t + (P - 2 P_A) + lambda glu
            + `moe_eager_clamp_bias_bytes` + `moe_quant_pad_bytes`
        C = 3 q_a T_sp h + P_A + B_hidden / 2   (the combine node, on the communication stream)
        A_once = lambda (rotary + repeat_kv) + `rope_kv_pass_bytes` + D_A
                 + `qk_norm_backward_excess_bytes`,     M_once = `moe_quant_pad_bytes`
    with P = `moe_permute_bytes` and P_A = phi q_a h T_e (1 + k C_f) for the alltoall
    dispatcher at e > 1 (its permute before the dispatch; its unpermute after the combine is
    C's), 0 for flex (DeepEP / HybridEP permute after the dispatch and unpermute before the
    combine, both in M) and at e = 1; D_A = B_probs + B_hidden / 2 (`dropout_bytes`: the
    attention's dropouts; the MLP's bias-dropout-add is C's); the other symbols as
    `elementwise_bytes`, of whose terms A + M + C is a partition (the 10 T_sp h of two norms
    and two residual adds: the input norm, the pre-MLP norm and the attention's residual add
    in A, the MLP's residual add in C).
    Source: Megatron-Core builds each MoE layer of the merged schedule from nodes on two streams
    (`models/common/model_chunk_schedule_plan.py`, `TransformerLayerSchedulePlan`: attn and mlp
    on the compute stream, moe_dispatch and moe_combine on the communication stream;
    `models/gpt/fine_grained_callables.py`, `build_transformer_layer_callables`):
    attn = input norm, attention, its residual add, pre-MLP norm, router and the dispatcher's
    `dispatch_preprocess` (alltoall: `permute`); mlp = `routed_experts_compute`
    (`dispatch_postprocess`: the chunk sort, flex: the permute; the experts with their
    activation and quantization padding; `combine_preprocess`: the chunk sort back, flex: the
    unpermute); moe_combine = the combine all-to-all, `combine_postprocess` (alltoall:
    `unpermute`) and the MLP's residual add (`mlp_bda`, "placed after mlp.combine"). Read at
    core_v0.14.0, core_v0.15.0 and core_v0.16.0 (the containers 25.09-26.04.01); the shared
    experts run in the mlp node at core_v0.15.0 and in the attn node from core_v0.16.0: they
    are counted in M here, as `predict._MLP_ROWS` counts their GEMMs [S].
    The windows of `schedule.overlap.ep_merged_1f1b_exposed_s` are these chunks' whole compute
    stream: GEMMs, attention core and these memory-bound kernels (`predict._layer_parts`).
    Example (Qwen3 235B-A22B on DGX-H100: h 4096, k 8, f_e 1536, SwiGLU; b 1, s 4096, t 2 with
    SP, etp 1, e 32, alltoall, bf16 tokens, moe_quant_pad 1): T = 4096, T_sp = T_e = 2048;
    A = 2 (7 x 2048 x 4096) + 2 x 4096 x 2048 x 9 + QK-norm 2 x 2 x 4096 x 72 x 128 / 2
      = 117.4e6 + 151.0e6 + 75.5e6 = 343.9e6 B;
    M = 2 x 4096 x 12288 x 3 / 2 + 2 x 4096 x 2048 x 32 + 4 x 2 x 4096 x 16384
      = 151.0e6 + 536.9e6 + 536.9e6 = 1224.7e6 B; C = 50.3e6 + 151.0e6 = 201.3e6 B;
    A_once = 0.5 x 2 x 2 x 4096 x 68 x 128 / 2 + 2 x 2 x 2 x 4096 x 4 x 128 / 2 = 35.7e6
    + 8.4e6 = 44.0e6 B (the QK-norm's backward excess), M_once = 536.9e6 B.
    """
    t, h, q, T, T_sp, f_act, scores, latents = _elementwise_shapes(
        model, parallel, training, fallback)
    _, T_e = _expert_tokens(model, parallel)
    kc = model.moe_topk * model.capacity_factor
    flex = (parallel.ep_dispatch > 0) & (parallel.ep > 1)
    perm_a = jnp.where(flex | (parallel.ep <= 1), 0.0,
                       moe_layer_fraction(model) * q * h * T_e * (1.0 + kc))
    perm = moe_permute_bytes(model, parallel, training)
    rope, repeat = _eager_rope_repeat_bytes(model, parallel, training)
    lam = training.llama_eager_pointwise
    d_probs, d_hidden = dropout_bytes(model, parallel, training)
    moved_once = (lam * (rope + repeat) + rope_kv_pass_bytes(model, parallel, training)
                  + d_probs + 0.5 * d_hidden)
    a_once = moved_once + qk_norm_backward_excess_bytes(model, parallel, training)
    m_once = moe_quant_pad_bytes(model, parallel, training)
    a = (q * (7.0 * T_sp * h + latents) + scores + perm_a
         + 2.0 * training.norm_extra_bytes * T_sp * h + moved_once
         + qk_norm_bytes(model, parallel, training))
    m = (q * T * f_act * (2.0 + model.gated_mlp) / t + (perm - 2.0 * perm_a)
         + lam * model.gated_mlp * 2.0 * q * T * f_act / t
         + moe_eager_clamp_bias_bytes(model, parallel, training) + m_once)
    return a, m, a_once, m_once


# Transformer Engine's GroupedLinear spreads its per-expert cuBLASLt GEMMs round-robin over
# this many CUDA streams (transformer_engine/common/util/multi_stream.cpp,
# `num_compute_streams = 4`, the same constant in v2.7, v2.12, v2.14, v2.16).
TE_GEMM_STREAMS = 4.0
# The routed-expert rows of layer_ops(...).dense (5: fc1, 6: fc2).
EXPERT_ROWS = (0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0)


def moe_expert_loop_kernels(model, parallel, training):
    """(serial, launches): kernels Transformer Engine's per-expert loop adds to a layer's
    forward, one micro-batch (0 unless training.moe_expert_loop = 1):

        E_l = E / e                      local experts of an EP rank
        g   = max(E_l / n_s, 1)          GEMMs each of the n_s streams runs one after another
        serial   = 2 phi (g - 1)         GPU-side: the grouped GEMM's chain is g kernels long
        launches = 2 phi (E_l - 1)       host-side: one cuBLASLt launch per expert
    for the two grouped GEMMs (fc1, fc2) of the MoE layer (phi = `moe_layer_fraction`), against
    the one kernel per grouped GEMM `layer_ops` counts; the backward's dgrad and wgrad double
    both (predict: 2 x the forward's kernels). The kernels the 4 streams run side by side
    overlap each other's fixed time (launch, tail), so the GPU pays the fixed time of one
    stream's chain (`costs.xla.kernel_fixed_s` each); the host launches every GEMM
    (`Efficiency.host_kernel_s` each). Per-expert quantization is counted in
    `lowp_quantize_kernels` (E_l quantizes per quantized tensor of the expert rows, each at
    TE's kernel count: 1 for MXFP8, 4 for FP8 current scaling; FP8 delayed scaling's split
    inputs stay one fused kernel).
    n_s = `TE_GEMM_STREAMS`. The stream events (1 + n_s records, 2 n_s waits per grouped
    GEMM) are not counted.
    Source: Transformer Engine `pytorch/module/grouped_linear.py` (forward: `general_grouped_gemm`
    of the m_splits; backward: dgrad and wgrad `general_grouped_gemm`) -> `nvte_multi_tensor_gemm`
    -> `multi_stream_cublas_gemm` (`common/gemm/cublaslt_gemm.cu`: one `nvte_cublas_gemm_v2`
    per GEMM on stream i % 4; the CUTLASS grouped GEMM only on Hopper under
    NVTE_USE_CUTLASS_GROUPED_GEMM), read at v2.7, v2.9, v2.12, v2.14 and v2.16; Megatron-Core's
    TEGroupedMLP (moe_grouped_gemm = True) builds one GroupedLinear of E_l GEMMs per projection.
    Example: DeepSeek-V3 (E 256, 58 of 61 layers MoE) at e 8: E_l = 32, g = 8,
    serial = 2 x 0.9508 x 7 = 13.31, launches = 2 x 0.9508 x 31 = 58.95 per layer forward;
    at e 64: E_l = 4, g = 1, serial 0, launches 5.70.
    """
    E_l = jnp.maximum(model.n_experts, 1.0) / parallel.ep
    g = jnp.maximum(E_l / TE_GEMM_STREAMS, 1.0)
    f = 2.0 * training.moe_expert_loop * moe_layer_fraction(model)
    return f * (g - 1.0), f * jnp.maximum(E_l - 1.0, 0.0)


def moe_quant_pad_kernels(model, training):
    """Kernels `moe_quant_pad_bytes` adds to a layer's forward: 3 (Fp8Padding of the tokens
    and of their probabilities, Fp8Unpadding of the fc2 output; one multi-tensor kernel each),
    x phi."""
    return training.moe_quant_pad * moe_layer_fraction(model) * 3.0


def attention_io_bytes(model, parallel, training):
    """HBM traffic of the fused attention kernel (forward): read Q, K, V and write O,

        q_a T (a d_qk + a_kv d_qk + a_kv d_v + a d_v) / t      (= q_a T (2 a + 2 a_kv) d_h / t
                                                                when d_v = d_qk = d_h)
    """
    T = tokens_per_device(model, parallel)
    a, akv, dqk, dv = model.n_heads, model.n_kv_heads, model.head_dim, v_dim(model)
    return training.activation_bytes * T * ((a + akv) * dqk + (akv + a) * dv) / head_shards(
        parallel)


def vector_flops(model, parallel, training):
    """Non-matrix FLOPs of a layer's forward: softmax (~5 per score) and norms/activations
    (~10 per element). Small next to the GEMMs; kept so vector-throughput has a gradient.

    Source: NERSC model counts softmax at vector speed (PAPERS.md section 3.2) [C].
    """
    T = tokens_per_device(model, parallel)
    kappa = attention_kappa(model, training)
    t = head_shards(parallel)
    scores = score_elements(model, parallel) * kappa
    return 5.0 * scores + 10.0 * T * (model.hidden / hidden_shards(parallel)
                                      + model.ffn_hidden / t)


def head_ops(model, parallel, training) -> HeadOps:
    """Output layer (logits GEMM, vocab-parallel over t) and loss; embedding lookup.

        logits  2 T h V_t FLOP          (PAPERS.md section 5.1, once per micro-batch)
                V_t = `vocab_rows_per_rank`: V padded to a multiple of d t, split over t
                (Megatron-LM, d = training.vocab_pad_to = 128), or floor(V / t) without
                padding (d = 0; vTrain's sharded GPT model, `vocab_size // world_size`).
                Its alignment sets the GEMM's efficiency (`roofline.alignment_factor`).
        loss    q_ce T V / t / 2 bytes per pass (forward and backward: q_ce T V / t)
                with q_ce = training.loss_bytes_per_logit, the fp32 cross-entropy's HBM
                traffic per logit element. Megatron-LM's _VocabParallelCrossEntropy, counted
                pass by pass (q_ce = 52, the fp16 / bf16 presets): forward: fp16 ->
                fp32 upcast (r2 w4), max (r4), subtract max in place (r4 w4), exp (r4 w4),
                sum (r4), divide by the sum in place (r4 w4) = 38 B; backward: scale the
                saved softmax by the loss gradient in place (r4 w4), cast the gradient
                back to 16 bits (r4 w2) = 14 B. PyTorch's F.cross_entropy (the amp-bf16
                preset, q_ce = 40): upcast (r2 w4), log_softmax (r4 r4 w4), nll backward's
                zero-filled gradient (w4), log_softmax backward (r4 r4 w4), downcast
                (r4 w2). One XLA program (the xla-amp-bf16 preset, q_ce = 14) fuses the
                chain: max (r2), exp-sum writing the fp32 exp(x - max) that the backward
                keeps (r2 w4), and the backward's softmax - one-hot cast to 16 bits
                (r4 w2) [D].
        embed   2 x q_a T h bytes       (gather rows, write activations)
    """
    T = tokens_per_device(model, parallel)
    rows = vocab_rows_per_rank(model, parallel, training)
    logits = Gemms(m=jnp.stack([T]), n=jnp.stack([rows]),
                   k=jnp.stack([model.hidden / hidden_shards(parallel)]), count=jnp.stack([1.0]))
    return HeadOps(
        logits=logits,
        embedding_bytes=2.0 * training.activation_bytes * T * model.hidden,
        loss_bytes=0.5 * training.loss_bytes_per_logit * T * rows,
    )


def vocab_rows_per_rank(model, parallel, training):
    """Vocabulary rows of the output layer on one of the t ranks that split it:

        V_t = ceil(V / (d t)) d     padded (Megatron-LM `_vocab_size_with_padding`: V up to a
                                    multiple of d t, d = --make-vocab-size-divisible-by = 128)
        V_t = floor(V / t)          d = 0: no padding (vTrain's sharded GPT model)
    d = training.vocab_pad_to. Example: V = 50257, t = 8: d = 128 -> 6400 (51200 in all);
    d = 0 -> 6282. Constant in every System leaf (no gradient flows through the rounding).
    """
    t = head_shards(parallel)
    d = jnp.maximum(training.vocab_pad_to, 1.0)
    padded = jnp.ceil(model.vocab / (d * t) - 1e-6) * d
    return jnp.where(training.vocab_pad_to > 0, padded, jnp.floor(model.vocab / t + 1e-6))


# ---------------------------------------------------------------- low precision (FP8 / FP4)
# Rows of `layer_ops(...).dense` that are linear layers, whose GEMMs a Transformer Engine
# low-precision recipe runs in FP8 / FP4: QKV, output projection, MLP up and down, routed
# experts up and down, shared experts up and down. The router (row 4) is not a TE linear
# (Megatron-Core computes its logits in fp32/bf16), and the attention core and the output
# layer are separate ops that stay 16-bit (docs/precision.md). Rows 9-11 (branch models: MLA's
# down and up projections, TE Linear layers in Megatron-Core's MLA) are linears too; DeepSeek-V3
# report Section 3.3.1 keeps only the embedding, output head, gating, norms and attention core
# in higher precision. (Merge of branches prec and models: prec had the 9 rows before MLA.)
LOWP_LINEAR_ROWS = (1.0, 1.0, 1.0, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0)


def lowp_pass_fracs(training):
    """(fprop, dgrad, wgrad) fraction of each dense GEMM row that runs in low precision:

        l_pass[r] = linear[r] x lambda x on_pass
    linear = `LOWP_LINEAR_ROWS`, lambda = training.lowp_layer_frac (the share of layers whose
    linears the recipe quantizes; the others run in BF16), on_pass = training.lowp_fprop /
    lowp_dgrad / lowp_wgrad. Averaging over layers is exact: a layer is either quantized or
    not, and the layer time is summed over layers. All 0 for the 16-bit presets.
    Source: Transformer Engine user guide, "Using FP8 with Transformer Engine": the
    fp8_autocast region runs the forward GEMM and both backward GEMMs (dgrad, wgrad) of every
    TE Linear / LayerNormLinear / LayerNormMLP / GroupedLinear in FP8 [B].
    """
    rows = jnp.asarray(LOWP_LINEAR_ROWS) * training.lowp_layer_frac
    return (rows * training.lowp_fprop, rows * training.lowp_dgrad, rows * training.lowp_wgrad)


def quantized_elem_bytes(training):
    """Bytes per quantized element, scales included:

        e_q = q_lp + q_s / B        (B = 0: one scale per tensor, nothing per element)
    q_lp = training.lowp_bytes (FP8: 1, FP4 E2M1: 0.5), q_s = lowp_scale_bytes, B =
    lowp_block. Examples: MXFP8 (OCP MX v1.0: 1 x 32 blocks, E8M0 scale) 1 + 1/32 = 1.03125;
    NVFP4 (1 x 16, E4M3 scale) 0.5 + 1/16 = 0.5625; DeepSeek-V3 blockwise (1 x 128, fp32)
    1 + 4/128 = 1.03125; per-tensor FP8 1.
    """
    block = training.lowp_block
    return training.lowp_bytes + jnp.where(block > 0, training.lowp_scale_bytes
                                           / jnp.maximum(block, 1.0), 0.0)


def cast_bytes(elements, read_bytes, copies, needed, training, amax=None):
    """HBM bytes of quantizing one 16-bit tensor of `elements` into `copies` quantized copies:

        bytes = N [ needed q_in (1 + a) + c e_q ]
    q_in = read_bytes (the 16-bit source), a = training.lowp_amax_pass (current scaling reads
    the tensor once more for its amax before the cast; delayed scaling takes the amax inside
    the cast kernel; block scaling finds each block's amax in the kernel itself), c = copies
    (row-wise for one GEMM operand, column-wise / transposed for the other: TE's fused
    cast-transpose reads once and writes both), e_q = `quantized_elem_bytes`, needed = 1 when
    any copy is made (then the source is read), else 0.
    Example: a BF16 activation of 8192 x 8192 into FP8 row- and column-wise with current
    scaling: 67.1e6 x (2 x 2 + 2 x 1) = 402.7 MB; delayed scaling: 67.1e6 x 4 = 268.4 MB.
    `amax` (default training.lowp_amax_pass) replaces a where the amax is taken elsewhere
    (`te_quantize_rows`: Transformer Engine's norm kernel computes it for a LayerNormLinear).
    Source: Transformer Engine, Float8CurrentScaling / DelayedScaling recipe docs (per-tensor
    amax: current vs history), MXFP8BlockScaling docs (both row-wise and column-wise MXFP8
    copies, each scaled along its own GEMM-reduction direction) [B].
    """
    a = training.lowp_amax_pass if amax is None else amax
    return elements * (needed * read_bytes * (1.0 + a)
                       + copies * quantized_elem_bytes(training))


def _recipe_kinds(training):
    """(per-tensor FP8, current scaling, delayed scaling) indicators of the low-precision
    preset: per-tensor = no block scales and not FP4; current = per-tensor with an amax pass
    (TE Float8CurrentScaling); delayed = per-tensor without one (TE DelayedScaling)."""
    a = training.lowp_amax_pass
    per_tensor_fp8 = jnp.where(training.lowp_block > 0, 0.0, 1.0) * (1.0 - training.lowp_fp4)
    return per_tensor_fp8, a * per_tensor_fp8, (1.0 - a) * per_tensor_fp8


class TeRows(NamedTuple):
    """`te_quantize_rows`' result: where Transformer Engine's quantization differs from the
    project's generic count, per dense GEMM row of `layer_ops` (12 rows)."""
    norm_fed: Any   # the row's input is a LayerNormLinear's: amax in the norm kernel
    saved: Any      # the row's 16-bit input is saved and quantized again in the backward
    both: Any       # ... and that backward quantize writes both usages (per-tensor FP8)
    one_buffer: Any  # a scalar: one FP8 buffer serves both usages (non-TN FP8 GEMMs)
    swizzles: Any   # (x_f, w_f, x_b, w_b, y_b): MXFP8 scale-swizzle kernels per operand


def te_quantize_rows(model, parallel, training, system=None) -> TeRows:
    """TeRows(norm_fed, saved, both, one_buffer, swizzles): per dense GEMM row of `layer_ops`
    (12 rows), where Transformer Engine's quantization of the row's input differs from one
    standalone quantize, under training.lowp_te_quantizer (0: all 0, the project's generic
    count); whether a per-tensor FP8 tensor keeps one buffer for both usages (a scalar); the
    MXFP8 scale swizzles per operand:

        norm_fed[r] = te cs (1 - cudnn) x (row 0 QKV: 1 without MLA, [q_lora_rank > 0] with
                               MLA (W^UQ); row 2 dense fc1: 1; row 11 MLA W^UK;W^UV: 1)
        saved[r]    = te (1 - ds) x (row 1 proj: 1; row 6 routed fc2: moe_act;
                                     row 7 shared fc1: 1 - shared_experts)
        both[r]     = saved[r] x per-tensor FP8 x (1 - [r = 7] g),   g = [sp and t > 1]
    te = lowp_te_quantizer, cs / ds = per-tensor current / delayed scaling (`_recipe_kinds`),
    moe_act / shared_experts = Megatron's selective recompute modules
    (`workload.recompute.megatron_module_fracs`).
    norm_fed: the linear is a TE LayerNormLinear (Megatron-Core's TE layer spec,
    models/gpt/gpt_layer_specs.py core_v0.14-0.18: linear_qkv =
    TELayerNormColumnParallelLinear; the dense MLP's fc1 the same (pre_mlp_layernorm =
    IdentityOp without experts); with MLA, linear_q_up_proj / linear_kv_up_proj fused with the
    q / kv latent norms). Its norm under current scaling is TE's FUSED_NORM_AMAX_FP8 path
    (pytorch/csrc/extensions/normalization.cpp, v2.7-v2.16): the norm kernel writes the 16-bit
    output and its amax, then `quantize_with_amax` runs the scale and the cast: no amax
    kernel and no amax read of the tensor; `amax.zero_()` before the norm stays a kernel.
    cudnn = training.te_cudnn_norm: with NVTE_NORM_FWD_USE_CUDNN set, normalization.cpp
    (v2.9-v2.16: `IsFloat8CurrentScalingQuantizers(...) && !getenv("NVTE_NORM_FWD_USE_CUDNN")`)
    keeps the UNFUSED path: the norm writes its 16-bit output, then the quantizer's full
    `quantize` (4 kernels, amax read), as for a plain Linear. (MXFP8 under the variable: the
    cuDNN norm writes MXFP8 itself for 128-aligned shapes, FULLY_FUSED; not modelled here.)
    saved: Megatron-Core calls `set_save_original_input` (TE >= 2.6, recipe not delayed; FP4
    from core_v0.16): linear_proj always (transformer/attention.py, multi_latent_attention.py),
    the shared experts' fc1 unless they are recomputed (moe/shared_experts.py), the routed
    experts' fc2 under recompute "moe_act" (moe/experts.py TEGroupedMLP: its input is the
    discarded, recomputed activation). TE then quantizes the input row-wise only in the
    forward and quantizes the saved 16-bit input again in the backward for the wgrad GEMM
    (pytorch/module/linear.py `_Linear.backward`, "Quantize input tensor"; grouped_linear.py:
    split_quantize of the saved input under `ctx.save_original_input`; v2.7-v2.16).
    both: that backward quantize writes the row-wise and the column-wise copy, not the
    column-wise one alone, for TE's per-tensor FP8 quantizers (Float8Quantizer,
    Float8CurrentScalingQuantizer: `supports_only_rowwise_all_gather()` is True):
    linear.py sets usage rowwise=True, columnwise=not backward_input_needs_gather;
    grouped_linear.py rowwise=True, columnwise=True for those two classes (MXFP8 / NVFP4:
    column-wise only); v2.7-v2.16. backward_input_needs_gather = column-parallel with
    sequence parallelism: of the saved rows only the shared experts' fc1 (row 7) when
    sp and t > 1 (Megatron turns SP off at t = 1); its FP8 transpose after the gather is not
    counted, as for the gathered inputs of rows 0 and 2.
    Not read (0 here): "layernorm" recompute's saved inputs (no quantized Bridge row runs it).
        one_buffer = te x per-tensor FP8 x system.fp8_non_tn_gemm       (system None: 0)
    one_buffer: on a GPU whose FP8 GEMMs take non-TN layouts (Blackwell sm100 / sm103:
    `nvte_is_non_tn_fp8_gemm_supported()`, common/transformer_engine.cpp, v2.7-v2.16) TE's
    per-tensor FP8 quantizers (Float8Quantizer, Float8CurrentScalingQuantizer) allocate the
    transposed column-wise buffer only when `columnwise_usage && !non_tn_fp8_gemm_supported()`
    (pytorch/csrc/quantizer.cpp `create_tensor`): the cast writes one FP8 copy whatever the
    usages (same kernel count: a cast instead of a cast-transpose). `lowp_quantize_bytes`
    then charges max(usages) copies instead of their sum. MXFP8 / NVFP4 keep both copies
    (scaled along different directions): not affected.
    swizzles = (x_f, w_f, x_b, w_b, y_b): per row, the MXFP8 scale-swizzle kernels of its
    input X, weight W and output gradient dY, forward and backward, one micro-batch:
        te_scale_swizzle 1 (TE 2.7 / 2.9): x_f = w_f = x_b = w_b = 1, y_b = 2
        te_scale_swizzle 2 (TE 2.12-2.16): w_f = w_b = 1, x_f = x_b = col_r g, y_b = 2 row_r g
    (0 otherwise; x te). TE 2.7 / 2.9 `pytorch/csrc/extensions/gemm.cpp` `gemm` calls
    `swizzle_scaling_factors(A_tensor, transa)` and `(B_tensor, !transb)` before every GEMM,
    one `nvte_swizzle_scaling_factors` kernel per MXFP8 operand (`csrc/util.cpp`); the grouped
    GEMM (`te_general_grouped_gemm`) one `nvte_multi_tensor_swizzle_scaling_factors` per operand
    list. fprop X, W; dgrad dY, W; wgrad X, dY. TE 2.12-2.16 `swizzle_scales_for_gemm`
    (`csrc/extensions/swizzle.cpp`) returns early for tensors with `with_gemm_swizzled_scales`,
    which the quantizers with `optimize_for_gemm` write: `module/linear.py` /
    `layernorm_linear.py` `_get_quantizers` set it on the input unless column-parallel with
    sequence parallelism and on dY unless row-parallel with it; `grouped_linear.py` on every
    input and dY; no weight quantizer sets it. col_r = rows 0, 2, 7 (QKV, dense fc1, shared fc1:
    column-parallel), row_r = rows 1, 3, 8 (proj, fc2, shared fc2), g = [sp and t > 1] as
    above. MLA's rows 9-11: weights only (their gathers not read). The bytes: each swizzle reads
    and writes the operand's scales (`lowp_quantize_bytes`).
    Example, Llama 3 70B FP8-CS: norm_fed = (1, 0, 1, 0, ..., 0), saved = both =
    (0, 1, 0, ..., 0), one_buffer 1 on B200 / GB200 / B300 / GB300, 0 on H100; MXFP8:
    norm_fed = both = 0, saved the same, one_buffer 0.
    """
    from diffperf.workload.recompute import megatron_module_fracs
    te = training.lowp_te_quantizer
    pt, cs, ds = _recipe_kinds(training)
    mla = is_mla(model)
    row0 = jnp.where(mla > 0, jnp.where(model.q_lora_rank > 0, 1.0, 0.0), 1.0)
    one, zero = jnp.ones_like(row0), jnp.zeros_like(row0)
    norm_fed = te * cs * (1.0 - training.te_cudnn_norm) * _rows(
        [row0, zero, one, zero, zero, zero, zero, zero, zero, zero, zero, one])
    mods = megatron_module_fracs(parallel)
    saved = te * (1.0 - ds) * _rows([zero, one, zero, zero, zero, zero,
                                     mods["moe_act"] * one,
                                     (1.0 - mods["shared_experts"]) * one,
                                     zero, zero, zero, zero])
    gather = jnp.where((parallel.sequence_parallel > 0) & (parallel.tp > 1), 1.0, 0.0)
    both = saved * pt * (1.0 - gather * _rows([zero] * 7 + [one] + [zero] * 4))
    one_buffer = 0.0 if system is None else te * pt * system.fp8_non_tn_gemm
    # MXFP8 scale swizzles per GEMM operand (te_scale_swizzle 1: TE 2.7 / 2.9; 2: 2.12-2.16)
    old = te * jnp.where(training.te_scale_swizzle == 1, 1.0, 0.0)
    new = te * jnp.where(training.te_scale_swizzle == 2, 1.0, 0.0)
    col = _rows([one, zero, one, zero, zero, zero, zero, one, zero, zero, zero, zero]) * gather
    row = _rows([zero, one, zero, one, zero, zero, zero, zero, one, zero, zero, zero]) * gather
    ones = _rows([one] * 12)
    swizzles = (old * ones + new * col, (old + new) * ones,            # forward X, W
                old * ones + new * col, (old + new) * ones,            # backward X, W
                2.0 * old * ones + 2.0 * new * row)                    # backward dY
    return TeRows(norm_fed, saved, both, one_buffer, swizzles)


def _copies(row, col, one_buffer):
    """Quantized copies written for a tensor used row-wise `row` and column-wise `col` times
    (0 / 1 each): row + col, or max(row, col) where one FP8 buffer serves both usages
    (`te_quantize_rows` one_buffer: Blackwell per-tensor FP8 under TE)."""
    return (1.0 - one_buffer) * (row + col) + one_buffer * jnp.maximum(row, col)


def lowp_quantize_bytes(dense, training, te_rows=None):
    """(forward, backward, weight) HBM bytes of a layer's quantization work, one micro-batch:

        forward   sum_r c_r l_r  cast(m k, q_a; copies f + w (1 - s_r); amax a (1 - n_r))
                                                                   inputs X of each linear
        backward  sum_r c_r l_r [cast(m n, q_a; copies d + w)      output gradients dY
                                 + s_r cast(m k, q_a; copies w (1 + b_r))]
                                                                   saved 16-bit X, again
        weights   sum_r c_r l_r  cast(k n, q_w; copies f + d)     weights W (once a step
                                                                   when cached, `lowp_weight_cache`)
    for each dense GEMM row r = (m x k)(k x n) done c_r times; l_r = `LOWP_LINEAR_ROWS` x
    lowp_layer_frac; f, d, w = training.lowp_fprop, lowp_dgrad, lowp_wgrad; (n_r, s_r, b_r) =
    te_rows' (norm_fed, saved, both) (`te_quantize_rows`; None: 0, 0, 0). X feeds fprop
    (row-wise) and wgrad (column-wise, X^T), dY feeds dgrad (row-wise) and wgrad
    (column-wise), W feeds fprop and dgrad (W^T). Source: Transformer Engine, "Using FP8 with
    Transformer Engine" (each GEMM's two inputs in FP8; Hopper FP8 GEMMs take only the TN
    layout, so the transposed copies are materialised) and the MXFP8 / NVFP4 recipe docs
    (row-wise and column-wise quantized copies) [B]. Not modelled: the fusion of the cast
    into the preceding LayerNorm (TE LayerNormLinear with delayed scaling writes FP8
    directly), which saves one 16-bit write and read of that input.
    Example (one row, m = k = n = 1024, c = 1, FP8-CS): no TE rows 2^20 (2 x 2 + 2) B
    forward; norm-fed 2^20 (2 + 2) B; saved: forward 2^20 (2 x 2 + 1), backward + 2^20 (2 x 2
    + 2) B (row- and column-wise again, b_r = 1); MXFP8 (a = 0, the column-wise copy alone):
    backward + 2^20 (2 + 1.03125) B.
    One FP8 buffer (o = te_rows' one_buffer: Blackwell, per-tensor FP8 under TE): every copy
    count row + col above becomes (1 - o)(row + col) + o max(row, col) (`_copies`). The FP8-CS
    row on B200 (o = 1): forward 2^20 (2 x 2 + 1) B, dY 2^20 (2 x 2 + 1) B, weight 2^20 (2 x 2
    + 1) B (each one FP8 copy fewer); saved input's backward + 2^20 (2 x 2 + 1) B.
    Source: TE `create_tensor`, see `te_quantize_rows`. MXFP8 scale swizzles (te_rows.swizzles,
    `te_quantize_rows`): forward + 2 s_e c_r l_r (x_f m k + w_f k n) f, backward
    + 2 s_e c_r l_r (w_b k n d + x_b m k w + y_b m n (d + w) / 2), s_e = lowp_scale_bytes /
    lowp_block (each swizzle reads and writes the operand's scales).
    """
    f, d, w = training.lowp_fprop, training.lowp_dgrad, training.lowp_wgrad
    rows = jnp.asarray(LOWP_LINEAR_ROWS) * training.lowp_layer_frac * dense.count
    q_a, q_w = training.activation_bytes, training.weight_bytes
    if te_rows is None:
        fwd = cast_bytes(dense.m * dense.k, q_a, f + w, jnp.maximum(f, w), training)
        again, ob = 0.0, 0.0
    else:
        norm_fed, saved, both, ob, _ = te_rows
        fwd = cast_bytes(dense.m * dense.k, q_a, _copies(f, w * (1.0 - saved), ob),
                         jnp.maximum(f, w), training,
                         training.lowp_amax_pass * (1.0 - norm_fed))
        again = saved * cast_bytes(dense.m * dense.k, q_a, _copies(w * both, w, ob), w,
                                   training)
    bwd = cast_bytes(dense.m * dense.n, q_a, _copies(d, w, ob), jnp.maximum(d, w), training)
    wts = cast_bytes(dense.k * dense.n, q_w, _copies(f, d, ob), jnp.maximum(f, d), training)
    if te_rows is not None:
        # MXFP8 scale swizzles: read and write one operand's scales (s_e bytes an element)
        x_f, w_f, x_b, w_b, y_b = te_rows.swizzles
        s_e = 2.0 * training.lowp_scale_bytes / jnp.maximum(training.lowp_block, 1.0)
        mk, kn, mn = dense.m * dense.k, dense.k * dense.n, dense.m * dense.n
        fwd = fwd + s_e * (x_f * mk + w_f * kn) * f
        bwd = bwd + s_e * (w_b * kn * d + x_b * mk * w + y_b * mn * (d + w) / 2.0)
    return jnp.sum(rows * fwd), jnp.sum(rows * (bwd + again)), jnp.sum(rows * wts)


# Kernels Transformer Engine launches for one per-tensor FP8 current-scaling quantize
# (`Float8CurrentScalingQuantizer::quantize`, pytorch/csrc/quantizer.cpp, v2.7-v2.16):
# zero_amax_kernel and the amax reduction (`nvte_compute_amax`), compute_scale_from_amax_kernel
# (`nvte_compute_scale_from_amax`, one thread) and the cast (`nvte_quantize_v2`)
# (common/recipe/current_scaling.cu).
TE_CURRENT_SCALING_KERNELS = 4.0


def lowp_quantize_kernels(dense, training, te_rows=None):
    """(forward, backward, weight) kernels of the quantization, one layer, one micro-batch:
    one fused cast(-transpose) kernel per quantized tensor, + one amax reduction kernel each
    under current scaling; tensors = the active linear rows (c_r > 0) x lowp_layer_frac.
    Under training.lowp_te_quantizer a per-tensor FP8 current-scaling quantize is Transformer
    Engine's: `TE_CURRENT_SCALING_KERNELS` = 4 kernels per tensor (inputs, output gradients,
    weights), 3 for a LayerNormLinear's input (the amax inside the norm kernel: n_r of
    `te_quantize_rows`), and a saved 16-bit input (s_r) is quantized once more in the
    backward:

        k_tensor = 1 + a + te (TE_CURRENT_SCALING_KERNELS - 2) cs
        forward  sum_r l_r on_r (k_tensor - te_cs n_r)      backward  sum_r l_r on_r k_tensor
                 (x max(f, w))                                        (x max(d, w))
                                                            + w sum_r l_r on_r s_r k_tensor
    (the project's generic count 1 + a: one cast and, under current scaling, one amax pass;
    a = lowp_amax_pass, te = lowp_te_quantizer, cs = per-tensor FP8 with an amax pass).
    Under training.moe_expert_loop the routed-expert rows (`EXPERT_ROWS`) quantize each local
    expert's slice on its own: c_r = phi E / e tensors instead of 1 (Transformer Engine
    `split_quantize` -> `multi_tensor_quantize_impl`, "Quantize kernels individually" for every
    quantizer but FP8 delayed scaling, v2.7-v2.16 `pytorch/csrc/extensions/cast.cpp`), each
    slice at TE's own kernel count:

        k_slice = 1 + a + (TE_CURRENT_SCALING_KERNELS - 2) cs      cs = per-tensor FP8 with
                                                                    an amax pass (current)
    (MXFP8 / blockwise 1, FP8 current scaling 4: `TE_CURRENT_SCALING_KERNELS`). FP8 delayed
    scaling (per-tensor, no amax pass) quantizes the split inputs and output gradients with one
    fused `nvte_multi_cast_transpose` (up to 64 tensors a launch): 1 kernel per expert row, as
    without the loop; its weights (one quantizer per expert, `get_weight_workspace`) E / e.
    NVFP4 keeps 1 + a per slice (v2.12+ runs a grouped amax before per-slice casts; not a row
    of the fact). DeepSeek-V3 MXFP8 at e 8: 2 x 0.9508 x 32 = 60.85 quantize kernels for the
    two expert inputs in the forward, not 2; FP8 current scaling 4 x 60.85 = 243.4, not 4.
    Llama 3 70B FP8-CS under lowp_te_quantizer (4 linears, QKV and fc1 norm-fed, proj saved):
    forward 3 + 4 + 3 + 4 = 14 (generic 8), backward 4 x 4 + 4 = 20 (generic 8), weights 16.
    MXFP8 scale swizzles (te_rows.swizzles, `te_quantize_rows`, Training.te_scale_swizzle):
    forward + sum_r l_r on_r (x_f + w_f) f, backward + sum_r l_r on_r (w_b d + x_b w
    + y_b (d + w) / 2); Llama 3 70B MXFP8 TP 4 SP: TE 2.7 / 2.9 + 8 / + 16, TE 2.12+ + 6 / + 10."""
    f, d, w = training.lowp_fprop, training.lowp_dgrad, training.lowp_wgrad
    a = training.lowp_amax_pass
    _, current, delayed = _recipe_kinds(training)
    k_slice = 1.0 + a + (TE_CURRENT_SCALING_KERNELS - 2.0) * current
    on = jnp.where(dense.count > 0, 1.0, 0.0)
    each = jnp.asarray(EXPERT_ROWS) * training.moe_expert_loop
    lin = jnp.asarray(LOWP_LINEAR_ROWS) * training.lowp_layer_frac
    sliced = each * dense.count * k_slice
    if te_rows is None:
        plain = (1.0 - each) * on * (1.0 + a)
        act = jnp.sum(lin * (plain + (1.0 - delayed) * sliced + delayed * each * on))
        wts = jnp.sum(lin * (plain + sliced))
        return act * jnp.maximum(f, w), act * jnp.maximum(d, w), wts * jnp.maximum(f, d)
    norm_fed, saved = te_rows.norm_fed, te_rows.saved
    x_f, w_f, x_b, w_b, y_b = te_rows.swizzles  # MXFP8 scale swizzles (te_quantize_rows)
    sw_f = jnp.sum(lin * on * (x_f + w_f)) * f
    sw_b = jnp.sum(lin * on * (w_b * d + x_b * w + y_b * (d + w) / 2.0))
    k_tensor = 1.0 + a + training.lowp_te_quantizer * (TE_CURRENT_SCALING_KERNELS - 2.0) * current
    plain = (1.0 - each) * on * k_tensor
    rest = (1.0 - delayed) * sliced + delayed * each * on
    act_f = jnp.sum(lin * (plain - (1.0 - each) * on * norm_fed + rest))
    act_b = jnp.sum(lin * (plain + rest))
    again = jnp.sum(lin * saved * (plain + sliced))
    wts = jnp.sum(lin * (plain + sliced))
    return (act_f * jnp.maximum(f, w) + sw_f, act_b * jnp.maximum(d, w) + again * w + sw_b,
            wts * jnp.maximum(f, d))

