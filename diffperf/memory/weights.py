"""Model-state memory per device under ZeRO (Rajbhandari et al. SC20, Section 3.1, Figure 1).

PAPERS.md section 5.5: per device, Psi parameters, N_d data-parallel ranks, K = master +
optimizer bytes:  DP (2 + 2 + K) Psi; ZeRO-1 2 Psi + 2 Psi + K Psi / N_d;
ZeRO-2 2 Psi + (2 + K) Psi / N_d; ZeRO-3 (2 + 2 + K) Psi / N_d.
Example: Psi = 7.5e9, N_d = 64, K = 12: 120 GB, 31.4 GB, 16.6 GB, 1.875 GB.
"""

from __future__ import annotations

import jax.numpy as jnp


def _shard(parallel, from_stage):
    """N_d when the ZeRO stage shards this state (stage >= from_stage), else 1."""
    return jnp.where(parallel.zero_stage >= from_stage, parallel.dp, 1.0)


def weight_bytes(params, parallel, training):
    """Psi (q_w + q_cast), divided by N_d under ZeRO-3 (FSDP); q_cast = 16-bit copies of
    fp32 weights that autocast keeps for the backward (0 for Megatron-style mixed precision)."""
    return params * (training.weight_bytes + training.cast_weight_bytes) / _shard(parallel, 3)


def gradient_bytes(params, parallel, training):
    """Psi q_g, divided by N_d under ZeRO-2 and -3."""
    return params * training.grad_bytes / _shard(parallel, 2)


def optimizer_bytes(params, parallel, training):
    """Psi (q_master + q_opt) = K Psi, divided by N_d under ZeRO-1, -2 and -3."""
    return params * (training.master_bytes + training.optimizer_bytes) / _shard(parallel, 1)
