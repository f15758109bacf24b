"""`diffperf design --grid`: every point of a hardware grid, priced, with its best layout."""

from __future__ import annotations

import time

import numpy as np

from diffperf.cli.design_cmd import _objective_cell
from diffperf.cli.output import fmt, print_json, table
from diffperf.cli.cache import kernel_store
from diffperf.cli.search_cmd import _devices, _progress, _wide, layout_dict
from diffperf.cli.sweep_cmd import _points


def _layout_text(lay: dict) -> str:
    """tp pp dp cp (ep, the grid when used) vp mb zero recompute sp placement, compact."""
    extra = "".join(f" {k} {lay[k]}" for k in ("ep", "gx", "gy", "gz") if lay[k] > 1)
    return (f"tp {lay['tp']} pp {lay['pp']} dp {lay['dp']} cp {lay['cp']}{extra} vp "
            f"{lay['vp']} mb {lay['micro_batch']} zero {lay['zero_stage']} {lay['recompute']} "
            f"sp {lay['sequence_parallel']} {lay['placement']}")


def _point_dict(result, axes, values, h, layouts, placements) -> dict:
    """Grid point h (flat index) in JSON; `values` its coordinates in the YAML's units."""
    sw = result.sweep
    i = int(sw.index.reshape(-1)[h])
    return dict(point={key: float(v) for (key, *_), v in zip(axes, values)},
                cost=float(result.cost.reshape(-1)[h]),
                within_budget=bool(result.within.reshape(-1)[h]),
                objective=float(result.objective.reshape(-1)[h]),
                step_time_s=float(sw.step_time_s.reshape(-1)[h]), feasible=int(
                    sw.n_fits.reshape(-1)[h]),
                layout=layout_dict(layouts[i], placements) if i >= 0 else None)


def run_grid(args, model, system, train, cost, placements) -> int:
    from diffperf.design_grid import grid_design
    from diffperf.load import sweep_axes
    from diffperf.search import enumerate_layouts

    axes = sweep_axes(system, args.grid, flag="--grid")
    start = time.perf_counter()
    layouts = enumerate_layouts(model, args.gpus, args.global_batch, placements=placements)
    with _progress(not args.json, "evaluating the grid") as progress:
        result = grid_design(model, system, train, layouts, cost,
                             {leaf: si for _, leaf, _, si in axes}, args.objective,
                             budget=args.budget, tokens=args.tokens, placements=placements,
                             devices=_devices(), progress=progress, store=kernel_store(args))
    seconds = time.perf_counter() - start
    # One sort of the H points and one pass over them: the points within the budget with a
    # layout that fits, best first (ties keep the grid's order).
    ranked = np.where(result.within, result.objective, np.inf).reshape(-1)
    order = np.argsort(ranked, kind="stable")
    order = order[np.isfinite(ranked[order])][:args.top]
    grid = _points(axes)
    points = [_point_dict(result, axes, grid[h], h, layouts, placements) for h in order]
    budget = cost.budget if args.budget is None else args.budget
    if args.json:
        print_json(dict(model=model.name, system=system.name, gpus=args.gpus,
                        global_batch=args.global_batch, cost_model=cost.name, unit=cost.unit,
                        objective=args.objective, budget=budget,
                        axes=[dict(field=k, leaf=leaf, values=[float(v) for v in human])
                              for k, leaf, human, _ in axes],
                        hardware_points=int(result.cost.size), within_budget=int(np.sum(
                            result.within)), evaluated=result.sweep.n_points, seconds=seconds,
                        best=points[0] if points else None, ranked=points))
        return 0
    rows = [[fmt(v) for v in p["point"].values()] + [
        fmt(p["cost"]), fmt(p["step_time_s"]), _objective_cell(args.objective, cost.unit,
                                                              p["objective"]),
        _layout_text(p["layout"])] for p in points]
    cols = [k for k, *_ in axes] + [f"cost_{cost.unit}", "step_time_s", args.objective,
                                    "best layout"]
    out = _wide()
    out.print(table(f"design grid: {model.name} on {args.gpus} x {system.name}, "
                    f"{args.objective}, cost model {cost.name} (budget {fmt(budget)} "
                    f"{cost.unit}): best {len(points)} points", cols, rows))
    if not points:
        out.print("[yellow]no point within the budget has a layout that fits[/yellow]")
    out.print(f"{int(np.sum(result.within)):,} of {result.cost.size:,} hardware points within "
              f"the budget; evaluated {result.sweep.n_points:,} layout x hardware points in "
              f"{seconds:.2f} s", highlight=False)
    return 0
