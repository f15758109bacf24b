"""`diffperf search`: the fastest layouts that fit, and the Pareto front of time vs memory."""

from __future__ import annotations

import contextlib
import threading
import time

import numpy as np

from diffperf.cli.output import console, err_console, fmt, print_json, table
from diffperf.cli.cache import kernel_store
from diffperf.cli.options import (RECOMPUTE_NAMES, add_job, add_model_system, add_placements,
                                  check_at_least, model_and_system, placements_of, print_notes,
                                  unmeasured_cost_notes)
from diffperf.cli.steer import (add_steering, budget_line, budget_of, similar_cells, steering,
                                write_csv)
from diffperf.errors import SpecError

_RECOMPUTE = RECOMPUTE_NAMES
_N_PARTS = 4  # breakdown columns in the top-K table: the largest parts on average
_FRONT_ROWS = 12  # Pareto points printed (evenly spaced along the front; --json has all)


def add_parser(sub):
    p = sub.add_parser("search", help="best parallel layouts: every valid one, evaluated batched",
                       description=(
        "Enumerate every valid layout (tp, pp, dp, cp, ep, vp, micro-batch, ZeRO stage, "
        "recompute, sequence parallelism, placement; with --axonn also the AxoNN 3D tensor "
        "grid gx, gy, gz), predict them all in one jitted batched computation, drop those "
        "that do not fit, and print the fastest ones and the Pareto front of step time vs "
        "memory. With --sweep, do so at every point of a grid of hardware values and print "
        "the best layout at each. The work is split over every local device (GPUs; on a CPU "
        "one device already uses every core). With no options: GPT-3 175B on 1024 A100 "
        "80 GB, global batch 1536. Steering (docs/guide-search.md): fix or range any "
        "layout field (--tp 8, --pp 2-8, --recompute none,full), --set framework facts, "
        "--csv of every layout that fits, --tokens for a time and cost answer."))
    add_model_system(p)
    add_job(p)
    p.add_argument("--top", type=int, default=None, help="layouts to list (default 10; with "
                   "--sweep, per hardware point, default 1)")
    add_placements(p, alias=True)
    add_steering(p)
    p.add_argument("--axonn", action="store_true", help="also enumerate the AxoNN 4D layouts "
                   "(3D tensor grid gx x gy x gz x dp, tp = pp = 1; Singh et al. SC24)")
    p.add_argument("--sweep", action="append", metavar="FIELD=VALUES", help="sweep a "
                   "hardware number over values: FIELD is a key of the system YAML in its "
                   "units (hbm_bandwidth_GBps, tiers[1].bandwidth_GBps, tiers[0].domain_size, "
                   "matmul_TFLOPs, efficiency.mm_max, ...; a tier by name too: "
                   "tiers[infiniband].bandwidth_GBps; or a System leaf path in SI as "
                   "sensitivity prints it: matmul_flops_per_s), VALUES is START:STOP:N (evenly "
                   "spaced), START:STOP:N:log (geometric) or V1,V2,...; repeat for a grid "
                   "(the outer product)")
    p.add_argument("--chunk", type=int, default=None, help="layouts per batched call")
    p.add_argument("--no-cache", action="store_true", help="do not keep compiled code in "
                   "the persistent cache (~/.cache/diffperf/jax)")
    p.add_argument("--robust", action="store_true", help="rank by the upper end of each "
                   "layout's 95 %% interval (wider outside the efficiency set's envelope; "
                   "docs/trust.md) instead of the predicted step time")
    p.add_argument("--in-envelope", action="store_true", help="keep only layouts inside the "
                   "envelope the efficiency set was measured on (docs/trust.md)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(run=run, efficiency_defaults=True)
    return p


def _enable_cache() -> None:
    """JAX's persistent compilation cache (cli.cache); tests pass --no-cache."""
    from diffperf.cli.cache import enable_compilation_cache

    enable_compilation_cache()


def _devices():
    """Every local device of the default backend, or None when there is one (the
    single-device program)."""
    import jax

    devices = jax.local_devices()
    return devices if len(devices) > 1 else None


def build(args):
    """(model, system, training, placements, steer) from parsed arguments, validated;
    steer: dict(fixed=..., parallel=..., notes=...) (`steering`)."""
    from diffperf import training

    check_at_least(args, dict(gpus=1, global_batch=1, top=1, chunk=1))
    fixed, par, tr, notes = steering(args)
    model, system = model_and_system(args)
    train = training(args.precision, **tr)
    steer = dict(fixed=fixed, parallel=par, notes=notes + args.batch_notes
                 + unmeasured_cost_notes(model, system, train))
    return model, system, train, placements_of(args.placements), steer


@contextlib.contextmanager
def _progress(enabled: bool, what="searching"):
    """A progress callback; the bar (stderr, transient) appears only after 1 s."""
    if not enabled or not err_console.is_terminal:
        yield None
        return
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                               TimeElapsedColumn, TimeRemainingColumn)

    bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                   TimeElapsedColumn(), TimeRemainingColumn(), console=err_console,
                   transient=True)
    task = bar.add_task(f"{what} (compiling first)", total=None)
    lock, state = threading.Lock(), {"on": False, "done": False}

    def start():
        with lock:
            if not state["done"]:
                bar.start()
                state["on"] = True

    timer = threading.Timer(1.0, start)
    timer.daemon = True
    timer.start()
    try:
        yield lambda done, total: bar.update(task, completed=done, total=total,
                                             description=what)
    finally:
        timer.cancel()
        with lock:
            state["done"] = True
            if state["on"]:
                bar.stop()


def layout_dict(row, placements) -> dict:
    from diffperf.search import COLUMNS

    out = {c: int(row[i]) for i, c in enumerate(COLUMNS[:-1])}
    out["recompute"] = _RECOMPUTE[out["recompute"]]
    out["placement"] = "-".join(placements[int(row[-1])])
    return out


def layout_trust(args, system, train, layouts, parallel=None) -> dict:
    """diffperf.trust.trust of every layout of the table (numpy, vectorized) under the
    efficiency set the command uses, plus the 95 % interval (low, high) of each step time
    (filled in by `with_interval`)."""
    from diffperf import trust as tr
    from diffperf.search import COLUMNS

    tset = getattr(args, "efficiency_set", None) or tr.resolve(system, "none")[1]
    cols = tr.layout_columns(layouts, COLUMNS, gpus=args.gpus)
    facts = parallel or {}  # --set Parallel facts, the same for every layout
    modules = tr.recompute_modules_of(facts, lambda d, k, v: d.get(k, v))
    cols["recompute"] = tr.unnamed_recompute(cols["recompute"],
                                             facts.get("recompute_policy", 0.0),
                                             facts.get("recompute_layer_frac", 1.0), modules)
    return tr.trust(cols, tset, train.name, system.gpu) | {"set": tset}


def _ranked(result, layouts, trust, args) -> list:
    """The ranked groups of near-tied layouts (search.merged): ranked by the step time, or by
    the top of each 95 % interval under --robust; only layouts inside the envelope under
    --in-envelope; near-ties within --tie-pct of the same key merged in every ranking (the
    reason to merge, a top list not filled with layouts that differ only in ZeRO stage,
    recompute, SP or placement, holds whatever the key; --tie-pct 0 lists the plain
    ranking)."""
    from diffperf.search import merged

    key = (np.asarray(result.step_time_s, float) * np.exp(trust["q"]) if args.robust
           else None)
    keep = trust["inside"] if args.in_envelope else None
    return merged(result, layouts, args.top or 10, args.tie_pct / 100, key=key, keep=keep)


def _entry(result, i, row, placements, rank=None, detail=None, trust=None) -> dict:
    """One layout in JSON: from `result` (RANK_FIELDS) by row i; with a rank, its breakdown
    and memory parts from `detail` (the full Result of the ranked rows) at rank - 1; with
    `trust` (`layout_trust`), whether it lies inside the envelope and its 95 % interval."""
    from diffperf.result import EXPOSED_PARTS, HIDDEN_PARTS, MEMORY_PARTS

    out = {} if rank is None else {"rank": rank}
    out |= dict(layout=layout_dict(row, placements),
                step_time_s=float(result.step_time_s[i]),
                memory_GiB=float(result.memory.total_bytes[i]) / 2**30,
                fits=bool(result.fits[i]), mfu=float(result.mfu[i]),
                tokens_per_s=float(result.tokens_per_s[i]))
    if trust is not None:
        T, q = float(result.step_time_s[i]), float(trust["q"][i])
        out |= dict(inside_envelope=bool(trust["inside"][i]),
                    envelope_score=float(trust["score"][i]), regime=str(trust["regime"][i]),
                    interval_95_s=[T * float(np.exp(-q)), T * float(np.exp(q))])
    if rank is not None:
        b, m, j = detail.breakdown, detail.memory, rank - 1
        out["breakdown"] = {k: float(getattr(b, k)[j]) for k in (*EXPOSED_PARTS, *HIDDEN_PARTS)}
        out["memory_bytes"] = {k: float(getattr(m, k)[j]) for k in MEMORY_PARTS}
    return out


def _rows(result, idx, layouts, placements, parts, moe, grid=False, detail=None, trust=None):
    """Table rows of the layouts idx; the breakdown `parts` from `detail` (row k for idx[k]);
    with `trust`, the envelope column ('in', or the score outside) and the interval's top."""
    rows = []
    for rank, i in enumerate(idx, 1):
        lay = layout_dict(layouts[i], placements)
        cells = [rank, fmt(result.step_time_s[i]), fmt(result.memory.total_bytes[i] / 2**30),
                 f"{100 * float(result.mfu[i]):.1f}"]
        if trust is not None:
            cells += ["in" if trust["inside"][i] else f"out {trust['score'][i]:.2f}",
                      fmt(float(result.step_time_s[i]) * float(np.exp(trust["q"][i])))]
        cells += [lay["tp"], lay["pp"], lay["dp"], lay["cp"]]
        cells += [lay["ep"]] if moe else []
        cells += [lay["gx"], lay["gy"], lay["gz"]] if grid else []
        cells += [lay["vp"], lay["micro_batch"], lay["zero_stage"], lay["recompute"],
                  lay["sequence_parallel"], lay["placement"]]
        cells += [fmt(getattr(detail.breakdown, k)[rank - 1]) for k in parts]
        rows.append(cells)
    return rows


def _columns(parts, moe, grid=False, trust=False):
    return ("#", "step_time_s", "mem_GiB", "MFU_%", *(("envelope", "hi95_s") if trust else ()),
            "tp", "pp", "dp", "cp",
            *(("ep",) if moe else ()), *(("gx", "gy", "gz") if grid else ()), "vp", "mb",
            "zero", "recompute", "sp", "placement", *parts)


def _wide():
    """The console, or a 200-column one when stdout is not a terminal (the tables are wide)."""
    from rich.console import Console

    return console if console.is_terminal else Console(width=200)


def render(model, system, args, layouts, placements, result, top, front, seconds, detail,
           similar=None, trust=None):
    from diffperf.result import EXPOSED_PARTS
    from diffperf.search import COLUMNS, axonn_mask

    out = _wide()
    n, feasible = len(layouts), int(np.sum(result.fits))
    moe = bool(np.any(layouts[:, COLUMNS.index("ep")] > 1))
    n_grid = int(np.sum(axonn_mask(layouts)))
    head = (f"{model.name} on {args.gpus} x {system.name}, global batch {args.global_batch}")
    if not len(top):
        i = int(np.argmin(result.memory.total_bytes))
        need = float(result.memory.total_bytes[i]) / 2**30
        cap = float(result.memory.capacity_bytes[i]) / 2**30
        out.print(f"[yellow]no layout fits[/yellow]: {head}; the smallest needs "
                      f"{need:.4g} GiB per device (usable {cap:.4g} GiB)")
    else:
        mean = {k: float(np.mean(getattr(detail.breakdown, k))) for k in EXPOSED_PARTS}
        parts = sorted(EXPOSED_PARTS, key=lambda k: -mean[k])[:_N_PARTS]
        how = "by the 95 % interval's upper end" if args.robust else "fastest"
        where = " inside the envelope" if args.in_envelope else ""
        rows = _rows(result, top, layouts, placements, parts, moe, n_grid > 0, detail, trust)
        columns = _columns(parts, moe, n_grid > 0, trust is not None)
        if similar is not None and any(similar):
            rows = [[*r, s] for r, s in zip(rows, similar)]
            columns = (*columns, f"near-ties (<= {args.tie_pct:g} %)")
        merged_note = " (near-ties merged)" if similar is not None and any(similar) else ""
        out.print(table(f"{how}: {len(top)} of {feasible:,} layouts that fit{where}"
                        f"{merged_note}: {head}", columns, rows))
        shown = front[np.unique(np.linspace(0, len(front) - 1, _FRONT_ROWS).round().astype(int))]
        note = f" ({len(shown)} of {len(front)} points; --json lists all)" if len(
            shown) < len(front) else ""
        out.print(table(f"Pareto front: step time vs memory per device{note}",
                        _columns((), moe, n_grid > 0),
                        _rows(result, shown, layouts, placements, (), moe, n_grid > 0)))
    grid = f", {n_grid:,} of them on the AxoNN grid" if args.axonn else ""
    out.print(f"evaluated {n:,} layouts{grid} ({feasible:,} fit) in {seconds:.2f} s, "
                  f"compiling or loading the kernels included ({n / seconds:,.0f} layouts/s)")
    if trust is not None:
        from diffperf.trust import describe_text

        inside = int(np.sum(trust["inside"] & np.asarray(result.fits)))
        out.print(describe_text(trust["set"]))
        out.print(f"{inside:,} of the {feasible:,} layouts that fit lie inside its envelope "
                  f"(envelope: 'in', or 'out' and a score 1 / (1 + distance); hi95_s: the top "
                  f"of the 95 % interval, wider outside; docs/trust.md)")
        if len(top) and not trust["inside"][top[0]]:
            out.print(f"[yellow]the first layout lies OUTSIDE the envelope[/yellow] (nearest "
                      f"measured regime: {trust['regime'][top[0]]}): its MFU "
                      f"{100 * float(result.mfu[top[0]]):.1f} % is not backed by measurements; "
                      f"--in-envelope keeps to it, --robust ranks by the interval's top")


def run(args) -> int:
    import dataclasses

    from diffperf.cli.options import inert_notes
    from diffperf.search import (DEFAULT_CHUNK, RANK_FIELDS, axonn_mask, enumerate_layouts,
                                 facts_inert_rows, pareto_front, search)

    model, system, train, placements, steer = build(args)
    if args.csv:
        from diffperf.cli.output import check_writable

        check_writable(args.csv, args.force)
    if args.sweep:
        from diffperf.cli.sweep_cmd import run_sweep

        if steer["parallel"] or args.csv or args.tokens is not None:
            raise SpecError("--sweep takes the layout values and the Training facts of "
                            "--set, not yet --set FIELD of Parallel, --csv or --tokens")
        print_notes(steer["notes"])
        return run_sweep(args, model, system, train, placements, steer["fixed"])
    start = time.perf_counter()
    layouts = enumerate_layouts(model, args.gpus, args.global_batch, placements=placements,
                                axonn=args.axonn, fixed=steer["fixed"])
    steer["notes"] += inert_notes(facts_inert_rows(model, train, layouts, steer["parallel"]),
                                  len(layouts))
    print_notes(steer["notes"])
    store, devices = kernel_store(args), _devices()
    with _progress(not args.json) as progress:
        # Tables from enumerate_layouts are valid by construction (tests/test_search.py).
        # Every layout with what ranking needs, then the whole Result of the top ones.
        result = search(model, system, train, layouts, placements=placements,
                        chunk=args.chunk or DEFAULT_CHUNK, validate=False, progress=progress,
                        devices=devices, store=store, fields=RANK_FIELDS,
                        parallel=steer["parallel"])
        trust = layout_trust(args, system, train, layouts, steer["parallel"])
        groups = _ranked(result, layouts, trust, args)
        top = np.array([g[0] for g in groups], dtype=np.int64)
        detail = search(model, system, train, layouts[top], placements=placements,
                        validate=False, optimize=False, store=store,
                        parallel=steer["parallel"]) if len(top) else None
    seconds = time.perf_counter() - start
    fit = np.flatnonzero(result.fits)
    front = fit[pareto_front(result.step_time_s[fit], result.memory.total_bytes[fit])]
    written = write_csv(args.csv, result, layouts, placements, args.force) if args.csv else None
    budget = budget_of(args, system, result, top[0] if len(top) else None)
    if args.json:
        from diffperf.trust import describe

        ranked_entries = []
        for r, (i, g) in enumerate(zip(top, groups), 1):
            e = _entry(result, i, layouts[i], placements, r, detail, trust)
            e["similar"] = [dict(layout=layout_dict(layouts[j], placements),
                                 step_time_s=float(result.step_time_s[j])) for j in g[1:]]
            ranked_entries.append(e)
        print_json(dict(
            model=model.name, system=system.name, gpus=args.gpus,
            global_batch=args.global_batch, seq_len=int(model.seq_len),
            placements=["-".join(p) for p in placements], evaluated=len(layouts),
            axonn=args.axonn, axonn_layouts=int(np.sum(axonn_mask(layouts))),
            feasible=int(len(fit)), seconds=seconds,
            fixed={c: [_RECOMPUTE[v] for v in vals] if c == "recompute" else list(vals)
                   for c, vals in steer["fixed"].items()},
            set=list(args.set or []), notes=steer["notes"], tie_pct=args.tie_pct,
            csv=None if args.csv is None else dict(path=str(args.csv), rows=written),
            budget=None if budget is None else dataclasses.asdict(budget),
            efficiency_set=describe(trust["set"]), robust=args.robust,
            in_envelope=args.in_envelope,
            feasible_in_envelope=int(np.sum(trust["inside"] & np.asarray(result.fits))),
            ranked=ranked_entries,
            pareto=[_entry(result, i, layouts[i], placements) for i in front]))
        return 0
    render(model, system, args, layouts, placements, result, top, front, seconds, detail,
           similar_cells(groups, layouts, placements), trust)
    if written is not None:
        _wide().print(f"wrote {written:,} layouts that fit to {args.csv}", highlight=False)
    if budget is not None:
        _wide().print(budget_line(budget), highlight=False)
    return 0
