"""Placement of a communication group on the network tiers (PAPERS.md sections 3.3 and 4.2)."""

from __future__ import annotations

import jax.numpy as jnp


def tier_bandwidths_Bps(system):
    """Achieved bandwidth per device on each tier:

        BW_i eta_i / o_i
    eta_i = eta_intra for the innermost tier, eta_inter for the others (NCCL bus-bandwidth
    convention, PAPERS.md section 5.9); o_i = the tier's oversubscription (>= 1): a level of
    a fat tree whose uplinks carry 1/o_i of the injection bandwidth below it gives each device
    BW_i / o_i when every device's traffic crosses it at once, as every group of a layout
    does when they all reduce or exchange together (Leiserson 1985, fat trees; Meta's Llama 3
    RoCE cluster: 1:7 between pods, Dubey et al. 2024, 3.3.1). Continuous in o_i, so the
    oversubscription has a gradient (it never speeds a step up).
    Example: 400 Gb/s NIC (50 GB/s), eta 0.8, o = 7: 5.71 GB/s per device across pods.
    """
    effs = [system.eff.coll_eff_intra] + [system.eff.coll_eff_inter] * (len(system.tiers) - 1)
    return [t.bandwidth_Bps * e / t.oversubscription for t, e in zip(system.tiers, effs)]


def tier_ranks(n, stride, system):
    """Ranks of a group at each tier level: r_i = n_i / n_{i-1}, with

        n_i = clip(D_i / stride, 1, n)    (members of the group inside one domain of tier i)

    and n_last = n. A group of size n whose members are `stride` ranks apart has D_i / stride
    members in each domain of D_i devices (ranks fill domains in order). Source: PAPERS.md
    section 4.2, "effective group bandwidth from placement" [D]. Continuous in D_i, so the
    NVLink domain size has a gradient (DESIGN.md, co-design).
    Example: n = 64, stride = 8, D = (8, 1e6): n_0 = 1, r = (1, 64): a DP group across nodes.
    """
    ranks = []
    inner = 1.0
    for i, tier in enumerate(system.tiers):
        if i == len(system.tiers) - 1:
            members = n
        else:
            members = jnp.clip(tier.domain_size / stride, 1.0, n)
            members = jnp.maximum(members, inner)
        ranks.append(members / inner)
        inner = members
    return ranks


def p2p_tier_fractions(n, stride, system):
    """Fraction of the n - 1 stage boundaries of a chain of n ranks, `stride` apart, whose
    outermost crossed tier is i:

        c_i = clip((n stride / D_i - 1) / (n - 1), 0, 1)   (boundaries crossing a tier-i domain)
        x_i = c_{i-1} - c_i,  c_{-1} = 1                    (so the x_i sum to 1)

    The chain spans n stride / D_i domains of tier i, so it crosses that many minus one of
    their boundaries. Source: PAPERS.md section 3.6 (NERSC mix of fast and slow pipeline
    links, slow_links = p / tau_pp - 1) [C], continuous in D_i [D].
    Example: n = 4 stages, stride 4, D = (8, 1e6): one of three boundaries crosses nodes.
    """
    fracs = []
    crossing_prev = 1.0
    links = jnp.maximum(n - 1.0, 1.0)
    for i, tier in enumerate(system.tiers):
        if i == len(system.tiers) - 1:
            crossing = 0.0
        else:
            crossing = jnp.clip((n * stride / tier.domain_size - 1.0) / links, 0.0, 1.0)
        fracs.append(crossing_prev - crossing)
        crossing_prev = crossing
    return fracs
