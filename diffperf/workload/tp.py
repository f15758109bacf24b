"""Megatron 1D tensor parallelism: collectives per layer and per micro-batch.

Source: Shoeybi et al. 2019 (Megatron-LM, Section 3); Korthikanti et al. 2022 Section 4.2.2
(sequence parallelism); PAPERS.md section 5.3.
"""

from __future__ import annotations

from diffperf.workload.flops import tokens_per_device
from diffperf.workload.recompute import full_frac, op_sac_frac


def tp_message_bytes(model, parallel, training):
    """S = b (s / c) h q_a: the activation each TP collective moves (NCCL convention)."""
    return tokens_per_device(model, parallel) * model.hidden * training.activation_bytes


def tp_collectives_per_layer(parallel):
    """(forward, backward) count of all-reduce equivalents per layer per micro-batch:

        forward 2, backward 2 + 2 phi_full + phi_sac
    phi_full: the share of the layers under full recompute (their recomputed forward's
    collectives, `workload.recompute.full_frac`). phi_sac = 1 under TorchTitan's per-op SAC:
    the recompute re-runs the all-gather of each sequence-parallel input (attention and MLP:
    two all-gathers, one all-reduce equivalent; the reduce-scatters are in its save list;
    without SP the output all-reduce of the recomputed wo). With sequence parallelism each
    all-reduce is a reduce-scatter + all-gather pair of the same ring cost (PAPERS.md
    section 5.3). Megatron's selective recompute adds none with its default ["core_attn"];
    with "mlp" in its recompute_modules the dense layers' MLP pair is re-run, one more
    backward all-reduce equivalent per dense layer (added in predict._layer_parts, which
    knows the model's share of dense layers).
    """
    return 2.0, 2.0 + 2.0 * full_frac(parallel) + op_sac_frac(parallel)


def tp_calls_per_all_reduce(parallel):
    """NCCL calls per all-reduce equivalent: 1, or 2 with sequence parallelism (the
    reduce-scatter and the all-gather that replace it are separate calls, each with its
    launch, its fixed cost and its barrier of the t ranks; Korthikanti et al. 2022 4.2.2).
    Not counted: Megatron's backward under SP all-gathers the column-parallel input once
    more for the weight gradient (PAPERS.md section 5.3), one more call and half an
    all-reduce of volume per such linear."""
    return 1.0 + (parallel.sequence_parallel > 0)
