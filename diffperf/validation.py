"""Predict measured runs and summarise the error (used by `diffperf validate` and calibrate)."""

from __future__ import annotations

import functools

import jax
import numpy as np

from diffperf.api import _as_float, _normalize, predict_batch
from diffperf.predict import FEATURES, predict_step
from diffperf.specs.batch import anonymous, stack
from diffperf.specs.validate import check_inputs


def _predict_rows_impl(model, parallel, system, training, temperature, features):
    return jax.vmap(predict_step, in_axes=(0, 0, 0, 0, None, None))(
        model, parallel, system, training, temperature, features)


@functools.cache
def _rows_program():
    """The jitted rows program; on XLA:CPU with predict's quick options, as api._predict_vmap
    (a runs CSV compiles about twice as fast and runs in milliseconds either way)."""
    if jax.default_backend() != "cpu":
        return jax.jit(_predict_rows_impl, static_argnames=("temperature", "features"))
    from diffperf.search.kernel import _CPU_QUICK_OPTIONS

    return jax.jit(_predict_rows_impl, static_argnames=("temperature", "features"),
                   compiler_options=_CPU_QUICK_OPTIONS)


def _predict_rows(*args, **kwargs):
    return _rows_program()(*args, **kwargs)


def predict_runs(runs, systems: dict, temperature=None):
    """(step time s, peak memory GB, fits) predicted for every run: one vmap over every row
    when the systems share a tree structure (the same number of network tiers; the system is
    then one more batched argument, one compilation for a CSV of several systems), else one
    vmap per system.

    Args:
        runs: `load.Runs`.
        systems: system name (the runs' `system` column, or '*' for all rows) -> System.
    """
    n = len(runs)
    step, mem, fits = np.full(n, np.nan), np.full(n, np.nan), np.zeros(n, bool)
    names = sorted(set(runs.systems))
    of = {name: systems.get("*", systems.get(name)) for name in names}
    structures = {jax.tree.structure(anonymous(s)) for s in of.values()}
    if len(names) > 1 and len(structures) == 1:
        for name in names:  # the checks predict_batch makes (check_inputs), per system
            idx = [i for i, s in enumerate(runs.systems) if s == name]
            check_inputs(stack([runs.models[i] for i in idx]),
                         _normalize(stack([runs.parallels[i] for i in idx])), of[name],
                         stack([runs.trainings[i] for i in idx]))
        args = _as_float((stack(runs.models), _normalize(stack(runs.parallels)),
                          stack([of[s] for s in runs.systems]), stack(runs.trainings)))
        res = _predict_rows(*args, temperature=temperature or None, features=FEATURES)
        step[:] = np.asarray(res.step_time_s)
        mem[:] = np.asarray(res.memory.total_bytes) / 1e9
        fits[:] = np.asarray(res.fits)
        return step, mem, fits
    for name in names:
        idx = [i for i, s in enumerate(runs.systems) if s == name]
        system = systems.get("*", systems.get(name))
        res = predict_batch(stack([runs.models[i] for i in idx]),
                            stack([runs.parallels[i] for i in idx]), system,
                            stack([runs.trainings[i] for i in idx]), temperature=temperature)
        step[idx] = np.asarray(res.step_time_s)
        mem[idx] = np.asarray(res.memory.total_bytes) / 1e9
        fits[idx] = np.asarray(res.fits)
    return step, mem, fits


def error_summary(predicted, measured) -> dict:
    """MAPE, median and max absolute percentage error over the rows with a measurement."""
    ok = np.isfinite(measured) & np.isfinite(predicted)
    if not ok.any():
        return dict(n=0, mape_pct=float("nan"), median_pct=float("nan"), max_pct=float("nan"))
    ape = 100.0 * np.abs(predicted[ok] - measured[ok]) / measured[ok]
    return dict(n=int(ok.sum()), mape_pct=float(ape.mean()), median_pct=float(np.median(ape)),
                max_pct=float(ape.max()))
