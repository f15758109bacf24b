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
    per-head K and V, a_kv = a).

    All-gather form: forward one all-gather of S; backward all-gather of S again and
    reduce-scatter of dK, dV (same S). Ring attention sends the same (c - 1)/c S per rank in
    c - 1 steps (`cp_ring_block_bytes`).
    Example (Llama 3 70B: a_kv = 8, d_h = 128; b = 1, s = 8192, t = 8, bf16): 4.19 MB.
    """
    dv = jnp.where(model.v_head_dim > 0, model.v_head_dim, model.head_dim)
    return (parallel.micro_batch * model.seq_len * model.n_kv_heads * (model.head_dim + dv)
            * training.activation_bytes / parallel.tp)


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
