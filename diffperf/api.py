"""The public predict(): validate concrete inputs, then one jitted computation.

Leaves are cast to floating arrays and static labels blanked before the jitted call, so a new
layout, a new model of the same kind or new hardware values reuse the compiled function
(DESIGN.md: one compile per shape).
"""

from __future__ import annotations

import functools
import os

import jax
import jax.numpy as jnp
import numpy as np

from diffperf.errors import SpecError, closest
from diffperf.predict import FEATURES, predict_step
from diffperf.result import Result
from diffperf.specs.batch import anonymous
from diffperf.specs.parallel import Parallel, Recompute, ZeroStage, placement_index
from diffperf.specs.training import Training
from diffperf.specs.validate import (check_facts_act, check_finite_result, check_inputs,
                                     check_layout, check_precision)

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
def _predict_impl(model, parallel, system, training, temperature, features):
    return predict_step(model, parallel, system, training, temperature, features)


_predict_jit = jax.jit(_predict_impl, static_argnames=("temperature", "features"))
# On XLA:CPU, one prediction is compiled with the search's quick options (LLVM -O0, the
# classic emitters: search.kernel._CPU_QUICK_OPTIONS): 1.3 s of compilation instead of 4.3 s
# (CPU seconds, GPT-3 175B on 2 cores), and the program runs in ~1 ms either way; the values
# agree with XLA's default options to float32 rounding (at most 6.2e-7 relative over every
# leaf of the 9 pinned cases; tests/test_regression.py).
@functools.cache
def _predict_jit_cpu():
    from diffperf.search.kernel import _CPU_QUICK_OPTIONS

    return jax.jit(_predict_impl, static_argnames=("temperature", "features"),
                   compiler_options=_CPU_QUICK_OPTIONS)


def _predict_program():
    """(jitted predict, its name in a program store) for the default backend."""
    if jax.default_backend() == "cpu":
        return _predict_jit_cpu(), "predict-cpu-legacy-O0"
    return _predict_jit, "predict"


NO_CACHE_ENV = "DIFFPERF_NO_CACHE"
DEFAULT_STORE = "default"
_STORES: dict = {}


def default_store():
    """The program store `predict` uses by default: the on-disk `cli.cache.KernelStore` under
    $XDG_CACHE_HOME/diffperf (~/.cache/diffperf), or None where the environment variable
    DIFFPERF_NO_CACHE is set to anything but '' or '0' (nothing read or written). One store per
    cache folder and process."""
    if os.environ.get(NO_CACHE_ENV, "") not in ("", "0"):
        return None
    from diffperf.cli.cache import KernelStore, cache_dir

    folder = cache_dir()
    if folder not in _STORES:
        _STORES[folder] = KernelStore()
    return _STORES[folder]


def _predict_vmap_impl(model, parallel, system, training, temperature, features):
    return jax.vmap(predict_step, in_axes=(0, 0, None, 0, None, None))(
        model, parallel, system, training, temperature, features)


_predict_vmap_jit = jax.jit(_predict_vmap_impl, static_argnames=("temperature", "features"))


@functools.cache
def _predict_vmap_cpu():
    from diffperf.search.kernel import _CPU_QUICK_OPTIONS

    return jax.jit(_predict_vmap_impl, static_argnames=("temperature", "features"),
                   compiler_options=_CPU_QUICK_OPTIONS)


def _predict_vmap(*args, **kwargs):
    """The batched prediction (predict_batch, validate): on XLA:CPU with the quick options of
    one prediction (above), as the search does below QUICK_BELOW layouts: a batch of a runs
    CSV (hundreds to a few thousand rows) runs in milliseconds either way, and compiles
    about twice as fast."""
    fn = _predict_vmap_cpu() if jax.default_backend() == "cpu" else _predict_vmap_jit
    return fn(*args, **kwargs)


def predict(model, parallel, system, training=None, *, temperature=None,
            store=DEFAULT_STORE) -> Result:
    """Step time, breakdown, memory, MFU, tokens/s and goodput of one configuration.

    Args:
        model: a `Model` (see `load_model`).
        parallel: a `Parallel` layout; validated against the model when its values are concrete.
        system: a `System` (see `load_system`).
        training: a `Training` (default: bf16 mixed precision with fp32 master weights and Adam).
        temperature: None for the exact (hard max) model; > 0 for the smooth variant used by
            calibration and the differentiable search.
        store: where the compiled program is kept between processes: by default
            (`"default"`) the on-disk `KernelStore` of the CLI under
            $XDG_CACHE_HOME/diffperf (~/.cache/diffperf; `default_store`), so the first
            prediction of a later process loads the program instead of compiling it (~1.3 s
            of CPU on 2 cores; diffperf.executables); the environment variable
            DIFFPERF_NO_CACHE=1 turns the default off. None: nothing is read or written (the
            program is compiled in the process). Or any mapping key -> bytes.
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
    if not _is_concrete((model, parallel, system, training)):
        if _is_concrete((model, parallel)):
            check_layout(model, parallel)
        if _is_concrete((system, training)):
            check_precision(system, training)
        if _is_concrete((model, parallel, training)):  # e.g. a gradient in the System only
            check_facts_act(model, parallel, training)
        return predict_step(model, parallel, system, training, temperature)
    check_inputs(model, parallel, system, training)
    result = _predict_concrete(model, parallel, system, training, temperature, store)
    check_finite_result(result, model, parallel)
    return result


def _predict_concrete(model, parallel, system, training, temperature, store) -> Result:
    args = _as_float((anonymous(model), anonymous(parallel), anonymous(system),
                      anonymous(training)))
    static = dict(temperature=temperature or None, features=FEATURES)
    fn, name = _predict_program()
    if isinstance(store, str) and store == DEFAULT_STORE:
        store = default_store()
    if store is not None and not all(callable(getattr(store, m, None))
                                     for m in ("get", "__setitem__")):
        raise SpecError(f"store={store!r} must be None or a mapping key -> bytes (a dict, "
                        "cli.cache.KernelStore)")
    # Under jax.disable_jit() the jitted function runs eagerly op by op (tests compare hard and
    # smooth models on the very same float32 ops that way); an AOT-compiled program from the
    # store cannot run there (JAX: "Disable jit is not supported in the AOT path"), so the
    # store is bypassed: nothing read, nothing written.
    if store is None or jax.config.jax_disable_jit:
        return fn(*args, **static)
    from diffperf.executables import executable

    return executable(fn, name, args, static, store)(*args)


def predict_batch(models, parallels, system, trainings, *, temperature=None) -> Result:
    """`predict` over a batch (leading axis on models, parallels and trainings; one system).

    Validates every entry, then runs one jitted vmap: the fast path of validate and search.
    """
    parallels = _normalize(parallels)
    check_inputs(models, parallels, system, trainings)
    args = _as_float((anonymous(models), anonymous(parallels), anonymous(system),
                      anonymous(trainings)))
    return _predict_vmap(*args, temperature=temperature or None, features=FEATURES)
