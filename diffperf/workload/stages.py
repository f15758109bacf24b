"""The three pipeline stages a prediction compares: the first, the largest middle and the last.

Stage times (schedule.pipeline), parameters (workload.params) and memory (memory.device,
memory.xla) are each computed for these three candidates at once, on a leading axis of 3, and
the slowest / largest is taken. The rule that says what each candidate holds lives here only:

                 layers n_i         position i     embedding   output layer + loss
    first        n_first            0              1           [p = 1]
    middle       n_mid (0, p = 2)   min(1, p - 1)  [p = 1]     [p = 1]
    last         n_last (+ D)       p - 1          [p = 1]     1
D = model.mtp_layers: the multi-token prediction modules sit with the loss (each one layer,
counted as the model's mean layer; their h x 2h projections, 0.9 % of a DeepSeek-V3 MTP
module's FLOPs, are not counted).
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
    """First, largest middle and last pipeline stage: each field a tuple of 3 (in that
    order). Kept as three values, not one stacked [3] array: arithmetic on a stacked
    candidate axis under vmap is a (batch, 3) layout that XLA:CPU transposes and copies
    between fusions (the search kernel ran 3-5x slower); `each` computes per candidate and
    stacks the result."""
    layers: tuple      # n_i, transformer layers on one device of the stage
    position: tuple    # i, the stage's index in the pipeline (0 = first)
    embedding: tuple   # 1 where the stage holds the input embedding, else 0
    output: tuple      # 1 where the stage holds the output layer and the loss, else 0


def each(f, *fields):
    """[f(first), f(middle), f(last)] stacked on a leading axis of 3 (batched leaves broadcast
    behind it): f takes one candidate's value of each field (tuples of 3, or [3] arrays)."""
    return jnp.stack(jnp.broadcast_arrays(*(f(*(x[i] for x in fields)) for i in range(3))))


def pipeline_stages(model, parallel) -> Stages:
    """The three candidate stages (module docstring table).

    Example: Llama 3 405B, 126 layers on p = 16: layers (7, 8, 7), position (0, 1, 15),
    embedding (1, 0, 0), output (0, 0, 1); p = 1: layers (L, L, L), position (0, 0, 0),
    embedding and output (1, 1, 1).
    """
    p = parallel.pp
    single = jnp.where(p <= 1, 1.0, 0.0)
    output = (single, single, 1.0)
    # MTP modules (DeepSeek-V3) run with the loss on the last stage: one more layer each
    # (Megatron-Bridge's DeepSeek-V3 layouts put ["mtp"] * D + ["loss"] on the last stage).
    layers = tuple(n + o * model.mtp_layers for n, o in zip(stage_layers(model, parallel),
                                                           output))
    return Stages(layers=layers,
                  position=(0.0, jnp.minimum(1.0, p - 1.0), p - 1.0),
                  embedding=(1.0, single, single),
                  output=output)


def at_largest(key):
    """A function v -> v at the candidate whose `key` is the largest, the first of equals, like
    argmax over the leading axis (the three stages, or any number of candidates: memory.xla
    has stage x phase); v has the candidates on its leading axis (an array or a tuple).
    Candidate i is chosen where key_i > key_j for every j < i and key_i >= key_j for j > i.
    Built from elementwise selects, not a gather (take_along_axis at the argmax is a gather
    per batch element inside vmap, slow on XLA:CPU), and not jnp.max, whose gradient divides
    by the count of entries equal to the result: compiled XLA can find 0 of them when it
    recomputes equal candidates (p = 1) in another fusion (0/0: NaN). The gradient flows to
    the one selected entry.
    Example: key (3, 5, 5), v (10, 20, 30) -> 20 (the middle: first of the equal largest).
    """
    n = len(key)
    chosen = []
    for i in range(n):
        mask = None
        for j in range(n):
            if j != i:
                c = key[i] > key[j] if j < i else key[i] >= key[j]
                mask = c if mask is None else mask & c
        chosen.append(mask)

    def pick(v):
        out = v[n - 1]
        for i in reversed(range(n - 1)):
            out = jnp.where(chosen[i], v[i], out)
        return out

    return pick
