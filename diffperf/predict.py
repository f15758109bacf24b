"""predict(): step time, breakdown, memory and MFU of one configuration (DESIGN.md).

Assembly after PAPERS.md section 5.11:
    t_f, t_b  = per layer: op times + exposed TP / CP collectives (+ recompute in t_b),
                each combined with the host launch floor by a smooth max
    T_pipe    = m t_max + (sum_i t_i - t_max)/v  + exposed p2p
    T_step    = T_pipe + exposed DP / ZeRO + optimizer step + per-step overhead
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from diffperf.costs.collectives import all_gather_s, all_reduce_s, reduce_scatter_s, send_recv_s
from diffperf.costs.compute import gemms_time_s, layer_times_s, matmul_peak, memory_time_s
from diffperf.costs.smooth import pnorm_max
from diffperf.memory.device import device_memory
from diffperf.result import EXPOSED_PARTS, Breakdown, Memory, Result
from diffperf.schedule.overlap import dp_exposed_s, split_exposed
from diffperf.schedule.pipeline import critical_stage_weights, p2p_exposed_s, pipeline_times_s
from diffperf.specs import Parallel, Training
from diffperf.workload.cp import cp_kv_bytes
from diffperf.workload.dp import dp_volumes_bytes
from diffperf.workload.flops import attention_io_bytes, head_ops, layer_ops
from diffperf.workload.groups import stride
from diffperf.workload.params import layer_params_per_device, stage_params_per_device
from diffperf.workload.pp import pp_message_bytes
from diffperf.workload.tp import tp_collectives_per_layer, tp_message_bytes

_PARTS = ("compute_s", "recompute_s", "tp_exposed_s", "cp_exposed_s", "overhead_s",
          "overlap_slowdown_s", "tp_hidden_s", "cp_hidden_s")


def _tp_collective_s(model, parallel, system, training):
    """One TP all-reduce of S = b (s/c) h q_a (with SP: RS + AG, same ring cost)."""
    S = tp_message_bytes(model, parallel, training)
    return all_reduce_s(S, parallel.tp, stride(parallel, "tp"), system)


def _layer_parts(model, parallel, system, training, temperature):
    """Named seconds of one layer, one micro-batch, forward + backward (+ recompute), and
    the (forward, backward) times used as overlap windows."""
    e = system.eff
    ops = layer_ops(model, parallel, training)
    dense, attn, other = layer_times_s(ops, system, training,
                                       attention_io_bytes(model, parallel, training), temperature)
    n_f, n_b = tp_collectives_per_layer(parallel)
    c_tp = _tp_collective_s(model, parallel, system, training)
    tp_f, tp_fh = split_exposed(n_f * c_tp, parallel.tp_overlap * dense, temperature)
    tp_b, tp_bh = split_exposed(n_b * c_tp, parallel.tp_overlap * 2.0 * dense, temperature)
    c_cp = all_gather_s(cp_kv_bytes(model, parallel, training), parallel.cp,
                        stride(parallel, "cp"), system)
    cp_f, cp_fh = split_exposed(c_cp, attn, temperature)
    # Attention backward: 2 x forward, + the recomputed scores of flash attention (0.5 x).
    attn_bwd = (2.0 + 0.5 * training.flash_attention) * attn
    cp_b, cp_bh = split_exposed(2.0 * c_cp, attn_bwd, temperature)
    full = jnp.where(parallel.recompute == 2, 1.0, 0.0)
    selective = jnp.where(parallel.recompute == 1, 1.0, 0.0)
    recompute = full * (dense + attn + other) + selective * attn
    slow = e.overlap_slowdown * (tp_fh + tp_bh + cp_fh + cp_bh)
    gpu_f = dense + attn + other + tp_f + cp_f + e.overlap_slowdown * (tp_fh + cp_fh)
    gpu_b = 2.0 * dense + attn_bwd + 2.0 * other + recompute + tp_b + cp_b + (
        e.overlap_slowdown * (tp_bh + cp_bh))
    kernels = ops.n_kernels + jnp.where(parallel.tp > 1, n_f, 0.0)
    host_f = kernels * e.host_kernel_s + e.host_layer_s
    # Full recompute re-runs the layer's forward inside the backward: one more layer pass on
    # the host, plus the checkpoint's own bookkeeping (RNG state, rebuilding the graph).
    host_b = (2.0 + full) * kernels * e.host_kernel_s + (1.0 + full) * e.host_layer_s + (
        full * e.host_recompute_s)
    t_f = pnorm_max(gpu_f, host_f, e.floor_pnorm)
    t_b = pnorm_max(gpu_b, host_b, e.floor_pnorm)
    parts = dict(compute_s=3.0 * dense + attn + attn_bwd + 3.0 * other, recompute_s=recompute,
                 tp_exposed_s=tp_f + tp_b, cp_exposed_s=cp_f + cp_b,
                 overhead_s=(t_f - gpu_f) + (t_b - gpu_b), overlap_slowdown_s=slow,
                 tp_hidden_s=tp_fh + tp_bh, cp_hidden_s=cp_fh + cp_bh)
    return parts, t_f, t_b


def _head_parts(model, parallel, system, training, temperature):
    """(first-stage extra, last-stage extra) named seconds per micro-batch: the embedding
    (lookup and its gradient, one TP all-reduce) and the output layer with the loss
    (logits GEMM forward + 2 x backward, fp32 loss traffic, one TP all-reduce)."""
    head = head_ops(model, parallel, training)
    logits = gemms_time_s(head.logits, system, training, system.eff.mm_max,
                          system.eff.mm_half_dim, temperature)
    loss = memory_time_s(head.loss_bytes, system) + 3.0 * system.eff.kernel_s
    emb = memory_time_s(head.embedding_bytes, system) + system.eff.kernel_s
    c_tp = _tp_collective_s(model, parallel, system, training)
    zero = jnp.zeros_like(logits)
    first = {k: zero for k in _PARTS} | dict(compute_s=2.0 * emb, tp_exposed_s=c_tp)
    last = {k: zero for k in _PARTS} | dict(compute_s=3.0 * logits + 2.0 * loss,
                                            tp_exposed_s=c_tp)
    return first, last


def _exposed_sum(parts):
    return sum(parts[k] for k in _PARTS if not k.endswith("hidden_s"))


def _dp_parts(model, parallel, system, training, t_f, t_b, temperature):
    """(exposed, hidden, params of the larger stage) of the DP gradient reduction / ZeRO."""
    first, last = stage_params_per_device(model, parallel)
    P = jnp.maximum(first, last)
    layer_P = layer_params_per_device(model, parallel)
    g, w, lw, lg = dp_volumes_bytes(P, layer_P, training)
    n, s = parallel.dp, stride(parallel, "dp")
    reduce_s = jnp.where(parallel.zero_stage == 0, all_reduce_s(g, n, s, system),
                         reduce_scatter_s(g, n, s, system))
    gather_s = all_gather_s(w, n, s, system)
    layer_s = 2.0 * all_gather_s(lw, n, s, system) + reduce_scatter_s(lg, n, s, system)
    layers = model.n_layers / parallel.pp
    exposed, hidden = dp_exposed_s(reduce_s, gather_s, layer_s, all_gather_s(lw, n, s, system),
                                   layers * t_b, t_f + t_b,
                                   parallel.n_microbatches * layers, parallel, temperature)
    return exposed, hidden, P


def _optimizer_s(P, parallel, system, training):
    """Memory-bound optimizer step over the parameters this rank owns (PAPERS.md 5.11):

        bytes = Psi_own (q_g + 2 q_opt + q_w + q_master + (q_master or q_w)) + q_g Psi_own
    (read gradient, master or weights, moments; write them and the 16-bit weights; one more
    gradient read for the norm / clipping). Mixed-precision Adam: (26 + q_g) + q_g per param.
    """
    own = P / jnp.where(parallel.zero_stage >= 1, parallel.dp, 1.0)
    q_master = training.master_bytes
    source = jnp.where(q_master > 0, q_master, training.weight_bytes)
    per_param = (2.0 * training.grad_bytes + 2.0 * training.optimizer_bytes
                 + training.weight_bytes + q_master + source)
    return memory_time_s(own * per_param, system) + 4.0 * system.eff.kernel_s


def _flops_per_step(model, parallel, training):
    """(model FLOPs, hardware FLOPs) of one step over all devices.

        model    = 3 B [L (dense + attention) + logits]    forward x 3, no recompute
        hardware = model + B L (flash backward's recomputed scores 0.5 x attention + recompute)
    per sequence forward FLOPs from `layer_ops` at b = 1 and no sharding (PAPERS.md 5.1).
    """
    unit = Parallel(micro_batch=1.0)
    ops = layer_ops(model, unit, training)
    dense = jnp.sum(ops.dense.flops)
    attn = jnp.sum(ops.attention.flops)
    logits = jnp.sum(head_ops(model, unit, training).logits.flops)
    B, L = parallel.global_batch, model.n_layers
    model_flops = 3.0 * B * (L * (dense + attn) + logits)
    full = jnp.where(parallel.recompute == 2, 1.0, 0.0)
    selective = jnp.where(parallel.recompute == 1, 1.0, 0.0)
    flash_bwd = 0.5 * training.flash_attention * attn  # flash backward recomputes the scores
    extra = B * L * (flash_bwd + full * (dense + attn) + selective * attn)
    return model_flops, model_flops + extra


def predict_step(model, parallel, system, training, temperature=None) -> Result:
    """The whole prediction for one configuration (pure; jit/vmap/grad-safe)."""
    layer, t_f, t_b = _layer_parts(model, parallel, system, training, temperature)
    first, last = _head_parts(model, parallel, system, training, temperature)
    layers = model.n_layers / parallel.pp
    body = {k: layers * v for k, v in layer.items()}
    body["overhead_s"] = body["overhead_s"] + system.eff.microbatch_s
    t_fe, t_le = _exposed_sum(first), _exposed_sum(last)
    _, bubble = pipeline_times_s(_exposed_sum(body), t_fe, t_le, parallel)
    w_first, w_last = critical_stage_weights(t_fe, t_le, parallel)
    m = parallel.n_microbatches
    crit = {k: m * (body[k] + w_first * first[k] + w_last * last[k]) for k in _PARTS}
    send = send_recv_s(pp_message_bytes(model, parallel, training), parallel.pp,
                       stride(parallel, "pp"), system)
    dp_exposed, dp_hidden, P = _dp_parts(model, parallel, system, training, t_f, t_b,
                                         temperature)
    breakdown = Breakdown(
        **{k: crit[k] for k in _PARTS}, pp_exposed_s=p2p_exposed_s(send, parallel),
        dp_exposed_s=dp_exposed, dp_hidden_s=dp_hidden, bubble_s=bubble,
        optimizer_s=_optimizer_s(P, parallel, system, training))
    breakdown = breakdown.replace(overhead_s=breakdown.overhead_s + system.eff.step_s)
    step = sum(getattr(breakdown, k) for k in EXPOSED_PARTS)
    memory = device_memory(model, parallel, system, training)
    model_flops, hw_flops = _flops_per_step(model, parallel, training)
    n = parallel.n_devices
    return Result(
        step_time_s=step, breakdown=breakdown, memory=memory,
        fits=memory.total_bytes <= memory.capacity_bytes,
        fit_margin_frac=(memory.capacity_bytes - memory.total_bytes) / memory.capacity_bytes,
        mfu=model_flops / (step * n * matmul_peak(system, training)),
        tokens_per_s=parallel.global_batch * model.seq_len / step,
        model_flops=model_flops, hardware_flops=hw_flops, n_devices=n)
