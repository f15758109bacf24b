"""Search: every valid parallel layout of a job, evaluated in one jitted, batched computation.

    enumerate   the layout table of a job (`enumerate_layouts`), the rules of check_layout
    kernel      `predict_step` over the factored grid of a table, one compile per shape
    evaluate    `search`: every row of a table, in table order; `ranked`, `pareto_front`
    soft        `soft_best`: the differentiable soft-min over a table
    sweeps      `sweep`: the best layouts at every point of a grid of hardware values
    hardware    the grid of hardware points of a sweep (System leaves, values, checks)
    budget      `token_budget`: days, GPU-hours, energy and dollars of a token budget
    axonn       `best_axonn_grid`: AxoNN's 4D grids ranked by modeled communication
"""

from __future__ import annotations

from diffperf.search.axonn import GRID_COLUMNS, axonn_comm_s, axonn_grids, best_axonn_grid
from diffperf.search.budget import Budget, token_budget
from diffperf.search.enumerate import (COLUMNS, FIXABLE, INNER, INNER_GRID, KEYS, OUTER,
                                       PLACEMENTS, axonn_mask, enumerate_layouts, parallel_of)
from diffperf.search.evaluate import (TIE_COLUMNS, facts_inert_rows, merged, pareto_front,
                                      ranked, search, search_sharded)
from diffperf.executables import executable
# The XLA:CPU options, private but shared: sensitivity and the studies compile with them.
from diffperf.search.kernel import (_CPU_COMPILER_OPTIONS, _CPU_QUICK_OPTIONS,  # noqa: F401
                                    DEFAULT_CHUNK, QUICK_BELOW, RANK_FIELDS)
from diffperf.search.soft import SoftBest, soft_best
from diffperf.search.sweeps import POINTS_PER_CALL, SWEEP_CELLS, Sweep, sweep

__all__ = ["COLUMNS", "INNER", "INNER_GRID", "KEYS", "OUTER", "PLACEMENTS", "DEFAULT_CHUNK",
           "QUICK_BELOW", "RANK_FIELDS", "SWEEP_CELLS", "POINTS_PER_CALL", "GRID_COLUMNS",
           "FIXABLE", "TIE_COLUMNS", "Budget", "merged", "token_budget",
           "SoftBest", "Sweep", "axonn_comm_s", "axonn_grids", "axonn_mask", "best_axonn_grid",
           "enumerate_layouts", "executable", "facts_inert_rows", "pareto_front", "parallel_of",
           "ranked", "search",
           "search_sharded", "soft_best", "sweep"]
