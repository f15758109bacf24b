"""Collective communication time on the network tiers a group actually spans.

Alpha-beta costs after Thakur, Rabenseifner & Gropp (IJHPCA 2005) with the hierarchical
(two-tier) decomposition of PAPERS.md section 5.9: a group that spans tiers runs a ring inside
each tier on the data left over from the tiers inside it. Volumes S follow NCCL's convention
(PAPERS.md section 0): the array each rank holds for all-reduce, the gathered output for
all-gather, the un-scattered input for reduce-scatter, the send buffer for all-to-all.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax.numpy as jnp

from diffperf.costs.tiers import tier_bandwidths_Bps, tier_ranks
from diffperf.workload.ep import domain_hit_fraction


class RingGroup(NamedTuple):
    """The alpha-beta coefficients of ring phases on one group (n ranks, `stride` apart):

        A = sum_i (r_i - 1) alpha_i              (latency of one step around every tier)
        B = sum_i (r_i - 1)/r_i / (n_{i-1} BW_i eta_i)   (seconds per byte of S)
    r_i = members per domain i / members per domain i-1 (tiers.tier_ranks), n_{i-1} the
    members inside one domain of the tier below. Every ring collective on the group is
    linear in S with these (`ring_phase_s`), so a caller with several collectives on the
    same group computes them once."""

    latency_s: Any
    s_per_byte: Any
    active: Any     # 0 for a group of one rank: it makes no call at all
    base_s: Any     # t0 = eff.coll_base_s, the fixed cost of one call


def ring_group(n, stride, system) -> RingGroup:
    """`RingGroup` of a group of n ranks `stride` apart on the system's tiers."""
    ranks = tier_ranks(n, stride, system)
    bws = tier_bandwidths_Bps(system)
    latency, per_byte, inner = 0.0, 0.0, 1.0
    for r, tier, bw in zip(ranks, system.tiers, bws):
        latency = latency + (r - 1.0) * tier.latency_s
        per_byte = per_byte + (r - 1.0) / r / (inner * bw)
        inner = inner * r
    return RingGroup(latency, per_byte, jnp.where(n > 1.0, 1.0, 0.0), system.eff.coll_base_s)


def ring_phase_s(group: RingGroup, S, steps_per_rank, volume_factor):
    """T = t0 + c A + f S B: c = steps_per_rank (2 for all-reduce, 1 for gather / scatter),
    f = volume_factor (the same); 0 for a group of one rank."""
    return group.active * (group.base_s + steps_per_rank * group.latency_s
                           + volume_factor * S * group.s_per_byte)


def ring_phase_calls_s(group: RingGroup, S, steps_per_rank, volume_factor, calls):
    """`ring_phase_s` of S bytes issued as `calls` collectives of S / calls each (ZeRO-3's
    per-layer gathers and reduce-scatters, one per parameter bucket): every call is a whole
    ring phase, so it pays t0 and the ring's latency; the bytes are paid once:

        T = calls (t0 + c A) + f S B
    Source: Thakur et al. 2005 (a ring phase's alpha-beta cost, applied per call).
    (Not the TP under sequence parallelism case: there one all-reduce becomes a
    reduce-scatter + an all-gather that share its 2 (n - 1) steps, so only t0 is paid twice.)
    Example: calls = 2, c = f = 1, t0 = 20 us, A = 35 us, S B = 1 ms:
    2 x 55 us + 1 ms = 1.11 ms.
    """
    return ring_phase_s(group, S, steps_per_rank, volume_factor) + (calls - 1.0) * (
        group.active * (group.base_s + steps_per_rank * group.latency_s))


def _ring_phases_s(S, n, stride, system, steps_per_rank, volume_factor):
    """Sum over tiers i of a ring phase on r_i ranks moving the data left from tiers < i:

        T = sum_i [ c (r_i - 1) alpha_i + f (r_i - 1)/r_i * S / n_{i-1} / (BW_i eta_i) ]

    with c = steps_per_rank (2 for all-reduce, 1 for gather/scatter) and f = volume_factor.
    """
    return ring_phase_s(ring_group(n, stride, system), S, steps_per_rank, volume_factor)


def all_reduce_s(S, n, stride, system):
    """Hierarchical ring all-reduce (reduce-scatter up the tiers, all-gather back down):

        T = t0 + sum_i [ 2 (r_i - 1) alpha_i + 2 (r_i - 1)/r_i * S / n_{i-1} / (BW_i eta_i) ]

    S = bytes per rank, n = group size, stride = rank distance between members.
    Source: Thakur et al. 2005 (ring all-reduce), PAPERS.md section 5.9 (hierarchical form);
    t0 = eff.coll_base_s, the fixed cost of one call.
    Example: S = 1 GB, n = 8 inside an 8-GPU node, BW = 400 GB/s x 0.8, alpha = 5 us:
    t0 + 70 us + 2 x 7/8 x 1e9 / 320e9 = t0 + 70 us + 5.469 ms.
    """
    return _ring_phases_s(S, n, stride, system, 2.0, 2.0)


def all_gather_s(S, n, stride, system):
    """Hierarchical ring all-gather of a gathered output of S bytes:

        T = t0 + sum_i [ (r_i - 1) alpha_i + (r_i - 1)/r_i * S / n_{i-1} / (BW_i eta_i) ]

    Source: Thakur et al. 2005, ring all-gather; PAPERS.md section 5.9.
    """
    return _ring_phases_s(S, n, stride, system, 1.0, 1.0)


def reduce_scatter_s(S, n, stride, system):
    """Hierarchical ring reduce-scatter of an S-byte input: same cost as the all-gather.

    Source: Thakur et al. 2005, ring / pairwise reduce-scatter (reduction folded in eta).
    """
    return _ring_phases_s(S, n, stride, system, 1.0, 1.0)


def all_to_all_s(S, n, stride, system):
    """Pairwise all-to-all with an S-byte send buffer per rank, each tier carrying the share
    of peers that lies beyond the tiers inside it:

        T = t0 + (n - 1) alpha_max + sum_i (n_i - n_{i-1}) / n * S / (BW_i eta_i)

    Source: Thakur et al. 2005 (pairwise exchange); PAPERS.md section 5.8.
    """
    ranks = tier_ranks(n, stride, system)
    bws = tier_bandwidths_Bps(system)
    total = 0.0
    inner = 1.0
    alpha = 0.0
    for r, tier, bw in zip(ranks, system.tiers, bws):
        outer = inner * r
        total = total + (outer - inner) / n * S / bw
        alpha = jnp.where(r > 1.0, tier.latency_s, alpha)
        inner = outer
    active = jnp.where(n > 1.0, 1.0, 0.0)
    return active * (total + (n - 1.0) * alpha + system.eff.coll_base_s)


def hierarchical_all_to_all_s(S, n, stride, k, E, system):
    """DeepEP-style dispatch (or combine) of an S-byte buffer (k copies of each routed token):
    a token crosses the scale-out network once per remote NVLink domain that holds one of its
    k experts, then the receiving GPU forwards it over NVLink to the experts' GPUs.

        N = n / n_0  domains spanned (n_0: members per innermost domain, `tier_ranks`)
        scale-out bytes = S / k x (N - 1) p
            (p = `workload.ep.domain_hit_fraction`(k, E, N))
        NVLink bytes    = S [ (n_0 - 1)/n + (n - n_0)/n x (n_0 - 1)/n_0 ]  (local + forwarded)
        T = t0 + (n - 1) alpha_max + NVLink bytes / (BW_0 eta_0)
            + d sum_{i>0} (n_i - n_{i-1}) / n S / (BW_i eta_i),   d = N p / k
    d = (N - 1) p / (k (N - 1) / N) is the scale-out volume relative to the pairwise
    all-to-all's (`all_to_all_s` sends every one of a token's k (N - 1) / N remote copies);
    1 / k <= d <= 1 for N > 1. Within one domain (N = 1) the NVLink term is the pairwise
    all-to-all's. Source: DeepSeek-V3 technical report (arXiv
    2412.19437) Section 3.2.2 ("cross-node all-to-all ... IB to the GPUs with the same in-node
    index on the target nodes, then forwarded via NVLink"; tokens deduplicated per node) and the
    DeepEP README (normal kernels: NVLink and RDMA forwarding); Megatron-Core's flex dispatcher
    with the deepep / hybridep backend [S].
    Example: n = 16 over two 8-GPU nodes, k = 8, E = 128: N = 2, p = 0.9969, d = 2 p / 8
    = 0.249: a quarter of the pairwise all-to-all's InfiniBand bytes.
    """
    ranks = tier_ranks(n, stride, system)
    bws = tier_bandwidths_Bps(system)
    n0 = ranks[0]
    N = n / n0
    p = domain_hit_fraction(k, E, N)
    d = jnp.where(N > 1.0, N * p / jnp.maximum(k, 1.0), 1.0)
    nvl = S * ((n0 - 1.0) / n + (n - n0) / n * (n0 - 1.0) / n0) / bws[0]
    outer_t = 0.0
    inner = n0
    alpha = jnp.where(n0 > 1.0, system.tiers[0].latency_s, 0.0)
    for r, tier, bw in zip(ranks[1:], system.tiers[1:], bws[1:]):
        outer = inner * r
        outer_t = outer_t + (outer - inner) / n * S / bw
        alpha = jnp.where(r > 1.0, tier.latency_s, alpha)
        inner = outer
    active = jnp.where(n > 1.0, 1.0, 0.0)
    return active * (nvl + d * outer_t + (n - 1.0) * alpha + system.eff.coll_base_s)


def ring_step_s(S, n, stride, system):
    """One step of a ring exchange: every rank of a ring of n sends S bytes to its neighbour at
    once, so the step lasts as long as the slowest link the ring uses:

        T = t0 + max_i w_i (alpha_i + S / (BW_i eta_i)),
        w_0 = 1,  w_i = clip(n stride / D_{i-1} - 1, 0, 1)  (the ring leaves a tier-(i-1) domain)

    S = bytes per rank per step, n = ring size, stride = rank distance between members, D_i the
    tier domain sizes; w_i is the crossing indicator of `tiers.p2p_tier_fractions`, not divided
    by the number of links (in a ring every step waits for its one crossing link). 0 for n = 1.
    Source: PAPERS.md section 5.7 (ring attention: c - 1 p2p steps of K/V blocks), section 5.9
    (send/recv: alpha + S beta) [D].
    Example: S = 1 MB, n = 4 inside an 8-GPU node, BW 450 GB/s x 0.8, alpha 2.5 us:
    t0 + 2.5 us + 1e6 / 360e9 = t0 + 5.28 us; the same ring of stride 8 across nodes at
    50 GB/s x 0.8 and alpha 5 us: t0 + 5 us + 25 us.
    """
    bws = tier_bandwidths_Bps(system)
    worst = 0.0
    crossing = 1.0
    for i, (tier, bw) in enumerate(zip(system.tiers, bws)):
        if i > 0:
            crossing = jnp.clip(n * stride / system.tiers[i - 1].domain_size - 1.0, 0.0, 1.0)
        worst = jnp.maximum(worst, crossing * (tier.latency_s + S / bw))
    active = jnp.where(n > 1.0, 1.0, 0.0)
    return active * (worst + system.eff.coll_base_s)


def send_recv_s(S, n, stride, system):
    """Point-to-point transfer of S bytes between neighbours of a chain of n ranks, `stride`
    apart (a pipeline):

        T = t0 + sum_i x_i (alpha_i + S / (BW_i eta_i))

    x_i = the fraction of transfers whose outermost crossed tier is i (tiers.p2p_tier_fractions).
    Source: PAPERS.md section 5.9 (send/recv: alpha + S beta), section 3.6 (mix of links).
    """
    from diffperf.costs.tiers import p2p_tier_fractions

    fracs = p2p_tier_fractions(n, stride, system)
    bws = tier_bandwidths_Bps(system)
    total = 0.0
    for x, tier, bw in zip(fracs, system.tiers, bws):
        total = total + x * (tier.latency_s + S / bw)
    return total + system.eff.coll_base_s
