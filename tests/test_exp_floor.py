"""The exponential floor of fused attention (System.sfu_exp_per_s; costs.compute.
attention_exp_floor_s): the shipped rates and their sources, golden values by hand on B200 at
head dim 64 and 128, GB300's doubled rate, the gradient contract, and no change where a GPU
has no rate or where the measured curve is slower than the floor."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import diffperf
from diffperf.costs.compute import attention_exp_floor_s, attention_time_s
from diffperf.errors import SpecError
from diffperf.specs.training import Training
from diffperf.workload.ops import Gemms

# One layer of attention, b = 1, s = 8192, 32 heads, causal (count 32 x 0.5 = 16 per row):
# N_exp = 16 x 8192^2 = 1.073742e9 score elements, one exponential each per pass.
N_EXP = 16 * 8192.0**2


def _layer(head_dim):
    return Gemms(m=np.array([8192.0, 8192.0]), n=np.array([8192.0, head_dim]),
                 k=np.array([head_dim, 8192.0]), count=np.array([16.0, 16.0]))


def _ideal(system):
    """The system with an attention curve at the full sustained rate (eta = 1 at any work and
    head size: attn_max 1, no work or head-size fall-off): a kernel as fast as its GEMMs, the
    regime where FlashAttention-4 places Blackwell's forward (arXiv:2603.05451)."""
    return system.replace(eff=system.eff.replace(attn_max=1.0, attn_half_work=1e-30,
                                                 attn_half_head_dim=0.0))


def test_systems_carry_their_exponential_rates():
    """1e12 exponentials/s: H100 3.9 (FA3 paper), GB200 5 and GB300 10.7 (NVIDIA Blackwell
    Ultra blog), B200 and B300 at the clock of their 2250 TFLOP/s peaks: x 2250 / 2500;
    none elsewhere (no published rate: no floor)."""
    want = {"h100-sxm-80gb": 3.9, "b200-sxm-180gb": 4.5, "dgx-b200": 4.5, "gb200-nvl72": 5.0,
            "gb200-nvl72-superpod": 5.0, "gb300-nvl72": 10.7, "dgx-b300": 9.63,
            "a100-sxm-80gb": 0.0, "h200-sxm-141gb": 0.0, "mi300x": 0.0}
    for name, rate in want.items():
        assert float(diffperf.load_system(name).sfu_exp_per_s) == pytest.approx(
            rate * 1e12, rel=1e-6), name


def test_exp_floor_by_hand_on_b200():
    """B200 (R_exp 4.5e12): t_exp = 1.073742e9 / 4.5e12 = 238.609 us forward, / 2.5 =
    95.444 us backward (per unit of forward work; the caller scales by 2.5).
    At eta = 1 the kernel runs at 2250e12 x (0.672 / (797.5 / 989.4)) = 1.875830e15 FLOP/s:
      d_h 64:  4 x 64 x N = 2.748779e11 FLOP -> 146.538 us < 238.609: exp-bound (forward);
               backward 146.538 > 95.444: GEMM-bound;
      d_h 128: 5.497558e11 FLOP -> 293.076 us > 238.609: GEMM-bound.
    The shipped (physics default) curve is slower than the floor at both head sizes:
    eta_inf(64) = 0.75 / (1 + 40 / 64) = 0.4615, so the floor changes nothing there."""
    b200 = diffperf.load_system("dgx-b200")
    assert float(attention_exp_floor_s(N_EXP, b200)) == pytest.approx(238.6093e-6, rel=1e-5)
    assert float(attention_exp_floor_s(N_EXP, b200, backward=True)) == pytest.approx(
        95.4437e-6, rel=1e-5)
    fast, t = _ideal(b200), Training()
    assert float(attention_time_s(_layer(64.0), fast, t, 0.0)) == pytest.approx(
        238.6093e-6, rel=1e-5)
    assert float(attention_time_s(_layer(64.0), fast, t, 0.0, backward=True)) == pytest.approx(
        146.538e-6, rel=1e-4)
    assert float(attention_time_s(_layer(128.0), fast, t, 0.0)) == pytest.approx(
        293.076e-6, rel=1e-4)
    # no rate: the curve alone; the shipped curve: unchanged by the floor
    none = fast.replace(sfu_exp_per_s=0.0)
    assert float(attention_time_s(_layer(64.0), none, t, 0.0)) == pytest.approx(
        146.538e-6, rel=1e-4)
    for d in (64.0, 128.0):
        assert float(attention_time_s(_layer(d), b200, t, 0.0)) == float(
            attention_time_s(_layer(d), b200.replace(sfu_exp_per_s=0.0), t, 0.0))


def test_gb300_doubled_rate_lifts_the_floor_that_binds_on_gb200():
    """d_h 64 at eta = 1: GB200 (2500 TFLOP/s, R 5e12) 214.748 us of exponentials vs
    2.748779e11 / (2500e12 x 0.833699) = 131.885 us of GEMMs: exp-bound; GB300 (R 10.7e12)
    100.350 us: GEMM-bound, 1.628x faster on the same peak. Unfused attention (its softmax a
    separate memory-bound kernel): no floor."""
    t = Training()
    gb200 = _ideal(diffperf.load_system("gb200-nvl72"))
    gb300 = _ideal(diffperf.load_system("gb300-nvl72"))
    t200 = float(attention_time_s(_layer(64.0), gb200, t, 0.0))
    t300 = float(attention_time_s(_layer(64.0), gb300, t, 0.0))
    assert t200 == pytest.approx(214.7484e-6, rel=1e-5)
    assert t300 == pytest.approx(131.885e-6, rel=1e-4)
    unfused = Training(flash_attention=0.0)
    assert float(attention_time_s(_layer(64.0), gb200, unfused, 0.0)) == float(
        attention_time_s(_layer(64.0), gb200.replace(sfu_exp_per_s=0.0), unfused, 0.0))


def test_exp_floor_gradient_contract():
    """Finite everywhere (no rate included), negative where the floor binds (d t / d R =
    -N / R^2 = -5.3025e-17 s^2 at B200's rate), zero where it does not; smooth variant
    finite and never positive."""
    fast = _ideal(diffperf.load_system("dgx-b200"))
    t = Training()

    def time_of(rate, d, temperature=None):
        return attention_time_s(_layer(d), fast.replace(sfu_exp_per_s=rate), t, 0.0,
                                temperature)

    grad = jax.grad(time_of)
    assert float(grad(4.5e12, 64.0)) == pytest.approx(-N_EXP / 4.5e12**2, rel=1e-4)
    assert float(grad(4.5e12, 128.0)) == 0.0
    assert float(grad(0.0, 64.0)) == 0.0
    for d in (64.0, 128.0):
        g = float(grad(4.5e12, d, 0.05))
        assert np.isfinite(g) and g <= 0.0


def test_negative_exponential_rate_is_refused(tmp_path):
    import yaml

    from diffperf import resources

    d = yaml.safe_load(resources.config_files("systems")["dgx-b200"].read_text())
    d["sfu_Texp_per_s"] = -1.0
    p = tmp_path / "bad.yaml"
    p.write_text(yaml.safe_dump(d))
    with pytest.raises(SpecError, match="sfu_Texp_per_s"):
        diffperf.load_system(str(p))
