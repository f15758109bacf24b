"""The MoE layer's host sync before the token dispatch (Training.moe_host_sync,
schedule.overlap.host_sync_regions_s; docs/accuracy-bridge.md "Session 15: host syncs inside
the MoE layer"). Expected values worked by hand.
"""

from __future__ import annotations

import csv
import importlib
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import diffperf
from diffperf import Parallel
from diffperf.api import _as_float
from diffperf.costs.smooth import pnorm_max
from diffperf.schedule.overlap import host_sync_regions_s
from shipped import model as _model, system as _system

ROOT = Path(__file__).resolve().parent.parent
DSV3 = _model("deepseek-v3")
PHI = 58.0 / 61.0  # DeepSeek-V3: 3 dense layers of 61
LOOP = diffperf.training("mxfp8").replace(moe_expert_loop=1.0, lowp_te_quantizer=1.0)


def test_regions_by_hand():
    """G = 10, H = 6, G_r = 2, H_r = 5: one max 10, regions max(2, 5) + max(8, 1) = 13 (the
    hard form, p -> inf); at p = 6: (2^6 + 5^6)^(1/6) = 15689^(1/6) = 5.00341 and
    (8^6 + 1)^(1/6) = 8.0000051: 13.00341. Same host / GPU ratio in both regions (G_r = 2,
    H_r = 1 of G = 10, H = 5): the p-norm is homogeneous, so the regions sum to the one max,
    (10^6 + 5^6)^(1/6) = 10.02587. A region's rest below zero is clipped: G = H = 1, G_r = 3,
    H_r = 0: max(3, 0) + max(0, 1) = 4."""
    assert float(host_sync_regions_s(10.0, 6.0, 2.0, 5.0, 6.0)) == pytest.approx(13.00341,
                                                                                  abs=2e-5)
    assert float(host_sync_regions_s(10.0, 6.0, 2.0, 5.0, 1e4)) == pytest.approx(13.0, rel=1e-4)
    assert float(host_sync_regions_s(10.0, 5.0, 2.0, 1.0, 6.0)) == pytest.approx(
        float(pnorm_max(10.0, 5.0, 6.0)), rel=1e-6)
    assert float(pnorm_max(10.0, 5.0, 6.0)) == pytest.approx(10.02587, abs=2e-5)
    assert float(host_sync_regions_s(1.0, 1.0, 3.0, 0.0, 1e4)) == pytest.approx(4.0, rel=1e-4)


def test_regions_never_faster_than_one_max():
    """Minkowski: M(a + b) <= M(a) + M(b) for the p-norm, so the two regions take at least the
    one smooth max of the whole pass (200 random splits, p 2 ... 12)."""
    rng = np.random.default_rng(0)
    for _ in range(200):
        g, h = rng.uniform(0.1, 10.0, 2)
        gr, hr = g * rng.uniform(), h * rng.uniform()
        p = rng.uniform(2.0, 12.0)
        assert float(host_sync_regions_s(g, h, gr, hr, p)) >= float(pnorm_max(g, h, p)) * (
            1.0 - 1e-6)


def test_regions_gradient_contract(x64):
    """host_sync_regions_s (x64, log-parameter check_grads): finite; more GPU work or more host
    work in the pass never makes it faster (d t / d G, d t / d H >= 0, with the region's
    shares fixed)."""
    from jax.test_util import check_grads

    def t_of(x):
        g, h = jnp.exp(x[0]), jnp.exp(x[1])
        return host_sync_regions_s(g, h, 0.3 * g, 0.7 * h, jnp.exp(x[2]))

    x = jnp.log(jnp.array([10.0, 6.0, 6.0]))
    grad = np.asarray(jax.grad(t_of)(x))
    assert np.all(np.isfinite(grad)) and grad[0] > 0 and grad[1] > 0
    check_grads(t_of, (x,), order=1, modes=("rev",), eps=1e-4)


def _layer_regions(monkeypatch, training, host_kernel_s):
    """predict._layer_parts on DeepSeek-V3 at e 8 (eager, nothing compiled): the arguments of
    its smooth max (forward) and of host_sync_regions_s (None without the fact), and t_f."""
    pr = importlib.import_module("diffperf.predict")
    seen, regions = [], []
    real_max, real_regions = pr.pnorm_max, pr.host_sync_regions_s
    monkeypatch.setattr(pr, "pnorm_max", lambda a, b, p: seen.append((a, b)) or real_max(a, b, p))
    monkeypatch.setattr(pr, "host_sync_regions_s", lambda *a: regions.append(a[:4])
                        or real_regions(*a))
    par = Parallel(micro_batch=1.0, pp=16.0, ep=8.0, dp=16.0, global_batch=4096)
    s = _system("dgx-b200")
    s = s.replace(eff=s.eff.replace(host_kernel_s=host_kernel_s))
    M, P, S, T = _as_float((DSV3, par, s, training))
    pr._layer_parts(M, P, S, T, None, features=pr.features_of(M, P, T))
    return ([float(x) for x in seen[0]],
            [float(x) for x in regions[0]] if regions else None)


def test_predict_region_host_launches_by_hand(monkeypatch):
    """The region after the sync (DeepSeek-V3, e 8: E_l = 32, MXFP8 with TE's loop): the host
    launches the dispatch (phi), the two grouped GEMMs (2 phi) and their other 2 phi 31 per-
    expert GEMMs, and quantizes the experts' two inputs slice by slice (2 phi 32, one MXFP8
    kernel each): host_r = (1 + 2 + 62 + 64) phi host_kernel_s = 129 phi 5 us = 613.3 us.
    Its GPU side is inside the pass's (G_r <= G), its host side inside the pass's (H_r <= H).
    Without the fact the pass keeps its one smooth max (no region call)."""
    (g, h), reg = _layer_regions(monkeypatch, LOOP.replace(moe_host_sync=1.0), 5e-6)
    gf, hf, gr, hr = reg
    assert (gf, hf) == pytest.approx((g, h), rel=1e-6)
    assert hr == pytest.approx(129 * PHI * 5e-6, rel=1e-4)
    assert 0 < gr < gf and 0 < hr < hf
    _, none = _layer_regions(monkeypatch, LOOP, 5e-6)
    assert none is None


def test_predict_fact_slows_only_a_host_bound_region():
    """Step time, DeepSeek-V3 e 8 on DGX-B200 (MXFP8, TE's loop): at the default host time per
    launch (5 us) the region after the sync stays GPU-bound and the fact moves the step by
    less than 0.2 % (the p-norm's smoothness); at 20 us per launch (2.58 ms of host work in a
    region of ~2 ms of GPU work) it is slower by more; never faster."""
    from diffperf.predict import features_of, predict_step

    par = Parallel(micro_batch=1.0, pp=16.0, ep=8.0, dp=16.0, global_batch=4096)
    out = {}
    for hk in (5e-6, 20e-6):
        s = _system("dgx-b200")
        s = s.replace(eff=s.eff.replace(host_kernel_s=hk))
        for f in (0.0, 1.0):
            M, P, S, T = _as_float((DSV3, par, s, LOOP.replace(moe_host_sync=f)))
            out[hk, f] = float(predict_step(M, P, S, T, features=features_of(M, P, T))
                               .step_time_s)
    low = out[5e-6, 1.0] / out[5e-6, 0.0] - 1.0
    high = out[20e-6, 1.0] / out[20e-6, 0.0] - 1.0
    assert 0.0 <= low < 2e-3
    assert high > 5.0 * max(low, 1e-4)


def test_fact_on_the_bridge_rows():
    """calibration/bridge_recipe_facts.py fact 14 sets moe_host_sync on the 92 dropless MoE rows
    of containers 25.09-26.04.01 (Megatron Core 0.14-0.17): not on the 12 drop-and-pad rows
    (the alltoall dispatcher's drop_and_pad path has no D2H copy), not on 26.06+, not on a dense
    row; the shipped CSV carries it."""
    from calibration.bridge_recipe_facts import HOST_SYNC_CONTAINERS

    rows = list(csv.DictReader((ROOT / "data" / "megatron_bridge.csv").open(newline="")))
    on = [r for r in rows if "moe_host_sync=1" in r["set"].split(";")]
    assert len(on) == 92
    assert all(float(r["moe_experts"]) > 0 and r["moe_token_drop"] != "1"
               and r["container"] in HOST_SYNC_CONTAINERS for r in on)
    moe = [r for r in rows if float(r["moe_experts"] or 0) > 0
           and r["container"] in HOST_SYNC_CONTAINERS]
    assert sorted(r["id"] for r in moe if r not in on) == sorted(
        r["id"] for r in moe if r["moe_token_drop"] == "1")
    assert len(moe) - len(on) == 12


def test_dense_model_refuses_the_fact():
    """A dense model with moe_host_sync = 1 is refused, naming the field (MOE_TRAINING_FACTS)."""
    from diffperf.errors import SpecError
    from diffperf.specs.validate import check_facts_act

    llama = _model("llama3-8b")
    with pytest.raises(SpecError, match="moe_host_sync"):
        check_facts_act(llama, Parallel(micro_batch=1.0, dp=8.0),
                        diffperf.training("bf16").replace(moe_host_sync=1.0))
