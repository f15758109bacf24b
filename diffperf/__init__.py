"""diffperf: differentiable performance model of distributed Transformer training.

Public interface (DESIGN.md): load_model, load_system, Parallel, Training, predict -> Result.
"""

from __future__ import annotations

from diffperf.api import predict, predict_batch
from diffperf.search.axonn import best_axonn_grid
from diffperf.errors import SpecError
from diffperf.result import Breakdown, Goodput, Memory, Result, as_dict
from diffperf.specs import (Efficiency, Model, Parallel, Recompute, Reliability, System, Tier,
                            Training, ZeroStage)
from diffperf.specs.batch import stack, unstack
from diffperf.load import (apply_overlay, load_model, load_runs, load_system, training,
                           write_overlay)

# Submodules by attribute, imported on first use (importing diffperf stays fast): dp.search
# (enumerate_layouts, search, ranked, merged, token_budget, sweep), dp.sensitivity,
# dp.calibrate, dp.design.
_LAZY = ("search", "sensitivity", "calibrate", "design")


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return importlib.import_module(f"diffperf.{name}")
    raise AttributeError(f"module 'diffperf' has no attribute {name!r}")


__all__ = ["predict", "predict_batch", "best_axonn_grid", "SpecError", "Breakdown", "Goodput",
           "Memory", "Result",
           "Efficiency", "Model", "Parallel", "Recompute", "Reliability", "System", "Tier",
           "Training", "ZeroStage", "stack", "unstack", "apply_overlay", "load_model", "load_runs",
           "load_system", "training", "as_dict", "write_overlay", *_LAZY]
__version__ = "0.1.0"
