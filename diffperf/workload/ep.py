"""Expert parallelism: the token all-to-alls of an MoE layer and the expert-gradient group.

Source: PAPERS.md section 5.8 [D] (pattern from GShard, Lepikhin et al. 2020, and Switch
Transformer, Fedus et al. 2021); Megatron-Core places the expert-parallel group inside the
data-parallel ranks (workload.groups: ep shares dp's stride).
"""

from __future__ import annotations

import jax.numpy as jnp

from diffperf.workload.flops import moe_layer_fraction, tokens_per_device


def ep_routed_tokens(model, parallel):
    """T_r: tokens of one micro-batch that one rank routes,

        T_r = b s / c            (no sequence parallelism)
        T_r = b s / (c t)        (with SP the tokens are already split over the TP ranks)
    Source: PAPERS.md section 5.8.
    Example: b = 1, s = 4096, c = 1, t = 2 with SP -> 2048 tokens.
    """
    T = tokens_per_device(model, parallel)
    return T / jnp.where(parallel.sequence_parallel > 0, parallel.tp, 1.0)


def ep_a2a_bytes(model, parallel, training):
    """Per-rank send buffer S of one dispatch (or combine) all-to-all, NCCL convention:

        S = k C_f T_r h q_a           (0 for a dense model)
    k = top-k experts per token, C_f = capacity factor (1 = dropless), T_r = `ep_routed_tokens`,
    h = hidden, q_a = activation bytes. Under uniform routing (e - 1)/e of S leaves the rank.
    Source: PAPERS.md section 5.8 [D].
    Example (Mixtral 8x7B: k = 2, C_f = 1, h = 4096; b = 1, s = 4096, no SP, bf16):
    S = 2 x 4096 x 4096 x 2 = 67.1 MB.
    """
    phi = moe_layer_fraction(model)  # the mean layer: MoE layers only (phi = 1 - L_dense / L)
    return (phi * model.moe_topk * model.capacity_factor * ep_routed_tokens(model, parallel)
            * model.hidden * training.activation_bytes)


def ep_a2a_per_layer(parallel):
    """(forward, backward) all-to-alls per MoE layer per micro-batch:

        forward 2 (dispatch, combine); backward 2 (the gradients of both) (+2 with full
        recompute: the recomputed forward dispatches and combines again).
    Selective recompute (attention core only) adds none. Source: PAPERS.md section 5.8 [D].
    """
    full = parallel.recompute == 2
    return 2.0, 2.0 + 2.0 * full


def expert_dp_degree(parallel):
    """Ranks that hold the same experts and reduce their gradients: (d / e) x c.

    The e ranks of an expert-parallel group hold different experts; the d / e groups of them
    (and the c context-parallel ranks, which hold the same weights; PAPERS.md section 3.5)
    hold copies. Source: Megatron-Core expert data parallelism [S]; PAPERS.md section 5.8.
    Example: d = 16, e = 8, c = 1 -> 2.
    """
    return parallel.dp / parallel.ep * parallel.cp
