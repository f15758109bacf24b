"""The three pipeline stages a prediction compares: the first, the largest middle and the last.

Stage times (schedule.pipeline), parameters (workload.params) and memory (memory.device,
memory.xla) are each computed for these three candidates at once, on a leading axis of 3, and
the slowest / largest is taken. The rule that says what each candidate holds lives here only:

                 layers n_i         position i     embedding   output layer + loss
    first        n_first            0              1           [p = 1]
    middle       n_mid (0, p = 2)   min(1, p - 1)  [p = 1]     [p = 1]
    last         n_last             p - 1          [p = 1]     1
n_i = `workload.pp.stage_layers`; one stage (p = 1) holds every layer, the embedding and the
output layer, so the three candidates are the same stage; with p = 2 there is no middle stage
(the middle candidate holds nothing). Source: Narayanan et al. SC21 Section 2.2 (1F1B: stage
i keeps p - i micro-batches in flight), Llama 3 405B (Dubey et al. 2024, 3.3.2: the first
stage holds the embedding, the last the output layer and the loss); PAPERS.md 5.4.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from diffperf.workload.pp import stage_layers


class Stages(struct.PyTreeNode):
    """First, largest middle and last pipeline stage: each leaf has a leading axis of 3 (in
    that order) before any batch axes of the specs."""
    layers: jax.Array     # n_i, transformer layers on one device of the stage
    position: jax.Array   # i, the stage's index in the pipeline (0 = first)
    embedding: jax.Array  # 1 where the stage holds the input embedding, else 0
    output: jax.Array     # 1 where the stage holds the output layer and the loss, else 0


def _stacked(*xs):
    """The three candidates stacked on a leading axis (batched leaves broadcast behind it)."""
    return jnp.stack(jnp.broadcast_arrays(*xs))


def pipeline_stages(model, parallel) -> Stages:
    """The three candidate stages (module docstring table).

    Example: Llama 3 405B, 126 layers on p = 16: layers (7, 8, 7), position (0, 1, 15),
    embedding (1, 0, 0), output (0, 0, 1); p = 1: layers (L, L, L), position (0, 0, 0),
    embedding and output (1, 1, 1).
    """
    p = parallel.pp
    single = jnp.where(p <= 1, 1.0, 0.0)
    return Stages(layers=_stacked(*stage_layers(model, parallel)),
                  position=_stacked(0.0, jnp.minimum(1.0, p - 1.0), p - 1.0),
                  embedding=_stacked(1.0, single, single),
                  output=_stacked(single, single, 1.0))
