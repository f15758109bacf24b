"""Fabrics as they are built (issue 14): N-tier systems, oversubscribed levels, frontier scale.

Shipped fabrics: `meta-h100-24k` (Meta's Llama 3 RoCE cluster: NVLink 8, rack 16, non-blocking
pod 3072, 1:7 aggregation; Dubey et al. 2024, 3.3.1) and `gb200-nvl72-superpod` (NVL72 racks,
scalable units of 576 GPUs, non-blocking core; NVIDIA DGX SuperPOD GB200 RA).
"""

from __future__ import annotations

import functools

import jax
import numpy as np
import pytest

from diffperf import Parallel, load_model, load_system, predict
from diffperf.costs.collectives import all_reduce_s
from diffperf.costs.tiers import tier_bandwidths_Bps, tier_ranks
from diffperf.specs.validate import check_layout

META = load_system("meta-h100-24k")
LLAMA = load_model("llama3-405b")


def test_oversubscribed_tier_bandwidth_docstring():
    # costs.tiers.tier_bandwidths_Bps: 400 Gb/s = 50 GB/s x eta_inter 0.8 / 7 = 5.714 GB/s
    bws = tier_bandwidths_Bps(META)
    eta = float(META.eff.coll_eff_inter)
    np.testing.assert_allclose(float(bws[3]), 50e9 * eta / 7.0, rtol=1e-6)
    np.testing.assert_allclose([float(b) for b in bws[1:3]], [50e9 * eta] * 2, rtol=1e-6)


def test_all_reduce_across_pods_by_hand():
    """A DP group of 512 with stride 8 (one rank per node: TP 8 inside it) spans 4096 GPUs:
    1 rank per node, 2 per rack (16 / 8), 384 per pod (3072 / 8), so its hierarchical ring
    runs rack r1 = 2, pod r2 = 192 (384 / 2), aggregation r3 = 512 / 384 (continuous in the
    domain sizes). Each level moves the data left by the levels inside it (PAPERS.md 5.9):
    T = t0 + sum_i [2 (r_i - 1) a_i + 2 (r_i - 1)/r_i S / n_{i-1} / BW_i]."""
    S, n, stride = 1e9, 512.0, 8.0
    ranks = [float(r) for r in tier_ranks(n, stride, META)]
    np.testing.assert_allclose(ranks, [1.0, 2.0, 192.0, 512.0 / 384.0], rtol=1e-6)
    bws = [float(b) for b in tier_bandwidths_Bps(META)]
    lat = [float(t.latency_s) for t in META.tiers]
    inner, want = 1.0, float(META.eff.coll_base_s)
    for r, bw, a in zip(ranks, bws, lat):
        want += 2 * (r - 1) * a + 2 * (r - 1) / r * S / inner / bw
        inner *= r
    np.testing.assert_allclose(float(all_reduce_s(S, n, stride, META)), want, rtol=1e-5)
    # The same group on a non-blocking aggregation layer is faster by exactly the
    # oversubscribed phase's excess: 2 (r3 - 1)/r3 S / 384 / (BW eta) x (7 - 1).
    flat = META.replace(tiers=META.tiers[:3] + (META.tiers[3].replace(oversubscription=1.0),))
    r3, extra = ranks[3], 2 * (ranks[3] - 1) / ranks[3] * S / 384.0 / (bws[2]) * 6.0
    np.testing.assert_allclose(float(all_reduce_s(S, n, stride, META))
                               - float(all_reduce_s(S, n, stride, flat)), extra, rtol=1e-4)
    assert r3 > 1


@functools.cache
def _oversubscription_gradient():
    """d step / d (aggregation layer's oversubscription) through the public predict, as one
    jitted program for every layout (the layout an argument: its leaves are traced), with the
    options predict uses on XLA:CPU (search.kernel._CPU_QUICK_OPTIONS): ~4.5 s of CPU for
    both layouts below, where the eager gradient compiled its ops one by one (~15 s)."""
    from diffperf.search.kernel import _CPU_QUICK_OPTIONS

    def step(o, par):
        tiers = META.tiers[:3] + (META.tiers[3].replace(oversubscription=o),)
        return predict(LLAMA, par, META.replace(tiers=tiers)).step_time_s

    options = dict(compiler_options=_CPU_QUICK_OPTIONS) if jax.default_backend() == "cpu" else {}
    return jax.jit(jax.grad(step), **options)


def _d_step_d_oversubscription(layout):
    """d step / d (aggregation layer's oversubscription) at `layout` (over Llama 3 405B's tp 8,
    pp 16 defaults), checked by check_layout as predict checks a concrete layout."""
    par = Parallel(**(dict(tp=8, pp=16, micro_batch=1, global_batch=2048, sequence_parallel=1,
                           recompute=1, zero_stage=1, placement=1) | layout))
    check_layout(LLAMA, par)
    return float(_oversubscription_gradient()(
        7.0, jax.tree.map(lambda x: np.asarray(x, np.float32), par)))


def test_oversubscription_gradient_sign():
    """Issue 14: the oversubscription is a continuous leaf whose gradient has the physical sign:
    > 0 when a group's traffic crosses the aggregation layer (DP of 128 over 16,384 GPUs: the
    DP group of a (tp, pp) rank spans pods), exactly 0 when every group stays inside one pod
    (tp 8 x pp 16 x dp 8 = 1024 GPUs, inside a pod of 3072)."""
    assert _d_step_d_oversubscription(dict(dp=128)) > 0
    assert _d_step_d_oversubscription(dict(dp=8, global_batch=256)) == 0.0


def test_llama3_405b_layouts_run_on_the_frontier_fabric():
    """The Llama 3 405B layouts of issue 14 (Dubey et al. 2024, Table 4: 8,192 and 16,384
    GPUs, tp 8, pp 16 on 126 layers, 8k and 128k context with cp 16) and a 98,304-GPU one
    predict finite step times, with the uneven stages (7, 8, ..., 8, 7)."""
    runs = [dict(dp=64), dict(dp=128), dict(dp=8, cp=16, global_batch=128, vp=1),
            dict(dp=768, global_batch=6144)]
    for layout in runs:
        model = LLAMA if layout.get("cp", 1) == 1 else LLAMA.replace(seq_len=131072.0)
        par = Parallel(**(dict(tp=8, pp=16, micro_batch=1, global_batch=2048,
                               sequence_parallel=1, recompute=1, zero_stage=1, placement=1)
                          | layout))
        r = predict(model, par, META)
        assert np.isfinite(float(r.step_time_s)) and 0 < float(r.mfu) < 1, layout
    assert int(par.n_devices) == 98304


@pytest.mark.parametrize("name", ["meta-h100-24k", "gb200-nvl72-superpod"])
def test_frontier_fabrics_nest(name):
    system = load_system(name)
    sizes = [float(t.domain_size) for t in system.tiers]
    assert sizes == sorted(sizes) and len(sizes) >= 3
    assert all(float(t.oversubscription) >= 1 for t in system.tiers)
