"""Hardware co-design on a grid: every point of a grid of hardware values, priced by a cost or
power model, with the best layout at each (search.sweep), and the best point within a budget.

The exhaustive counterpart of `design.optimize_design` (gradient descent on the same cost
model and objectives): no temperature, no local optimum, at the price of evaluating every
layout at every point (10^9 layout x hardware points take a few minutes on 2 CPU cores).

    C(theta) = base + sum_k p_k (theta_k - theta_k^min)          (per device, design.py)
    time_to_train_s = T tokens / (B s)
    cost_per_token  = n C T / (B s) / lifetime_s   (USD)    = n C T / (B s)   (W: J/token)
T = the best step time among the layouts that fit at the point (inf where none fits). The
16-bit matrix peak carries the fp32 and vector peaks with it, as in the gradient design.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from flax import struct

from diffperf.design import _LINKED, _budget, _check, _job, _knobs, _lifetime_s
from diffperf.search import PLACEMENTS, Sweep, sweep
from diffperf.specs.paths import leaf_values


class GridDesign(struct.PyTreeNode):
    """What `grid_design` returns (arrays of the grid's shape)."""

    sweep: Sweep        # best layouts, step times, memory and counts at every point
    cost: Any           # per device, in the cost model's unit
    objective: Any      # s, USD/token or J/token of the best layout (inf: none fits)
    within: Any         # cost <= budget (all True without a budget)
    best: int = struct.field(pytree_node=False, default=-1)  # flat index of the best point


def _cost(cost_model, system, sw: Sweep) -> np.ndarray:
    """C at every grid point: the swept values where swept, the system's elsewhere."""
    leaves = leaf_values(system)
    grids = dict(zip(sw.paths, np.meshgrid(*sw.values, indexing="ij")))
    total = np.full(sw.shape, float(cost_model.base))
    for path, price, low in _knobs(cost_model, system):
        total = total + price * (grids.get(path, leaves[path]) - low)
    return total


def grid_design(model, system, training, layouts, cost_model, axes,
                objective="time_to_train", *, budget=None, tokens=300e9,
                placements=PLACEMENTS, devices=None, progress=None, store=None) -> GridDesign:
    """The objective of the best layout at every point of a hardware grid, and the best point
    whose device costs at most the budget.

    Args:
        layouts: the job's layout table (its devices and global batch fix n and B).
        cost_model: `design.CostModel` (prices per device; unpriced leaves cost nothing).
        axes: {System leaf path: values (SI)}, as for `search.sweep`.
        objective: "time_to_train" (needs a budget) or "cost_per_token".
        budget: per device in cost_model.unit (default: cost_model.budget; inf: none).
    Returns:
        `GridDesign`; `best` is -1 when no point within the budget has a layout that fits.
    """
    budget = _budget(cost_model, budget)
    _check(objective, budget, 0, 1.0, 1.0, tokens, 1)
    _knobs(cost_model, system)  # a SpecError when it prices nothing or not these tiers
    # (a peak the device does not have, 0 such as FP8 on an A100, stays 0: nothing to tie)
    tied = {p: ("matmul_flops_per_s", float(getattr(system, p)) / float(
        system.matmul_flops_per_s)) for p in _LINKED
        if float(getattr(system, p)) > 0} if "matmul_flops_per_s" in axes else {}
    sw = sweep(model, system, training, layouts, axes, placements=placements, top=1,
               devices=devices, progress=progress, store=store, tied=tied)
    n, per_step = _job(model, layouts)
    cost = _cost(cost_model, system, sw)
    step = sw.step_time_s[..., 0]
    if objective == "time_to_train":
        value = step * tokens / per_step
    else:
        value = n * cost * step / (per_step * _lifetime_s(cost_model))
    within = np.ones(sw.shape, bool) if budget is None else cost <= budget
    ranked = np.where(within & np.isfinite(value), value, np.inf).reshape(-1)
    best = int(np.argmin(ranked)) if np.isfinite(ranked).any() else -1
    return GridDesign(sweep=sw, cost=cost, objective=value, within=within, best=best)
