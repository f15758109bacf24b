"""Model-state memory per device under ZeRO (Rajbhandari et al. SC20, Section 3.1, Figure 1).

PAPERS.md section 5.5: per device, Psi parameters, N_d data-parallel ranks, K = master +
optimizer bytes:  DP (2 + 2 + K) Psi; ZeRO-1 2 Psi + 2 Psi + K Psi / N_d;
ZeRO-2 2 Psi + (2 + K) Psi / N_d; ZeRO-3 (2 + 2 + K) Psi / N_d.
Example: Psi = 7.5e9, N_d = 64, K = 12: 120 GB, 31.4 GB, 16.6 GB, 1.875 GB.

The ranks that hold the same weights are the data-parallel ranks times the context-parallel
ranks, N_d = d c (PAPERS.md section 3.5: states sharded over d x c); routed experts are
replicated only over N_e = d c / e (workload.ep.expert_dp_degree). Under HSDP (zero_shard =
g > 0) the states are sharded over g of them and replicated across the rest. `expert_params` is the part
of `params` that is routed experts (0 for a dense model).
"""

from __future__ import annotations

import jax.numpy as jnp

from diffperf.workload.dp import zero_groups
from diffperf.workload.ep import expert_dp_degree


def _sharded(params, expert_params, parallel, from_stage):
    """(Psi - Psi_e) / N_d + Psi_e / N_e when the ZeRO stage shards this state
    (stage >= from_stage), else Psi; N_d, N_e = the ZeRO shard groups of the d c dense and
    the expert-data-parallel ranks (`workload.dp.zero_groups`: all of them, or zero_shard
    under HSDP)."""
    on = parallel.zero_stage >= from_stage
    n_d = jnp.where(on, zero_groups(parallel.dp * parallel.cp, 1.0, parallel)[0][0], 1.0)
    n_e = jnp.where(on, zero_groups(expert_dp_degree(parallel), 1.0, parallel)[0][0], 1.0)
    return (params - expert_params) / n_d + expert_params / n_e


def weight_bytes(params, parallel, training, expert_params=0.0):
    """Psi (q_w + q_cast), sharded under ZeRO-3 (FSDP); q_cast = 16-bit copies of fp32
    weights that autocast keeps for the backward (0 for Megatron-style mixed precision)."""
    return _sharded(params, expert_params, parallel, 3) * (
        training.weight_bytes + training.cast_weight_bytes)


def gradient_bytes(params, parallel, training, expert_params=0.0):
    """Psi q_g, sharded under ZeRO-2 and -3."""
    return _sharded(params, expert_params, parallel, 2) * training.grad_bytes


def optimizer_bytes(params, parallel, training, expert_params=0.0):
    """Psi (q_master + q_opt) = K Psi, sharded under ZeRO-1, -2 and -3."""
    return _sharded(params, expert_params, parallel, 1) * (
        training.master_bytes + training.optimizer_bytes)
