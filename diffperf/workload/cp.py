"""Context parallelism: K/V exchange per layer (all-gather form; ring form has the same volume).

Source: PAPERS.md section 5.7 [D] (Liu et al. 2023, Ring Attention; Megatron-Core CP);
NERSC 2D-seqp model (section 3.5) [C].
"""

from __future__ import annotations


def cp_kv_bytes(model, parallel, training):
    """S = 2 b s a_kv d_h q_a / t: the gathered K and V of the whole sequence (NCCL convention).

    Forward: one all-gather of S. Backward: all-gather of S again and reduce-scatter of dK, dV
    (same S). Ring attention sends the same (c - 1)/c S per rank in c - 1 steps.
    """
    return (2.0 * parallel.micro_batch * model.seq_len * model.n_kv_heads * model.head_dim
            * training.activation_bytes / parallel.tp)
