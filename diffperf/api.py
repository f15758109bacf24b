"""The public predict(): validate concrete inputs, then one jitted computation.

Leaves are cast to floating arrays and static labels blanked before the jitted call, so a new
layout, a new model of the same kind or new hardware values reuse the compiled function
(DESIGN.md: one compile per shape).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from diffperf.errors import SpecError, closest
from diffperf.predict import FEATURES, predict_step
from diffperf.result import Result
from diffperf.specs.batch import anonymous
from diffperf.specs.parallel import Parallel, Recompute, ZeroStage, placement_index
from diffperf.specs.training import Training
from diffperf.specs.validate import check_layout, check_precision

_RECOMPUTE = {r.name.lower(): int(r) for r in Recompute}


def _as_float(tree):
    """Every leaf as a floating array (numpy: converting on the host costs microseconds,
    jnp.asarray per leaf costs ~10 ms per call); float32, or float64 when x64 is enabled."""
    dtype = jnp.result_type(float)
    return jax.tree.map(lambda x: x if isinstance(x, jax.Array) and x.dtype == dtype
                        else np.asarray(x, dtype=dtype), tree)


def _is_concrete(tree) -> bool:
    return not any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(tree))


def _normalize(parallel: Parallel) -> Parallel:
    """Accept recompute as a name ('full') or enum, zero_stage as an enum, bools as 0/1."""
    rec = parallel.recompute
    if isinstance(rec, str):
        if rec not in _RECOMPUTE:
            raise SpecError(f"parallel.recompute={rec!r} is not allowed{closest(rec, _RECOMPUTE)}"
                            f" (allowed: {', '.join(_RECOMPUTE)})")
        parallel = parallel.replace(recompute=_RECOMPUTE[rec])
    if isinstance(parallel.zero_stage, ZeroStage):
        parallel = parallel.replace(zero_stage=int(parallel.zero_stage))
    if isinstance(parallel.placement, (str, tuple, list)):  # 'tp-cp-pp-dp': its ORDERS index
        parallel = parallel.replace(placement=placement_index(parallel.placement))
    return parallel


# The public predict keeps every term (features=FEATURES): one compiled program serves every
# layout and model of a kind (DESIGN.md: a new layout never recompiles); search and the
# sensitivities, which compile per table anyway, leave out the terms that are 0 there.
@functools.partial(jax.jit, static_argnames=("temperature", "features"))
def _predict_jit(model, parallel, system, training, temperature, features):
    return predict_step(model, parallel, system, training, temperature, features)


@functools.partial(jax.jit, static_argnames=("temperature", "features"))
def _predict_vmap(model, parallel, system, training, temperature, features):
    return jax.vmap(predict_step, in_axes=(0, 0, None, 0, None, None))(
        model, parallel, system, training, temperature, features)


def predict(model, parallel, system, training=None, *, temperature=None,
            store=None) -> Result:
    """Step time, breakdown, memory, MFU, tokens/s and goodput of one configuration.

    Args:
        model: a `Model` (see `load_model`).
        parallel: a `Parallel` layout; validated against the model when its values are concrete.
        system: a `System` (see `load_system`).
        training: a `Training` (default: bf16 mixed precision with fp32 master weights and Adam).
        temperature: None for the exact (hard max) model; > 0 for the smooth variant used by
            calibration and the differentiable search.
        store: None, or a mapping key -> bytes of serialized executables (the CLI's on-disk
            `KernelStore`): a later process loads the compiled program from it instead of
            tracing and compiling it (~3.5 s on 2 CPU cores; diffperf.executables).
    Returns:
        A `Result` pytree (step time, breakdown, memory, MFU, tokens/s, and `goodput`: the
        effective tokens/s under failures, checkpoints and restarts, from
        `system.reliability` and `training.checkpoint_interval_s`). Works under jit, vmap
        and grad (inputs that are tracers skip the validation, which needs concrete values).
    """
    training = Training() if training is None else training
    parallel = _normalize(parallel)
    if temperature is not None and not temperature >= 0:
        raise SpecError(f"temperature={temperature} must be >= 0 (or None for the exact model)")
    if _is_concrete((model, parallel)):
        check_layout(model, parallel)
    if _is_concrete((system, training)):
        check_precision(system, training)
    if not _is_concrete((model, parallel, system, training)):
        return predict_step(model, parallel, system, training, temperature)
    args = _as_float((anonymous(model), anonymous(parallel), anonymous(system),
                      anonymous(training)))
    static = dict(temperature=temperature or None, features=FEATURES)
    if store is None:
        return _predict_jit(*args, **static)
    if not all(callable(getattr(store, m, None)) for m in ("get", "__setitem__")):
        raise SpecError(f"store={store!r} must be None or a mapping key -> bytes (a dict, "
                        "cli.cache.KernelStore)")
    from diffperf.executables import executable

    return executable(_predict_jit, "predict", args, static, store)(*args)


def predict_batch(models, parallels, system, trainings, *, temperature=None) -> Result:
    """`predict` over a batch (leading axis on models, parallels and trainings; one system).

    Validates every entry, then runs one jitted vmap: the fast path of validate and search.
    """
    parallels = _normalize(parallels)
    check_layout(models, parallels)
    check_precision(system, trainings)
    args = _as_float((anonymous(models), anonymous(parallels), anonymous(system),
                      anonymous(trainings)))
    return _predict_vmap(*args, temperature=temperature or None, features=FEATURES)
