"""The differentiable soft search: a soft-min over the layouts of a table.

    J = -tau log sum_i exp(-s_i / tau),   s_i = ln T_i + softplus(-m_i / tau)

evaluated on the same factored grid as the hard search (`search.kernel`), each chunk
rematerialised in the backward pass, so that the memory capacity and every other System leaf
get a gradient (DESIGN.md, differentiable search).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from diffperf.api import _as_float, _is_concrete
from diffperf.errors import SpecError
from diffperf.search.enumerate import KEYS, PLACEMENTS
from diffperf.search.kernel import (_CPU_COMPILER_OPTIONS, _batched, _chunk_parallel, _grid,
                                    _grid_predict_impl, _table_features)
from diffperf.specs.batch import anonymous
from diffperf.specs.training import Training
from diffperf.specs.validate import check_facts_act


class SoftBest(struct.PyTreeNode):
    """Soft-min over layouts: differentiable in the model, system and training leaves."""

    step_time_s: Any  # exp(J): the soft-min step time; -> the best feasible one as tau -> 0
    weights: Any      # softmax weight of each layout (table order), sums to 1


def _soft_scores_impl(model, keys, system, training, tau, smooth, features):
    """s = ln T + softplus(-margin / tau) on the [chunks, outer, 24] grid; each chunk is
    rematerialised in the backward pass (jax.checkpoint), so memory stays one chunk's."""
    dtype = keys.dtype

    def one(k):
        parallel = _chunk_parallel(np.zeros((0, len(KEYS))), dtype, features)
        parallel = parallel.replace(**{c: k[:, KEYS.index(c)] for c in _batched(features)})
        r = _grid_predict_impl(model, parallel, system, training, smooth, features,
                               ("step_time_s", "fit_margin_frac"))
        return jnp.log(r.step_time_s) + jax.nn.softplus(-r.fit_margin_frac / tau)

    return jax.lax.map(jax.checkpoint(one), keys)


_soft_scores = jax.jit(_soft_scores_impl, static_argnames=("smooth", "features"))
_soft_scores_cpu = jax.jit(_soft_scores_impl, static_argnames=("smooth", "features"),
                           compiler_options=_CPU_COMPILER_OPTIONS)


def soft_best(model, system, training, layouts, temperature, *, placements=PLACEMENTS,
              smooth=None, chunk=1 << 13) -> SoftBest:
    """Soft-min over layouts of the log step time, with a soft memory-feasibility penalty:

        J = -tau log sum_i exp(-s_i / tau),   s_i = ln T_i + softplus(-m_i / tau)

    T_i = step time, m_i = `Result.fit_margin_frac` ((capacity - total) / capacity) of layout
    i. As tau -> 0 the penalty vanishes for layouts that fit and grows as -m_i / tau for those
    that do not, so J -> ln min_{fits} T_i, with min s - tau ln n <= J <= min s. For tau > 0
    the memory capacity gets a gradient (DESIGN.md, differentiable search).
    Args:
        temperature: tau > 0 (dimensionless: a relative spread in step time).
        smooth: the model's own temperature (None: exact model) inside each prediction.
        chunk: layouts per rematerialised block of the backward pass.
    Returns:
        `SoftBest` (step_time_s = exp J, weights = softmax(-s / tau)). A row on which a
        fact of `training` cannot act (cp_torch at cp 1: `search.facts_inert_rows`) counts
        as the framework runs it, without the fact; a fact that no row can meet is refused.
    """
    tau = temperature
    if not isinstance(tau, jax.core.Tracer) and not float(tau) > 0:
        raise SpecError(f"temperature={tau} must be > 0 for the soft search")
    layouts = np.asarray(layouts)
    training = Training() if training is None else training
    if _is_concrete((model, training)):  # the rules read concrete values
        check_facts_act(model, None, training, layout=False)
    model, system, training = _as_float((anonymous(model), anonymous(system),
                                         anonymous(training)))
    dtype = jnp.result_type(float)
    # compiler_options are allowed on a top-level jit only, not inside the caller's jit.
    top = _is_concrete((model, system, training, tau))
    fn = _soft_scores_cpu if top and jax.default_backend() == "cpu" else _soft_scores
    keys, cell, per = _grid(layouts, placements, int(chunk), 1)
    features = _table_features(model, keys, training)
    grid = fn(model, keys.reshape(-1, per, len(KEYS)).astype(dtype), system, training, tau,
              smooth=smooth, features=features)
    logits = -grid.reshape(-1)[cell] / tau
    lse = jax.nn.logsumexp(logits)
    return SoftBest(step_time_s=jnp.exp(-tau * lse), weights=jnp.exp(logits - lse))
