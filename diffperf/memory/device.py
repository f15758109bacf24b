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
from diffperf.workload.dp import gathered_weight_bytes, root_unit_params, zero3_prefetch_frac
from diffperf.workload.params import (embedding_params, grid_shards, layer_matrix_params,
                                      layer_params_per_device, lowp_weight_cache_params,
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


def nonlayer_unit_bytes(model, parallel, training, stages, stage_params, slack, room=0.0):
    """Bytes that the parameters outside the transformer layers (embedding, final norm, output
    layer) add under ZeRO-3 / FSDP to the layers' buffers (`gathered_buffer_bytes`) at the
    memory peak, per candidate stage i ([3], `workload.stages`). Two moments of a micro-batch's
    backward are compared, both beside the layers' buffers B_l:

        start (the output layer's backward: every activation of the stage still live)
        end   (the embedding's backward and the root's reduce-scatter: the micro-batch's
               activations freed; `slack` = the bytes freed by then, from the caller)
        extra_i = X_i + max(0, Y_i - X_i - slack_i)
    The output unit of the default (below) is in use at the loss, the layer units during the
    layers' backward: where the working layer exceeds the loss's buffers by `room_i` (from
    the caller; `device_memory` counts max(working, logits)), X_i hides in it: max(0, X_i -
    room_i). The root unit is held throughout: no room.
    N_o = V h / (t G) (the output matrix, tied or not: its weight is gathered whole for the
    logits; G = the AxoNN grid's shards, `workload.params.grid_shards`, 1 without a grid),
    N_e = embedding / (t G), Psi_r = `workload.dp.root_unit_params` (stage params minus
    n_i layers), o_i / e_i = the stage holds the output / the embedding, q_w =
    training.weight_bytes (the 16-bit compute copy: no framework quantizes the embedding or
    the output layer), q_g = training.grad_bytes, f N_l q_gw = the prefetched last layer
    (`zero3_buffer_bytes`: B_l = (1 + f) N_l q_gw + N_l q_g).

    ZeRO-3 without the root-unit fact (any implementation: the output matmul needs its whole
    weight, and its whole gradient exists before its reduce-scatter):
        X_i = o_i max(0, N_o (q_w + q_g) + f N_l q_gw - B_l)    (the output unit in use, the
                                                                 last layer prefetched, in
                                                                 place of the layer unit)
        Y_i = e_i N_e (q_w + q_g)                               (the embedding unit)
    Tied embeddings on one stage (p = 1; at p > 1 the last stage keeps its own copy,
    `stage_params_per_device`): the output's use and the embedding's use feed one
    parameter, whose AccumulateGrad runs once, after the embedding's backward has added its
    gradient (the autograd engine sums a node's inputs before running it; DeepSpeed ZeRO-3's
    reduce hook sits on that node, so nothing reduces the output's contribution earlier).
    The output's gradient, N_o q_w (autograd's dtype is the parameter's), is therefore held
    through the whole backward, beside the layers' buffers, where no working layer hides it:
        X_i = max(X_i, t_e o_i e_i N_o q_w)     (t_e = model.tied_embeddings)
    (Y_i already counts that gradient: it is the embedding unit's own.)
    FSDP's root unit (Parallel.zero3_root_unit = 1: fully_shard(model) / the FSDP1 root
    FlatParameter, `schedule.overlap.zero3_root_unit_s`):
        X_i = Psi_r q_w + o_i N_o q_w    the root stays unsharded from its pre-forward to its
                                         post-backward (FSDP2 `FSDPState._lazy_init`: "For the
                                         root, do not reshard after forward"; FSDP1
                                         `_post_forward_reshard`: "Do not free the root's
                                         parameters in the post-forward for FULL_SHARD"), and
                                         the output's unsharded gradient, in the parameter
                                         dtype (MixedPrecisionPolicy.param_dtype: "the dtype
                                         for ... the parameter gradient"), waits for the root's
                                         post-backward at the end of the backward
        Y_i = Psi_r (q_w + q_g)          at that post-backward: the unsharded gradients (output
                                         and embedding) and the reduce-scatter input in the
                                         reduce dtype (FSDP2 `foreach_reduce`: copy-in into
                                         a new reduce_dtype buffer, then the gradients are
                                         freed; the parameters were resharded just before)
    0 below ZeRO-3. Sources: pytorch torch/distributed/_composable/fsdp (`_fsdp_state.py`,
    `_fsdp_param_group.py` post_backward, `_fsdp_collectives.py` foreach_reduce) and
    torch/distributed/fsdp/_runtime_utils.py at the torch the published FSDP rows used
    (data/published_fsdp.md); TorchTitan `apply_fsdp` (9dec370: the last block is not
    resharded after forward, so it is the prefetched unit at the start of the backward);
    Zhao et al. VLDB 2023 Section 3 (FSDP units) [D].
    Example: Llama 3 8B, t = 1, p = 1, bf16 (q_w 2, q_g 4 as TorchTitan reduces in fp32),
    N_o = N_e = V h = 525,336,576, Psi_r = 2 V h, N_l = 218,112,000, f = 1, slack 0:
    root unit: X = 2 V h 2 + V h 2 = 3.152 GB, Y = 2 V h 6 = 6.304 GB -> extra 6.304 GB;
    with slack 10 GB -> 3.152 GB; without the fact (q_g 4): B_l = 2 N_l 2 + 4 N_l = 1.745 GB,
    X = 6 V h + 2 N_l - B_l = 1.843 GB, Y = 3.152 GB -> 1.843 + max(0, 1.309 - slack).
    """
    z3 = jnp.where(parallel.zero_stage == 3, 1.0, 0.0)
    shards = parallel.tp * grid_shards(parallel)
    n_out = model.vocab * model.hidden / shards
    n_emb = embedding_params(model) / shards
    n_l = layer_params_per_device(model, parallel)
    f = zero3_prefetch_frac(parallel, n_l)
    q_w, q_g = training.weight_bytes, training.grad_bytes
    b_l = zero3_buffer_bytes(n_l, parallel, training)
    pre = f * n_l * gathered_weight_bytes(training)
    root_on = parallel.zero3_root_unit > 0

    def extra(n, o, e, psi, s, r):
        held = model.tied_embeddings * o * e * n_out * q_w   # tied: the output's gradient
        x_def = jnp.maximum(o * jnp.maximum(n_out * (q_w + q_g) + pre - b_l - r, 0.0), held)
        y_def = e * n_emb * (q_w + q_g)
        root = root_unit_params(psi, n_l, n)
        x = jnp.where(root_on, root * q_w + o * n_out * q_w, x_def)
        y = jnp.where(root_on, root * (q_w + q_g), y_def)
        return z3 * (x + jnp.maximum(y - x - s, 0.0))

    room = jnp.broadcast_to(room, jnp.shape(slack))
    return each(extra, stages.layers, stages.output, stages.embedding, stage_params, slack, room)


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
        activations_i = A_layer x layers_in_flight(n_i, i) + max(working, [last] logits)
        working = the layer rebuilt under full recompute + CP's K/V buffers
        logits  = the loss's buffers (`activations.logits_bytes`), live at the loss and freed
                  once the output layer's backward has read the logits' gradient, before the
                  last layer's backward rebuilds it: the two are never live together (the
                  XLA model's phases A and B, memory.xla; TorchTitan's printed memory of the
                  Llama 3 8B CP 1-8 runs is flat, 83.9-84.5 GiB, while the CP K/V buffers
                  grow 3.9 -> 11.7 GB: docs/accuracy-hopper.md, Session 14)
        buffers = ZeRO-3: the gathered layer in use, the part (f) of the next one prefetched
                  and the layer's unsharded gradient before its reduce-scatter,
                  (1 + f) N_layer q_w + N_layer q_g (`zero3_buffer_bytes`)
                  + the embedding / output units or FSDP's root unit at the start or the
                  end of the backward (`nonlayer_unit_bytes`, per stage)
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
    # The logits' buffers live at the loss (start of the backward), the working layer during a
    # layer's backward: never together (the loss's buffers are freed before the last layer's
    # backward starts), as the XLA model's phases A and B already say.
    activations = each(lambda n, i, o: k * kept * act.layers_in_flight(n, i, parallel)
                       + jnp.maximum(working, o * logits), stages.layers, stages.position,
                       stages.output)
    buffers = gathered_buffer_bytes(model, parallel, training) + system.eff.mem_reserved_bytes
    # Low precision: the quantized weight copies of the stage's layers (0 for 16-bit presets).
    cache_layer = lowp_weight_cache_params(model, parallel, training)
    cache = lowp_weight_cache_bytes(each(lambda n: n * cache_layer, stages.layers), parallel,
                                    training)
    # The three stages at once: a leading axis of 3 (first, middle, last).
    parts = _stage_memory(params, expert_P, activations, buffers, parallel, training, cache)
    # ZeRO-3: the embedding / output units (FSDP's root unit) beside the layers' buffers. What
    # the end of a micro-batch's backward no longer holds: its activations and the gradient
    # bytes that `_gradients_at_peak` lets them share.
    one = each(lambda n, o: k * kept * n + jnp.maximum(working, o * logits), stages.layers,
               stages.output)
    grads = gradient_bytes(params, parallel, training, expert_P)
    slack = jnp.minimum(one, activations) + parts["gradients_bytes"] - grads
    room = each(lambda o: jnp.maximum(working - o * logits, 0.0), stages.output)
    parts["buffers_bytes"] = buffers + nonlayer_unit_bytes(model, parallel, training, stages,
                                                           params, slack, room)
    total = sum(parts[k] for k in MEMORY_PARTS)
    picked, peak_total = peak_parts(parts, total)
    return Memory(**picked, total_bytes=peak_total,
                  capacity_bytes=system.hbm_capacity_bytes * system.eff.mem_usable_frac)
