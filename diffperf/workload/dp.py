"""Data parallelism and ZeRO: gradient reduction and parameter gathers.

Source: Rajbhandari et al. SC20 (ZeRO), Sections 3, 7.2; PAPERS.md section 5.5.
"""

from __future__ import annotations

import jax.numpy as jnp


def dp_volumes_bytes(params_local, layer_params_local, training):
    """Per-step DP volumes on one device (NCCL convention S):

        gradients  S_g = Psi_local q_g       (all-reduce; or reduce-scatter under ZeRO >= 1)
        parameters S_w = Psi_local q_w       (all-gather after the step under ZeRO 1-2)
        per layer  S_lw = Psi_layer q_w, S_lg = Psi_layer q_g   (ZeRO-3 gathers per layer)
    Ring cost is the same for AR as for RS + AG: 2 Psi elements moved (ZeRO table, section 5.5).
    """
    return (params_local * training.grad_bytes, params_local * training.weight_bytes,
            layer_params_local * training.weight_bytes, layer_params_local * training.grad_bytes)


def product_group(n_a, stride_a, n_b, stride_b):
    """(size, effective stride) of the group spanned by two orthogonal groups (e.g. the data-
    and context-parallel ranks that hold the same weights), for `costs.tiers.tier_ranks`:

        n = n_a n_b,   stride = max(s_in, s_out / n_in)
    with "in" the member group of the smaller stride (a group of one rank does not count).
    Then D / stride = min(D / s_in, n_in D / s_out) members per tier-D domain: exact when the
    inner group fits in the domain (n_in s_in <= D) or is adjacent to the outer one
    (s_out = n_in s_in, the product is one contiguous group of stride s_in) [D].
    Example: dp = 4 (stride 2) x cp = 2 (stride 1) -> (8, 1): one group of 8 adjacent ranks.
    """
    a_in = stride_a <= stride_b
    s_in = jnp.where(a_in, stride_a, stride_b)
    s_out = jnp.where(a_in, stride_b, stride_a)
    n_in = jnp.where(a_in, n_a, n_b)
    both = jnp.maximum(s_in, s_out / n_in)
    stride = jnp.where(n_a <= 1, stride_b, jnp.where(n_b <= 1, stride_a, both))
    return n_a * n_b, stride
