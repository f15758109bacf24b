"""Model-state memory per device under ZeRO (Rajbhandari et al. SC20, Section 3.1, Figure 1).

PAPERS.md section 5.5: per device, Psi parameters, N_d data-parallel ranks, K = master +
optimizer bytes:  DP (2 + 2 + K) Psi; ZeRO-1 2 Psi + 2 Psi + K Psi / N_d;
ZeRO-2 2 Psi + (2 + K) Psi / N_d; ZeRO-3 (2 + 2 + K) Psi / N_d.
Example: Psi = 7.5e9, N_d = 64, K = 12: 120 GB, 31.4 GB, 16.6 GB, 1.875 GB.

The ranks that hold the same weights are the data-parallel ranks times the context-parallel
ranks, N_d = d c (PAPERS.md section 3.5: states sharded over d x c); routed experts are
replicated only over N_e = d c / e (workload.ep.expert_dp_degree). Under HSDP (zero_shard =
g > 0) the states are sharded over g of them and replicated across the rest. `expert_params`
is the part of `params` that is routed experts (0 for a dense model).
"""

from __future__ import annotations

import jax.numpy as jnp

from diffperf.workload.dp import gathered_weight_bytes, zero_groups
from diffperf.workload.ep import expert_dp_degree
from diffperf.workload.flops import quantized_elem_bytes


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
    weights that autocast keeps for the backward (0 for Megatron-style mixed precision).
    With FP8 primary weights (training.lowp_param_gather, Megatron --fp8-param-gather with
    TE's fp8_model_init) the weights held are the quantized ones: q_w ->
    `workload.dp.gathered_weight_bytes` (e_q; q_w itself otherwise), under a sharded
    optimizer only (zero_stage >= 1): Megatron-LM validate_args refuses --fp8-param-gather
    without the distributed optimizer or FSDP, so at ZeRO 0 a framework that sets it keeps
    16-bit weights (a search's row; `specs.validate.check_facts_act` refuses a given one)."""
    q_w = jnp.where(parallel.zero_stage >= 1, gathered_weight_bytes(training),
                    training.weight_bytes)
    return _sharded(params, expert_params, parallel, 3) * (q_w + training.cast_weight_bytes)


def gradient_bytes(params, parallel, training, expert_params=0.0):
    """Psi q_g, sharded under ZeRO-2 and -3."""
    return _sharded(params, expert_params, parallel, 2) * training.grad_bytes


def optimizer_bytes(params, parallel, training, expert_params=0.0):
    """Psi (q_master + q_opt) = K Psi, sharded under ZeRO-1, -2 and -3."""
    return _sharded(params, expert_params, parallel, 1) * (
        training.master_bytes + training.optimizer_bytes)


def lowp_weight_cache_bytes(cache_elems, parallel, training):
    """Quantized weight copies held beside the 16-bit weights and the fp32 master (FP8 / FP4
    recipes), sharded under ZeRO-3 like the weights:

        N_cache e_q            (/ N_d under ZeRO-3)
    N_cache = the stage's quantized weight elements (`workload.params.lowp_weight_cache_params`
    x layers: a row-wise copy for fprop and a column-wise one for dgrad of every quantized
    linear), e_q = `workload.flops.quantized_elem_bytes`. 0 for 16-bit presets.
    Example: Llama 3 70B, tp 4, pp 4 (20 layers), FP8 current scaling: a layer's linears
    hold h (a + 2 a_kv) d_h + a d_h h + 3 h f = 8.556e8 weights, 2.139e8 per tp rank;
    20 x 2.139e8 x 2 copies x 1 B = 8.56 GB. Source: Transformer Engine, the FP8 weight workspace
    kept across micro-batches (is_first_microbatch) of Linear / LayerNormLinear /
    LayerNormMLP, with its transpose for the backward on Hopper [B].
    """
    return _sharded(cache_elems, 0.0, parallel, 3) * quantized_elem_bytes(training)
