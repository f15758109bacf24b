"""Context parallelism: the K/V exchange of one layer, in ring or all-gather form.

Source: PAPERS.md section 5.7 [D] (Liu et al. 2023, Ring Attention; Megatron-Core CP);
NERSC 2D-seqp model (section 3.5) [C]. Causal attention is assumed load-balanced by zig-zag
chunking (each rank holds chunks i and 2c - 1 - i of the sequence), so every rank does
1/c of the attention work: `flops.layer_ops` counts b (a/t) (s/c) s kappa score elements per
rank, which is the total / c.
"""

from __future__ import annotations

import jax.numpy as jnp


def cp_kv_bytes(model, parallel, training):
    """S = b s a_kv (d_qk + d_v) q_a / t: the gathered K and V of the whole sequence (NCCL
    convention; = 2 b s a_kv d_h q_a / t when d_v = d_qk; MLA exchanges the up-projected
    per-head K and V, a_kv = a; under `Training.cp_torch` the a query heads: `cp_kv_heads`).

    All-gather form: forward one all-gather of S; backward all-gather of S again and
    reduce-scatter of dK, dV (same S). Ring attention sends the same (c - 1)/c S per rank in
    c - 1 steps (`cp_ring_block_bytes`).
    Example (Llama 3 70B: a_kv = 8, d_h = 128; b = 1, s = 8192, t = 8, bf16): 4.19 MB.
    """
    dv = jnp.where(model.v_head_dim > 0, model.v_head_dim, model.head_dim)
    return (parallel.micro_batch * model.seq_len * cp_kv_heads(model, training)
            * (model.head_dim + dv) * training.activation_bytes / parallel.tp)


def cp_kv_heads(model, training):
    """Heads of the K and V that the context-parallel attention exchanges: a_kv, or the a
    query heads under `Training.cp_torch` (PyTorch's experimental CP runs on SDPA's flash /
    efficient backends, which took K and V with the query heads: TorchTitan expands them with
    `repeat_kv` before `F.scaled_dot_product_attention`, models/llama/model.py
    Attention.forward at 9dec370, so the exchanged blocks carry a / a_kv x the bytes).
    Example: Llama 3 8B (a 32, a_kv 8): 8, or 32 with the fact."""
    return jnp.where(training.cp_torch > 0, model.n_heads, model.n_kv_heads)


def cp_ring_block_bytes(model, parallel, training):
    """S_blk = 2 b (s/c) a_kv d_h q_a / t: the K and V block one ring step sends to the next
    rank. A forward pass makes c - 1 such steps, each overlapped with the attention of the
    block already held; the backward circulates K, V and the dK, dV accumulators (2 S_blk per
    step). Source: PAPERS.md section 5.7 [D].
    Example (as `cp_kv_bytes`, c = 4): 4.19 MB / 4 = 1.05 MB.
    """
    return cp_kv_bytes(model, parallel, training) / parallel.cp


def cp_ring_steps(parallel):
    """c - 1 ring steps per pass: every rank receives the c - 1 blocks it does not hold."""
    return parallel.cp - 1.0


def cp_torch_elements(model, parallel, training):
    """(E_q, E_o, E_kv): elements of one rank's local Q, attention output and K + V (one
    layer, one micro-batch) in PyTorch's experimental context parallel (`Training.cp_torch`):

        E_q = b (s/c) a d_qk / t,   E_o = b (s/c) a d_v / t,   E_kv = b (s/c) a_x (d_qk + d_v) / t
    a_x = `cp_kv_heads` (a under the fact). Example: Llama 3 8B, b 1, s 262144, c 8, t 1:
    E_q = E_o = 32768 x 4096 = 134,217,728; E_kv = 2 E_q."""
    T = parallel.micro_batch * model.seq_len / parallel.cp / parallel.tp
    dv = jnp.where(model.v_head_dim > 0, model.v_head_dim, model.head_dim)
    a = model.n_heads
    return (T * a * model.head_dim, T * a * dv,
            T * cp_kv_heads(model, training) * (model.head_dim + dv))


def cp_torch_merge_bytes(model, parallel, training):
    """(forward, backward) HBM bytes of one layer's fp32 merging in PyTorch's experimental
    context parallel, one micro-batch, on the last CP rank (0 without the fact or at c = 1):

        forward   (c - 1) (8 + q_a) E_o
        backward  c (8 + q_a) (E_q + E_kv) + (4 + q_a) (E_q + E_kv)
    Source: pytorch torch/distributed/tensor/experimental/_attention.py (a version after PR
    142093 `set_rotate_method`, 2024-12-05, as the rows' torch 1963fc8 of 2024-12-23 is; the
    same loop at 0123248a, 2025),
    `_ContextParallelOptions.convert_to_f32 = True`. Forward (`_templated_ring_attention`,
    `_SDPAMerger.step` / `_merge_one`): every step i >= 1 casts the step's q_a-byte output to
    fp32 and merges it into the fp32 running output, out - sigmoid(lse_i - lse) (out - out_i);
    with the round-robin load balance the last rank (every i <= rank) merges its whole output
    each step, the others half of it plus a copy of the other half (`_partial_update`'s cat).
    Backward (`_templated_ring_attention_backward`): fp32 accumulators dQ, dK, dV
    (`torch.zeros_like(..., dtype=float32)`) take each step's q_a-byte gradients (+=, or
    `_partial_update` on the half the step touched), dK, dV are cat'ed into the fp32 buffer
    that the next rank receives, and at the end dQ and the received dK, dV are cast to q_a.
    Each step is counted as one pass that reads the fp32 accumulator and the step's q_a-byte
    result and writes the fp32 accumulator (4 + q_a + 4 B per element: the pointwise chain of
    a step fused into one kernel, as torch.compile generates; eager PyTorch runs each op as
    its own kernel and moves more), the final casts read 4 and write q_a bytes.
    Example (Llama 3 8B, b 1, s 262144, c 8, bf16, the fact): forward 7 x 10 x 134,217,728 =
    9.40 GB; backward (8 x 10 + 6) x 3 x 134,217,728 = 34.63 GB.
    """
    c, q = parallel.cp, training.activation_bytes
    E_q, E_o, E_kv = cp_torch_elements(model, parallel, training)
    on = jnp.where((training.cp_torch > 0) & (c > 1), 1.0, 0.0)
    fwd = (c - 1.0) * (8.0 + q) * E_o
    bwd = (c * (8.0 + q) + 4.0 + q) * (E_q + E_kv)
    return on * fwd, on * bwd


def cp_torch_dkv_block_bytes(model, parallel, training):
    """D = 4 E_kv: the fp32 dK, dV block that each backward step of PyTorch's experimental
    context parallel sends to the next rank (`_templated_ring_attention_backward`:
    `dkv_rotater = _create_rotater(..., method=_RotateMethod.ALL_TO_ALL)` whatever the K/V
    rotate method, `ft_c.permute_tensor` of the cat'ed fp32 grad_key, grad_value, c sends per
    layer backward, the last one waited after the loop). Example (Llama 3 8B, s 262144, c 8,
    the fact): 4 x 268,435,456 = 1.07 GB."""
    return 4.0 * cp_torch_elements(model, parallel, training)[2]
