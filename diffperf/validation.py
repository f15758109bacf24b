"""Predict measured runs and summarise the error (used by `diffperf validate` and calibrate)."""

from __future__ import annotations

import numpy as np

from diffperf.api import predict_batch
from diffperf.specs.batch import stack


def predict_runs(runs, systems: dict, temperature=None):
    """(step time s, peak memory GB, fits) predicted for every run, one vmap per system.

    Args:
        runs: `load.Runs`.
        systems: system name (the runs' `system` column, or '*' for all rows) -> System.
    """
    n = len(runs)
    step, mem, fits = np.full(n, np.nan), np.full(n, np.nan), np.zeros(n, bool)
    names = sorted(set(runs.systems))
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
