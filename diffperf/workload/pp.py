"""Pipeline parallelism: stage-boundary transfers and the schedule's bubble.

Source: Narayanan et al. SC21 Sections 2.2 and 4.1; PAPERS.md section 5.4.
"""

from __future__ import annotations

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
