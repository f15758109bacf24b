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
    one smooth max of the whole pass (200 random splits, p 2 ... 12, in one batched call)."""
    rng = np.random.default_rng(0)
    g, h = rng.uniform(0.1, 10.0, (2, 200))
    gr, hr = g * rng.uniform(size=200), h * rng.uniform(size=200)
    p = rng.uniform(2.0, 12.0, 200)
    assert np.all(np.asarray(host_sync_regions_s(g, h, gr, hr, p))
                  >= np.asarray(pnorm_max(g, h, p)) * (1.0 - 1e-6))


def test_regions_gradient_contract(x64):
    """host_sync_regions_s (x64, log-parameter check_grads, one small jitted program): finite;
    more GPU work or more host work in the pass never makes it faster (d t / d G, d t / d H
    >= 0, with the region's shares fixed); host work moved from a GPU-bound rest into the
    host-bound region after the sync makes it slower (d t / d H_r > 0 at H fixed, here: the
    sign the other way round would be a rest more host-bound than the region)."""
    from jax.test_util import check_grads

    @jax.jit
    def t_of(x):
        g, h, hr = jnp.exp(x[0]), jnp.exp(x[1]), jnp.exp(x[3])
        return host_sync_regions_s(g, h, 0.3 * g, hr, jnp.exp(x[2]))

    x = jnp.log(jnp.array([10.0, 6.0, 6.0, 4.2]))
    grad = np.asarray(jax.grad(t_of)(x))
    assert np.all(np.isfinite(grad)) and grad[0] > 0 and grad[1] > 0 and grad[3] > 0
    check_grads(t_of, (x,), order=1, modes=("rev",), eps=1e-4)


# Six layouts of one compiled predict_step (DeepSeek-V3, e 8 on DGX-B200, MXFP8 with TE's
# loop: E_l = 32), with _layer_parts' host_sync_regions_s arguments:
# (host_kernel_s, moe_host_sync, recompute) by entry.
PAR = Parallel(micro_batch=1.0, pp=16.0, ep=8.0, dp=16.0, global_batch=4096)
CASES = ((5e-6, 0.0, 0.0), (5e-6, 1.0, 0.0), (20e-6, 0.0, 0.0), (20e-6, 1.0, 0.0),
         (20e-6, 0.0, 2.0), (20e-6, 1.0, 2.0))


@pytest.fixture(scope="module")
def batch():
    """(step seconds by entry, [forward region args], [backward region args]) of CASES: one
    jitted program (the features of the concrete layout with the fact and full recompute),
    run once per entry; it returns the arguments its first two host_sync_regions_s calls
    (_layer_parts' forward and backward) traced."""
    pr = importlib.import_module("diffperf.predict")
    real = pr.host_sync_regions_s
    feats = pr.features_of(*_as_float((DSV3, PAR.replace(recompute=2.0),
                                       LOOP.replace(moe_host_sync=1.0))))

    @jax.jit
    def one(M, P, S, T):
        calls = []
        pr.host_sync_regions_s = lambda *a: calls.append(a[:4]) or real(*a)
        return pr.predict_step(M, P, S, T, features=feats).step_time_s, calls[0], calls[1]

    out = []
    try:
        for hk, sync, rec in CASES:
            s = _system("dgx-b200")
            s = s.replace(eff=s.eff.replace(host_kernel_s=hk))
            out.append(jax.tree.map(float, one(*_as_float((
                DSV3, PAR.replace(recompute=rec), s, LOOP.replace(moe_host_sync=sync))))))
    finally:
        pr.host_sync_regions_s = real
    step = np.array([o[0] for o in out])
    return (step, [np.array([o[1][k] for o in out]) for k in range(4)],
            [np.array([o[2][k] for o in out]) for k in range(4)])


def test_predict_region_host_launches_by_hand(batch):
    """The region after the sync (DeepSeek-V3, e 8: E_l = 32, MXFP8 with TE's loop): the host
    launches the dispatch (phi), the two grouped GEMMs (2 phi) and their other 2 phi 31 per-
    expert GEMMs, and quantizes the experts' two inputs slice by slice (2 phi 32, one MXFP8
    kernel each): host_r = (1 + 2 + 62 + 64) phi host_kernel_s = 129 phi 5 us = 613.3 us.
    Its GPU side is inside the pass's (G_r <= G), its host side inside the pass's (H_r <= H).
    Without full recompute the backward's region is empty (0, 0: its one max exactly); under
    full recompute (recompute_layer_frac 1) it is the forward's region, re-run. A concrete
    moe_host_sync = 0 leaves the feature, so the region call, out of the program."""
    from diffperf.predict import features_of

    _, (gf, hf, gr, hr), (gb, hb, grb, hrb) = batch
    hk = np.array([c[0] for c in CASES])
    assert hr == pytest.approx(129 * PHI * hk, rel=1e-4)
    assert np.all((0 < gr) & (gr < gf) & (0 < hr) & (hr < hf))
    full = np.array([c[2] == 2.0 for c in CASES])
    assert np.all(grb[~full] == 0) and np.all(hrb[~full] == 0)
    assert grb[full] == pytest.approx(gr[full], rel=1e-6)
    assert hrb[full] == pytest.approx(hr[full], rel=1e-6)
    assert np.all((grb[full] < gb[full]) & (hrb[full] < hb[full]))
    assert "host_sync" not in features_of(DSV3, PAR, LOOP)
    assert "host_sync" in features_of(DSV3, PAR, LOOP.replace(moe_host_sync=1.0))


def test_predict_fact_slows_only_a_host_bound_region(batch):
    """Step time, DeepSeek-V3 e 8 on DGX-B200 (MXFP8, TE's loop): at the default host time per
    launch (5 us) the region after the sync stays GPU-bound and the fact moves the step by
    less than 0.2 % (the p-norm's smoothness); at 20 us per launch (2.58 ms of host work in a
    region of ~2 ms of GPU work) it is slower by more; never faster. Under full recompute the
    backward re-runs the sync: the fact costs the forward's seconds and more."""
    step = batch[0]
    low = step[1] / step[0] - 1.0
    high = step[3] / step[2] - 1.0
    assert 0.0 <= low < 2e-3
    assert high > 5.0 * max(low, 1e-4)
    assert step[5] - step[4] > step[3] - step[2] > 0.0


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
