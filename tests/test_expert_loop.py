"""Transformer Engine's per-expert loop of a grouped GEMM: one cuBLASLt GEMM per local expert
round-robin over 4 streams (multi_stream_cublas_gemm) and one quantize kernel per expert
(split_quantize), TE 2.7-2.16 (Training.moe_expert_loop, workload.flops.moe_expert_loop_kernels;
docs/accuracy-bridge.md "Session 12: MoE on 8-GPU nodes"). Expected values worked by hand.
"""

from __future__ import annotations


import jax
import numpy as np
import pytest

import diffperf
from diffperf import Parallel
from diffperf.costs.compute import layer_times_s
from diffperf.workload.flops import (attention_io_bytes, layer_ops, lowp_quantize_kernels,
                                     moe_expert_loop_kernels)
from layer_spy import layer_gpu_host_s
from shipped import model as _model, system as _system

MX = diffperf.training("mxfp8")
LOOP = MX.replace(moe_expert_loop=1.0)
DSV3 = _model("deepseek-v3")
PHI = 58.0 / 61.0  # DeepSeek-V3: 3 dense layers of 61


def test_deepseek_v3_kernels_by_hand():
    """E 256 at e 8: E_l = 32 local experts, g = 32 / 4 = 8 GEMMs per stream:
    serial = 2 phi (8 - 1) = 13.311, launches = 2 phi 31 = 58.951 per layer forward
    (phi = 58/61 = 0.95082); at e 64, E_l = 4 = one GEMM per stream: serial 0, launches
    2 phi 3 = 5.705. layer_ops' forward kernels grow by the serial count only."""
    par = Parallel(micro_batch=1.0, pp=16.0, ep=8.0, dp=16.0)
    serial, launches = (float(x) for x in moe_expert_loop_kernels(DSV3, par, LOOP))
    assert serial == pytest.approx(2 * PHI * 7, rel=1e-6)
    assert launches == pytest.approx(2 * PHI * 31, rel=1e-6)
    dk = float(layer_ops(DSV3, par, LOOP).n_kernels) - float(layer_ops(DSV3, par, MX).n_kernels)
    assert dk == pytest.approx(2 * PHI * 7, rel=1e-5)
    par64 = Parallel(micro_batch=1.0, pp=4.0, vp=4.0, ep=64.0, dp=64.0)
    serial, launches = (float(x) for x in moe_expert_loop_kernels(DSV3, par64, LOOP))
    assert serial == 0.0
    assert launches == pytest.approx(2 * PHI * 3, rel=1e-6)


def test_quantize_kernels_one_per_local_expert_by_hand():
    """MXFP8 (one kernel per quantized tensor): the two expert rows quantize phi E_l = 30.43
    slices each instead of 1: forward + 2 (30.43 - 1) = 58.85 kernels, backward (the output
    gradients) the same, weights the same. FP8 current scaling: 4 kernels per slice in TE
    (zero amax, amax, scale from amax, cast) against 2 per unsplit tensor: 2 (4 x 30.43 - 2)
    = 239.4. FP8 delayed scaling: the split inputs and output gradients are one fused
    multi-cast-transpose (+0), the weights one cast per expert (+58.85)."""
    par = Parallel(micro_batch=1.0, pp=16.0, ep=8.0, dp=16.0)
    dense = layer_ops(DSV3, par, MX).dense
    d = np.asarray(lowp_quantize_kernels(dense, LOOP)) - np.asarray(
        lowp_quantize_kernels(dense, MX))
    np.testing.assert_allclose(d, [2 * (PHI * 32 - 1)] * 3, rtol=1e-5)
    cs = diffperf.training("fp8-current")
    d_cs = np.asarray(lowp_quantize_kernels(dense, cs.replace(moe_expert_loop=1.0))) - np.asarray(
        lowp_quantize_kernels(dense, cs))
    np.testing.assert_allclose(d_cs, [2 * (4 * PHI * 32 - 2)] * 3, rtol=1e-5)
    ds = diffperf.training("fp8-delayed")
    d_ds = np.asarray(lowp_quantize_kernels(dense, ds.replace(moe_expert_loop=1.0))) - np.asarray(
        lowp_quantize_kernels(dense, ds))
    np.testing.assert_allclose(d_ds, [0.0, 0.0, 2 * (PHI * 32 - 1)], atol=1e-4)
    # BF16: nothing is quantized, only the GEMM launches remain
    bf = diffperf.training("bf16")
    assert np.all(np.asarray(lowp_quantize_kernels(dense, bf.replace(moe_expert_loop=1.0))) == 0)


def test_off_by_default_and_nothing_for_a_dense_model():
    """The default Training adds nothing; a dense model (no experts) adds nothing with it."""
    par = Parallel(micro_batch=1.0, ep=8.0, dp=8.0)
    assert [float(x) for x in moe_expert_loop_kernels(DSV3, par, MX)] == [0.0, 0.0]
    llama = _model("llama3-8b")
    lpar = Parallel(micro_batch=1.0, dp=8.0)
    assert [float(x) for x in moe_expert_loop_kernels(llama, lpar, LOOP)] == [0.0, 0.0]
    assert float(layer_ops(llama, lpar, LOOP).n_kernels) == float(layer_ops(llama, lpar, MX).n_kernels)
    dense = layer_ops(llama, lpar, MX).dense
    np.testing.assert_array_equal(np.asarray(lowp_quantize_kernels(dense, LOOP)),
                                  np.asarray(lowp_quantize_kernels(dense, MX)))


def test_fixed_time_gradient_is_the_kernel_count():
    """The memory-bound part of the layer (layer_times_s[2]) is linear in the fixed time per
    kernel: d/d kernel_s = the forward kernels (finite, > 0: a slower launch never speeds
    it), and the fact adds 13.311 of them at e 8 (float32, no float64 program)."""
    par = Parallel(micro_batch=1.0, pp=16.0, ep=8.0, dp=16.0)
    s = _system("dgx-b200")

    def other(k, tr):
        ops = layer_ops(DSV3, par, tr)
        sys_ = s.replace(eff=s.eff.replace(kernel_s=k))
        return layer_times_s(ops, sys_, tr, attention_io_bytes(DSV3, par, tr))[2]

    g_on = float(jax.grad(other)(4e-6, LOOP))
    g_off = float(jax.grad(other)(4e-6, MX))
    assert np.isfinite(g_on) and g_on > g_off > 0
    assert g_on - g_off == pytest.approx(2 * PHI * 7, rel=1e-4)


def test_predict_launches_every_expert_gemm_on_the_host(monkeypatch):
    """predict's layer: the host side (the second argument of the smooth max with the GPU time)
    gains every launch, forward (launches + the forward's extra quantize kernels, weights once
    a step) x host_kernel_s and the backward 2 x the launches + the backward quantize kernels;
    the GPU side gains the serial chain and the quantize kernels x kernel_s."""
    par = Parallel(micro_batch=1.0, pp=16.0, ep=8.0, dp=16.0, global_batch=4096)
    sys_ = _system("dgx-b200")
    out = layer_gpu_host_s(monkeypatch, DSV3, par, sys_, (MX, LOOP))
    (gf0, hf0), (gb0, hb0) = out[0]
    (gf1, hf1), (gb1, hb1) = out[1]
    serial, launches = 2 * PHI * 7, 2 * PHI * 31
    q = 2 * (PHI * 32 - 1)  # extra quantize kernels per pass (test above)
    m = 4096 / 16  # micro-batches: the cached weights' casts once a step
    hk, ks = float(sys_.eff.host_kernel_s), float(sys_.eff.kernel_s)
    assert hf1 - hf0 == pytest.approx((launches + q + q / m) * hk, rel=1e-3)
    assert hb1 - hb0 == pytest.approx((2 * launches + q) * hk, rel=1e-3)
    assert gf1 - gf0 == pytest.approx((serial + q + q / m) * ks, rel=1e-3)
    assert gb1 - gb0 == pytest.approx((2 * serial + q) * ks, rel=1e-3)


def test_fact_on_the_bridge_rows():
    """calibration/bridge_recipe_facts.py fact 9 sets moe_expert_loop on every MoE row of
    containers 25.09-26.04.01 (104 of the 133 MoE rows: TE 2.7-2.14, op fuser off in the
    performance scripts), on the three 26.06 rows whose configs run TE's GroupedLinear module
    (no cutedsl fused grouped MLP: DGX-B300 DeepSeek-V3 / GPT-OSS MXFP8, DGX-H100 Qwen3 30B
    FP8-CS; session 13) and on no dense row; the shipped CSV carries it."""
    import csv
    from pathlib import Path

    from calibration.bridge_recipe_facts import EXPERT_LOOP_CONTAINERS

    rows = list(csv.DictReader((Path(__file__).resolve().parent.parent / "data"
                                / "megatron_bridge.csv").open(newline="")))
    on = [r for r in rows if "moe_expert_loop=1" in r["set"].split(";")]
    assert len(on) == 107
    assert all(float(r["moe_experts"]) > 0 for r in on)
    late = sorted(r["id"] for r in on if r["container"] not in EXPERT_LOOP_CONTAINERS)
    assert late == ["mb-26_06-dgx-b300-deepseek-v3-mxfp8-256g",
                    "mb-26_06-dgx-b300-gpt-oss-120b-mxfp8-64g",
                    "mb-26_06-dgx-h100-qwen3-30b-a3b-fp8-current-16g"]
    moe = [r for r in rows if float(r["moe_experts"] or 0) > 0]
    off = [r for r in moe if r not in on]
    assert {r["container"] for r in off} == {"26.06", "26.06.01", "26.08"}
    assert {(r["system"], r["precision"]) for r in off} == {
        ("gb200-nvl72", "mxfp8"), ("gb300-nvl72", "mxfp8"), ("dgx-b300", "mxfp8")}
