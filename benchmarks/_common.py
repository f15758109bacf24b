"""Shared helpers of the benchmark scripts: the machine line, a best-of-n timer and the CPU
seconds of a process."""

from __future__ import annotations

import os
import platform
import time


def machine() -> str:
    """Device, JAX version, CPU count and load: printed beside every figure (STYLE.md 8)."""
    import jax

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (f"device: {jax.devices()[0].device_kind} x {len(jax.devices())} "
            f"({jax.default_backend()}), jax {jax.__version__}, python "
            f"{platform.python_version()}, {os.cpu_count()} CPU cores, "
            f"load average {load:.2f}")


def cpu_seconds(children: bool = False) -> float:
    """CPU seconds (user + system) used so far by this process, every thread (XLA's
    included), or with children=True by its finished child processes (getrusage)."""
    import resource

    r = resource.getrusage(resource.RUSAGE_CHILDREN if children else resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def best_of(fn, repeat: int) -> float:
    """Smallest wall time of `repeat` calls of fn() (fn blocks until its result is ready)."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def batched_parallel(columns, rows, dtype=float):
    """A Parallel whose every leaf has the batch axis: the table's columns, and each other
    field's default broadcast to the number of rows (so new Parallel fields need no edit)."""
    import numpy as np

    from diffperf.specs import Parallel

    n = len(rows)
    base = {f: np.full(n, float(getattr(Parallel(), f)), dtype)
            for f in Parallel.__dataclass_fields__}
    base |= {c: rows[:, i].astype(dtype) for i, c in enumerate(columns)}
    return Parallel(**base)
