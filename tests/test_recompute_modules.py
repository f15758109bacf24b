"""Megatron-Core's selective `recompute_modules` (Parallel.recompute_<module>;
workload.recompute.megatron_module_fracs / megatron_recompute_rows / megatron_recompute_bytes,
memory.activations.megatron_dropped_bytes) and the Bridge rows' recompute facts
(calibration/bridge_recipe_facts.py, item 6). Expected values are the docstrings'
arithmetic, worked by hand.
"""

from __future__ import annotations

import csv
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import diffperf
from diffperf import Parallel
from diffperf.costs.compute import memory_time_s
from diffperf.memory.activations import layer_activation_parts, megatron_dropped_bytes
from diffperf.workload.flops import layer_ops
from diffperf.workload.recompute import (megatron_module_fracs, megatron_recompute_bytes,
                                         megatron_recompute_rows, separate_norms)
from shipped import model as _model, system as _system

BF16 = diffperf.training("bf16")
DSV3 = _model("deepseek-v3")
GPT_OSS = _model("gpt-oss-120b")
# b 1, s 4096, t 1
SEL = dict(micro_batch=1.0, recompute=1.0)
MLA = Parallel(**SEL, recompute_core_attn=0.0, recompute_mla_up_proj=1.0)
NOTHING = Parallel(**SEL, recompute_core_attn=0.0)
OSS = Parallel(**SEL, ep=8.0, dp=8.0, recompute_core_attn=0.0, recompute_moe_act=1.0,
               recompute_layernorm=1.0)


def test_default_is_megatrons_core_attn_and_nothing_outside_selective():
    """The default fields are Megatron-Core's default list ["core_attn"]; the modules are read
    only under recompute = 1, recompute_policy = 0."""
    f = megatron_module_fracs(Parallel(recompute=1))
    assert {k: float(v) for k, v in f.items()} == dict(
        core_attn=1.0, mlp=0.0, moe_act=0.0, layernorm=0.0, mla_up_proj=0.0,
        shared_experts=0.0)
    for par in (Parallel(recompute=0), Parallel(recompute=2),
                Parallel(recompute=1, recompute_policy=1)):
        assert all(float(v) == 0.0 for v in megatron_module_fracs(par).values())
    rows = megatron_recompute_rows(DSV3, Parallel(recompute=1))
    assert float(jnp.sum(rows)) == 0.0
    assert float(megatron_recompute_bytes(DSV3, Parallel(recompute=1), BF16)) == 0.0


def test_mla_up_proj_one_layer_by_hand():
    """DeepSeek-V3, b 1, s 4096 (T 4096), t 1, bf16, ["mla_up_proj"]:
    GEMMs re-run: W^UQ;W^QR 2 x 4096 x (128 x 192) x 1536 = 309,237,645,312 and W^UK;W^UV
    2 x 4096 x 128 (192 - 64 + 128) x 512 = 137,438,953,472 FLOP (446.7 GFLOP, 109.1 MFLOP a
    token); element-wise: the latent norms fused into the up-projections, 4 x 2 x 4096 x
    (1536 + 512) = 67,108,864 B. Memory no longer kept: Q, K, V and the normed latents,
    2 x 4096 x (128 x (2 x 192 + 128) + 1536 + 512) = 553,648,128 B."""
    rows = megatron_recompute_rows(DSV3, MLA)
    assert [float(x) for x in rows] == [1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]
    flops = float(jnp.sum(rows * layer_ops(DSV3, MLA, BF16).dense.flops))
    assert flops == pytest.approx(309_237_645_312 + 137_438_953_472, rel=1e-6)
    assert float(megatron_recompute_bytes(DSV3, MLA, BF16)) == pytest.approx(67_108_864, rel=1e-6)
    assert float(megatron_dropped_bytes(DSV3, MLA, BF16)) == pytest.approx(553_648_128, rel=1e-6)
    # the layer keeps exactly that much less than with no module re-run (scores: flash, none)
    kept_mla = float(layer_activation_parts(DSV3, MLA, BF16)[0])
    kept_none = float(layer_activation_parts(DSV3, NOTHING, BF16)[0])
    assert kept_none - kept_mla == pytest.approx(553_648_128, rel=1e-5)
    # ... and holds it again while its backward runs (rebuilt before the attention's
    # backward), as full recompute's rebuilt layer
    rebuilt_mla = float(layer_activation_parts(DSV3, MLA, BF16)[1])
    rebuilt_none = float(layer_activation_parts(DSV3, NOTHING, BF16)[1])
    assert rebuilt_none == 0.0
    assert rebuilt_mla == pytest.approx(553_648_128, rel=1e-6)


def test_gpt_oss_moe_act_and_layernorm_by_hand():
    """GPT-OSS 120B (all 36 layers MoE, GQA: the input norm is fused into linear_qkv, the
    pre-MLP norm is a module: n_norm = 0 + 1), b 1, s 4096, t 1, bf16,
    ["layernorm", "moe_act"]: no GEMM re-run; bytes moe_act 2 x 4096 x 4 x 2880 x 3 =
    283,115,520 + layernorm 2 x 2 x 4096 x 2880 = 47,185,920; memory dropped: the activation
    output 2 x 4096 x 4 x 2880 = 94,371,840 + the norm output 2 x 4096 x 2880 = 23,592,960."""
    assert float(separate_norms(GPT_OSS)) == 1.0
    assert float(separate_norms(DSV3)) == pytest.approx(1.0 + 58.0 / 61.0)
    assert float(separate_norms(_model("llama3-8b"))) == 0.0
    assert float(jnp.sum(megatron_recompute_rows(GPT_OSS, OSS))) == 0.0
    assert float(megatron_recompute_bytes(GPT_OSS, OSS, BF16)) == pytest.approx(
        283_115_520 + 47_185_920, rel=1e-6)
    assert float(megatron_dropped_bytes(GPT_OSS, OSS, BF16)) == pytest.approx(
        94_371_840 + 23_592_960, rel=1e-6)


def test_mlp_recompute_reruns_the_fused_pre_mlp_norm():
    """DeepSeek-V3 ["mlp"] (3 of 61 layers dense: their pre-MLP norm is fused into fc1,
    TELayerNormColumnParallelLinear, so the checkpointed MLP re-runs it), b 1, s 4096, bf16:
    element-wise bytes re-run (3/61) x 2 x 4096 x (18432 x 3 + 2 x 7168) at t 1, and with
    t 2 + SP (3/61) x 2 x 4096 x (18432 x 3 / 2 + 2 x 7168 / 2): the SiLU-product and the
    norm (read, write), the norm's output being what the layer no longer keeps."""
    mlp = Parallel(**SEL, recompute_core_attn=0.0, recompute_mlp=1.0)
    want = 3.0 / 61.0 * 2 * 4096 * (18432 * 3 + 2 * 7168)
    assert float(megatron_recompute_bytes(DSV3, mlp, BF16)) == pytest.approx(want, rel=1e-6)
    tp2 = mlp.replace(tp=2.0, sequence_parallel=1.0)
    want2 = 3.0 / 61.0 * 2 * 4096 * (18432 * 3 / 2 + 2 * 7168 / 2)
    assert float(megatron_recompute_bytes(DSV3, tp2, BF16)) == pytest.approx(want2, rel=1e-6)
    # dropped: fc1 output 2 f q_a, activation output f q_a, the fused norm's output h q_a
    dropped = 3.0 / 61.0 * 4096 * (18432 * (2 * 2 + 2) + 2 * 7168)
    assert float(megatron_dropped_bytes(DSV3, mlp, BF16)) == pytest.approx(dropped, rel=1e-6)


def test_recompute_time_is_the_modules_forward():
    """One layer's recompute_s under ["mla_up_proj"] less that under [] (predict._layer_parts)
    is the two rows' GEMM time plus the element-wise bytes at HBM speed (bf16: no
    quantization), and the hardware FLOPs grow by B L x 446.7 GFLOP (L = 61 + 1 MTP)."""
    from diffperf.costs.compute import layer_pass_gemm_times_s
    from diffperf.predict import _flops_per_step, _layer_parts

    h100 = _system("h100-sxm-80gb")
    parts_mla = _layer_parts(DSV3, MLA, h100, BF16, None)[0]
    parts_none = _layer_parts(DSV3, NOTHING, h100, BF16, None)[0]
    ops = layer_ops(DSV3, MLA, BF16)
    fwd_rows = layer_pass_gemm_times_s(ops, h100, BF16, None, False)[0]
    want = float(fwd_rows[0] + fwd_rows[11]) + float(memory_time_s(67_108_864.0, h100))
    got = float(parts_mla["recompute_s"] - parts_none["recompute_s"])
    assert got == pytest.approx(want, rel=1e-5)
    assert got > 0
    hw = float(_flops_per_step(DSV3, MLA.replace(global_batch=8.0), BF16)[1]
               - _flops_per_step(DSV3, NOTHING.replace(global_batch=8.0), BF16)[1])
    assert hw == pytest.approx(8 * 62 * (309_237_645_312 + 137_438_953_472), rel=1e-5)


def test_mlp_recompute_reruns_the_dense_mlps_tp_pair():
    """DeepSeek-V3 at t 2 with SP, experts TP-split (t_e = t: every layer's MLP on the TP
    group), no TP overlap: a layer's exposed TP time is (2 forward + 2 backward) c_tp; with
    ["mlp"] the 3 dense layers of 61 re-run their MLP's all-gather + reduce-scatter (one
    all-reduce equivalent), so the mean layer's grows by 3/61 c_tp: a ratio 1 + 3 / (61 x 4)."""
    from diffperf.predict import _layer_parts

    h100 = _system("h100-sxm-80gb")
    tp2 = dict(tp=2.0, sequence_parallel=1.0, tp_overlap=0.0)
    none = _layer_parts(DSV3, NOTHING.replace(**tp2), h100, BF16, None)[0]["tp_exposed_s"]
    mlp = _layer_parts(DSV3, NOTHING.replace(recompute_mlp=1.0, **tp2), h100, BF16,
                       None)[0]["tp_exposed_s"]
    assert float(none) > 0
    assert float(mlp / none) == pytest.approx(1.0 + 3.0 / (61.0 * 4.0), rel=1e-5)


def test_selective_modules_gradient_contract(x64):
    """The selective term of predict._layer_parts' recompute, sum_r rho_r t_r +
    B / (BW_hbm eta_mem): d / d log(HBM bandwidth, GEMM peak efficiency) matches finite
    differences (float64), finite, and negative (faster hardware never slows the recompute)."""
    from jax.test_util import check_grads

    from diffperf.costs.compute import layer_pass_gemm_times_s

    h100 = _system("h100-sxm-80gb")
    ops = layer_ops(DSV3, MLA, BF16)
    rows = megatron_recompute_rows(DSV3, MLA)
    nbytes = megatron_recompute_bytes(DSV3, MLA, BF16)

    @jax.jit
    def t(logs):
        e = h100.eff.replace(mm_max=h100.eff.mm_max * jnp.exp(logs[1]))
        s = h100.replace(hbm_bandwidth_Bps=h100.hbm_bandwidth_Bps * jnp.exp(logs[0]), eff=e)
        dense = layer_pass_gemm_times_s(ops, s, BF16, None, False)[0]
        return jnp.sum(rows * dense) + memory_time_s(nbytes, s)

    x = jnp.zeros(2)
    check_grads(t, (x,), order=1, modes=("rev",), eps=1e-4)
    g = np.asarray(jax.grad(t)(x))
    assert np.all(np.isfinite(g)) and np.all(g < 0)


def _bridge_rows():
    return list(csv.DictReader((Path(__file__).resolve().parent.parent / "data"
                                / "megatron_bridge.csv").open(newline="")))


def test_bridge_rows_recompute_as_their_release_recipes_set_it():
    """calibration/bridge_recipe_facts.py item 6 (read at Megatron-Bridge v0.1.0rc3 ...
    v0.6.0): the CSV's recompute column and set facts are what it writes; spot checks read by
    hand: DeepSeek-V3 26.02 GB300 MXFP8 ["mla_up_proj"] (DEEPSEEK_V3_PRETRAIN_CONFIG_GB300_
    FP8_MX_V2), 26.04 GB200 ["mlp"], 26.06 GB300 [] (none), 25.09 B200 the recipe's selective
    with Megatron's default ["core_attn"]; GPT-OSS 26.04 H100 BF16 ["layernorm", "moe_act"],
    25.11 none (granularity left None); Llama 3 8B 25.11 H100 FP8-CS full, 5 of 32 layers;
    no Qwen3 row recomputes."""
    from calibration.bridge_recipe_facts import recompute_of

    facts = {"overlap", "layout", "dispatch", "attn", "moe_act", "recompute"}
    rows = {r["id"]: r for r in _bridge_rows()}
    for r in rows.values():
        assert r["recompute"] == recompute_of(r, facts)[0], r["id"]
    rc = lambda i: (rows["mb-" + i]["recompute"], sorted(  # noqa: E731
        f for f in rows["mb-" + i]["set"].split(";") if f.startswith("recompute")))
    assert rc("26_02-dgx-gb300-deepseek-v3-mxfp8-256g") == (
        "selective", ["recompute_core_attn=0", "recompute_mla_up_proj=1"])
    assert rc("26_04-dgx-gb200-deepseek-v3-mxfp8-256g") == (
        "selective", ["recompute_core_attn=0", "recompute_mlp=1"])
    assert rc("26_06-dgx-gb300-deepseek-v3-mxfp8-256g-1") == ("none", [])
    assert rc("25_09-dgx-b200-deepseek-v3-mxfp8-256g") == ("selective", [])
    assert rc("26_04-dgx-h100-gpt-oss-120b-bf16-64g") == (
        "selective", ["recompute_core_attn=0", "recompute_layernorm=1",
                      "recompute_moe_act=1"])
    assert rc("25_11-dgx-h100-gpt-oss-120b-bf16-64g") == ("none", [])
    assert rc("25_11-dgx-h100-llama3-8b-fp8-current-8g") == (
        "full", ["recompute_layer_frac=0.15625"])
    assert all(r["recompute"] == "none" for r in rows.values() if r["model"].startswith("qwen3"))
    counts = {k: sum(r["recompute"] == k for r in rows.values())
              for k in ("none", "selective", "full")}
    assert counts == dict(none=180, selective=41, full=1)
