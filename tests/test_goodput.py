"""Goodput at scale (schedule/goodput.py, Result.goodput, sensitivity --goodput; issue 14).

- golden cases by hand: Daly's (2006) worked examples (figures 3-5) and the docstrings';
- the checkpoint interval that minimises the implemented model, found numerically (bisection
  on the sign of jax.grad, float64), matches Daly's higher-order and Young's first-order
  closed forms within the next term of their series;
- gradients: finite everywhere (float32, extreme regimes included), equal to finite
  differences (check_grads, float64, log coordinates), with the physical sign;
- predict's goodput equals the module's formulas, and the user guide's goodput example (docs/guide.md).

Cheap: the module's functions are tiny; the one prediction-sized program is the goodput
gradient, compiled once and shared with test_cli.py's `sensitivity --goodput` run.
"""

from __future__ import annotations

import functools
import math
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

from diffperf import Parallel, Training, predict, training
from diffperf.predict import _goodput
from diffperf.result import GOODPUT_FRACS
from diffperf.schedule.goodput import (checkpoint_bytes, checkpoint_write_s, daly_interval_s,
                                       job_mtbf_s, log_goodput_frac, lost_fracs,
                                       young_interval_s)
from diffperf.sensitivity import goodput_elasticities
from diffperf.specs.system import LLAMA3_FAILURES_PER_DEVICE_HOUR
from diffperf.workload.params import total_params
from shipped import model as _model, system as _system

REPO = Path(__file__).resolve().parents[1]
MIN, HOUR = 60.0, 3600.0





# ------------------------------------------------------------------------------ golden cases


@pytest.mark.parametrize("M,published_min,digits", [
    (24 * HOUR, 117.0, 0), (6 * HOUR, 57.0, 0), (15 * MIN, 9.1, 1)])
def test_daly_interval_reproduces_dalys_figures(M, published_min, digits):
    """Daly (2006), captions of figures 3, 4 and 5: delta = 5 min, R = 10 min and M = 24 h,
    6 h, 15 min give tau_opt = 117, 57 and 9.1 min (rounded as published)."""
    tau = float(daly_interval_s(5 * MIN, M))
    assert round(tau / MIN, digits) == published_min


def test_daly_interval_and_fractions_by_hand():
    """The docstring example (Daly's figure 3): delta = 300 s, M = 86,400 s, R = 600 s."""
    delta, M, R = 300.0, 86400.0, 600.0
    # xi = delta / 2M = 1/576, sqrt(xi) = 1/24: tau = sqrt(2 delta M) (1 + 1/72 + 1/5184) - delta
    tau = 7200.0 * (1.0 + 1.0 / 72.0 + 1.0 / 5184.0) - 300.0
    assert float(daly_interval_s(delta, M)) == pytest.approx(tau, rel=1e-6)
    assert float(young_interval_s(delta, M)) == pytest.approx(7200.0, rel=1e-6)
    E = M * math.exp(R / M) * math.expm1((tau + delta) / M)   # expected time of one segment
    kept, ckpt, rework, restart = (float(v) for v in lost_fracs(tau, delta, M, R))
    assert kept == pytest.approx(tau / E, rel=1e-5)                       # 0.9126
    assert ckpt == pytest.approx(delta / E, rel=1e-5)                     # 0.0391
    assert rework == pytest.approx((M * math.expm1((tau + delta) / M) - (tau + delta)) / E,
                                   rel=1e-4)                               # 0.0414
    assert restart == pytest.approx(1.0 - math.exp(-R / M), rel=1e-5)   # 0.0069
    assert kept + ckpt + rework + restart == pytest.approx(1.0, abs=1e-6)


def test_llama3_checkpoint_mtbf_and_goodput():
    """Llama 3 405B on 16,384 H100 with the shipped reliability defaults (Dubey et al. 2024):
    V = N (2 + 4 + 8) bytes (bf16 weights, fp32 master, Adam), delta = V / 2 TB/s,
    M = 54 days x 24 h / 419 failures. The paper reports more than 90 % effective training
    time over all causes of lost time, so the failures alone must leave at least 90 %."""
    model, system = _model("llama3-405b"), _system("h100-sxm-80gb")
    g = _goodput(model, system, Training(), 16384.0, 1.0)
    V = float(total_params(model)) * (2.0 + 4.0 + 8.0)
    assert float(g.checkpoint_bytes) == pytest.approx(V, rel=1e-6)        # 5.68 TB
    assert float(g.checkpoint_s) == pytest.approx(V / 2e12, rel=1e-6)     # 2.84 s
    assert float(g.mtbf_s) == pytest.approx(54 * 24 * HOUR / 419, rel=1e-6)  # 3.09 h
    assert LLAMA3_FAILURES_PER_DEVICE_HOUR == pytest.approx(1.973e-5, rel=1e-3)
    assert 0.90 <= float(g.goodput_frac) < 1.0
    assert float(g.effective_tokens_per_s) == pytest.approx(float(g.goodput_frac), rel=1e-6)


def test_checkpoint_bytes_by_precision():
    """One copy of the weights, master weights and optimizer state: 14 B/param for bf16
    mixed precision, 12 for amp-bf16 (fp32 weights are the master), 6 for pure bf16."""
    N = 1e9
    for precision, per_param in (("bf16", 14.0), ("amp-bf16", 12.0), ("bf16-pure", 6.0)):
        assert float(checkpoint_bytes(N, training(precision))) == N * per_param
    assert float(checkpoint_write_s(2e12, 1e12)) == 2.0
    assert float(job_mtbf_s(1.0 / HOUR, 4.0)) == HOUR / 4.0


# ------------------------------------------------------------------ optimum: Young and Daly


# d ln G / d tau as one jitted program (every argument traced: one compile for every delta, M
# and R): the bisection below calls it 200 times per case, which eagerly cost ~1 ms a call.
_SLOPE = jax.jit(jax.grad(log_goodput_frac))


def _numerical_optimum(delta, M, R):
    """The tau that maximises the implemented ln G: bisection on the sign of d ln G / d tau
    (float64), between Young's tau / 4 and 4 x Young's tau."""
    def slope(t):
        return _SLOPE(t, delta, M, R)

    lo, hi = young_interval_s(delta, M) / 4.0, young_interval_s(delta, M) * 4.0
    assert slope(lo) > 0 > slope(hi)
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if slope(mid) > 0 else (lo, mid)
    return float(0.5 * (lo + hi))


@pytest.mark.parametrize("xi", [1e-4, 1e-3, 1e-2])
def test_optimal_interval_matches_young_and_daly(x64, xi):
    """In the regime delta << M (xi = delta / 2M <= 1e-2) the minimiser of the implemented
    expected wall time matches Daly's closed form within xi^{3/2} relative and Young's
    within xi^{1/2}: the orders of the first term each series leaves out (measured: 0.03
    xi^{3/2} and 0.67 xi^{1/2}, so the bounds hold with margin, and a wrong cost function,
    e.g. a lost work of tau instead of tau / 2, moves the optimum by a factor sqrt(2) and
    fails both). The restart time scales E by e^{R/M} and moves no optimum."""
    M = 10 * HOUR
    delta = 2.0 * xi * M
    for R in (0.0, 600.0, 3 * HOUR):
        tau = _numerical_optimum(delta, M, R)
        daly, young = float(daly_interval_s(delta, M)), float(young_interval_s(delta, M))
        assert abs(daly - tau) / tau <= xi ** 1.5
        assert abs(young - tau) / tau <= xi ** 0.5
        assert abs(daly - tau) < abs(young - tau)  # the higher order is closer


# --------------------------------------------------------------------------------- gradients

# (lambda per device-hour, devices, storage GB/s, restart s, given interval s): regimes from
# a small job to 100k devices, a given interval, and failures winning (M << R, delta >> M).
REGIMES = [
    (LLAMA3_FAILURES_PER_DEVICE_HOUR, 1024.0, 2000.0, 600.0, 0.0),
    (LLAMA3_FAILURES_PER_DEVICE_HOUR, 16384.0, 2000.0, 600.0, 0.0),
    (LLAMA3_FAILURES_PER_DEVICE_HOUR, 100000.0, 500.0, 1800.0, 0.0),
    (1e-4, 8192.0, 100.0, 300.0, 3600.0),
    (0.1, 100000.0, 1.0, 3600.0, 0.0),
]


def _goodput_of(log_scale, base, model, tau, log):
    """(ln of) the goodput fraction of predict's goodput block with the reliability leaves and
    the device count scaled by exp(log_scale) (O(1) coordinates for check_grads)."""
    rate, write, restart, devices = (b * jnp.exp(s) for b, s in zip(base, log_scale))
    system = _system("h100-sxm-80gb")
    system = system.replace(reliability=system.reliability.replace(
        failure_rate_per_s=rate, storage_write_Bps=write, restart_s=restart))
    g = _goodput(model, system, Training(checkpoint_interval_s=tau), devices, 1.0)
    return jnp.log(g.effective_tokens_per_s) if log else g.goodput_frac


def _base(regime):
    rate_h, n, write_GBps, restart, _ = regime
    return (rate_h / HOUR, write_GBps * 1e9, restart, n)


@pytest.mark.parametrize("regime", REGIMES[:4])
def test_check_grads_in_log_coordinates(x64, regime):
    """d ln X / d ln(failure rate, storage bandwidth, restart, devices) matches central finite
    differences (float64; the extreme regime has G ~ 0, where ln G is steep but smooth)."""
    f = functools.partial(_goodput_of, base=_base(regime), model=_model("llama3-70b"),
                          tau=regime[-1], log=True)
    check_grads(f, (jnp.zeros(4),), order=1, modes=["rev"])


@pytest.mark.parametrize("regime", REGIMES)
def test_physical_signs_and_finite_gradients(regime):
    """float32: finite gradients everywhere, and the physical sign of each: a higher failure
    rate, a longer restart or more devices never raise the goodput; faster storage never
    lowers it. The finite step (x 1.1) agrees."""
    f = functools.partial(_goodput_of, base=_base(regime), model=_model("llama3-70b"),
                          tau=regime[-1], log=False)  # G, not ln G: 0 in the last regime
    zero = jnp.zeros(4)
    grad = jax.grad(f)(zero)
    assert np.all(np.isfinite(np.asarray(grad))), grad
    rate, write, restart, devices = (float(g) for g in grad)
    assert rate <= 0 and restart <= 0 and devices <= 0 and write >= 0, grad
    base = float(f(zero))
    for i, sign in enumerate((-1, +1, -1, -1)):
        step = float(f(zero.at[i].set(math.log(1.1))))
        assert sign * (step - base) >= -1e-6, (i, step, base)


def test_fractions_sum_to_one_and_stay_finite_in_extremes():
    """float32, from negligible failures to failures that win (G underflows to 0): the four
    fractions lie in [0, 1] and sum to 1; gradients stay finite."""
    for delta, M, R in ((1e-3, 1e9, 1.0), (300.0, 86400.0, 600.0), (10.0, 60.0, 3600.0),
                        (1e4, 1.0, 1e4), (1e-2, 1e-2, 1e-2)):
        tau = daly_interval_s(delta, M)
        parts = [float(v) for v in lost_fracs(tau, delta, M, R)]
        assert all(0.0 <= p <= 1.0 for p in parts), parts
        assert sum(parts) == pytest.approx(1.0, abs=1e-5), parts
        for i in range(4):
            g = jax.grad(lambda a: lost_fracs(daly_interval_s(a[0], a[1]), *a)[i])(
                jnp.array([delta, M, R]))
            assert np.all(np.isfinite(np.asarray(g))), (i, delta, M, R, g)


# ------------------------------------------------------------------- predict and sensitivity


GPT3_LAYOUT = dict(tp=8, pp=8, dp=16, micro_batch=1, global_batch=1536, sequence_parallel=1,
                   recompute=1, zero_stage=1)


def test_predict_reports_goodput_from_the_module():
    """Result.goodput is the module's model at predict's own inputs; effective tokens/s =
    tokens/s x goodput; a given interval replaces Daly's; the step time does not move."""
    model, system = _model("gpt3-175b"), _system("a100-sxm-80gb")
    r = predict(model, Parallel(**GPT3_LAYOUT), system)
    g = r.goodput
    V = float(total_params(model)) * 14.0
    delta, M = V / 2e12, 1.0 / (float(system.reliability.failure_rate_per_s) * 1024)
    assert float(g.checkpoint_s) == pytest.approx(delta, rel=1e-5)
    assert float(g.mtbf_s) == pytest.approx(M, rel=1e-5)
    assert float(g.checkpoint_interval_s) == pytest.approx(float(daly_interval_s(delta, M)),
                                                           rel=1e-5)
    assert sum(float(getattr(g, k)) for k in GOODPUT_FRACS) == pytest.approx(1.0, abs=1e-5)
    assert float(g.effective_tokens_per_s) == pytest.approx(
        float(r.tokens_per_s) * float(g.goodput_frac), rel=1e-6)
    hourly = predict(model, Parallel(**GPT3_LAYOUT), system,
                     training("bf16", checkpoint_interval_s=HOUR))
    assert float(hourly.goodput.checkpoint_interval_s) == HOUR
    assert float(hourly.goodput.goodput_frac) < float(g.goodput_frac)  # Daly's is better
    assert float(hourly.step_time_s) == float(r.step_time_s)


def test_goodput_elasticities_of_the_reliability_leaves():
    """sensitivity.goodput_elasticities at the GPT-3 layout: d ln X / d ln R = -R / M exactly
    (ln G holds -R / M; Daly's interval does not depend on R); every other leaf's elasticity
    is minus its step-time one plus the goodput's own (0 for leaves the goodput ignores)."""
    model, system = _model("gpt3-175b"), _system("a100-sxm-80gb")
    par = Parallel(**GPT3_LAYOUT)
    x, e = goodput_elasticities(model, par, system)
    r = predict(model, par, system)
    assert x == pytest.approx(float(r.goodput.effective_tokens_per_s), rel=1e-5)
    R, M = float(system.reliability.restart_s), float(r.goodput.mtbf_s)
    assert e["reliability.restart_s"] == pytest.approx(-R / M, rel=1e-4)
    assert e["reliability.failure_rate_per_s"] < 0 < e["reliability.storage_write_Bps"]
    assert e["matmul_flops_per_s"] > 0.1 and e["power_W"] == 0.0
    assert "fp8_non_tn_gemm" not in e  # a 0/1 switch: no elasticity (specs.system.SWITCHES)


def test_guide_goodput_example():
    """The user guide's (docs/guide.md) `sensitivity --goodput` excerpt shows the reliability leaves' elasticities
    of Llama 3 405B's 16K-GPU layout on meta-h100-24k (tp 8, pp 16 on 126 layers, vp 8, ZeRO-2,
    no recompute): they depend only on the devices, the model's state and System.reliability,
    not on the step time; the printed values are what the library computes (3 significant
    digits)."""
    text = (REPO / "docs" / "guide.md").read_text()
    assert "sensitivity --goodput --model llama3-405b" in text
    # rows "leaf   value   elasticity   +10 %": columns are 2+ spaces apart
    rows = dict(re.findall(r"^(reliability\.\w+) {2,}\S.*?\S {2,}(-?[\d.]+) {2,}[-+][\d.]+$",
                           text, flags=re.M))
    assert set(rows) == {"reliability.failure_rate_per_s", "reliability.restart_s",
                         "reliability.storage_write_Bps"}, rows
    par = Parallel(tp=8, pp=16, vp=8, dp=128, micro_batch=1, global_batch=2048,
                   sequence_parallel=1, recompute=0, zero_stage=2)
    _, e = goodput_elasticities(_model("llama3-405b"), par, _system("meta-h100-24k"))
    for leaf, shown in rows.items():
        assert float(f"{e[leaf]:.3g}") == float(shown), (leaf, e[leaf], shown)
