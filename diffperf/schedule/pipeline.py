"""Pipeline schedule: 1F1B and interleaved 1F1B with unequal first and last stages.

Source: Narayanan et al. SC21 Sections 2.2 (1F1B) and 2.2.2 (interleaved); PAPERS.md 5.4, 5.11.
"""

from __future__ import annotations

import jax.numpy as jnp


def pipeline_times_s(t_body, t_first_extra, t_last_extra, parallel):
    """(busy time of the critical stage, bubble) of one step.

        T_pipe = m t_max + (sum_i t_i - t_max) / v
    with t_i the time of one micro-batch (forward + backward) on stage i: t_body on every
    stage, plus the embedding on the first and the output layer on the last. For equal stages
    this is (m + (p - 1)/v) t, the 1F1B / interleaved form of PAPERS.md section 5.4.
    Example: p = 4, m = 8, v = 1, t = 1 s each: 8 s busy + 3 s bubble.
    """
    t_first = t_body + t_first_extra
    t_last = t_body + t_last_extra
    single = parallel.pp == 1
    t_max = jnp.where(single, t_body + t_first_extra + t_last_extra,
                      jnp.maximum(t_first, t_last))
    t_sum = parallel.pp * t_body + t_first_extra + t_last_extra
    bubble = (t_sum - t_max) / parallel.vp
    return parallel.n_microbatches * t_max, bubble


def critical_stage_weights(t_first_extra, t_last_extra, parallel):
    """(weight of the first-stage extra, weight of the last-stage extra) in the critical stage:
    both 1 when p = 1; else the larger one's weight is 1."""
    single = parallel.pp == 1
    first_is_max = t_first_extra >= t_last_extra
    w_first = jnp.where(single | first_is_max, 1.0, 0.0)
    w_last = jnp.where(single | ~first_is_max, 1.0, 0.0)
    return w_first, w_last


def p2p_exposed_s(send_s, parallel):
    """Stage-boundary transfers on the critical path, forward and backward:

        (v m + p - 1) x (t_send,f + t_send,b)     (zero when p = 1)
    Each of the v m micro-batch chunks crosses one boundary each way per stage, and the fill
    and drain add p - 1 (Narayanan et al. SC21 Section 2.2.2: interleaving multiplies the
    number of transfers by v).
    """
    count = parallel.vp * parallel.n_microbatches + parallel.pp - 1.0
    return jnp.where(parallel.pp > 1, count * 2.0 * send_s, 0.0)
