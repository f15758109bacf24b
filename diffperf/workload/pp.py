"""Pipeline parallelism: stage-boundary transfers and the schedule's bubble.

Source: Narayanan et al. SC21 Sections 2.2 and 4.1; PAPERS.md section 5.4.
"""

from __future__ import annotations

import jax.numpy as jnp

from diffperf.workload.flops import hidden_shards, tokens_per_device


def pp_message_bytes(model, parallel, training):
    """S = b (s / c) h q_a / (t G_x): one stage-boundary activation (or gradient) per rank,
    with Megatron's scatter/gather optimisation (each TP rank sends 1/t; Section 4.1); on the
    AxoNN grid each rank holds and sends its h / G_x slice of the residual stream
    (`flops.hidden_shards`; PAPERS.md section 4.2) [D]."""
    return tokens_per_device(model, parallel) * model.hidden * training.activation_bytes / (
        parallel.tp * hidden_shards(parallel))


def bubble_fraction(parallel):
    """Idle fraction of the pipeline relative to the useful work:

        (p - 1) / (v m)       (1F1B: v = 1; interleaved 1F1B: v chunks per device)
    Example: p = 8, m = 64, v = 1 -> 7/64 = 0.109; v = 2 -> 0.055.
    """
    return (parallel.pp - 1.0) / (parallel.vp * parallel.n_microbatches)


def stage_layers(model, parallel):
    """(first, middle, last) transformer layers held by one device of the first stage, of the
    largest middle stage and of the last stage of the pipeline (uneven stages allowed):

        given:  n_first = pp_first_layers,  n_last = pp_last_layers   (both > 0)
        auto:   c = ceil(L / p),  D = p c - L  stages hold c - 1 layers, the rest c; the last
                stage gives up a layer first (it carries the output layer and the loss), then
                the first (the embedding, and the most micro-batches in flight), then
                middle ones:  n_last = c - [D >= 1],  n_first = c - [D >= 2]
        middle: n_mid = ceil((L - n_first - n_last) / (p - 2))  (the slowest middle stage;
                0 when p = 2);  p = 1: the one stage holds all L layers (all three = L)
    v virtual chunks per device split each stage's layers (interleaving changes the count per
    chunk, not per device). Source: Llama 3 405B (Dubey et al. 2024, section 3.3.2): 126
    layers on 16 stages, one layer fewer on the first and the last stage, which hold the
    embedding and the output layer; Megatron-Core `--decoder-first-pipeline-num-layers` /
    `--decoder-last-pipeline-num-layers` [D for the auto rule].
    Example: L = 126, p = 16: c = 8, D = 2 -> (7, 8, 7); L = 96, p = 8 -> (12, 12, 12);
    L = 10, p = 4: c = 3, D = 2 -> (2, 3, 2).
    """
    L, p = model.n_layers, parallel.pp
    c = jnp.ceil(L / p - 1e-6)
    D = p * c - L
    auto = (parallel.pp_first_layers <= 0) & (parallel.pp_last_layers <= 0)
    first = jnp.where(auto, c - jnp.where(D >= 2, 1.0, 0.0), parallel.pp_first_layers)
    last = jnp.where(auto, c - jnp.where(D >= 1, 1.0, 0.0), parallel.pp_last_layers)
    middles = jnp.maximum(p - 2.0, 1.0)
    mid = jnp.where(p > 2, jnp.ceil((L - first - last) / middles - 1e-6), 0.0)
    single = p <= 1
    return (jnp.where(single, L, first), jnp.where(single, L, mid), jnp.where(single, L, last))
