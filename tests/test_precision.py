"""Low precision as it runs (FP8 / MXFP8 / NVFP4 recipes, docs/precision.md) and the Blackwell
systems: every new term against a value computed by hand from its formula and the datasheet.

The gradient contract of the low-precision step (finite, check_grads under x64, more FP8 / FP4
peak never slows a step) is in tests/test_gradients.py, which shares its compilations.
"""

from __future__ import annotations

import re

import math
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from diffperf import Parallel, predict
from diffperf.cli.main import main
from diffperf.costs.compute import (gemm_times_s, lowp_gemm_times_s, lowp_peak, lowp_rate,
                                    lowp_quantize_times_s, matmul_peak, matmul_rate,
                                    sustained_scale)
from diffperf.errors import SpecError
from diffperf.load import training
from diffperf.specs.training import PRECISIONS
from diffperf.workload.dp import dp_volumes_bytes, gathered_weight_bytes
from diffperf.workload.flops import (cast_bytes, lowp_pass_fracs, lowp_quantize_bytes,
                                     quantized_elem_bytes)
from diffperf.workload.ops import Gemms
from shipped import model as _model, system as _system

LOW = ("fp8-delayed", "fp8-current", "fp8-blockwise", "mxfp8", "nvfp4")
N = 8192.0


def _one_gemm(m, n, k):
    return Gemms(m=jnp.array([m]), n=jnp.array([n]), k=jnp.array([k]), count=jnp.array([1.0]))


def _nine_rows(m, n, k, rows=(0, 4)):
    """A layer_ops-shaped Gemms (len(LOWP_LINEAR_ROWS) rows: 9, or 12 with the MLA rows of
    branch models) with count 1 on `rows` only (row 4 = the router)."""
    from diffperf.workload.flops import LOWP_LINEAR_ROWS

    r = len(LOWP_LINEAR_ROWS)
    count = np.zeros(r)
    count[list(rows)] = 1.0
    full = lambda x: jnp.full(r, float(x))  # noqa: E731
    return Gemms(m=full(m), n=full(n), k=full(k), count=jnp.asarray(count))


# ------------------------------------------------------------------------------ presets

def test_the_shared_names_exist_and_fp8_is_fp8_current():
    for name in LOW + ("fp8", "bf16"):
        assert name in PRECISIONS
        assert training(name).name == name
    assert PRECISIONS["fp8"] == PRECISIONS["fp8-current"]
    for name in LOW:
        t = training(name)
        # TE: fprop, dgrad and wgrad of every linear in the low format
        assert (t.lowp_fprop, t.lowp_dgrad, t.lowp_wgrad) == (1.0, 1.0, 1.0)
        # Megatron mixed precision underneath: bf16 weights and grads, fp32 master + Adam
        assert (t.weight_bytes, t.grad_bytes, t.master_bytes, t.optimizer_bytes) == (
            2.0, 2.0, 4.0, 8.0)


def test_bf16_presets_quantize_nothing():
    for name in ("bf16", "fp16", "amp-bf16", "xla-amp-bf16", "bf16-pure", "fp32"):
        for frac in lowp_pass_fracs(training(name)):
            assert float(jnp.sum(frac)) == 0.0
        f, b, w = lowp_quantize_bytes(_nine_rows(64, 64, 64), training(name))
        assert (float(f), float(b), float(w)) == (0.0, 0.0, 0.0)


@pytest.mark.parametrize("name, e_q", [
    ("fp8-delayed", 1.0), ("fp8-current", 1.0),
    ("fp8-blockwise", 1.0 + 4.0 / 128.0),   # fp32 scale per 1 x 128 tile (DeepSeek-V3 3.3)
    ("mxfp8", 1.0 + 1.0 / 32.0),            # E8M0 scale per 32 (OCP MX v1.0)
    ("nvfp4", 0.5 + 1.0 / 16.0)])           # E2M1 + E4M3 scale per 16
def test_quantized_bytes_per_element(name, e_q):
    assert float(quantized_elem_bytes(training(name))) == pytest.approx(e_q, rel=1e-7)


def test_linear_rows_only_the_router_stays_16_bit():
    f, d, w = lowp_pass_fracs(training("fp8-current"))
    # rows 9-11: MLA's projections (branch models), linears in FP8 too
    assert np.asarray(f).tolist() == [1, 1, 1, 1, 0, 1, 1, 1, 1, 1, 1, 1]
    half = training("nvfp4", lowp_layer_frac=0.5)
    assert np.asarray(lowp_pass_fracs(half)[2]).tolist() == [.5, .5, .5, .5, 0, .5, .5, .5, .5,
                                                             .5, .5, .5]


# ------------------------------------------------------------------- GEMM time (golden)

def _eta(m, n, k, eff):
    """Shape efficiency by hand: eta = mm_max / (1 + (d_half / d)^gamma), d = soft-min p=4."""
    d = (m ** -4 + n ** -4 + k ** -4) ** -0.25
    return eff.mm_max / (1.0 + (eff.mm_half_dim / d) ** eff.mm_exponent)


def test_fp8_gemm_on_h100_from_the_datasheet_peak():
    """8192^3 GEMM on an H100 SXM: 2 N^3 / (1978.9 TFLOP/s x s x eta), s = 0.711 / 0.80604 =
    0.88209 (the measured FP8 fraction over the BF16 reference, configs/systems/h100-sxm-80gb.
    yaml), eta = 0.8 / (1 + (64 / (3^-1/4 8192))^1.5) = 0.79917 -> 0.7881 ms; compute-bound
    (its 268 MB of FP8 inputs and BF16 output take 0.094 ms at 3350 GB/s x 0.85). BF16: the
    same eta at 989.4 (s = 1, the reference): 2 x 0.88209 = 1.7642x the FP8 time, not 2x."""
    h100 = _system("h100-sxm-80gb")
    t8 = training("fp8-current")
    g = _one_gemm(N, N, N)
    eta = _eta(N, N, N, h100.eff)
    s = 0.711 / (797.5 / 989.4)
    assert s == pytest.approx(0.88209, abs=1e-5)
    hand = 2 * N ** 3 / (1978.9e12 * s * eta)
    assert hand == pytest.approx(7.881e-4, rel=1e-3)
    got = float(lowp_gemm_times_s(g, h100, t8, h100.eff.mm_max, h100.eff.mm_half_dim)[0])
    assert got == pytest.approx(hand, rel=1e-5)
    bf16 = float(gemm_times_s(g, h100, t8, h100.eff.mm_max, h100.eff.mm_half_dim)[0])
    assert bf16 / got == pytest.approx(1978.9 / 989.4 * s, rel=1e-5)
    assert bf16 / got == pytest.approx(1.7642, abs=1e-4)


def test_nvfp4_gemm_on_b200_runs_at_the_fp4_peak_it_sustains():
    """NVFP4 GEMMs at the 9000 TFLOP/s dense peak (HGX B200, the datasheet: lowp_peak, MFU's
    denominator) x the published sustained fraction relative to H100's (costs.compute.
    sustained_scale): FP4 3904.3 / 9000 = 0.434, BF16 1512.8 / 2250 = 0.672, reference
    797.5 / 989.4 = 0.80604 (configs/systems/dgx-b200.yaml sources). By hand:
    F_fp4 = 9000e12 x 0.434 / 0.80604 = 4845.9 TFLOP/s, F_bf16 = 2250e12 x 0.672 / 0.80604 =
    1875.8 TFLOP/s: NVFP4 2.583x BF16 (not the datasheets' 4x), same eta."""
    b200 = _system("dgx-b200")
    t4 = training("nvfp4")
    assert float(lowp_peak(b200, t4)) == pytest.approx(9000e12, rel=1e-6)
    assert float(lowp_peak(b200, training("mxfp8"))) == pytest.approx(4500e12, rel=1e-6)
    ref = 797.5 / 989.4
    assert float(lowp_rate(b200, t4)) == pytest.approx(4845.9e12, rel=1e-4)
    assert float(lowp_rate(b200, training("mxfp8"))) == pytest.approx(
        4500e12 * 0.566 / ref, rel=1e-6)
    assert float(matmul_rate(b200, t4)) == pytest.approx(1875.8e12, rel=1e-4)
    g = _one_gemm(N, N, N)
    e = b200.eff
    fp4 = float(lowp_gemm_times_s(g, b200, t4, e.mm_max, e.mm_half_dim)[0])
    assert fp4 == pytest.approx(2 * N ** 3 / (4845.9e12 * _eta(N, N, N, e)), rel=1e-4)
    bf16 = float(gemm_times_s(g, b200, t4, e.mm_max, e.mm_half_dim)[0])
    assert bf16 / fp4 == pytest.approx(4.0 * 0.434 / 0.672, rel=1e-5)


def test_sustained_scale_by_hand_and_unmeasured_gpus_unchanged():
    """s = f / f_ref for a measured fraction f (0.566 -> 0.70220), exactly 1 when unmeasured
    (f = 0: H100, A100, ...; the rate is then the datasheet peak, bit for bit)."""
    ref = 797.5 / 989.4
    assert float(sustained_scale(0.566)) == pytest.approx(0.566 / ref, rel=1e-6)
    assert 0.566 / ref == pytest.approx(0.70220, rel=1e-4)
    assert float(sustained_scale(0.0)) == 1.0
    assert float(sustained_scale(ref)) == pytest.approx(1.0, rel=1e-6)
    # H100's 16-bit rate is the reference (no matmul_sustained_frac): the peak, bit for bit;
    # its FP8 rate has a measured fraction since branch h100fp8 (test_h100_fp8_fraction_...)
    h100 = _system("h100-sxm-80gb")
    for name in ("bf16", "fp8-current"):
        t = training(name)
        assert float(matmul_rate(h100, t)) == float(matmul_peak(h100, t))
    # a GPU with FP8 tensor cores and no FP8 measurement keeps its datasheet FP8 peak
    unmeasured = h100.replace(matmul_fp8_sustained_frac=0.0)
    t8 = training("fp8-current")
    assert float(lowp_rate(unmeasured, t8)) == float(lowp_peak(unmeasured, t8))


def test_b300_and_gb200_fractions_carry_the_mamf_ratio_onto_b200s_shape_class():
    """DGX B300 and GB200 take B200's vLLM-shape fraction (M 16384, N 6144, K 4096: BF16 0.672,
    FP8 0.566) times the ratio of their Maximum Achievable Matmul FLOPS fractions to B200's, one
    benchmark run on all three (stas00/ml-engineering MAMF table, torch.matmul best shape):
    B200 BF16 1745.0 / 2250, FP8 3432.5 / 4500; B300 1769.0 / 2250, 3353.3 / 4500; GB200
    1822.0 / 2500, 3615.6 / 5000. By hand: B300 0.672 x 0.78622 / 0.77556 = 0.6812, 0.566 x
    0.74518 / 0.76278 = 0.5529; GB200 0.672 x 0.72880 / 0.77556 = 0.6315, 0.566 x 0.72312 /
    0.76278 = 0.5366. GB300's BF16 (no measurement) and FP4 (none in the table) keep B200's;
    its FP8 is test_gb300_fp8_fraction_carries_the_azure_ratio_onto_gb200s."""
    b16, b8 = 1745.0 / 2250, 3432.5 / 4500
    hand = {"dgx-b300": (0.672 * (1769.0 / 2250) / b16, 0.566 * (3353.3 / 4500) / b8),
            "gb200-nvl72": (0.672 * (1822.0 / 2500) / b16, 0.566 * (3615.6 / 5000) / b8),
            "gb200-nvl72-superpod": (0.672 * (1822.0 / 2500) / b16, 0.566 * (3615.6 / 5000) / b8),
            "gb300-nvl72": (0.672, 0.537 * 3308.5 / 2819.5), "dgx-b200": (0.672, 0.566)}
    assert hand["dgx-b300"] == pytest.approx((0.6812, 0.5529), abs=1e-4)
    assert hand["gb200-nvl72"] == pytest.approx((0.6315, 0.5366), abs=1e-4)
    for name, (f16, f8) in hand.items():
        s = _system(name)
        assert float(s.matmul_sustained_frac) == pytest.approx(f16, abs=5e-4), name
        assert float(s.matmul_fp8_sustained_frac) == pytest.approx(f8, abs=5e-4), name
        assert float(s.matmul_fp4_sustained_frac) == pytest.approx(0.434, abs=1e-9), name
    # the sustained FP8 rate of GB200 over B200 is the measured 3615.6 / 3432.5 = 1.0533 (to the
    # 3-digit rounding of the fractions), not the datasheets' 5000 / 4500 = 1.111
    t8 = training("fp8-current")
    ratio = float(lowp_rate(_system("gb200-nvl72"), t8)) / float(lowp_rate(_system("dgx-b200"), t8))
    assert ratio == pytest.approx(3615.6 / 3432.5, rel=1.5e-3)
    assert float(lowp_rate(_system("gb200-nvl72"), t8)) == pytest.approx(
        5000e12 * 0.537 / (797.5 / 989.4), rel=1e-6)


def test_grand_teton_500w_cap_slows_the_sm_clocked_rates_not_hbm():
    """The 500 W Grand Teton H100 (94 GiB HBM2e) sustains the 700 W reference fraction times
    its SM clock at the cap over the uncapped clock, 1731 / 1969 MHz (arXiv:2604.11391v2
    Fig. 6b; configs/systems/grand-teton-h100.yaml sources): f = 0.80604 x 0.87913 = 0.7086.
    By hand: s = 0.7086 / 0.80604 = 0.879108; BF16 989.4 x s = 869.790 TFLOP/s; FP8: the 700 W
    H100 SXM's FP8 fraction x the same clock ratio, 0.711 x 0.87913 = 0.6251, 1978.9 x 0.6251 /
    0.80604 = 1534.668; vector 66.9 x 0.87913 = 58.81. The datasheet peak (MFU's denominator) and the
    HBM bandwidth (its own clock) are unchanged; an 8192^3 GEMM takes 1 / s = 1.137516 x the
    700 W SXM's time, a memory-bound op the same time at the same bandwidth."""
    gt, sxm = _system("grand-teton-h100"), _system("h100-sxm-80gb")
    ref = 797.5 / 989.4
    clock = 1731.0 / 1969.0
    assert ref * clock == pytest.approx(0.7086, abs=5e-5)
    assert float(gt.matmul_sustained_frac) == 0.7086
    # FP8: the 700 W H100 SXM's FP8 fraction (0.711, branch h100fp8) x the same clock ratio
    assert float(gt.matmul_fp8_sustained_frac) == 0.6251
    assert 0.711 * clock == pytest.approx(0.6251, abs=5e-5)
    s = 0.7086 / ref
    assert s == pytest.approx(0.879108, abs=1e-6)
    t16, t8 = training("bf16"), training("fp8-current")
    assert float(matmul_peak(gt, t16)) == pytest.approx(989.4e12, rel=1e-6)
    assert float(lowp_peak(gt, t8)) == pytest.approx(1978.9e12, rel=1e-6)
    assert float(matmul_rate(gt, t16)) == pytest.approx(869.790e12, rel=2e-6)
    assert float(lowp_rate(gt, t8)) == pytest.approx(1978.9e12 * 0.6251 / ref, rel=1e-6)
    assert 1978.9 * 0.6251 / ref == pytest.approx(1534.668, abs=1e-3)
    assert float(gt.vector_flops_per_s) == pytest.approx(66.9e12 * clock, rel=1e-4)
    assert float(gt.hbm_bandwidth_Bps) == pytest.approx(2.4e12, rel=1e-6)
    g = _one_gemm(N, N, N)
    sxm = sxm.replace(eff=gt.eff, hbm_bandwidth_Bps=gt.hbm_bandwidth_Bps)
    e = gt.eff
    slow = float(gemm_times_s(g, gt, t16, e.mm_max, e.mm_half_dim)[0])
    fast = float(gemm_times_s(g, sxm, t16, e.mm_max, e.mm_half_dim)[0])
    assert slow / fast == pytest.approx(1.137516, rel=2e-6)
    from diffperf.costs.compute import memory_time_s
    assert float(memory_time_s(1e9, gt)) == float(memory_time_s(1e9, sxm))


def test_sustained_fraction_gradient_contract(x64):
    """d t / d f of a compute-bound FP8 GEMM on B200 (x64, log-parameter check_grads): finite,
    negative (a GPU that sustains more of its peak is faster), and -t / f (t ~ 1 / f); the
    unmeasured branch (f = 0) has a finite zero gradient (double where)."""
    from jax.test_util import check_grads

    b200 = _system("dgx-b200")
    t8 = training("mxfp8")
    g = _one_gemm(N, N, N)

    def time_of(log_f):
        s = b200.replace(matmul_fp8_sustained_frac=jnp.exp(log_f))
        return lowp_gemm_times_s(g, s, t8, s.eff.mm_max, s.eff.mm_half_dim)[0]

    x = jnp.log(jnp.float64(0.566))
    check_grads(time_of, (x,), order=1, modes=("rev",), eps=1e-4)
    d = float(jax.grad(time_of)(x))
    assert d < 0 and d == pytest.approx(-float(time_of(x)), rel=1e-6)  # d t / d ln f = -t
    zero = jax.grad(lambda f: lowp_gemm_times_s(
        g, b200.replace(matmul_fp8_sustained_frac=f), t8, b200.eff.mm_max,
        b200.eff.mm_half_dim)[0])(jnp.float64(0.0))
    assert np.isfinite(float(zero)) and float(zero) == 0.0


def test_memory_bound_fp8_gemm_moves_one_byte_per_input_element():
    """A skinny GEMM (m = 16) is memory-bound: e_q (m k + k n) + q m n bytes at BW x eta_mem."""
    h100 = _system("h100-sxm-80gb")
    m, n, k = 16.0, N, N
    got = float(lowp_gemm_times_s(_one_gemm(m, n, k), h100, training("fp8-delayed"),
                                  h100.eff.mm_max, h100.eff.mm_half_dim)[0])
    by_bytes = (1.0 * (m * k + k * n) + 2.0 * m * n) / (3350e9 * h100.eff.mem_eff)
    by_flops = 2 * m * n * k / (1978.9e12 * _eta(m, n, k, h100.eff))
    assert by_bytes > by_flops
    assert got == pytest.approx(by_bytes, rel=1e-5)


# ------------------------------------------------------------- quantization work (golden)

def test_cast_bytes_of_a_bf16_activation():
    """8192 x 8192 BF16 -> FP8 row- and column-wise: current scaling reads it twice (amax,
    then cast) and writes 2 x 1 B: 67108864 x 6 = 402653184 B; delayed: x 4; MXFP8 adds
    1 B per 32 to each copy: x (2 + 2 x 1.03125)."""
    n = N * N
    assert float(cast_bytes(n, 2.0, 2.0, 1.0, training("fp8-current"))) == 402653184.0
    assert float(cast_bytes(n, 2.0, 2.0, 1.0, training("fp8-delayed"))) == 268435456.0
    assert float(cast_bytes(n, 2.0, 2.0, 1.0, training("mxfp8"))) == n * (2 + 2 * 1.03125)
    assert float(cast_bytes(n, 2.0, 1.0, 1.0, training("nvfp4"))) == n * (2 * 2 + 0.5625)


@pytest.mark.parametrize("name, fwd, bwd, wts", [
    # X 4 x 8 (32), dY 4 x 6 (24), W 8 x 6 (48) of one linear row; the router row is skipped.
    ("fp8-current", 32 * (2 * 2 + 2), 24 * (2 * 2 + 2), 48 * (2 * 2 + 2)),
    ("fp8-delayed", 32 * (2 + 2), 24 * (2 + 2), 48 * (2 + 2)),
    ("mxfp8", 32 * (2 + 2 * 1.03125), 24 * (2 + 2 * 1.03125), 48 * (2 + 2 * 1.03125)),
    ("nvfp4", 32 * (4 + 2 * 0.5625), 24 * (4 + 2 * 0.5625), 48 * (4 + 2 * 0.5625))])
def test_layer_quantize_bytes_by_hand(name, fwd, bwd, wts):
    got = lowp_quantize_bytes(_nine_rows(4, 6, 8), training(name))
    assert [float(x) for x in got] == pytest.approx([fwd, bwd, wts], rel=1e-6)
    # wgrad in BF16 (fprop, dgrad FP8): X and dY one copy each, W still two
    only = training(name, lowp_wgrad=0.0)
    e_q, amax = float(quantized_elem_bytes(only)), only.lowp_amax_pass
    got = lowp_quantize_bytes(_nine_rows(4, 6, 8), only)
    assert [float(x) for x in got] == pytest.approx(
        [32 * (2 * (1 + amax) + e_q), 24 * (2 * (1 + amax) + e_q),
         48 * (2 * (1 + amax) + 2 * e_q)], rel=1e-6)


def test_quantize_time_on_h100():
    """fp8-current, one 8192^2 linear (count 1), 4 micro-batches, weights cached: forward
    (402.65 MB + 402.65 MB / 4) / (3350 GB/s x 0.85) + 2.5 kernels x 4 us; backward
    402.65 MB / (...) + 2 kernels."""
    h100 = _system("h100-sxm-80gb")
    e = h100.eff
    f, b = lowp_quantize_times_s(_nine_rows(N, N, N, rows=(0,)), h100, training("fp8-current"),
                                 4.0)
    bw = 3350e9 * e.mem_eff
    assert float(f) == pytest.approx(402653184 * 1.25 / bw + 2.5 * e.kernel_s, rel=1e-5)
    assert float(b) == pytest.approx(402653184 / bw + 2.0 * e.kernel_s, rel=1e-5)
    assert 402653184 / bw == pytest.approx(1.414e-4, rel=1e-3)


# ------------------------------------------------------------------- memory and gathers

def test_weight_cache_and_quantized_saved_inputs():
    """Llama 3 8B, tp 8 with SP, one stage: FP8 keeps 32 layers x 2.181e8 / 8 weights x 2
    copies x 1 B more (the quantized weight cache), and its saved linear inputs (2 s b h / t
    + s b f / t per layer, 32 layers, one micro-batch in flight) at 1 B instead of 2."""
    model, system = _model("llama3-8b"), _system("h100-sxm-80gb")
    parallel = Parallel(tp=8, pp=1, dp=1, micro_batch=1, global_batch=8, sequence_parallel=1)
    h, f, a, akv, d = 4096.0, 14336.0, 32.0, 8.0, 128.0
    per_layer = h * (a + 2 * akv) * d + a * d * h + 3 * h * f
    assert per_layer == pytest.approx(2.181e8, rel=1e-3)
    r16 = predict(model, parallel, system, training("bf16"))
    r8 = predict(model, parallel, system, training("fp8-current"))
    cache = 32 * per_layer / 8 * 2 * 1.0
    assert float(r8.memory.weights_bytes - r16.memory.weights_bytes) == pytest.approx(
        cache, rel=1e-5)
    T = 8192.0
    saved = 32 * (2 * T * h / 8 + T * f / 8) * (2.0 - 1.0)
    assert float(r16.memory.activations_bytes - r8.memory.activations_bytes) == pytest.approx(
        saved, rel=1e-4)
    # FP8 primary weights (--fp8-param-gather): every weight held at 1 B, and only the
    # column-wise copy is extra: P (2 - 1) + 32 x 2.181e8 / 8 x 1 B less than without it
    # (Megatron needs the distributed optimizer for it: ZeRO-1, over dp = 1 the same memory)
    rp = predict(model, parallel.replace(zero_stage=1), system,
                 training("fp8-current", lowp_param_gather=1.0))
    P = float(r16.memory.weights_bytes) / 2.0
    assert float(r8.memory.weights_bytes - rp.memory.weights_bytes) == pytest.approx(
        P + 32 * per_layer / 8, rel=1e-5)
    # NVFP4 keeps 0.5625 B per element instead
    r4 = predict(model, parallel, _system("dgx-b200"), training("nvfp4"))
    r16b = predict(model, parallel, _system("dgx-b200"), training("bf16"))
    assert float(r4.memory.weights_bytes - r16b.memory.weights_bytes) == pytest.approx(
        32 * per_layer / 8 * 2 * 0.5625, rel=1e-5)


def test_fp8_parameter_gather_halves_the_gathered_bytes():
    assert float(gathered_weight_bytes(training("fp8-current"))) == 2.0   # off by default
    on = training("fp8-current", lowp_param_gather=1.0)
    assert float(gathered_weight_bytes(on)) == 1.0
    assert float(gathered_weight_bytes(training("mxfp8", lowp_param_gather=1.0))) == 1.03125
    assert float(gathered_weight_bytes(training("bf16", lowp_param_gather=1.0))) == 2.0
    g, w, lw, lg = dp_volumes_bytes(1e9, 1e7, on)
    assert (float(g), float(w), float(lw), float(lg)) == (2e9, 1e9, 1e7, 2e7)
    # ZeRO-3 over 2 nodes: the per-layer gathers are half as long, the step no slower
    model, system = _model("llama3-8b"), _system("h100-sxm-80gb")
    parallel = Parallel(tp=1, pp=1, dp=16, micro_batch=1, global_batch=16, zero_stage=3)
    off = predict(model, parallel, system, training("fp8-current"))
    gathered = predict(model, parallel, system, on)
    assert float(gathered.step_time_s) < float(off.step_time_s)


# ------------------------------------------------------------------------ whole steps

def test_step_time_ordering_llama3_70b():
    """Compute-bound Llama 3 70B: every low-precision recipe is faster than bf16; current
    scaling's amax pass makes it slower than delayed scaling; on B200 NVFP4 (FP4 peak) is
    the fastest, MXFP8 and per-tensor FP8 share the FP8 peak."""
    model = _model("llama3-70b")
    parallel = Parallel(tp=4, pp=4, dp=4, vp=5, micro_batch=1, global_batch=128,
                        sequence_parallel=1, zero_stage=1)

    def step(system, precision):
        return float(predict(model, parallel, _system(system), training(precision)).step_time_s)

    h = {p: step("h100-sxm-80gb", p) for p in ("bf16", "fp8-delayed", "fp8-current")}
    assert h["fp8-delayed"] < h["fp8-current"] < h["bf16"]
    b = {p: step("dgx-b200", p) for p in ("bf16", "fp8-current", "mxfp8", "nvfp4")}
    assert b["nvfp4"] < b["mxfp8"] < b["bf16"] and b["nvfp4"] < b["fp8-current"] < b["bf16"]
    # the gain is below the 2x (4x) of the peaks: attention, the output layer, memory-bound
    # kernels and communication stay as they are, and the casts are added
    assert 1.0 < h["bf16"] / h["fp8-delayed"] < 2.0
    assert 1.0 < b["bf16"] / b["nvfp4"] < 4.0


def test_bf16_ignores_the_low_precision_peaks():
    """A bf16 step does not change when the FP8 / FP4 peaks change (exactly)."""
    model, system = _model("llama3-8b"), _system("dgx-b200")
    parallel = Parallel(tp=2, pp=1, dp=4, micro_batch=1, global_batch=8)
    base = float(predict(model, parallel, system).step_time_s)
    other = system.replace(matmul_fp8_flops_per_s=1e15, matmul_fp4_flops_per_s=3e16)
    assert float(predict(model, parallel, other).step_time_s) == base


# --------------------------------------------------------------------------- refusals

@pytest.mark.parametrize("system, precision, needs", [
    ("a100-sxm-80gb", "fp8", "no FP8 tensor cores"),
    ("a100-sxm-80gb", "fp8-blockwise", "no FP8 tensor cores"),
    ("h100-sxm-80gb", "mxfp8", "block-scaled"),
    ("h200-sxm-141gb", "nvfp4", "block-scaled")])
def test_low_precision_needs_its_tensor_cores(system, precision, needs):
    model = _model("llama3-8b")
    with pytest.raises(SpecError, match=needs):
        predict(model, Parallel(tp=1, dp=8, micro_batch=1, global_batch=8), _system(system),
                training(precision))


def test_cli_refuses_fp8_on_a100_with_exit_2(capsys):
    code = main(["predict", "--model", "llama3-8b", "--system", "a100-sxm-80gb",
                 "--gpus", "8", "--tp", "1", "--precision", "fp8"])
    assert code == 2
    assert "no FP8 tensor cores" in capsys.readouterr().err



def test_gb300_fp8_fraction_carries_the_azure_ratio_onto_gb200s():
    """GB300's FP8 fraction is GB200's (0.537, itself B200's vLLM-shape 0.566 carried by the MAMF
    ratio) times the ratio of one benchmark run on both GPUs at the same 5000 TFLOP/s datasheet
    peak: Azure AI-benchmarking-guide, cuBLASLt FP8 E4M3 at M = N = K = 16384 (each GPU's best
    shape), GB300 3308.5 TFLOP/s, GB200 2819.5. By hand: 3308.5 / 2819.5 = 1.17344, 0.537 x
    1.17344 = 0.63014. The model's sustained FP8 rate of GB300 over GB200 is then the measured
    1.173 (to the 3-digit rounding), not the 1.055 of 0.566 / 0.537 before, nor the
    datasheets' 1."""
    assert 3308.5 / 2819.5 == pytest.approx(1.17344, abs=1e-5)
    assert 0.537 * 3308.5 / 2819.5 == pytest.approx(0.63014, abs=1e-5)
    gb300, gb200 = _system("gb300-nvl72"), _system("gb200-nvl72")
    assert float(gb300.matmul_fp8_sustained_frac) == pytest.approx(0.630, abs=1e-9)
    t8 = training("fp8-current")
    ratio = float(lowp_rate(gb300, t8)) / float(lowp_rate(gb200, t8))
    assert ratio == pytest.approx(3308.5 / 2819.5, rel=1e-3)
    assert float(lowp_rate(gb300, t8)) == pytest.approx(5000e12 * 0.630 / (797.5 / 989.4), rel=1e-6)
    # BF16 stays B200's fraction (no GB300 BF16 measurement): GB300 / GB200 = 0.672 / 0.631
    t16 = training("bf16")
    assert float(matmul_rate(gb300, t16)) / float(matmul_rate(gb200, t16)) == pytest.approx(
        0.672 / 0.631, rel=1e-6)

def test_h100_fp8_fraction_is_the_reference_times_the_mamf_fp8_to_bf16_ratio():
    """H100 SXM (700 W) FP8 fraction = the BF16 reference fraction x the FP8 / BF16 fraction
    ratio of one benchmark run of both dtypes on a 700 W H100 SXM (stas00/ml-engineering MAMF
    table, torch 2.7.0+cu126: BF16 794.5, FP8 1402.6 TFLOP/s; configs/systems/h100-sxm-80gb.
    yaml). By hand: 794.5 / 989.4 = 0.80301, 1402.6 / 1978.9 = 0.70878, ratio 0.88265;
    797.5 / 989.4 = 0.80604 x 0.88265 = 0.71145 -> 0.711. H200, Meta's 24K H100 and the
    fms-fsdp H100 nodes (same 700 W part) take it; Grand Teton (500 W) x 1731 / 1969 = 0.6251.
    The model's FP8 / BF16 sustained rate on H100 is then 2 x 0.711 / 0.80604 = 1.7642 (was
    2), and GB200 / H100 in FP8 5000 x 0.537 / (1978.9 x 0.711) = 1.9083 (was 1.6834; Azure's
    cuBLASLt 16384^3 pair 2819.5 / 1377.3 = 2.047, docs/accuracy-bridge.md Session 11)."""
    bf16_mamf, fp8_mamf = 794.5 / 989.4, 1402.6 / 1978.9
    assert bf16_mamf == pytest.approx(0.80301, abs=1e-5)
    assert fp8_mamf == pytest.approx(0.70878, abs=1e-5)
    ratio = fp8_mamf / bf16_mamf
    assert ratio == pytest.approx(0.88265, abs=1e-5)
    ref = 797.5 / 989.4
    assert ref * ratio == pytest.approx(0.71145, abs=1e-5)
    for name in ("h100-sxm-80gb", "h200-sxm-141gb", "meta-h100-24k", "h100-80gb-800gbps-node"):
        s = _system(name)
        assert float(s.matmul_fp8_sustained_frac) == pytest.approx(0.711, abs=1e-9), name
        assert float(s.matmul_sustained_frac) == 0.0, name   # BF16 stays the reference
    assert float(_system("grand-teton-h100").matmul_fp8_sustained_frac) == pytest.approx(
        0.711 * 1731 / 1969, abs=5e-5)
    h100, t8, t16 = _system("h100-sxm-80gb"), training("fp8-current"), training("bf16")
    assert float(lowp_rate(h100, t8)) == pytest.approx(1978.9e12 * 0.711 / ref, rel=1e-6)
    assert float(lowp_rate(h100, t8)) / float(matmul_rate(h100, t16)) == pytest.approx(
        1.7642, abs=1e-4)
    gb200 = _system("gb200-nvl72")
    assert float(lowp_rate(gb200, t8)) / float(lowp_rate(h100, t8)) == pytest.approx(
        1.9083, abs=1e-4)


def test_cli_runs_every_precision_on_b300(capsys):
    for p in LOW + ("fp8",):
        code = main(["predict", "--model", "llama3-8b", "--system", "dgx-b300", "--gpus", "8",
                     "--tp", "1", "--precision", p, "--json"])
        assert code == 0, capsys.readouterr().err
        capsys.readouterr()


# ----------------------------------------------------------------------------- systems

@pytest.mark.parametrize(
    "name, domain, nvlink_GBps, nic_GBps, bf16, fp8, fp4, hbm_GBps, cap_GiB, watts", [
        ("dgx-b200", 8, 900, 50, 2250, 4500, 9000, 7700, 179.06, 1000),
        ("dgx-b300", 8, 900, 100, 2250, 4500, 13500, 7700, 268.59, 1100),
        ("gb200-nvl72", 72, 900, 50, 2500, 5000, 10000, 8000, 185.03, 1200),
        ("gb300-nvl72", 72, 900, 100, 2500, 5000, 15000, 8000, 277.55, 1400),
        ("h100-sxm-80gb", 8, 450, 50, 989.4, 1978.9, 0, 3350, 79.65, 700),
        ("h200-sxm-141gb", 8, 450, 50, 989.4, 1978.9, 0, 4800, 140.4, 700)])
def test_systems_as_built(name, domain, nvlink_GBps, nic_GBps, bf16, fp8, fp4, hbm_GBps,
                          cap_GiB, watts):
    """The datasheet numbers of configs/systems (dense peaks; bandwidth per direction:
    NVLink5 1.8 TB/s and NVLink4 900 GB/s bidirectional halved; one NIC per GPU, ConnectX-7
    400 Gb/s or ConnectX-8 800 Gb/s, / 8 bits)."""
    s = _system(name)
    assert float(s.tiers[0].domain_size) == domain
    assert float(s.tiers[0].bandwidth_Bps) == nvlink_GBps * 1e9
    assert float(s.tiers[-1].bandwidth_Bps) == nic_GBps * 1e9
    assert math.isclose(float(s.matmul_flops_per_s), bf16 * 1e12, rel_tol=1e-6)
    assert math.isclose(float(s.matmul_fp8_flops_per_s), fp8 * 1e12, rel_tol=1e-6)
    assert math.isclose(float(s.matmul_fp4_flops_per_s), fp4 * 1e12, rel_tol=1e-6)
    assert math.isclose(float(s.hbm_bandwidth_Bps), hbm_GBps * 1e9, rel_tol=1e-6)
    assert math.isclose(float(s.hbm_capacity_bytes), cap_GiB * 2 ** 30, rel_tol=1e-6)
    assert float(s.power_W) == watts


def test_sustained_fraction_over_one_is_refused(tmp_path):
    """A measured fraction of the datasheet peak above 1 is a clear SpecError naming it."""
    from diffperf import load_system

    text = (Path(__file__).resolve().parent.parent / "configs" / "systems" /
            "dgx-b200.yaml").read_text()
    bad = tmp_path / "bad.yaml"
    bad.write_text(text.replace("matmul_fp8_sustained_frac: 0.566",
                                "matmul_fp8_sustained_frac: 1.5"))
    with pytest.raises(SpecError, match=re.escape(
            "matmul_fp8_sustained_frac=1.5 must be at most 1 (a measured throughput over "
            "the datasheet peak; 0 = not measured)")):
        load_system(str(bad))


def test_sustained_fraction_out_of_range_is_refused_by_predict():
    """The Python API path (no YAML): predict validates the fraction before tracing."""
    b200 = _system("dgx-b200").replace(matmul_fp8_sustained_frac=1.5)
    with pytest.raises(SpecError, match=r"matmul_fp8_sustained_frac=1.5 is not allowed "
                                        r"\(allowed: 0 to 1"):
        predict(_model("llama3-8b"), Parallel(dp=8, global_batch=64), b200,
                training("mxfp8"))
