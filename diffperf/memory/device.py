"""Memory of the device with the largest footprint: the first or the last pipeline stage.

The first stage holds min(p, m) micro-batches of activations (1F1B) and the embedding; the last
holds one micro-batch, the output layer and the logits (PAPERS.md sections 5.4-5.6).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from diffperf.memory import activations as act
from diffperf.memory.weights import gradient_bytes, optimizer_bytes, weight_bytes
from diffperf.result import MEMORY_PARTS, Memory
from diffperf.workload.params import (layer_matrix_params, layer_params_per_device,
                                      stage_expert_params_per_device, stage_params_per_device)


def _gradients_at_peak(grads, activations, parallel, training):
    """Gradient bytes live at the memory peak.

        persistent buffers, or m > 1 (accumulation keeps them across micro-batches):  G
        otherwise (allocated during the backward as activations are freed): max(0, G - A)
    so that the peak is max(A, G) above the other states, not A + G [D].
    """
    persist = (training.grad_buffers_persist > 0) | (parallel.n_microbatches > 1)
    return jnp.where(persist, grads, jnp.maximum(grads - activations, 0.0))


def _stage_memory(params, expert_params, activations, buffers, parallel, training):
    grads = gradient_bytes(params, parallel, training, expert_params)
    return dict(weights_bytes=weight_bytes(params, parallel, training, expert_params),
                gradients_bytes=_gradients_at_peak(grads, activations, parallel, training),
                optimizer_bytes=optimizer_bytes(params, parallel, training, expert_params),
                activations_bytes=activations, buffers_bytes=buffers)


def device_memory(model, parallel, system, training) -> Memory:
    """Memory parts of the larger of the first and last stage at its peak, and the usable
    capacity.

        total = weights + gradients (live at the peak) + optimizer + activations + buffers
        activations(first) = A_layer x layers_in_flight + working (+ logits if p = 1)
        activations(last)  = A_layer x (L/p) x interleave + working + logits
        working = the layer rebuilt under full recompute + CP's K/V buffers
        buffers = 2 gathered layers under ZeRO-3 (prefetch) + 2 layers' weights gathered over
                  the AxoNN depth G_z (N_layer / (t G_x G_y)) + runtime workspace
    """
    first_P, last_P = stage_params_per_device(model, parallel)
    expert_P = stage_expert_params_per_device(model, parallel)
    k = system.eff.act_mem_factor
    kept, rebuilt = act.layer_activation_parts(model, parallel, training)
    a_layer = k * kept
    working = k * (rebuilt + act.cp_kv_buffer_bytes(model, parallel, training))
    logits = act.logits_bytes(model, parallel, training)
    single = jnp.where(parallel.pp == 1, 1.0, 0.0)
    first_act = a_layer * act.layers_in_flight(model, parallel) + working + single * logits
    last_act = a_layer * model.n_layers / parallel.pp + working + logits
    z3 = jnp.where(parallel.zero_stage == 3, 1.0, 0.0)
    depth = jnp.where(parallel.gz > 1, 1.0, 0.0)
    gathered = layer_matrix_params(model)[0] / (parallel.tp * parallel.gx * parallel.gy)
    buffers = (z3 * 2.0 * layer_params_per_device(model, parallel) * training.weight_bytes
               + depth * 2.0 * gathered * training.weight_bytes
               + system.eff.mem_reserved_bytes)
    # Both stages at once: a leading axis of 2 (first, last).
    both = _stage_memory(jnp.stack(jnp.broadcast_arrays(first_P, last_P)), expert_P,
                         jnp.stack(jnp.broadcast_arrays(first_act, last_act)), buffers,
                         parallel, training)
    total = sum(both[k] for k in MEMORY_PARTS)  # every part but the buffers has the axis
    pick_first = total[0] >= total[1]
    parts = {k: both[k] if k == "buffers_bytes" else jnp.where(pick_first, both[k][0],
                                                                 both[k][1])
             for k in MEMORY_PARTS}
    return Memory(**parts, total_bytes=jnp.maximum(total[0], total[1]),
                  capacity_bytes=system.hbm_capacity_bytes * system.eff.mem_usable_frac)
