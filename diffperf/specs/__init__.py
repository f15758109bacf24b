"""Specs: frozen pytrees describing the model, the layout, the training precision and the system."""

from diffperf.specs.model import Model
from diffperf.specs.parallel import Parallel, Recompute, ZeroStage
from diffperf.specs.training import Training
from diffperf.specs.system import Efficiency, Reliability, System, Tier

__all__ = ["Model", "Parallel", "Recompute", "ZeroStage", "Training", "Efficiency", "Reliability",
           "System", "Tier"]
