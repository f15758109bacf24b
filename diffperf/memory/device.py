"""Memory of the device with the largest footprint: the first, a middle or the last stage.

The first stage holds min(p, m) micro-batches of activations (1F1B) and the embedding; a
middle stage one micro-batch fewer but possibly more layers (uneven stages); the last holds one
micro-batch, the output layer and the logits (PAPERS.md sections 5.4-5.6).
"""

from __future__ import annotations

import jax.numpy as jnp

from diffperf.memory import activations as act
from diffperf.memory.weights import (gradient_bytes, lowp_weight_cache_bytes, optimizer_bytes,
                                     weight_bytes)
from diffperf.result import MEMORY_PARTS, Memory
from diffperf.workload.dp import gathered_weight_bytes, zero3_prefetch_frac
from diffperf.workload.params import (layer_matrix_params, layer_params_per_device,
                                      lowp_weight_cache_params,
                                      stage_expert_params_per_device, stage_params_per_device)
from diffperf.workload.stages import at_largest, each, pipeline_stages


def _gradients_at_peak(grads, activations, parallel, training):
    """Gradient bytes live at the memory peak.

        persistent buffers, or m > 1 (accumulation keeps them across micro-batches):  G
        otherwise (allocated during the backward as activations are freed): max(0, G - A)
    so that the peak is max(A, G) above the other states, not A + G [D].
    """
    persist = (training.grad_buffers_persist > 0) | (parallel.n_microbatches > 1)
    return jnp.where(persist, grads, jnp.maximum(grads - activations, 0.0))


def _stage_memory(params, expert_params, activations, buffers, parallel, training,
                  lowp_cache=0.0):
    grads = gradient_bytes(params, parallel, training, expert_params)
    return dict(weights_bytes=weight_bytes(params, parallel, training, expert_params)
                + lowp_cache,
                gradients_bytes=_gradients_at_peak(grads, activations, parallel, training),
                optimizer_bytes=optimizer_bytes(params, parallel, training, expert_params),
                activations_bytes=activations, buffers_bytes=buffers)


def zero3_buffer_bytes(layer_params, parallel, training):
    """ZeRO-3 / FSDP working buffers at the backward's peak, on one device:

        (1 + f) N_l q_w + N_l q_g
    the layer whose parameters are gathered for its backward, the fraction f of the next
    one prefetched (`workload.dp.zero3_prefetch_frac`: FSDP's next unit whole, f = 1;
    DeepSpeed's prefetch bucket), and the layer's full gradient before it is reduce-scattered.
    N_l = one layer's parameters on the device (its TP shard). Source: Zhao et al. VLDB 2023
    (FSDP: unsharded flat parameter of the current and the prefetched unit, the unsharded
    gradient until its reduce-scatter); Rajbhandari et al. SC20 (ZeRO-3) [D].
    Example: N_l = 1.81e9 / 8 (GPT-3 layer, tp 8), q_w = q_g = 2, f = 1: 3 x 0.45 GB = 1.36 GB.
    """
    f = zero3_prefetch_frac(parallel, layer_params)
    return layer_params * ((1.0 + f) * gathered_weight_bytes(training) + training.grad_bytes)


def gathered_buffer_bytes(model, parallel, training):
    """Parameters gathered for the layer in use (whatever the framework, eager or XLA):

        ZeRO-3: (1 + f) N_l q_w + N_l q_g        (`zero3_buffer_bytes`)
        AxoNN depth G_z > 1: 2 N_mat q_w / (t G_x G_y)
    N_mat = one layer's matrix weights (`workload.params.layer_matrix_params`). AxoNN
    all-gathers each linear's weight shard over the depth group Z before using it, which
    materialises its (n_out / G_y x k_in / G_x) block, n_out k_in q_w / (G_x G_y) bytes
    (PAPERS.md section 4.2, forward row "all-gather W over depth"); the gather of the next
    layer is issued ahead and cached (section 4.3, `cache_weights`; AxoNN
    `axonn/intra_layer/fully_connected.py`), so two layers' blocks are live: the one in use
    and the next [D for the count of two].
    Examples: ZeRO-3 without prefetch (f = 0), N_l = 1e9, q_w = q_g = 2: 4 GB. AxoNN G_x = G_y
    = 2, G_z = 4, N_mat = 1.2e9 (a 10B-class layer), q_w = 2: 2 x 1.2e9 x 2 / 4 = 1.2 GB.
    """
    z3 = jnp.where(parallel.zero_stage == 3, 1.0, 0.0)
    depth = jnp.where(parallel.gz > 1, 1.0, 0.0)
    gathered = layer_matrix_params(model)[0] / (parallel.tp * parallel.gx * parallel.gy)
    return (z3 * zero3_buffer_bytes(layer_params_per_device(model, parallel), parallel,
                                    training)
            + depth * 2.0 * gathered * training.weight_bytes)


def stage_states_params(model, parallel, stages):
    """(parameters, routed-expert parameters) on one device of each candidate stage, [3]
    each (`workload.params.stage_params_per_device`, `stage_expert_params_per_device`): what
    the ZeRO model-state formulas of `memory.weights` take."""
    per_layer = stage_expert_params_per_device(model, parallel, 1.0)
    return (stage_params_per_device(model, parallel, stages),
            each(lambda n: n * per_layer, stages.layers))


def peak_parts(parts, total):
    """(each part, the total) at the candidate (leading axis) whose total is the largest, the
    first of equals; parts without that axis are broadcast to it first. Batched leaves
    (evaluated eagerly, without vmap) keep their batch axes behind the candidate axis. The
    total is selected (`workload.stages.at_largest`), not taken by jnp.max, whose gradient
    can be 0/0 = NaN on equal candidates (p = 1)."""
    pick = at_largest(total)
    return {k: pick(jnp.broadcast_to(v, total.shape)) for k, v in parts.items()}, pick(total)


def device_memory(model, parallel, system, training, stages=None) -> Memory:
    """Memory parts of the pipeline stage with the largest footprint at its peak, and the
    usable capacity. Three stages are candidates (`workload.stages.pipeline_stages`; pass
    `stages` when the caller has them): the first (embedding, the most micro-batches in
    flight), the largest middle one (most layers, one micro-batch fewer in flight) and the
    last (output layer, logits):

        total_i = weights (+ quantized weight copies, `memory.weights.lowp_weight_cache_bytes`)
                  + gradients (live at the peak) + optimizer + activations + buffers
        activations_i = A_layer x layers_in_flight(n_i, i) + working (+ logits, last stage)
        working = the layer rebuilt under full recompute + CP's K/V buffers
        buffers = ZeRO-3: the gathered layer in use, the part (f) of the next one prefetched
                  and the layer's unsharded gradient before its reduce-scatter,
                  (1 + f) N_layer q_w + N_layer q_g (`zero3_buffer_bytes`)
                  + 2 layers' weights gathered over the AxoNN depth G_z (N_layer / (t G_x G_y))
                  + runtime workspace
    Example: Llama 3 405B on 16 stages (7, 8, ..., 8, 7 layers) with 1F1B: the second stage
    (8 layers x 15 micro-batches) holds more activations than the first (7 x 16).
    """
    if stages is None:
        stages = pipeline_stages(model, parallel)
    params, expert_P = stage_states_params(model, parallel, stages)
    k = system.eff.act_mem_factor
    kept, rebuilt = act.layer_activation_parts(model, parallel, training)
    working = k * (rebuilt + act.cp_kv_buffer_bytes(model, parallel, training))
    logits = act.logits_bytes(model, parallel, training)
    activations = each(lambda n, i, o: k * kept * act.layers_in_flight(n, i, parallel)
                       + working + o * logits, stages.layers, stages.position, stages.output)
    buffers = gathered_buffer_bytes(model, parallel, training) + system.eff.mem_reserved_bytes
    # Low precision: the quantized weight copies of the stage's layers (0 for 16-bit presets).
    cache_layer = lowp_weight_cache_params(model, parallel, training)
    cache = lowp_weight_cache_bytes(each(lambda n: n * cache_layer, stages.layers), parallel,
                                    training)
    # The three stages at once: a leading axis of 3 (first, middle, last).
    parts = _stage_memory(params, expert_P, activations, buffers, parallel, training, cache)
    total = sum(parts[k] for k in MEMORY_PARTS)  # every part but the buffers has the axis
    picked, peak_total = peak_parts({k: parts[k] for k in MEMORY_PARTS
                                     if k != "buffers_bytes"}, total)
    return Memory(**picked, buffers_bytes=buffers, total_bytes=peak_total,
                  capacity_bytes=system.hbm_capacity_bytes * system.eff.mem_usable_frac)
