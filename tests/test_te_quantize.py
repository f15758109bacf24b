"""Quantize kernels as Transformer Engine launches them (Training.lowp_te_quantizer, session 13,
branch fp8cs; workload.flops.te_quantize_rows, lowp_quantize_kernels, lowp_quantize_bytes):
TE 2.7-2.16's Float8CurrentScalingQuantizer runs 4 kernels per tensor (zero amax, amax, scale,
cast), 3 behind a LayerNormLinear's norm (amax inside the norm kernel, no amax read), and
Megatron-Core 0.14-0.18 keeps linear_proj's input (and the shared experts' fc1, the routed fc2
under "moe_act" recompute) in 16 bits, quantized again in the backward. Every count by hand;
nothing compiled but one small float64 gradient program of lowp_quantize_times_s."""

from __future__ import annotations

import csv
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import diffperf
from diffperf import Parallel
from diffperf.costs.compute import lowp_quantize_times_s
from diffperf.workload.flops import (layer_ops, lowp_quantize_bytes, lowp_quantize_kernels,
                                     moe_layer_fraction, te_quantize_rows)
from layer_spy import layer_gpu_host_s
from shipped import model as _model, system as _system

ROOT = Path(__file__).resolve().parent.parent
CS = diffperf.training("fp8-current")
CS_TE = CS.replace(lowp_te_quantizer=1.0)
MX_TE = diffperf.training("mxfp8", lowp_te_quantizer=1.0)
L70 = _model("llama3-70b")
DSV3 = _model("deepseek-v3")
TP4 = Parallel(tp=4.0, sequence_parallel=1.0)


def _f(xs):
    return [float(x) for x in xs]


def test_rows_by_hand():
    """Llama: QKV and fc1 are LayerNormLinears, proj keeps its input; DeepSeek-V3 (MLA with
    q_lora_rank): W^UQ (row 0) and W^UK;W^UV (row 11) behind the latent norms, the down
    projections (9, 10) plain; shared fc1 (7) kept; routed fc2 (6) only under moe_act;
    MXFP8: no norm-fused amax (per-tensor current scaling only), the kept inputs the same;
    nothing without the fact."""
    nf, sv, bo, *_ = (np.asarray(x) for x in te_quantize_rows(L70, TP4, CS_TE))
    assert nf.tolist() == [1, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1]
    assert sv.tolist() == [0, 1, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0]
    # per-tensor FP8: row- and column-wise again, but row 7 (shared fc1, no row of a dense
    # model) is gathered at TP 4 with SP
    assert bo.tolist() == [0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
    sel = Parallel(recompute=1.0, recompute_moe_act=1.0, recompute_shared_experts=1.0)
    nf, sv, bo, *_ = (np.asarray(x) for x in te_quantize_rows(DSV3, sel, MX_TE))
    assert nf.tolist() == [0] * 12 and bo.tolist() == [0] * 12  # MXFP8: column-wise only
    assert sv.tolist() == [0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0]
    # FP8-CS: the shared fc1 (7) is gathered in the backward under SP at t > 1 (row-wise
    # before the gather), proj (1) and the grouped fc2 (6) never
    act = Parallel(recompute=1.0, recompute_moe_act=1.0)
    _, sv, bo, *_ = (np.asarray(x) for x in te_quantize_rows(DSV3, act, CS_TE))
    assert sv.tolist() == bo.tolist() == [0, 1, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0]
    _, sv, bo, *_ = (np.asarray(x) for x in te_quantize_rows(
        DSV3, act.replace(tp=2.0, sequence_parallel=1.0), CS_TE))
    assert sv.tolist() == [0, 1, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0]
    assert bo.tolist() == [0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0]
    assert all(np.all(np.asarray(x) == 0) for x in te_quantize_rows(L70, TP4, CS))
    # delayed scaling: TE refuses save_original_input, and its norm writes FP8 itself
    ds = diffperf.training("fp8-delayed", lowp_te_quantizer=1.0)
    assert all(np.all(np.asarray(x) == 0) for x in te_quantize_rows(L70, TP4, ds))


def test_llama_kernels_by_hand():
    """Llama 3 70B, FP8 current scaling, one layer: forward QKV 3 + proj 4 + fc1 3 + fc2 4 = 14
    (generic 1 + 1 each: 8); backward 4 output gradients x 4 + proj's input again 4 = 20;
    weights 4 x 4 = 16. MXFP8: one kernel a quantize, forward 4, backward 4 + 1, weights 4."""
    ops = layer_ops(L70, TP4, CS_TE)
    rows = te_quantize_rows(L70, TP4, CS_TE)
    assert _f(lowp_quantize_kernels(ops.dense, CS_TE, rows)) == [14.0, 20.0, 16.0]
    assert _f(lowp_quantize_kernels(ops.dense, CS)) == [8.0, 8.0, 8.0]
    mx_rows = te_quantize_rows(L70, TP4, MX_TE)
    assert _f(lowp_quantize_kernels(ops.dense, MX_TE, mx_rows)) == [4.0, 5.0, 4.0]
    # the fact off: the per-row form is bit-identical to the generic one
    off = te_quantize_rows(L70, TP4, CS)
    assert _f(lowp_quantize_kernels(ops.dense, CS, off)) == _f(lowp_quantize_kernels(ops.dense, CS))
    assert _f(lowp_quantize_bytes(ops.dense, CS, off)) == _f(lowp_quantize_bytes(ops.dense, CS))


def test_cudnn_norm_quantizes_after_the_norm():
    """te_cudnn_norm (NVTE_NORM_FWD_USE_CUDNN=1): TE 2.9-2.16's norm takes no amax, so QKV's
    and fc1's inputs get the full quantize: forward 4 x 4 = 16 kernels (not 14) and the amax
    reads of T x h x 2 B each back (+268,435,456 B at TP 4); backward and weights as without it."""
    ops = layer_ops(L70, TP4, CS_TE)
    cu = CS_TE.replace(te_cudnn_norm=1.0)
    nf, sv, bo, *_ = (np.asarray(x) for x in te_quantize_rows(L70, TP4, cu))
    assert nf.tolist() == [0] * 12 and sv.tolist()[1] == bo.tolist()[1] == 1
    assert _f(lowp_quantize_kernels(ops.dense, cu, te_quantize_rows(L70, TP4, cu))) == [
        16.0, 20.0, 16.0]
    f1, b1, _ = _f(lowp_quantize_bytes(ops.dense, CS_TE, te_quantize_rows(L70, TP4, CS_TE)))
    f2, b2, _ = _f(lowp_quantize_bytes(ops.dense, cu, te_quantize_rows(L70, TP4, cu)))
    assert f2 - f1 == 2 * 2 * 8192 * 8192 and b2 == b1


def test_llama_bytes_by_hand():
    """Llama 3 70B, TP 4, T = 8192 tokens: QKV's and fc1's inputs (T x h = 8192^2) lose their
    amax read (2 B each): -2 x 2 x 8192^2 = -268,435,456 B; proj's input (T x a d_v / t =
    8192 x 2048) is written row-wise only in the forward (-1 B an element: -16,777,216 B) and
    read (2 B + 2 B amax) and written row- and column-wise (2 x 1 B: TE's per-tensor FP8
    quantizer takes both usages there) again in the backward: +100,663,296 B."""
    ops = layer_ops(L70, TP4, CS_TE)
    rows = te_quantize_rows(L70, TP4, CS_TE)
    f1, b1, w1 = _f(lowp_quantize_bytes(ops.dense, CS_TE, rows))
    f0, b0, w0 = _f(lowp_quantize_bytes(ops.dense, CS))
    assert f1 - f0 == -268435456.0 - 16777216.0
    assert b1 - b0 == 8192 * 2048 * (2 * 2 + 2) == 100663296
    assert w1 == w0


def test_deepseek_moe_act_requantizes_each_expert_slice():
    """DeepSeek-V3 MXFP8 at EP 8 (32 local experts) under moe_act recompute and the per-expert
    loop: the routed fc2 input is split-quantized again in the backward, phi x 32 kernels, and
    its bytes (T_e x f_e: read 2 B, write 1 + 1/32 B) again; shared fc1 (kept, no shared
    recompute) 1 kernel more."""
    par = Parallel(ep=8.0, dp=8.0, recompute=1.0, recompute_moe_act=1.0)
    tr = MX_TE.replace(moe_expert_loop=1.0)
    ops = layer_ops(DSV3, par, tr)
    phi = float(moe_layer_fraction(DSV3))
    k_on = _f(lowp_quantize_kernels(ops.dense, tr, te_quantize_rows(DSV3, par, tr)))
    no_act = par.replace(recompute_moe_act=0.0)
    k_off = _f(lowp_quantize_kernels(ops.dense, tr, te_quantize_rows(DSV3, no_act, tr)))
    assert k_on[1] - k_off[1] == pytest.approx(phi * 32, rel=1e-6)
    assert k_on[0] == k_off[0] and k_on[2] == k_off[2]
    b_on = _f(lowp_quantize_bytes(ops.dense, tr, te_quantize_rows(DSV3, par, tr)))
    b_off = _f(lowp_quantize_bytes(ops.dense, tr, te_quantize_rows(DSV3, no_act, tr)))
    m6, k6 = float(ops.dense.m[6]), float(ops.dense.k[6])
    count6 = phi * 256 / 8
    assert b_on[1] - b_off[1] == pytest.approx(count6 * m6 * k6 * (2 + 1 + 1 / 32), rel=1e-5)  # float32 sums
    assert b_on[0] - b_off[0] == pytest.approx(-count6 * m6 * k6 * (1 + 1 / 32), rel=1e-5)


# Llama 3 70B at TP 4, T = 8192: the dense rows' (m k) input, (m n) output-gradient and (k n)
# weight elements (QKV n = (64 + 2 x 8) 128 / 4 = 2560, proj k = 2048, fc1 n = 2 x 7168,
# fc2 k = 7168), for the one-FP8-buffer savings of 1 B an element (test_blackwell_...)
_MK = 8192 * (8192 + 2048 + 8192 + 7168)
_MN = 8192 * (2560 + 8192 + 14336 + 8192)
_KN = 8192 * (2560 + 2048 + 14336 + 7168)


def test_blackwell_keeps_one_fp8_buffer():
    """On Blackwell (System.fp8_non_tn_gemm = 1: TE's `nvte_is_non_tn_fp8_gemm_supported`)
    a per-tensor FP8 tensor is one buffer for its row- and column-wise usages: every tensor
    that was written twice is written once (1 B an element less); kernels unchanged; MXFP8
    untouched; without lowp_te_quantizer nothing changes. Llama 3 70B FP8-CS, TP 4: forward
    inputs of QKV, fc1, fc2 (proj's is row-wise only already), backward every dY and proj's
    re-quantized input, weights all four."""
    ops = layer_ops(L70, TP4, CS_TE)
    hop, bw = _system("h100-sxm-80gb"), _system("gb200-nvl72")
    assert float(hop.fp8_non_tn_gemm) == 0.0
    assert all(float(_system(n).fp8_non_tn_gemm) == 1.0 for n in (
        "gb200-nvl72", "gb300-nvl72", "dgx-b200", "dgx-b300", "b200-sxm-180gb"))
    r_h, r_b = te_quantize_rows(L70, TP4, CS_TE, hop), te_quantize_rows(L70, TP4, CS_TE, bw)
    assert float(r_h[3]) == 0.0 and float(r_b[3]) == 1.0
    f0, b0, w0 = _f(lowp_quantize_bytes(ops.dense, CS_TE, r_h))
    f1, b1, w1 = _f(lowp_quantize_bytes(ops.dense, CS_TE, r_b))
    assert f0 - f1 == _MK - 8192 * 2048 == 192937984
    assert b0 - b1 == _MN + 8192 * 2048 == 289406976
    assert w0 - w1 == _KN == 213909504
    assert _f(lowp_quantize_kernels(ops.dense, CS_TE, r_b)) == _f(
        lowp_quantize_kernels(ops.dense, CS_TE, r_h))
    mx = layer_ops(L70, TP4, MX_TE)
    assert float(te_quantize_rows(L70, TP4, MX_TE, bw)[3]) == 0.0
    assert _f(lowp_quantize_bytes(mx.dense, MX_TE, te_quantize_rows(L70, TP4, MX_TE, bw))) == \
        _f(lowp_quantize_bytes(mx.dense, MX_TE, te_quantize_rows(L70, TP4, MX_TE)))
    assert float(te_quantize_rows(L70, TP4, CS, bw)[3]) == 0.0


def test_predict_layer_counts_the_kernels_on_gpu_and_host(monkeypatch):
    """predict's layer, Llama 3 70B FP8-CS on GB200: the fact adds 6 forward kernels and
    8 / m weight kernels (cached: once a step) and 12 backward kernels, at kernel_s on the GPU
    (with the bytes above at the memory rate, less Blackwell's one-buffer savings) and at
    host_kernel_s on the host."""
    from diffperf.costs.compute import memory_time_s

    par = TP4.replace(dp=16.0, global_batch=128.0, micro_batch=1.0)
    sys_ = _system("gb200-nvl72")
    out = layer_gpu_host_s(monkeypatch, L70, par, sys_, (CS, CS_TE))
    (gf0, hf0), (gb0, hb0) = out[0]
    (gf1, hf1), (gb1, hb1) = out[1]
    m = 128 / 16
    hk, ks = float(sys_.eff.host_kernel_s), float(sys_.eff.kernel_s)
    assert hf1 - hf0 == pytest.approx((6 + 8 / m) * hk, rel=1e-3)
    assert hb1 - hb0 == pytest.approx(12 * hk, rel=1e-3)
    mem = lambda b: float(memory_time_s(b, sys_))  # noqa: E731
    one_buf_f = -(_MK - 8192 * 2048) - _KN / m  # test_blackwell_keeps_one_fp8_buffer
    one_buf_b = -(_MN + 8192 * 2048)
    assert gf1 - gf0 == pytest.approx((6 + 8 / m) * ks + mem(-285212672.0 + one_buf_f),
                                      rel=1e-3)
    assert gb1 - gb0 == pytest.approx(12 * ks + mem(100663296.0 + one_buf_b), rel=1e-3)


def test_quantize_time_gradient_contract(x64):
    """lowp_quantize_times_s with TE's rows (x64, log-parameter check_grads): finite; more HBM
    bandwidth and a shorter fixed kernel time each make it faster."""
    from jax.test_util import check_grads

    sys_ = _system("gb200-nvl72")
    ops = layer_ops(L70, TP4, CS_TE)
    rows = te_quantize_rows(L70, TP4, CS_TE, sys_)  # with Blackwell's one FP8 buffer

    def time_of(x):
        s = sys_.replace(hbm_bandwidth_Bps=jnp.exp(x[0]),
                         eff=sys_.eff.replace(kernel_s=jnp.exp(x[1])))
        f, b = lowp_quantize_times_s(ops.dense, s, CS_TE, 8.0, rows)
        return f + b

    x = jnp.log(jnp.array([float(sys_.hbm_bandwidth_Bps), float(sys_.eff.kernel_s)]))
    g = np.asarray(jax.grad(time_of)(x))
    assert np.all(np.isfinite(g)) and g[0] < 0 < g[1]
    check_grads(time_of, (x,), order=1, modes=("rev",), eps=1e-4)


def test_fact_on_the_bridge_rows_and_not_on_torchao_rows():
    """bridge_recipe_facts.py fact 11 sets lowp_te_quantizer on the 176 FP8-CS and MXFP8 rows
    (TE on every release), on no BF16 or NVFP4 row; the TorchTitan Float8 (torchao) rows of
    published_fsdp_fp8.csv, FP8 current scaling too, do not carry it."""
    from calibration.bridge_recipe_facts import TE_QUANT_PRECISIONS, row_facts

    rows = list(csv.DictReader((ROOT / "data" / "megatron_bridge.csv").open(newline="")))
    on = [r for r in rows if "lowp_te_quantizer=1" in r["set"].split(";")]
    assert len(on) == 176
    assert {r["precision"] for r in on} == set(TE_QUANT_PRECISIONS) == {"fp8-current", "mxfp8"}
    assert all(("lowp_te_quantizer=1" in row_facts(r, {"te_quant"})) == (r in on) for r in rows)
    # fact 12: NVTE_NORM_FWD_USE_CUDNN kept by v0.2.0-v0.5.1's perf_plugins (25.11-26.06.01)
    cu = [r for r in rows if "te_cudnn_norm=1" in r["set"].split(";")]
    assert len(cu) == 23 and all(r in on and r["precision"] == "fp8-current"
                                 and r["container"] != "25.09" for r in cu)
    assert {(r["model"], r["system"]) for r in cu} == {
        ("llama3-8b", "h100-sxm-80gb"), ("llama3-70b", "gb200-nvl72"),
        ("llama3-70b", "gb300-nvl72"), ("llama3.1-405b", "gb200-nvl72"),
        ("llama3.1-405b", "gb300-nvl72")}
    tao = list(csv.DictReader((ROOT / "data" / "published_fsdp_fp8.csv").open(newline="")))
    assert tao and all("lowp_te_quantizer" not in r["set"] for r in tao)


def test_fp8_non_tn_gemm_refuses_other_values():
    """System YAML key fp8_non_tn_gemm is 0/1: 2 is refused with a SpecError naming it."""
    from diffperf.errors import SpecError
    from diffperf.load import read_yaml, system_from_dict

    d = read_yaml(ROOT / "configs" / "systems" / "gb200-nvl72.yaml")
    assert float(system_from_dict(d, "gb200").fp8_non_tn_gemm) == 1.0
    with pytest.raises(SpecError, match="fp8_non_tn_gemm=2"):
        system_from_dict(d | {"fp8_non_tn_gemm": 2}, "gb200")


def test_mxfp8_scale_swizzles_by_hand():
    """Training.te_scale_swizzle, Llama 3 70B MXFP8 at TP 4 with SP (4 linears):
    TE 2.7 / 2.9 (1) swizzle both operands' scales before each GEMM: forward 4 x 2 = 8
    kernels, backward 4 x 4 = 16; TE 2.12-2.16 (2) only the weights (fprop, dgrad) and the
    SP-gathered tensors (QKV's / fc1's input in fprop and wgrad, proj's / fc2's dY in dgrad
    and wgrad): forward 4 + 2 = 6, backward 4 + 2 + 4 = 10. Bytes: each swizzle reads and
    writes the operand's E8M0 scales, 2 / 32 B an element; weights' own quantize unchanged."""
    ops = layer_ops(L70, TP4, MX_TE)
    base_k = _f(lowp_quantize_kernels(ops.dense, MX_TE, te_quantize_rows(L70, TP4, MX_TE)))
    base_b = _f(lowp_quantize_bytes(ops.dense, MX_TE, te_quantize_rows(L70, TP4, MX_TE)))
    s = 2 / 32
    col_mk = 8192 * (8192 + 8192)     # QKV and fc1 inputs (gathered T x h)
    row_mn = 8192 * (8192 + 8192)     # proj and fc2 output gradients (T x h)
    for mode, dk, db in ((1.0, (8, 16), (s * (_MK + _KN), s * (_KN + _MK + 2 * _MN))),
                         (2.0, (6, 10), (s * (_KN + col_mk), s * (_KN + col_mk + 2 * row_mn)))):
        tr = MX_TE.replace(te_scale_swizzle=mode)
        rows = te_quantize_rows(L70, TP4, tr)
        k = _f(lowp_quantize_kernels(ops.dense, tr, rows))
        b = _f(lowp_quantize_bytes(ops.dense, tr, rows))
        assert (k[0] - base_k[0], k[1] - base_k[1], k[2] - base_k[2]) == (*dk, 0.0)
        assert b[0] - base_b[0] == pytest.approx(db[0], rel=1e-6)
        assert b[1] - base_b[1] == pytest.approx(db[1], rel=1e-6)
        assert b[2] == base_b[2]
    # without sequence parallelism (t = 1): TE 2.12+ swizzles the weights only
    t1 = Parallel()
    tr = MX_TE.replace(te_scale_swizzle=2.0)
    o1 = layer_ops(L70, t1, tr)
    k1 = _f(lowp_quantize_kernels(o1.dense, tr, te_quantize_rows(L70, t1, tr)))
    k0 = _f(lowp_quantize_kernels(o1.dense, MX_TE, te_quantize_rows(L70, t1, MX_TE)))
    assert (k1[0] - k0[0], k1[1] - k0[1]) == (4.0, 4.0)


def test_te_scale_swizzle_refusals():
    """te_scale_swizzle is 0 / 1 / 2 and needs lowp_te_quantizer with block scales (MXFP8)."""
    from diffperf.errors import SpecError
    from diffperf.specs.validate import check_facts_act

    with pytest.raises(SpecError, match="te_scale_swizzle=3 is not allowed"):
        check_facts_act(L70, TP4, MX_TE.replace(te_scale_swizzle=3.0))
    with pytest.raises(SpecError, match="te_scale_swizzle=1 needs lowp_te_quantizer=1"):
        check_facts_act(L70, TP4, CS_TE.replace(te_scale_swizzle=1.0))
    check_facts_act(L70, TP4, MX_TE.replace(te_scale_swizzle=2.0))
