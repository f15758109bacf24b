"""`diffperf search --sweep`: the best layout at every point of a grid of hardware values."""

from __future__ import annotations

import time

import numpy as np

from diffperf.cli.output import fmt, print_json, table
from diffperf.cli.cache import kernel_store
from diffperf.cli.search_cmd import _devices, _progress, _wide, layout_dict

_MAX_ROWS = 48  # hardware points printed (every k-th of the grid's; --json has all)
_LAYOUT = ("tp", "pp", "dp", "cp", "ep", "gx", "gy", "gz", "vp", "micro_batch", "zero_stage",
           "recompute", "sequence_parallel", "placement")
_SHORT = {"micro_batch": "mb", "zero_stage": "zero", "sequence_parallel": "sp"}


def _points(axes) -> np.ndarray:
    """[H, n_axes] values (the YAML's units) of every grid point, first axis slowest."""
    grids = np.meshgrid(*[human for _, _, human, _ in axes], indexing="ij")
    return np.stack([g.reshape(-1) for g in grids], axis=1)


def _best(result, layouts, placements, h, k, tokens_per_step) -> dict | None:
    i = int(result.index.reshape(-1, result.index.shape[-1])[h, k])
    if i < 0:
        return None
    step = float(result.step_time_s.reshape(-1, result.step_time_s.shape[-1])[h, k])
    mem = float(result.memory_bytes.reshape(-1, result.memory_bytes.shape[-1])[h, k])
    return dict(layout=layout_dict(layouts[i], placements), step_time_s=step,
                memory_GiB=mem / 2**30, tokens_per_s=tokens_per_step / step)


def _json(args, model, system, axes, layouts, placements, result, seconds):
    tokens = args.global_batch * float(model.seq_len)
    points, fits = _points(axes), result.n_fits.reshape(-1)
    top = result.index.shape[-1]
    rows = []
    for h, values in enumerate(points):
        best = [_best(result, layouts, placements, h, k, tokens) for k in range(top)]
        rows.append(dict(point={key: float(v) for (key, *_), v in zip(axes, values)},
                         feasible=int(fits[h]), best=[b for b in best if b is not None]))
    print_json(dict(model=model.name, system=system.name, gpus=args.gpus,
                    global_batch=args.global_batch, seq_len=int(model.seq_len),
                    placements=["-".join(p) for p in placements],
                    axes=[dict(field=key, leaf=leaf, values=[float(v) for v in human])
                          for key, leaf, human, _ in axes],
                    layouts=len(layouts), hardware_points=len(points),
                    evaluated=result.n_points, seconds=seconds, points=rows))


def _layout_columns(layouts) -> tuple:
    """_LAYOUT less ep (a dense model) and gx, gy, gz (no AxoNN grid rows), as search prints."""
    from diffperf.search import COLUMNS, axonn_mask

    drop = set() if np.any(layouts[:, COLUMNS.index("ep")] > 1) else {"ep"}
    drop |= set() if np.any(axonn_mask(layouts)) else {"gx", "gy", "gz"}
    return tuple(c for c in _LAYOUT if c not in drop)


def _shown(axes, n_points) -> tuple:
    """(points to print, note): all of them, or every k-th value of the first (slowest) axis
    with every value of the others, so that at most _MAX_ROWS rows (or one first-axis value's
    worth) are printed."""
    if n_points <= _MAX_ROWS:
        return np.arange(n_points), ""
    inner = n_points // len(axes[0][2])
    k = -(-n_points // max(_MAX_ROWS, inner))
    shown = np.concatenate([np.arange(i, i + inner) for i in range(0, n_points, k * inner)])
    return shown, (f" (1 value in {k} of {axes[0][0]}: {len(shown)} of {n_points} points; "
                   f"--json lists all)")


def _render(args, model, system, axes, layouts, placements, result, seconds):
    tokens = args.global_batch * float(model.seq_len)
    shown_layout = _layout_columns(layouts)
    points, fits = _points(axes), result.n_fits.reshape(-1)
    top = result.index.shape[-1]
    shown, note = _shown(axes, len(points))
    rows = []
    for h in shown:
        for k in range(top):
            best = _best(result, layouts, placements, h, k, tokens)
            cells = [fmt(v) if k == 0 else "" for v in points[h]]
            cells += [k + 1, int(fits[h]) if k == 0 else ""]
            if best is None:
                rows.append(cells + ["none fits"] + [""] * (2 + len(shown_layout)))
                break
            lay = best["layout"]
            rows.append(cells + [fmt(best["step_time_s"]), fmt(best["tokens_per_s"]),
                                 fmt(best["memory_GiB"])] + [lay[c] for c in shown_layout])
    head = f"{model.name} on {args.gpus} x {system.name}, global batch {args.global_batch}"
    columns = [key for key, *_ in axes] + ["#", "fit", "step_time_s", "tokens_per_s",
                                            "mem_GiB"] + [_SHORT.get(c, c) for c in shown_layout]
    out = _wide()
    out.print(table(f"best layout at each hardware point{note}: {head}", columns, rows))
    out.print(f"evaluated {result.n_points:,} layout x hardware points ({len(layouts):,} "
              f"layouts x {len(points):,} points) in {seconds:.2f} s, compiling or loading the "
              f"kernel included "
              f"({result.n_points / seconds:,.0f} points/s)", highlight=False)


def run_sweep(args, model, system, train, placements, fixed=None) -> int:
    from diffperf.load import sweep_axes
    from diffperf.cli.options import inert_notes, print_notes
    from diffperf.search import SWEEP_CELLS, enumerate_layouts, facts_inert_rows, sweep

    axes = sweep_axes(system, args.sweep)
    start = time.perf_counter()
    layouts = enumerate_layouts(model, args.gpus, args.global_batch, placements=placements,
                                axonn=args.axonn, fixed=fixed)
    print_notes(inert_notes(facts_inert_rows(model, train, layouts), len(layouts)))
    store = kernel_store(args)
    with _progress(not args.json, "sweeping") as progress:
        result = sweep(model, system, train, layouts, {leaf: si for _, leaf, _, si in axes},
                       placements=placements, top=args.top or 1, validate=False,
                       cells=args.chunk or SWEEP_CELLS,
                       devices=_devices(), progress=progress, store=store)
    seconds = time.perf_counter() - start
    if args.json:
        _json(args, model, system, axes, layouts, placements, result, seconds)
    else:
        _render(args, model, system, axes, layouts, placements, result, seconds)
    return 0
