"""The shipped configs (configs/), loaded once per test session."""

import functools

from diffperf.load import load_model, load_system


@functools.lru_cache(maxsize=None)
def model(name):
    return load_model(name)


@functools.lru_cache(maxsize=None)
def system(name):
    return load_system(name)
