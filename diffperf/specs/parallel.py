"""The parallel layout of one training job, as a frozen pytree of numbers.

Every degree and switch is an array leaf, so that a search evaluates a batch of layouts in one
`vmap` and one compilation (STYLE.md section 3). The only static field is `order`, the
placement of the parallel dimensions in rank space, innermost first: it decides which groups
share a fast domain (a TP group of 8 inside an NVLink node, a DP group spanning nodes).
"""

from __future__ import annotations

import enum
from typing import Any

from flax import struct


class Recompute(enum.IntEnum):
    """Activation recomputation (Korthikanti et al. 2022, Section 5)."""

    NONE = 0
    SELECTIVE = 1  # recompute the attention core only
    FULL = 2  # keep each layer's input, re-run its forward before its backward


class ZeroStage(enum.IntEnum):
    """ZeRO sharding of model states over the data-parallel group (Rajbhandari et al. 2020)."""

    NONE = 0
    OPTIMIZER = 1
    GRADIENTS = 2
    PARAMETERS = 3  # = FSDP


DIMENSIONS = ("tp", "cp", "ep", "dp", "pp")


class Parallel(struct.PyTreeNode):
    """Degrees tp x cp x dp x pp = number of devices; ep divides dp (experts are sharded over
    a sub-group of the data-parallel ranks, as in Megatron-Core); vp virtual stages per device."""

    tp: Any = 1                 # tensor (Megatron 1D) parallel degree t
    pp: Any = 1                 # pipeline stages p
    dp: Any = 1                 # data-parallel degree d
    cp: Any = 1                 # context-parallel degree c (sequence split, ring attention)
    ep: Any = 1                 # expert-parallel degree e (divides dp)
    vp: Any = 1                 # interleaved virtual stages per device v
    micro_batch: Any = 1        # sequences per micro-batch b
    global_batch: Any = 1       # sequences per optimizer step B
    sequence_parallel: Any = 0  # 1: Megatron sequence parallelism on the TP group
    zero_stage: Any = 0         # ZeroStage (0-3)
    recompute: Any = 0          # Recompute (0 none, 1 selective, 2 full)
    dp_overlap: Any = 1         # 1: gradient reduction overlaps the backward (bucketed DDP)
    tp_overlap: Any = 0         # fraction of TP communication that can hide behind GEMMs
    order: tuple = struct.field(pytree_node=False, default=("tp", "cp", "dp", "pp"))

    @property
    def n_devices(self):
        """tp x cp x dp x pp."""
        return self.tp * self.cp * self.dp * self.pp

    @property
    def n_microbatches(self):
        """m = B / (d b): micro-batches per pipeline per step (gradient accumulation steps)."""
        return self.global_batch / (self.dp * self.micro_batch)
