"""QK-norm (Model.qk_norm: Qwen3 and Gemma 3 per head, OLMo 2 over the whole projection):
its forward traffic and kernels (workload.flops.qk_norm_bytes / qk_norm_kernels), the inputs
it keeps for its backward (memory.activations.qk_norm_saved_bytes) and its weights
(workload.params.qk_norm_params). Expected values are the docstrings' arithmetic, worked by
hand (docs/accuracy-bridge.md "Session 16: QK-norm").
"""

from __future__ import annotations

import re

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import yaml

import diffperf
from diffperf import Parallel
from diffperf.errors import SpecError
from diffperf.hf import hf_to_dict
from diffperf.load import model_from_dict
from diffperf.memory.activations import layer_activation_parts, qk_norm_saved_bytes
from diffperf.costs.compute import memory_time_s
from diffperf.costs.xla import kernel_fixed_s
from diffperf.predict import predict_step
from diffperf.workload.flops import (elementwise_backward_once_bytes, elementwise_bytes,
                                     ep_chunk_elementwise_bytes, layer_ops,
                                     qk_norm_backward_excess_bytes,
                                     qk_norm_backward_excess_kernels, qk_norm_bytes,
                                     qk_norm_kernels)
from diffperf.workload.params import qk_norm_params, total_params
from memory_bound import check_fact_part
from shipped import model as _model, system as _system

BF16 = diffperf.training("bf16")
QWEN = _model("qwen3-30b-a3b")            # a 32, a_kv 4, d_h 128, s 4096
BARE = QWEN.replace(qk_norm=0.0)
WHOLE = QWEN.replace(qk_norm=2.0)
ONE = Parallel(micro_batch=1.0)
HF = Path(__file__).resolve().parent / "data" / "hf"


def test_shipped_qwen3_models_have_the_per_head_form():
    assert float(QWEN.qk_norm) == 1.0
    assert float(_model("qwen3-235b-a22b").qk_norm) == 1.0
    assert float(_model("llama3-8b").qk_norm) == 0.0


def test_bytes_and_kernels_by_hand():
    """b 1, s 4096, t 1: norms 2 q_a T (a + a_kv) d_h = 2 x 2 x 4096 x 36 x 128 = 75,497,472;
    the key view copied (a_kv = 4 > t: the query's reshape already copied it) 2 x 2 x 4096 x 4
    x 128 = 8,388,608: 83,886,080 B, 3 kernels. t 4 (a_kv <= t: the query is a strided view,
    copied too): 2 x 2 x 4096 x (36 + 36) x 128 / 4 = 37,748,736 B, 4 kernels. The whole-
    projection form has no copies: 75,497,472 B, 2 kernels; none: 0."""
    assert float(qk_norm_bytes(QWEN, ONE, BF16)) == pytest.approx(83_886_080.0, rel=1e-7)
    assert float(qk_norm_kernels(QWEN, ONE)) == 3.0
    tp4 = Parallel(micro_batch=1.0, tp=4.0)
    assert float(qk_norm_bytes(QWEN, tp4, BF16)) == pytest.approx(37_748_736.0, rel=1e-7)
    assert float(qk_norm_kernels(QWEN, tp4)) == 4.0
    assert float(qk_norm_bytes(WHOLE, ONE, BF16)) == pytest.approx(75_497_472.0, rel=1e-7)
    assert float(qk_norm_kernels(WHOLE, ONE)) == 2.0
    assert float(qk_norm_bytes(BARE, ONE, BF16)) == 0.0
    assert float(qk_norm_kernels(BARE, ONE)) == 0.0


def test_layer_sums_hold_the_term_once():
    """elementwise_bytes and layer_ops' kernels gain exactly the QK-norm's; the merged EP
    schedule's pre-dispatch chunk A holds it (A + M + C stays a partition of the layer)."""
    par = Parallel(micro_batch=1.0, ep=8.0, dp=8.0)
    d_bytes = float(elementwise_bytes(QWEN, par, BF16)) - float(
        elementwise_bytes(BARE, par, BF16))
    assert d_bytes == pytest.approx(83_886_080.0, rel=1e-5)
    d_k = float(layer_ops(QWEN, par, BF16).n_kernels) - float(
        layer_ops(BARE, par, BF16).n_kernels)
    assert d_k == pytest.approx(3.0, abs=1e-9)
    a1, m1, _, _ = ep_chunk_elementwise_bytes(QWEN, par, BF16)
    a0, m0, _, _ = ep_chunk_elementwise_bytes(BARE, par, BF16)
    assert float(a1 - a0) == pytest.approx(83_886_080.0, rel=1e-5)
    assert float(m1) == float(m0)


def test_qk_norm_and_dropout_meet_without_a_cross_term():
    """Session 16's two traffic terms on one MoE layer under the merged EP schedule (b 1,
    s 4096, t 1, unfused attention): each adds its own bytes to the layer's element-wise sum
    and to chunk A, by hand, and neither reads the other. QK-norm 83,886,080 B (above);
    dropout's probabilities (2 q_a + 1) b a s^2 = 5 x 32 x 4096^2 = 2,684,354,560 B and its
    two masks 2 T h = 2 x 4096 x 2048 = 16,777,216 B, of which chunk A holds the attention's
    (8,388,608 B) and moves the dropout bytes once back, beside the QK-norm's backward excess
    54,525,952 B (`test_backward_excess_by_hand`); M holds neither."""
    par = Parallel(micro_batch=1.0, ep=8.0, dp=8.0)
    plain = BF16.replace(flash_attention=0.0)
    drop = plain.replace(dropout=1.0)
    qk, probs, masks = 83_886_080.0, 2_684_354_560.0, 16_777_216.0
    assert float(elementwise_bytes(QWEN, par, drop)) - float(
        elementwise_bytes(BARE, par, plain)) == pytest.approx(qk + probs + masks, rel=1e-6)
    a1, m1, ao1, mo1 = (float(x) for x in ep_chunk_elementwise_bytes(QWEN, par, drop))
    a0, m0, ao0, mo0 = (float(x) for x in ep_chunk_elementwise_bytes(BARE, par, plain))
    assert a1 - a0 == pytest.approx(qk + probs + masks / 2.0, rel=1e-6)
    assert ao1 - ao0 == pytest.approx(probs + masks / 2.0 + 54_525_952.0, rel=1e-6)
    assert (m1, mo1) == (m0, mo0)


def test_backward_excess_by_hand():
    """TE's backward moves 1.5 x the norms' forward bytes (read dy, read x, write dx) and none
    of the copies': the 2 x convention's excess is 0.5 B_norm + 2 B_copy. t 1: 0.5 x
    75,497,472 + 2 x 8,388,608 = 54,525,952 B; t 4: 0.5 x 18,874,368 + 2 x 18,874,368 =
    47,185,920 B; whole projection 37,748,736 B; none 0. Kernels: the copies' 2 x (1 at t 1,
    2 at t 4), none for the norms (their 2 x 2 is TE's main + dgamma-finalize pair)."""
    tp4 = Parallel(micro_batch=1.0, tp=4.0)
    for m, par, want_b, want_k in ((QWEN, ONE, 54_525_952.0, 2.0),
                                   (QWEN, tp4, 47_185_920.0, 4.0),
                                   (WHOLE, ONE, 37_748_736.0, 0.0), (BARE, ONE, 0.0, 0.0)):
        assert float(qk_norm_backward_excess_bytes(m, par, BF16)) == pytest.approx(
            want_b, rel=1e-7, abs=0.0)
        assert float(qk_norm_backward_excess_kernels(m, par)) == want_k
        once = float(elementwise_backward_once_bytes(m, par, BF16)) - float(
            elementwise_backward_once_bytes(BARE, par, BF16))
        assert once == pytest.approx(want_b, rel=1e-6, abs=1.0)
    # the merged-EP pre-dispatch chunk's once-share carries it (Qwen3 30B-A3B, t 1)
    par = Parallel(micro_batch=1.0, ep=8.0, dp=8.0)
    a_once = float(ep_chunk_elementwise_bytes(QWEN, par, BF16)[2]) - float(
        ep_chunk_elementwise_bytes(BARE, par, BF16)[2])
    assert a_once == pytest.approx(54_525_952.0, rel=1e-6)


def _one_gpu(host_kernel_s):
    s = _system("h100-sxm-80gb")
    return s.replace(eff=s.eff.replace(host_kernel_s=host_kernel_s, host_layer_s=0.0))


def test_step_time_rises_by_the_exact_backward():
    """dp 1, b 1, no recompute, no host floor: each layer's memory-bound seconds grow by the
    forward B = 83,886,080 B and 3 kernels, and the backward 1.5 B_norm = 113,246,208 B and
    4 kernels (not 2 x: 167,772,160 B, 6 kernels): 197,132,288 B and 7 kernel fixed times per
    layer and micro-batch. With a host-bound launch cost (1 s per kernel) the step grows by
    3 + 4 = 7 launches per layer and micro-batch (the copies launch nothing backward)."""
    par = Parallel(micro_batch=1.0, dp=1.0)
    n = float(QWEN.n_layers) * float(par.n_microbatches)
    gpu = _one_gpu(0.0)
    t0 = float(predict_step(BARE, par, gpu, BF16).step_time_s)
    t1 = float(predict_step(QWEN, par, gpu, BF16).step_time_s)
    per_layer = float(memory_time_s(197_132_288.0, gpu) + 7.0 * kernel_fixed_s(gpu, BF16))
    assert t1 - t0 == pytest.approx(per_layer * n, rel=2e-3)
    host = _one_gpu(1.0)
    t0 = float(predict_step(BARE, par, host, BF16).step_time_s)
    t1 = float(predict_step(QWEN, par, host, BF16).step_time_s)
    assert t1 - t0 == pytest.approx(7.0 * n, rel=1e-3)


def test_saved_bytes_by_hand_and_under_recompute():
    """Kept: x (q_a per element) and the fp32 rstd per row: 4096 x (2 x 36 x 128 + 4 x 36) =
    38,338,560 B per layer (whole projection: 4 x 2 rows per token: 4096 x 9224). Kept under
    no recompute and under Megatron's selective recompute whatever its modules ("layernorm"
    is the input and pre-MLP norms); not under full recompute (the layer input alone)."""
    assert float(qk_norm_saved_bytes(QWEN, ONE, BF16)) == pytest.approx(38_338_560.0,
                                                                        rel=1e-7)
    assert float(qk_norm_saved_bytes(WHOLE, ONE, BF16)) == pytest.approx(4096.0 * 9224.0,
                                                                         rel=1e-7)
    assert float(qk_norm_saved_bytes(BARE, ONE, BF16)) == 0.0
    for par, want in ((ONE, 38_338_560.0),
                      (Parallel(micro_batch=1.0, recompute=1.0), 38_338_560.0),
                      (Parallel(micro_batch=1.0, recompute=1.0, recompute_layernorm=1.0),
                       38_338_560.0),
                      (Parallel(micro_batch=1.0, recompute=2.0), 0.0)):
        kept = float(layer_activation_parts(QWEN, par, BF16)[0]) - float(
            layer_activation_parts(BARE, par, BF16)[0])
        assert kept == pytest.approx(want, abs=64.0), par.recompute


def test_weights_and_published_counts():
    """2 d_h = 256 per layer per head (Qwen3: + 48 x 256 = 12,288 over the model, 30.53 B
    stays 30.5 B); (a + a_kv) d_h = 36 x 128 = 4608 over the whole projection."""
    assert float(qk_norm_params(QWEN)) == 256.0
    assert float(qk_norm_params(WHOLE)) == 4608.0
    assert float(qk_norm_params(BARE)) == 0.0
    assert float(total_params(QWEN) - total_params(BARE)) == pytest.approx(12_288.0, abs=1.0)


def test_hf_families_set_the_form():
    """transformers: Qwen3 / Qwen3-MoE / Gemma 3 norm each head, OLMo 2 the projection;
    Llama none."""
    for name, want in (("qwen3-30b-a3b", 1.0), ("qwen3-8b", 1.0), ("gemma-3-12b", 1.0),
                       ("gemma-2-9b", 0.0), ("llama-3-8b", 0.0)):
        assert float(diffperf.load_model(HF / f"{name}.json").qk_norm) == want, name
    d = hf_to_dict(json.loads((HF / "qwen3-8b.json").read_text()), "x")[0]
    assert d["qk_norm"] == "head"


def test_bad_qk_norm_is_a_spec_error():
    d = yaml.safe_load((Path(diffperf.__file__).parent / "configs" / "models"
                        / "qwen3-30b-a3b.yaml").read_text())
    with pytest.raises(SpecError, match=r"qk_norm='heads'.*allowed: none, head, projection"):
        model_from_dict(d | {"qk_norm": "heads"})
    v3 = yaml.safe_load((Path(diffperf.__file__).parent / "configs" / "models"
                         / "deepseek-v3.yaml").read_text())
    with pytest.raises(SpecError, match=r"qk_norm='head' with kv_lora_rank=512.*allowed: none"):
        model_from_dict(v3 | {"qk_norm": "head"})


def test_bad_qk_norm_leaf_is_a_spec_error():
    """A Model built in Python with a qk_norm that is no form's index (3, 0.5) is refused by
    name before tracing (check_model, which check_inputs runs), not priced as a mix of the
    forms; the traced rules (valid_mask) mark it invalid."""
    from diffperf.specs.validate import check_model, valid_mask
    for v in (3.0, 0.5, -1.0):
        bad = QWEN.replace(qk_norm=v)
        with pytest.raises(SpecError, match=re.escape(
                f"qk_norm={v:g} is not allowed (allowed: 0 none, 1 head, 2 projection)")):
            check_model(bad)
        assert not bool(valid_mask(bad, ONE, _one_gpu(0.0), BF16))
    assert bool(valid_mask(QWEN, ONE, _one_gpu(0.0), BF16))


def test_gradient_contract(x64):
    """The bytes, the saved bytes and the backward excess in log(d_h, a, micro-batch): match
    finite differences (float64), finite, positive (more heads or tokens never move less);
    the layer's memory-bound part in log(HBM bandwidth, mem_eff, kernel_s): faster memory
    never slows it, a slower launch never speeds it, and the QK-norm makes it slower than
    without."""
    from jax.test_util import check_grads

    def dims(logs):
        m = QWEN.replace(head_dim=QWEN.head_dim * jnp.exp(logs[0]),
                         n_heads=QWEN.n_heads * jnp.exp(logs[1]))
        return m, ONE.replace(micro_batch=ONE.micro_batch * jnp.exp(logs[2]))

    x = jnp.zeros(3)
    for f in (qk_norm_bytes, qk_norm_saved_bytes, qk_norm_backward_excess_bytes):
        def g(logs, f=f):
            m, p = dims(logs)
            return f(m, p, BF16)
        check_grads(g, (x,), order=1, modes=("rev",), eps=1e-4)
        grad = np.asarray(jax.grad(g)(x))
        assert np.all(np.isfinite(grad)) and np.all(grad > 0)

    check_fact_part(QWEN, _system("h100-sxm-80gb"), BF16, BF16, without_model=BARE)
