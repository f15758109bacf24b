"""GPT-OSS's expert-MLP element-wise work as Megatron-Core 0.15-0.17 runs it
(docs/accuracy-gptoss.md, section "Expert MLP element-wise"): the clamp of the fc1 output
(two clamps and a cat) and the per-expert fc2 bias (`_apply_bias`) as eager memory-bound
kernels (Training.moe_eager_clamp_bias; workload.flops.moe_eager_clamp_bias_bytes). Expected
values are the docstring's arithmetic, worked by hand.
"""

from __future__ import annotations

import pytest

import diffperf
from diffperf import Parallel
from diffperf.workload.flops import (elementwise_bytes, layer_ops,
                                     moe_eager_clamp_bias_bytes, moe_eager_clamp_bias_kernels)
from memory_bound import check_fact_part
from shipped import model as _model, system as _system

BF16 = diffperf.training("bf16")
EAGER = BF16.replace(moe_eager_clamp_bias=1.0)
GPT_OSS = _model("gpt-oss-120b")


def test_gpt_oss_bytes_and_kernels_by_hand():
    """b 1, s 4096, t 1, e 8, bf16: R = k C_f T = 4 x 4096 = 16384 routed copies; per copy
    clamp 8 x 2880 (clamp both halves r + w, cat r + w of 2 x 2880) and fc2 bias 6 x 2880
    (b p written, t + b p read 2 written 1, cat r + w): 2 B x 16384 x 14 x 2880 =
    1,321,205,760 B per layer forward. Kernels: 3 (clamp) + 2 x 128 / 8 + 1 = 36."""
    par = Parallel(micro_batch=1.0, ep=8.0, dp=8.0)
    got = float(moe_eager_clamp_bias_bytes(GPT_OSS, par, EAGER))
    assert got == pytest.approx(1_321_205_760.0, rel=1e-6)
    delta = float(elementwise_bytes(GPT_OSS, par, EAGER)) - float(
        elementwise_bytes(GPT_OSS, par, BF16))
    assert delta == pytest.approx(1_321_205_760.0, rel=1e-5)
    assert float(moe_eager_clamp_bias_kernels(GPT_OSS, par, EAGER)) == 36.0
    dk = float(layer_ops(GPT_OSS, par, EAGER).n_kernels) - float(
        layer_ops(GPT_OSS, par, BF16).n_kernels)
    assert dk == pytest.approx(36.0)
    # e 64 (the Blackwell recipes): 2 local experts, 3 + 4 + 1 kernels; b 4 quadruples bytes
    par64 = Parallel(micro_batch=4.0, ep=64.0, dp=64.0)
    assert float(moe_eager_clamp_bias_kernels(GPT_OSS, par64, EAGER)) == 8.0
    assert float(moe_eager_clamp_bias_bytes(GPT_OSS, par64, EAGER)) == pytest.approx(
        4 * 1_321_205_760.0, rel=1e-6)


def test_off_by_default_and_nothing_for_a_dense_model():
    """The default Training adds nothing; a dense model (phi = 0) adds nothing even with the
    fact set: only routed expert copies carry the term."""
    par = Parallel(micro_batch=1.0, ep=8.0, dp=8.0)
    assert float(moe_eager_clamp_bias_bytes(GPT_OSS, par, BF16)) == 0.0
    assert float(moe_eager_clamp_bias_kernels(GPT_OSS, par, BF16)) == 0.0
    llama = _model("llama3-8b")
    lpar = Parallel(micro_batch=1.0, dp=8.0)
    assert float(moe_eager_clamp_bias_bytes(llama, lpar, EAGER)) == 0.0
    assert float(elementwise_bytes(llama, lpar, EAGER)) == float(
        elementwise_bytes(llama, lpar, BF16))
    assert float(layer_ops(llama, lpar, EAGER).n_kernels) == float(
        layer_ops(llama, lpar, BF16).n_kernels)


def test_expert_tensor_parallel_splits_only_the_clamp():
    """etp 2 (t 2): each rank's experts serve T t_e / t = T tokens; the fc1 output is
    2 f_e / 2 wide (the clamp halves), the fc2 output h wide (partial sums): per copy
    8 x 1440 + 6 x 2880 = 28,800 elements, against 40,320 at etp 1."""
    par = Parallel(micro_batch=1.0, tp=2.0, etp=2.0, ep=4.0, dp=4.0)
    got = float(moe_eager_clamp_bias_bytes(GPT_OSS, par, EAGER))
    assert got == pytest.approx(2 * 4 * 4096 * (8 * 1440 + 6 * 2880), rel=1e-6)


def test_eager_clamp_bias_gradient_contract(x64):
    """d t_other / d log(leaf) for HBM bandwidth, mem_eff and the per-kernel time of a layer's
    memory-bound part with the fact set: matches finite differences (float64), finite, and
    the physical sign (more bandwidth never slows it, a slower kernel launch never speeds it);
    the fact makes the part slower."""
    check_fact_part(GPT_OSS, _system("h100-sxm-80gb"), EAGER, BF16)


def test_fact_on_the_bridge_rows():
    """calibration/bridge_recipe_facts.py sets the fact on the GPT-OSS rows of the containers
    with Megatron Core 0.15-0.17 (25.11 to 26.04.01: the 24 BF16 rows) and nowhere else, and
    the shipped CSV carries it."""
    import csv
    from pathlib import Path

    from calibration.bridge_recipe_facts import row_facts

    rows = list(csv.DictReader((Path(__file__).resolve().parent.parent / "data"
                                / "megatron_bridge.csv").open(newline="")))
    facts = {"overlap", "layout", "attn", "moe_act", "recompute", "quant_pad", "waves",
             "expert_loop", "tp_ub", "te_quant", "cudnn_norm", "swizzle", "host_sync"}
    on = [r for r in rows if "moe_eager_clamp_bias=1" in row_facts(r, facts)]
    assert len(on) == 24
    assert all(r["model"] == "gpt-oss-120b" and r["precision"] == "bf16" for r in on)
    assert all(";".join(row_facts(r, facts)) == r["set"] for r in rows)
