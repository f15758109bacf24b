"""Pipeline schedule: 1F1B and interleaved 1F1B with unequal stages (uneven layer counts,
the embedding on the first stage and the output layer on the last).

Source: Narayanan et al. SC21 Sections 2.2 (1F1B) and 2.2.2 (interleaved); PAPERS.md 5.4, 5.11.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def stage_times_s(t_layer, stages, n_layers, t_first_extra, t_last_extra):
    """(times [3] of the first, largest middle and last stage, sum over all p stages) of one
    micro-batch (forward + backward):

        t_i = n_i t + [embedding_i] e_f + [output_i] e_l        sum_i t_i = L t + e_f + e_l
    t = one layer's time, `stages` = `workload.stages.pipeline_stages` (n_i layers, and which
    candidate holds the embedding, e_f, and the output layer and loss, e_l: the first and the
    last stage; every candidate when p = 1; with p = 2 the middle candidate holds nothing).
    A stage's time is its layers' and its extras' (Narayanan et al. SC21 Section 2.2: 1F1B
    runs each micro-batch's forward and backward on every stage in turn;
    PAPERS.md 5.4 and 5.11, uneven stages after Llama 3 405B, Dubey et al. 2024, 3.3.2) [D].
    Example: L = 126, p = 16, (7, 8, 7), t = 1 s, e_f = 0.1 s, e_l = 0.7 s:
    (7.1, 8, 7.7) and sum 126.8 s.
    """
    # per candidate, then stacked (`workload.stages.each`: schedule does not import workload)
    times = jnp.stack(jnp.broadcast_arrays(*(
        stages.layers[i] * t_layer + stages.embedding[i] * t_first_extra
        + stages.output[i] * t_last_extra for i in range(3))))
    return times, n_layers * t_layer + t_first_extra + t_last_extra


def pipeline_times_s(stage_times, t_sum, parallel):
    """(busy time of the slowest stage, bubble) of one step with 1F1B / interleaved 1F1B:

        T_pipe = m t_max + (sum_i t_i - t_max) / v
    t_i = stage i's time per micro-batch (`stage_times_s`): the first micro-batch crosses
    every stage once, the slowest stage then sets the pace of the other m - 1 (fill and drain
    of a pipeline with unequal stages); interleaving v chunks per device shortens fill and
    drain by v. For equal stages this is (m + (p - 1)/v) t, PAPERS.md section 5.4
    (Narayanan et al. SC21 2.2); the slowest stage setting the step is what uneven stages
    are for (Llama 3 405B: first and last stage one layer short) [D].
    Example: p = 4, m = 8, v = 1, t = 1 s each: 8 s busy + 3 s bubble.
    """
    # One reduce with a first-maximum derivative (`_max_first`): jnp.max's gradient can be
    # 0/0 = NaN on the equal candidates of p = 1, even through the jnp.where below.
    t_max = _max_first(stage_times)
    # One stage (p = 1) has no fill or drain: exactly 0, not the rounding of t_sum - t_max.
    bubble = jnp.where(parallel.pp > 1, (t_sum - t_max) / parallel.vp, 0.0)
    return parallel.n_microbatches * t_max, bubble


def critical_stage(stage_times, stages):
    """(layers, weight of the first-stage extra, weight of the last-stage extra) of the
    slowest stage, the one whose time per micro-batch sets the pace of the other m - 1
    (`pipeline_times_s`; Narayanan et al. SC21 Section 2.2, PAPERS.md 5.4):

        k = argmax_i t_i over (first, last, middle), the first of equals in that order
        returns (n_k, [embedding_k], [output_k])          (`workload.stages.pipeline_stages`)
    One stage (p = 1) is all three candidates: (L, 1, 1). The step's per-part times are m
    times this stage's parts (predict) [D].
    Example: (7.1, 8, 7.7) s of the `stage_times_s` example -> (8, 0, 0) (a middle stage);
    with e_l = 1.5 s, (7.1, 8, 8.5) -> (7, 0, 1) (the last stage).
    """
    pick = _slowest(stage_times)
    return pick(stages.layers), pick(stages.embedding), pick(stages.output)


def _slowest(stage_times):
    """x -> x[k] at the slowest candidate k (`critical_stage`'s order of equals: first, last,
    middle), by elementwise selects: the gradient flows to the one selected entry."""
    t_first, t_mid, t_last = stage_times[0], stage_times[1], stage_times[2]
    is_first = (t_first >= t_last) & (t_first >= t_mid)
    is_last = ~is_first & (t_last >= t_mid)
    return lambda x: jnp.where(is_first, x[0], jnp.where(is_last, x[2], x[1]))


def p2p_exposed_s(send_s, parallel):
    """Stage-boundary transfers on the critical path, forward and backward:

        (v m + p - 1) x (t_send,f + t_send,b)     (zero when p = 1)
    Each of the v m micro-batch chunks crosses one boundary each way per stage, and the fill
    and drain add p - 1 (Narayanan et al. SC21 Section 2.2.2: interleaving multiplies the
    number of transfers by v).
    """
    count = parallel.vp * parallel.n_microbatches + parallel.pp - 1.0
    return jnp.where(parallel.pp > 1, count * 2.0 * send_s, 0.0)


@jax.custom_jvp
def _max_first(x):
    """max over the leading (candidate) axis, one reduce; its derivative is the first maximal
    entry's (jnp.max's own divides by the count of maximal entries, which compiled XLA can
    find to be 0 for the equal candidates of p = 1: 0/0 = NaN; selecting by elementwise
    slices of the stacked axis instead costs the sweep kernel 3x)."""
    return jnp.max(x, axis=0)


@_max_first.defjvp
def _max_first_jvp(primals, tangents):
    (x,), (dx,) = primals, tangents
    first = jnp.arange(x.shape[0]).reshape((-1,) + (1,) * (x.ndim - 1)) == jnp.argmax(x, axis=0)
    return jnp.max(x, axis=0), jnp.sum(jnp.where(first, dx, 0.0), axis=0)
