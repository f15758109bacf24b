"""Expert parallelism: the token all-to-alls of an MoE layer and the expert-gradient group.

Source: PAPERS.md section 5.8 [D] (pattern from GShard, Lepikhin et al. 2020, and Switch
Transformer, Fedus et al. 2021); Megatron-Core places the expert-parallel group inside the
data-parallel ranks (workload.groups: ep shares dp's stride).
"""

from __future__ import annotations

import jax.numpy as jnp
from jax.scipy.special import gammaln

from diffperf.workload.flops import moe_layer_fraction, tokens_per_device
from diffperf.workload.recompute import full_frac


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
        recompute: the recomputed forward dispatches and combines again; x the share of the
        layers checkpointed, `workload.recompute.full_frac`).
    Selective recompute (attention core only) adds none. Source: PAPERS.md section 5.8 [D].
    """
    return 2.0, 2.0 + 2.0 * full_frac(parallel)


def expert_tp(parallel):
    """t_e: ranks that split each routed expert's matrices (expert tensor parallelism),

        t_e = etp  when etp > 0,   t_e = t  when etp = 0 (the layout before etp existed)
    Source: Megatron-Core `--expert-tensor-parallel-size` (defaults to the TP size); the
    Megatron-Bridge MoE recipes set it to 1 (e.g. recipes/deepseek/h100/deepseek_v3.py,
    `expert_tensor_parallel_size = 1`).
    """
    return jnp.where(parallel.etp > 0, parallel.etp, parallel.tp)


def expert_dp_degree(parallel):
    """Ranks that hold the same experts and reduce their gradients:

        N_e = t c d / (t_e e)
    Megatron-Core lays the expert layers' ranks out as t_e x e x N_e over the t x c x d ranks
    of a pipeline stage (parallel_state: the expert RankGenerator with tp = etp, ep, dp =
    expert data parallel, order tp-ep-dp-pp); the N_e groups hold copies (the c context-parallel
    ranks hold the same weights, PAPERS.md section 3.5). With t_e = t (etp = 0) this is the
    (d / e) x c of the layout before etp. Source: Megatron-Core expert data parallelism [S];
    PAPERS.md section 5.8.
    Examples: d = 16, e = 8, c = 1, t_e = t -> 2; t = 2, d = 16, e = 32, t_e = 1 -> 1.
    """
    return parallel.tp * parallel.cp * parallel.dp / (expert_tp(parallel) * parallel.ep)


def expert_token_share(parallel):
    """t_e / t: the tokens a rank's experts see relative to the b s / c of its micro-batch.

    With sequence parallelism (required for MoE with t > 1) a rank routes T / t tokens; its
    expert-TP group of t_e ranks gathers those of its t_e members, so the expert GEMMs see
    T t_e / t tokens times k e / E (`workload.flops.layer_ops`). t_e = t gives the old
    T k e / E (the TP group gathers its sequence shards first); t_e = 1 < t: each rank's experts
    see only the tokens dispatched to them. Source: Megatron-Core MoE token dispatcher
    (alltoall: all-gather over the expert-TP group after the all-to-all over EP).
    Example: t = 2, t_e = 1 -> 0.5.
    """
    return expert_tp(parallel) / parallel.tp


def ep_stride(parallel, dp_stride):
    """Rank distance of the EP group's members: inside dp (stride of dp) for etp = 0, or
    t_e in Megatron-Core's expert rank order tp-ep-dp (etp > 0: the EP group takes adjacent
    ranks after the expert-TP ones, so EP fills an NVLink domain before DP does)."""
    return jnp.where(parallel.etp > 0, expert_tp(parallel), dp_stride)


def moe_mlp_on_tp(model, parallel):
    """1 when the layer's MLP runs on the TP group (a dense layer, or experts split by t_e =
    t); 0 for an MoE layer whose experts are not TP-split (t_e < t): its tokens go straight
    to the EP all-to-all from their sequence shard, with no TP all-gather / reduce-scatter
    around the MLP (Megatron-Core alltoall dispatcher with sequence parallelism). For the mean
    layer of a model with dense layers: 1 - phi [t_e < t] (phi = `moe_layer_fraction`)."""
    phi = moe_layer_fraction(model)  # the mean layer: its share of MoE layers
    return 1.0 - phi * jnp.where(expert_tp(parallel) < parallel.tp, 1.0, 0.0)


def domain_hit_fraction(k, E, N):
    """p: probability that a token's k distinct routed experts include at least one of the
    E / N experts of a given domain, experts spread evenly over N domains and chosen uniformly
    (force-balanced routing: every expert gets k T / E tokens on average):

        p = 1 - C(E - E/N, k) / C(E, k)      (hypergeometric; 0 for N = 1)
    Evaluated with log-gamma, so it is smooth in N (the domain count has a gradient).
    Example: k = 8, E = 128, N = 2: 1 - C(64, 8) / C(128, 8) = 0.9969.
    """
    rest = E - E / jnp.maximum(N, 1.0)
    ok = rest - k + 1.0 > 0.0
    rest_safe = jnp.where(ok, rest, k)
    log_miss = (gammaln(rest_safe + 1.0) - gammaln(rest_safe - k + 1.0)
                - gammaln(E + 1.0) + gammaln(E - k + 1.0))
    return jnp.where(N > 1.0, 1.0 - jnp.where(ok, jnp.exp(log_miss), 0.0), 0.0)
