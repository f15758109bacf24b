"""Peak memory of a training step compiled as one XLA program (JAX `jit`), term by term.

A JAX step is one program: XLA's buffer assignment decides which buffers are live at each
point, and its peak is what `jax.jit(f).lower(...).compile().memory_analysis()` reports,
arguments + outputs + temporaries - aliased (the measured `peak_memory_GB` of
data/h100_jax_single_gpu.csv). The program modelled is the one that file describes:
layers as one `lax.scan` over stacked fp32 weights, bf16 matmul inputs, cuDNN flash attention,
AdamW, gradient accumulation as a `lax.scan` over micro-batches, parameters and optimizer state
donated, `recompute=full` = `jax.checkpoint` around the scanned layer.

Live sets (S = states, the donated fp32 parameters and Adam m, v: outputs alias arguments, so
they are counted once; G = gradient bytes of the stage; R = stacked residuals):
    A  loss, start of the backward (last stage):  S + G_acc + R + loss buffers
    B  backward of the layer scan:                 S + G_acc + G_layers + R + working layer
    C  optimizer update (in place, donated):       S + G
    peak = max(A, B, C) + runtime workspace (eff.mem_reserved_bytes)
G_acc = G when the step accumulates m > 1 micro-batches (the fp32 carry of the micro-batch
scan; with m = 1 XLA's while-loop simplifier removes the one-trip loop and the add of zeros);
G_layers = the layer gradients the backward scan stacks as its outputs, allocated when the loop
starts (the embedding and output-layer gradients are scheduled outside it).
How this was found: the step of tests/jax_transformer.py (`make_scan_step`), written as the
data README says, compiled on the CPU at the 25 measured shapes and at small ones while
varying layers, micro-batch, accumulation, vocabulary and remat. What `lax.scan` stacks is
fixed by JAX's partial evaluation (the jaxpr), the same on every backend, and the count below
equals it (tests/test_memory_xla.py); the temporaries around it are backend-specific (the
CPU compiler fuses less and keeps 2-60 % more than the GPU measured), so only the structure
(which phase, which terms) was taken from the CPU, never its numbers. Against the 20
measured H100 peaks the formula (without eff.mem_reserved_bytes) is within 3.1 % (mean
1.1 %) with no fitted parameter, and puts the 5 runs that ran out of memory at 81-161 GB
against 76.7 GB for the largest that ran [D].
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from diffperf.memory.activations import cp_kv_buffer_bytes, layers_in_flight
from diffperf.memory.device import (gathered_buffer_bytes, nonlayer_unit_bytes, peak_parts,
                                   stage_states_params)
from diffperf.memory.weights import gradient_bytes, optimizer_bytes, weight_bytes
from diffperf.result import MEMORY_PARTS, Memory
from diffperf.workload.flops import tokens_per_device, vocab_rows_per_rank
from diffperf.workload.params import layer_params_per_device, residual_shards
from diffperf.workload.recompute import full_frac
from diffperf.workload.stages import each, pipeline_stages
from diffperf.workload.xla import FP32_BYTES, layer_residual_bytes


def scan_residual_bytes(model, parallel, training):
    """Bytes stacked per layer and micro-batch for the backward of the layer scan:

        recompute full (jax.checkpoint around the body): q_r T h_r   the scan carry only
        none or selective: layer_residual_bytes   (with flash attention there are no scores
                                                   to drop; a jax.checkpoint policy that
                                                   saves some values is not modelled, nor
                                                   XLA's own rematerialisation near the
                                                   memory limit)
    Full recompute of a fraction p of the layers (`workload.recompute.full_frac`): the mean
    layer stacks p x the carry + (1 - p) x layer_residual_bytes.
    q_r = training.residual_bytes (the dtype of the carry, the residual stream); a checkpointed
    body keeps its input and rebuilds the rest in the backward; its weights are slices of the
    scanned stack, so nothing is stacked for them [D: jaxpr].
    Example (L 24, h 2048, b 1, s 1024, q_r 2): 2 x 1024 x 2048 = 4.19 MB a layer, 0.1007 GB
    for 24 layers: the measured 21.323 GB of that run less 12 P + 4 P (16 P = 21.22 GB).
    """
    T = tokens_per_device(model, parallel)
    carry = training.residual_bytes * T * model.hidden / residual_shards(parallel)
    p = full_frac(parallel)
    return p * carry + (1.0 - p) * layer_residual_bytes(model, parallel, training)


def xla_working_layer_bytes(model, parallel, training):
    """Extra bytes while one scanned layer's backward runs, one micro-batch, one device:

        recompute full:  layer_residual_bytes     the layer rebuilt by `jax.checkpoint`
                                                  (its saved values and its weights' bf16
                                                  casts), live until its backward ends
        otherwise:       0                        the backward reads the stacked residuals
                                                  and fuses its temporaries
    The eager counterpart is `memory.activations.working_layer_bytes` (Korthikanti et al.'s
    full-layer activations). Source: the jaxpr of tests/jax_transformer.py `make_scan_step`
    under `jax.checkpoint` (the rematerialised primal values are the residuals that the
    non-remat scan stacks for one layer) and its compiled memory on the CPU [D; phase B of
    the module docstring, tests/test_memory_xla.py].
    Example (h 2048, a 16, a_kv 4, d_h 128, f 5376 SwiGLU, b 2, s 1024, q 2, full recompute):
    0.3326 GB, the `layer_residual_bytes` example.
    """
    return jnp.where(parallel.recompute == 2, layer_residual_bytes(model, parallel, training),
                     0.0)


def loss_buffer_bytes(model, parallel, training):
    """Buffers of the fp32 cross-entropy at the start of the backward, last stage:

        (4 + q) T V_t
    the fp32 exp(logits - max) that the loss saves for its backward and the q-byte gradient
    of the logits that the output layer's two backward GEMMs read (the q-byte logits are dead
    once the fused reductions have read them). T = b s / c tokens, q =
    training.activation_bytes, V_t = `vocab_rows_per_rank`. Source: the loss of
    tests/jax_transformer.py `scan_loss`, `optax.softmax_cross_entropy_with_integer_labels`
    on fp32 logits, whose `jax.nn.logsumexp` keeps exp(logits - max), a (T, V) fp32 array, as
    its `jax.vjp` residual; phase A of the module docstring against the measured peaks of
    data/h100_jax_single_gpu.csv (the example below) [D].
    Example: T = 32768, V = 128256, q = 2: 6 x 4.203e9 = 25.2 GB (the measured run peaks at
    33.55 GB = 12 P 6.32 + stacked carry 1.61 + 25.2 + 0.4).
    """
    T = tokens_per_device(model, parallel)
    return (FP32_BYTES + training.activation_bytes) * T * vocab_rows_per_rank(model, parallel,
                                                                         training)


def _stage_phases(params, expert_params, layer_P, resid, loss, working, parallel, training):
    """(parts at A, B, C) of one stage: dicts of MEMORY_PARTS without the buffers."""
    no_cast = training.replace(cast_weight_bytes=0.0)  # casts are in the stacked residuals
    w = weight_bytes(params, parallel, no_cast, expert_params)
    opt = optimizer_bytes(params, parallel, training, expert_params)
    grads = gradient_bytes(params, parallel, training, expert_params)
    acc = jnp.where(parallel.n_microbatches > 1, grads, 0.0)
    layer_grads = gradient_bytes(layer_P, parallel, training, expert_params)
    part = lambda g, act: dict(weights_bytes=w, gradients_bytes=g, optimizer_bytes=opt,  # noqa
                               activations_bytes=act)
    return (part(acc, resid + loss), part(acc + layer_grads, resid + working),
            part(grads, jnp.zeros_like(resid)))


def xla_device_memory(model, parallel, system, training, stages=None) -> Memory:
    """Memory parts of the pipeline stage and phase with the largest footprint (module
    docstring: A loss, B layer backward, C optimizer), and the usable capacity. The stages are
    memory.device's three candidates (`workload.stages.pipeline_stages`: first, largest
    middle, last; pass `stages` when the caller has them), each holding n_i layers:

        R_i = scan_residual_bytes x layers_in_flight(n_i, i)   (1F1B: min(p - i, m) micro-
                                                                batches on stage i)
        loss buffers on the last stage (on the only stage when p = 1)
    ZeRO shards the states as in `memory.weights`. What a sharded program holds beside its
    live sets, as the eager model does (memory.device): the parameters gathered for the layer
    in use (ZeRO-3 / FSDP, AxoNN's depth: `gathered_buffer_bytes`; the output / embedding
    units beside it: `memory.device.nonlayer_unit_bytes`) and CP's K/V buffers during
    the layer's backward (`activations.cp_kv_buffer_bytes`); the measured XLA runs are single
    GPU, so these two are not checked against XLA's own report [D].
    Example: p = 1 -> n_i = L, one micro-batch of stacked residuals: the single-GPU runs of
    the h100_jax_single_gpu runs file (data/).
    """
    if stages is None:
        stages = pipeline_stages(model, parallel)
    params, expert_P = stage_states_params(model, parallel, stages)
    per_layer = layer_params_per_device(model, parallel)
    loss_bytes = loss_buffer_bytes(model, parallel, training)
    layer_P = each(lambda n: n * per_layer, stages.layers)
    in_flight = each(lambda n, i: layers_in_flight(n, i, parallel), stages.layers,
                     stages.position)
    resid = scan_residual_bytes(model, parallel, training) * in_flight
    loss = each(lambda o: o * loss_bytes, stages.output)
    working = (xla_working_layer_bytes(model, parallel, training)
               + cp_kv_buffer_bytes(model, parallel, training))
    phases = _stage_phases(params, expert_P, layer_P, resid, loss, working, parallel, training)
    # ZeRO-3: the output / embedding units beside the layer's (`memory.device.
    # nonlayer_unit_bytes`), per stage, in the backward's phases A and B. The end of a micro-
    # batch's backward (the embedding's / the root's reduce-scatter) is reached from each
    # phase P by freeing that micro-batch's part of P's activations (its stacked residuals and
    # P's loss buffers or working layer) and growing P's gradients to those of the end (phase
    # C's: all of them at m = 1, where A holds none; the accumulated ones at m > 1):
    #     slack_P = min(one_P, act_P) - (G_C - G_P)
    # so that either phase, plus the units, is never below the end of the backward. Phase C
    # (the optimizer) follows that reduce-scatter: the units are resharded by then, and only
    # the layers' buffers and the workspace stay, as before.
    one = each(lambda n: scan_residual_bytes(model, parallel, training) * n, stages.layers)
    buffers = gathered_buffer_bytes(model, parallel, training) + system.eff.mem_reserved_bytes
    room = jnp.maximum(working - loss, 0.0)

    def with_units(c, held):
        slack = (jnp.minimum(one + held, c["activations_bytes"])
                 - (phases[2]["gradients_bytes"] - c["gradients_bytes"]))
        return dict(c, buffers_bytes=buffers + nonlayer_unit_bytes(
            model, parallel, training, stages, params, slack, room))

    phases = (with_units(phases[0], loss), with_units(phases[1], working),
              dict(phases[2], buffers_bytes=buffers))
    keys = MEMORY_PARTS
    # (phase, stage) flattened into one leading axis of 9 candidates; batched leaves follow.
    shape = jnp.broadcast_shapes(*(jnp.shape(c[k]) for c in phases for k in keys))
    flat = lambda x: jnp.broadcast_to(x, shape).reshape((-1,) + shape[1:])  # noqa: E731
    parts = {k: jnp.concatenate([flat(c[k]) for c in phases]) for k in keys}
    total = sum(parts[k] for k in keys)
    picked, peak_total = peak_parts(parts, total)
    return Memory(**picked, total_bytes=peak_total,
                  capacity_bytes=system.hbm_capacity_bytes * system.eff.mem_usable_frac)


def select_memory(training, xla: Memory, other: Memory) -> Memory:
    """`xla` where training.xla_compiled = 1, else `other`, leaf by leaf (jnp.where: with the
    flag at 0 every leaf is `other`'s, bit for bit)."""
    on = training.xla_compiled > 0
    return jax.tree.map(lambda a, b: jnp.where(on, a, b), xla, other)
