"""Megatron 1D tensor parallelism: collectives per layer and per micro-batch.

Source: Shoeybi et al. 2019 (Megatron-LM, Section 3); Korthikanti et al. 2022 Section 4.2.2
(sequence parallelism); PAPERS.md section 5.3.
"""

from __future__ import annotations

from diffperf.workload.flops import tokens_per_device


def tp_message_bytes(model, parallel, training):
    """S = b (s / c) h q_a: the activation each TP collective moves (NCCL convention)."""
    return tokens_per_device(model, parallel) * model.hidden * training.activation_bytes


def tp_collectives_per_layer(parallel):
    """(forward, backward) count of all-reduce equivalents per layer per micro-batch:

        forward 2, backward 2 (+2 with full recompute: the recomputed forward's collectives).
    With sequence parallelism each all-reduce is a reduce-scatter + all-gather pair of the same
    ring cost (PAPERS.md section 5.3). Selective recompute adds none.
    """
    full = parallel.recompute == 2
    return 2.0, 2.0 + 2.0 * full


def tp_calls_per_all_reduce(parallel):
    """NCCL calls per all-reduce equivalent: 1, or 2 with sequence parallelism (the
    reduce-scatter and the all-gather that replace it are separate calls, each with its
    launch, its fixed cost and its barrier of the t ranks; Korthikanti et al. 2022 4.2.2).
    Not counted: Megatron's backward under SP all-gathers the column-parallel input once
    more for the weight gradient (PAPERS.md section 5.3), one more call and half an
    all-reduce of volume per such linear."""
    return 1.0 + (parallel.sequence_parallel > 0)
