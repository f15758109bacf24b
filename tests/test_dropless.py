"""The copies a quantized dropless MoE layer makes to pad each local expert's routed tokens to
the FP8 / MXFP8 grouped-GEMM alignment (Transformer Engine Fp8Padding / Fp8Unpadding in
Megatron-Core 0.14-0.17's TEGroupedMLP; Training.moe_quant_pad,
workload.flops.moe_quant_pad_bytes; docs/accuracy-bridge.md "Session 10: the dropless alltoall
path"). Expected values are the docstring's arithmetic, worked by hand.
"""

from __future__ import annotations

import pytest

import diffperf
from diffperf import Parallel
from diffperf.workload.flops import (elementwise_backward_once_bytes,
                                     elementwise_bytes, layer_ops, moe_quant_pad_bytes,
                                     moe_quant_pad_kernels)
from memory_bound import check_fact_part
from shipped import model as _model, system as _system

MX = diffperf.training("mxfp8")
PAD = MX.replace(moe_quant_pad=1.0)
QWEN = _model("qwen3-30b-a3b")


def test_qwen3_30b_bytes_and_kernels_by_hand():
    """b 1, s 4096, t 1, e 8: R = k C_f T = 8 x 4096 = 32768 routed copies of h = 2048 bf16
    values; pad (read R h, write R h) + unpad of the fc2 output (the same):
    4 x 2 B x 2048 x 32768 = 536,870,912 B per layer forward; 3 kernels (tokens, probs,
    output)."""
    par = Parallel(micro_batch=1.0, ep=8.0, dp=8.0)
    got = float(moe_quant_pad_bytes(QWEN, par, PAD))
    assert got == pytest.approx(536_870_912.0, rel=1e-6)
    delta = float(elementwise_bytes(QWEN, par, PAD)) - float(elementwise_bytes(QWEN, par, MX))
    assert delta == pytest.approx(536_870_912.0, rel=1e-5)
    # the backward copies the gradients once (pad dY, strip dX): one pass, not the 2 x; the
    # rest is the QK-norm's backward excess (0.5 x 75,497,472 + 2 x 8,388,608 B, test_qknorm)
    assert float(elementwise_backward_once_bytes(QWEN, par, PAD)) == pytest.approx(
        536_870_912.0 + 54_525_952.0, rel=1e-6)
    assert float(elementwise_backward_once_bytes(QWEN, par, MX)) == pytest.approx(
        54_525_952.0, rel=1e-6)
    assert float(moe_quant_pad_kernels(QWEN, PAD)) == 3.0
    dk = float(layer_ops(QWEN, par, PAD).n_kernels) - float(layer_ops(QWEN, par, MX).n_kernels)
    assert dk == pytest.approx(3.0)
    # b 2 doubles the copies; the local-expert count does not enter (one multi-tensor kernel)
    par2 = Parallel(micro_batch=2.0, ep=16.0, dp=16.0)
    assert float(moe_quant_pad_bytes(QWEN, par2, PAD)) == pytest.approx(2 * 536_870_912.0,
                                                                       rel=1e-6)


def test_expert_tokens_under_tensor_parallelism():
    """Qwen3 235B-A22B (h 4096, k 8) at t 2 with sequence parallelism and etp 1 (the DGX-H100
    recipe): each rank's experts serve the T / t = 2048 tokens of its sequence shard,
    R = 8 x 2048 = 16384: 4 x 2 x 4096 x 16384 = 536,870,912 B."""
    q235 = _model("qwen3-235b-a22b")
    par = Parallel(micro_batch=1.0, tp=2.0, etp=1.0, ep=32.0, dp=128.0, sequence_parallel=1.0)
    assert float(moe_quant_pad_bytes(q235, par, PAD)) == pytest.approx(536_870_912.0, rel=1e-6)


def test_off_by_default_and_nothing_for_a_dense_model():
    """The default Training adds nothing; a dense model (phi = 0) adds nothing with the fact."""
    par = Parallel(micro_batch=1.0, ep=8.0, dp=8.0)
    assert float(moe_quant_pad_bytes(QWEN, par, MX)) == 0.0
    assert float(moe_quant_pad_kernels(QWEN, MX)) == 0.0
    llama = _model("llama3-8b")
    lpar = Parallel(micro_batch=1.0, dp=8.0)
    assert float(moe_quant_pad_bytes(llama, lpar, PAD)) == 0.0
    assert float(elementwise_bytes(llama, lpar, PAD)) == float(elementwise_bytes(llama, lpar, MX))
    assert float(layer_ops(llama, lpar, PAD).n_kernels) == float(
        layer_ops(llama, lpar, MX).n_kernels)


def test_quant_pad_gradient_contract(x64):
    """d t_other / d log(leaf) for HBM bandwidth, mem_eff and the per-kernel time of a layer's
    memory-bound part with the fact set: matches finite differences (float64), finite, the
    physical sign (more bandwidth never slows it, a slower launch never speeds it); the fact
    makes the part slower."""
    check_fact_part(QWEN, _system("dgx-b200"), PAD, MX)


def test_fact_on_the_bridge_rows():
    """calibration/bridge_recipe_facts.py sets the fact on exactly the quantized, dropless MoE
    rows that ran the alltoall dispatcher in containers 25.09-26.04.01 (16 rows: Qwen3 and one
    DeepSeek-V3), never on a drop-and-pad, flex, BF16 or 26.06+ row, and the shipped CSV
    carries it."""
    import csv
    from pathlib import Path

    from calibration.bridge_recipe_facts import QUANT_PAD_CONTAINERS, row_facts

    rows = list(csv.DictReader((Path(__file__).resolve().parent.parent / "data"
                                / "megatron_bridge.csv").open(newline="")))
    facts = {"overlap", "layout", "attn", "moe_act", "recompute", "quant_pad", "waves",
             "expert_loop", "tp_ub", "te_quant", "cudnn_norm", "swizzle", "host_sync"}
    on = [r for r in rows if "moe_quant_pad=1" in row_facts(r, facts)]
    assert len(on) == 16
    assert all(r["ep_dispatch"] == "0" and r["moe_token_drop"] == "0"
               and r["precision"] != "bf16" and r["container"] in QUANT_PAD_CONTAINERS
               and r["model"] in ("qwen3-30b-a3b", "qwen3-235b-a22b", "deepseek-v3")
               for r in on)
    assert all(";".join(row_facts(r, facts)) == r["set"] for r in rows)
    # the drop-and-pad rows of the same layouts stay without it
    assert not any("moe_quant_pad=1" in r["set"] for r in rows if r["moe_token_drop"] == "1")
