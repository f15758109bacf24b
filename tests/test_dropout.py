"""Dropout's HBM traffic (Training.dropout; workload.flops.dropout_bytes): the attention-probs
dropout of unfused attention and the masks of Megatron's fused bias-dropout-adds, as vTrain's
Megatron-DeepSpeed runs them. Expected values are the docstring's arithmetic, worked by hand.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

from diffperf import Model, Parallel, Training
from diffperf.costs.compute import memory_time_s
from diffperf.predict import predict_step
from diffperf.workload.flops import (dropout_bytes, elementwise_backward_once_bytes,
                                     elementwise_bytes, ep_chunk_elementwise_bytes, layer_ops)
from shipped import system as _system

# a vTrain single-node GPT (h 1024, a 16, s 1024), fp16, unfused attention
GPT = Model(n_layers=12.0, hidden=1024.0, ffn_hidden=4096.0, n_heads=16.0, n_kv_heads=16.0,
            head_dim=64.0, vocab=50257.0, seq_len=1024.0, biases=1.0, learned_positions=1.0)
UNFUSED = Training(flash_attention=0.0, fused_softmax_max_seq=2048.0)
DROP = UNFUSED.replace(dropout=1.0)


def test_bytes_by_hand():
    """b 1, t 1: B_probs = (2 x 2 + 1) x 16 x 1024 x 1024 = 83,886,080 B (read P, write P',
    write the 1-byte mask); B_hidden = 2 x 1024 x 1024 x 1 = 2,097,152 B (two masks). The
    layer's forward element-wise bytes grow by exactly their sum, and the bytes moved once
    back by the same sum."""
    par = Parallel(micro_batch=1.0)
    probs, hidden = (float(x) for x in dropout_bytes(GPT, par, DROP))
    assert probs == 83_886_080.0
    assert hidden == 2_097_152.0
    d = float(elementwise_bytes(GPT, par, DROP)) - float(elementwise_bytes(GPT, par, UNFUSED))
    assert d == pytest.approx(85_983_232.0, rel=1e-6)
    d_once = float(elementwise_backward_once_bytes(GPT, par, DROP)) - float(
        elementwise_backward_once_bytes(GPT, par, UNFUSED))
    assert d_once == pytest.approx(85_983_232.0, rel=1e-6)


def test_tensor_parallel_and_micro_batch():
    """t 8, b 2 (vTrain's 2 batches x heads per rank): scores 2 x 2 x 1024^2 x 5 = 20,971,520 B;
    without SP the hidden masks stay whole: 2 x 2048 x 1024 = 4,194,304 B; with SP they are
    split over t: 524,288 B."""
    par = Parallel(micro_batch=2.0, tp=8.0)
    probs, hidden = (float(x) for x in dropout_bytes(GPT, par, DROP))
    assert probs == 20_971_520.0
    assert hidden == 4_194_304.0
    sp = Parallel(micro_batch=2.0, tp=8.0, sequence_parallel=1.0)
    assert float(dropout_bytes(GPT, sp, DROP)[1]) == 524_288.0


def test_off_without_dropout_and_no_probs_with_flash():
    """dropout 0 adds nothing; flash attention draws its dropout in the kernel: only the two
    hidden masks remain. The kernel count never changes (the dropout kernel is already in
    _UNFUSED_ATTENTION_EXTRA_KERNELS; the masks ride in the fused bias-dropout-add)."""
    par = Parallel(micro_batch=1.0)
    assert [float(x) for x in dropout_bytes(GPT, par, UNFUSED)] == [0.0, 0.0]
    flash = Training(dropout=1.0)
    assert [float(x) for x in dropout_bytes(GPT, par, flash)] == [0.0, 2_097_152.0]
    assert float(layer_ops(GPT, par, DROP).n_kernels) == float(
        layer_ops(GPT, par, UNFUSED).n_kernels)


def test_ep_chunks_keep_the_partition():
    """The merged-EP chunks: the attention's dropouts (probs + one mask) are A's and moved
    once back; the MLP's mask is the combine node's (C), in neither A nor M."""
    par = Parallel(micro_batch=1.0)
    a1, m1, ao1, mo1 = (float(x) for x in ep_chunk_elementwise_bytes(GPT, par, DROP))
    a0, m0, ao0, mo0 = (float(x) for x in ep_chunk_elementwise_bytes(GPT, par, UNFUSED))
    assert a1 - a0 == pytest.approx(83_886_080.0 + 1_048_576.0, rel=1e-6)
    assert ao1 - ao0 == pytest.approx(83_886_080.0 + 1_048_576.0, rel=1e-6)
    assert (m1, mo1) == (m0, mo0)


def test_step_time_rises_by_the_priced_traffic():
    """No recompute: the step's memory-bound seconds (in breakdown.compute_s) grow by the
    forward bytes once forward and once backward (2 x 85,983,232 B at the A100's memory
    roofline, times layers and micro-batches); the prediction gets slower, never faster.
    The step time itself passes the GPU seconds through the p-norm smooth max with the host
    time (here 93 % of them at host_kernel_s 12.9 us), so it is compared by sign only."""
    system = _system("a100-sxm-80gb")
    par = Parallel(micro_batch=1.0, dp=1.0)
    r0 = predict_step(GPT, par, system, UNFUSED)
    r1 = predict_step(GPT, par, system, DROP)
    per_layer = float(memory_time_s(2.0 * 85_983_232.0, system))
    assert float(r1.step_time_s) > float(r0.step_time_s)
    d = float(r1.breakdown.compute_s) - float(r0.breakdown.compute_s)
    assert d == pytest.approx(per_layer * 12 * float(par.n_microbatches), rel=1e-5)


@pytest.mark.parametrize("recompute", [0.0, 1.0])
def test_gradient_contract(x64, recompute):
    """d step_time / d log(HBM bandwidth, mem_eff) with dropout priced (no recompute, and
    selective recompute re-running the unfused core): matches finite differences (float64),
    finite, and physical (more bandwidth or efficiency never slows the step)."""
    system = _system("a100-sxm-80gb")
    par = Parallel(micro_batch=1.0, dp=1.0, recompute=recompute)

    def t(logs):
        e = system.eff.replace(mem_eff=system.eff.mem_eff * jnp.exp(logs[1]))
        s = system.replace(hbm_bandwidth_Bps=system.hbm_bandwidth_Bps * jnp.exp(logs[0]), eff=e)
        return predict_step(GPT, par, s, DROP).step_time_s

    x = jnp.zeros(2)
    check_grads(t, (x,), order=1, modes=("rev",), eps=1e-4)
    g = np.asarray(jax.grad(t)(x))
    assert np.all(np.isfinite(g))
    assert g[0] < 0 and g[1] < 0


def test_selective_recompute_reruns_the_unfused_core_attention():
    """Megatron's selective recompute (recompute 1, core_attn) re-runs the whole core
    attention, scale-mask-softmax and attention dropout included (Megatron-LM
    megatron/core/transformer/attention.py `_checkpointed_attention_forward`,
    dot_product_attention.py; Korthikanti et al. 2022 Section 5): on the unfused path its
    element-wise bytes are re-run once. b 1, t 1, fp16, s 1024 (fused softmax): scores
    4 x 2 x 16 x 1024^2 = 134,217,728 B, the dropout's B_probs 83,886,080 B; flash attention
    re-runs neither (its kernel is the attention time). Full recompute is unchanged."""
    from diffperf.workload.recompute import megatron_recompute_bytes

    sel = Parallel(micro_batch=1.0, recompute=1.0)
    assert float(megatron_recompute_bytes(GPT, sel, UNFUSED)) == 134_217_728.0
    assert float(megatron_recompute_bytes(GPT, sel, DROP)) == 134_217_728.0 + 83_886_080.0
    assert float(megatron_recompute_bytes(GPT, sel, Training(dropout=1.0))) == 0.0
    assert float(megatron_recompute_bytes(GPT, Parallel(micro_batch=1.0, recompute=2.0),
                                          DROP)) == 0.0
    # the step's recompute seconds grow by B_probs at the memory roofline, per layer and
    # micro-batch (forward and backward are unchanged by the recompute)
    system = _system("a100-sxm-80gb")
    par = Parallel(micro_batch=1.0, dp=1.0, recompute=1.0)
    r0 = float(predict_step(GPT, par, system, UNFUSED).breakdown.recompute_s)
    r1 = float(predict_step(GPT, par, system, DROP).breakdown.recompute_s)
    want = float(memory_time_s(83_886_080.0, system)) * 12 * float(par.n_microbatches)
    assert r1 - r0 == pytest.approx(want, rel=2e-3)
