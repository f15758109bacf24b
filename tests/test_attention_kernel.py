"""The attention kernel a run ran (Training.attention_fa2; costs.compute.attention_kernel_factor):
FlashAttention-2 on Hopper at its published rate, golden values by hand, and no change where
the fact is off or the GPU has no published FA2 rate (A100: FA2 is the set's own kernel)."""

from __future__ import annotations

import numpy as np
import pytest

import diffperf
from diffperf import Parallel, Training, predict
from diffperf.costs.compute import attention_kernel_factor, attention_time_s
from diffperf.errors import SpecError
from diffperf.specs.system import Efficiency
from diffperf.workload.ops import Gemms


def test_hopper_systems_carry_the_fa3_paper_fa2_rates():
    """335 and 322 TFLOP/s (FA3 paper Figs. 5 and 6, head dim 128, 16k) over 989.4."""
    for name in ("h100-sxm-80gb", "grand-teton-h100", "h100-80gb-800gbps-node",
                 "meta-h100-24k", "h200-sxm-141gb"):
        s = diffperf.load_system(name)
        assert float(s.attn_fa2_fwd_frac) == pytest.approx(335 / 989.4, abs=5e-5), name
        assert float(s.attn_fa2_bwd_frac) == pytest.approx(322 / 989.4, abs=5e-5), name
    for name in ("a100-sxm-80gb", "a100-80gb-400gbps-node", "dgx-b200"):
        s = diffperf.load_system(name)
        assert float(s.attn_fa2_fwd_frac) == 0.0 == float(s.attn_fa2_bwd_frac), name


def test_kernel_factor_by_hand():
    """r = min(1, c / (eta_max / (1 + d_half / d_h))). Default efficiencies (eta_max 0.75,
    d_half 40), d_h 128: plateau 0.75 / 1.3125 = 0.571429; r_f = 0.3386 / 0.571429 = 0.592550,
    r_b = 0.3254 / 0.571429 = 0.569450. Shipped H100 set (0.7833378, 49.828804): plateau
    0.7833378 / 1.3892875 = 0.563842, r_f = 0.600523."""
    h100 = diffperf.load_system("h100-sxm-80gb")
    fa2 = Training(attention_fa2=1.0)
    assert float(attention_kernel_factor(128.0, h100, fa2)) == pytest.approx(0.592550, rel=1e-5)
    assert float(attention_kernel_factor(128.0, h100, fa2, backward=True)) == pytest.approx(
        0.569450, rel=1e-5)
    shipped = h100.replace(eff=h100.eff.replace(attn_max=0.7833378, attn_half_head_dim=49.828804))
    assert float(attention_kernel_factor(128.0, shipped, fa2)) == pytest.approx(0.600523,
                                                                                rel=1e-5)
    # off: the fact unset, or no published FA2 rate (A100), or a head so small that the set's
    # own plateau (0.75 / (1 + 40 / 16) = 0.2143) is below FA2's: factor 1
    assert float(attention_kernel_factor(128.0, h100, Training())) == 1.0
    assert float(attention_kernel_factor(128.0, diffperf.load_system("a100-sxm-80gb"),
                                         fa2)) == 1.0
    assert float(attention_kernel_factor(16.0, h100, fa2)) == 1.0


def test_fa2_attention_time_by_hand():
    """b = 1, 32 heads, s = 8192, d_h 128, causal (count 32 x 0.5 = 16 per row):
    W = 16 x 8192^2 = 1.073742e9; FLOPs F = 2 x (2 x 8192 x 8192 x 128 x 16) = 5.497558e11.
    FA2's own fall-off (F_f 2.7655e10, gamma_f 1.3011): (2.7655e10 / F)^1.3011 =
    0.0503042^1.3011 = 0.0204483; forward eta = min(0.571429, 0.3386) / 1.0204483 = 0.331815:
    t = 5.497558e11 / (989.4e12 x 0.331815) = 1.674565 ms; backward eta 0.3254 / 1.0204483
    = 0.318879, t = 1.742494 ms. The set's kernel (default efficiencies, (9e7 / W)^1.2 =
    0.051051): eta = 0.75 / (1.051051 x 1.3125) = 0.543674, t = 1.022035 ms. Without F_f
    (the set's fall-off at FA2's plateau, the shape before fa2curve): eta = 0.3386 /
    1.051051 = 0.322154, t = 1.724785 ms."""
    h100 = diffperf.load_system("h100-sxm-80gb").replace(eff=Efficiency())
    g = Gemms(m=np.array([8192.0, 8192.0]), n=np.array([8192.0, 128.0]),
              k=np.array([128.0, 8192.0]), count=np.array([16.0, 16.0]))
    fa2 = Training(attention_fa2=1.0)
    assert float(attention_time_s(g, h100, fa2, 0.0)) == pytest.approx(1.674565e-3, rel=2e-5)
    assert float(attention_time_s(g, h100, fa2, 0.0, backward=True)) == pytest.approx(
        1.742494e-3, rel=2e-5)
    assert float(attention_time_s(g, h100.replace(attn_fa2_half_flop=0.0), fa2, 0.0)) == (
        pytest.approx(1.724785e-3, rel=2e-5))
    assert float(attention_time_s(g, h100, Training(), 0.0)) == pytest.approx(1.022035e-3,
                                                                             rel=2e-5)
    assert float(attention_time_s(g, h100, Training(), 0.0, backward=True)) == float(
        attention_time_s(g, h100, Training(), 0.0))


def test_fa2_own_fall_off_at_a_fa3_paper_point():
    """The FA3 paper's Fig. 5(d) shape at s = 1k (b = 16k / s = 16, 16 heads of 128, causal:
    count 16 x 16 x 0.5 = 128): F = 2 x (2 x 1024^2 x 128 x 128) = 6.871948e10,
    (2.7655e10 / F)^1.3011 = 0.402433^1.3011 = 0.305962; FA2 forward 335 / 1.305962 =
    256.52 TFLOP/s (paper: 260, a bar not used to derive F_f) -> t = 0.2678869 ms; the
    exponential floor (1.342e8 / 3.9e12 = 34 us) does not bind. Both shipped fields are
    the closed form of the paper's 512 and 2k bars (191, 298; F 3.436e10 and 1.374e11)."""
    import math

    h100 = diffperf.load_system("h100-sxm-80gb").replace(eff=Efficiency())
    y1, y2 = 335 / 191 - 1, 335 / 298 - 1
    gamma = math.log(y1 / y2) / math.log(4.0)
    assert float(h100.attn_fa2_exponent) == pytest.approx(gamma, abs=5e-5)
    assert float(h100.attn_fa2_half_flop) == pytest.approx(3.4359738e10 * y1 ** (1 / gamma),
                                                           rel=1e-4)
    g = Gemms(m=np.array([1024.0, 1024.0]), n=np.array([1024.0, 128.0]),
              k=np.array([128.0, 1024.0]), count=np.array([128.0, 128.0]))
    t = float(attention_time_s(g, h100, Training(attention_fa2=1.0), 0.0))
    assert t == pytest.approx(0.2678869e-3, rel=2e-5)
    assert 6.871948e10 / t / 1e12 == pytest.approx(256.52, abs=0.02)


def test_fa2_slows_an_h100_step_and_leaves_an_a100_step_unchanged():
    """Llama 3 8B, 8 GPUs, FSDP: the FA2 fact adds exactly the attention's slowdown to the
    compute on H100 and changes nothing on A100 (no published FA2 rate: the set's kernel)."""
    model = diffperf.load_model("llama3-8b")
    par = Parallel(dp=8, micro_batch=1, global_batch=8, zero_stage=3)
    for name, slower in (("h100-sxm-80gb", True), ("a100-sxm-80gb", False)):
        system = diffperf.load_system(name)
        base = predict(model, par, system, Training())
        fa2 = predict(model, par, system, Training(attention_fa2=1.0))
        if slower:
            assert float(fa2.step_time_s) > 1.05 * float(base.step_time_s)
            assert float(fa2.breakdown.compute_s) > float(base.breakdown.compute_s)
        else:
            assert float(fa2.step_time_s) == float(base.step_time_s)


def test_fa2_rate_above_one_is_refused(tmp_path):
    import yaml

    from diffperf import resources

    d = yaml.safe_load(resources.config_files("systems")["h100-sxm-80gb"].read_text())
    d["attn_fa2_fwd_frac"] = 1.5
    p = tmp_path / "bad.yaml"
    p.write_text(yaml.safe_dump(d))
    with pytest.raises(SpecError, match="attn_fa2_fwd_frac=1.5 must be at most 1"):
        diffperf.load_system(str(p))
    for key, value, rule in (("attn_fa2_half_GFLOP", -1.0, "must be >= 0"),
                             ("attn_fa2_exponent", 0.0, "must be > 0")):
        bad = dict(d, attn_fa2_fwd_frac=0.3386, **{key: value})
        p.write_text(yaml.safe_dump(bad))
        with pytest.raises(SpecError, match=f"{key}={value:g} {rule}"):
            diffperf.load_system(str(p))


def test_fa2_backward_rate_reaches_the_tiled_window_kernels():
    """With full and window layers as their own kernels (attn_tile > 0), the backward rate
    applies to each kernel too: compute-bound (io 0), backward / forward per unit of work =
    r_f / r_b = c_fwd / c_bwd = 0.3386 / 0.3254 = 1.040565 at GPT-OSS's head dim 64 (the
    default plateau 0.75 / (1 + 40 / 64) = 0.4615 is above both rates)."""
    from diffperf.costs.compute import attention_by_kind_time_s
    from diffperf.workload.flops import attention_by_kind

    model = diffperf.load_model("gpt-oss-20b")
    h100 = diffperf.load_system("h100-sxm-80gb").replace(eff=Efficiency())
    training = Training(attention_fa2=1.0, attn_tile=128.0)
    kinds = attention_by_kind(model, Parallel(), training)
    fwd = float(attention_by_kind_time_s(kinds, h100, training, 0.0))
    bwd = float(attention_by_kind_time_s(kinds, h100, training, 0.0, backward=True))
    assert bwd / fwd == pytest.approx(0.3386 / 0.3254, rel=1e-5)
    plain = Training(attn_tile=128.0)
    assert float(attention_by_kind_time_s(kinds, h100, plain, 0.0, backward=True)) == float(
        attention_by_kind_time_s(kinds, h100, plain, 0.0))
