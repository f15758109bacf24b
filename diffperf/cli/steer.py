"""The steering options of `diffperf search` (docs/guide-search.md): what a planner already
knows (layout values or ranges, framework facts) and the answers beyond the top list
(near-ties, a CSV of every layout, a token budget)."""

from __future__ import annotations

import numpy as np

from diffperf.cli.options import RECOMPUTE_NAMES, framework_facts, parse_values
from diffperf.errors import SpecError

_RECOMPUTE = RECOMPUTE_NAMES
# The layout options of search: (option dest, table column); each takes V, A-B or V1,V2,...
_STEER = (("tp", "tp"), ("pp", "pp"), ("dp", "dp"), ("cp", "cp"), ("ep", "ep"), ("vp", "vp"),
          ("micro_batch", "micro_batch"), ("zero_stage", "zero_stage"),
          ("recompute", "recompute"), ("sequence_parallel", "sequence_parallel"),
          ("gx", "gx"), ("gy", "gy"), ("gz", "gz"))


def add_steering(p) -> None:
    """What a planner already knows: layout values or ranges, framework facts, and the
    options of the answer (near-ties, CSV, token budget). docs/guide-search.md."""
    g = p.add_argument_group("steering (each layout option takes V, A-B or V1,V2,...)")
    for dest, _ in _STEER:
        flag = "--" + dest.replace("_", "-")
        extra = (" (names none, selective, full or 0-2)" if dest == "recompute" else
                 " (0-3)" if dest == "zero_stage" else " (0, 1)" if dest == "sequence_parallel"
                 else " (AxoNN grid; a value > 1 implies --axonn)" if dest in ("gx", "gy", "gz")
                 else " (vp values given here need not divide a stage's layers)"
                 if dest == "vp" else "")
        g.add_argument(flag, dest=dest, default=None, metavar="VALUES",
                       help=f"only layouts with these {dest} values{extra}")
    g.add_argument("--set", action="append", metavar="FIELD=VALUE", help=(
        "framework fact for every layout: a Parallel field that is not a layout option "
        "(tp_overlap=0, dp_overlap=0, cp_ring=0) or a Training field (flash_attention=0); "
        "repeatable. A layout on which it cannot act (tp_overlap at tp 1, cp_ring=0 at cp "
        "1, ...) is ranked as the framework runs it, without it; a note says how many. With "
        "--calibration, the overlay's fitted_on.set is applied first"))
    g.add_argument("--tie-pct", type=float, default=0.5, help="merge, in the top list, "
                   "layouts with the same degrees and micro-batch whose step time (under --robust "
                   "the 95 %% interval's top) is within this many %% of the group's best "
                   "(they differ only in ZeRO stage, "
                   "recompute, sequence parallelism or placement); 0: no merging (default "
                   "0.5)")
    g.add_argument("--csv", metavar="PATH", help="write every layout that fits, fastest "
                   "first, to this CSV")
    g.add_argument("--force", action="store_true", help="overwrite an output file that exists "
                   "(--csv; with plot, --out too)")
    g.add_argument("--tokens", type=float, help="token budget: days, GPU-hours, energy "
                   "(the system's power_W per device) and, with --usd-per-gpu-hour, dollars "
                   "to train on this many tokens with the fastest layout")
    g.add_argument("--usd-per-gpu-hour", type=float, help="price of one GPU-hour for --tokens")


def steering(args) -> tuple:
    """(fixed {column: values}, Parallel facts, Training facts, notes) of the steering
    options, checked."""
    from diffperf.load import parse_overrides
    from diffperf.search import COLUMNS

    fixed = {}
    for dest, column in _STEER:
        values = parse_values(dest.replace("_", "-"), getattr(args, dest, None),
                              _RECOMPUTE if dest == "recompute" else None)
        if values is not None:
            fixed[column] = values
    if any(v > 1 for g in ("gx", "gy", "gz") for v in fixed.get(g, ())):
        args.axonn = True
    items, notes = framework_facts(args)
    par, tr = parse_overrides(items)
    staged = [k for k in par if k in COLUMNS or k in ("pp_first_layers", "pp_last_layers")]
    if staged:
        k = staged[0]
        if k in COLUMNS:
            raise SpecError(f"--set {k}: the search enumerates it; give "
                            f"--{k.replace('_', '-')} VALUES")
        raise SpecError(f"--set {k}: the search balances the pipeline stages itself (give it "
                        f"to predict)")
    for name in ("tie_pct", "tokens", "usd_per_gpu_hour"):
        v = getattr(args, name, None)
        if v is not None and (not (v >= 0 and np.isfinite(v)) or (name == "tokens" and v == 0)):
            raise SpecError(f"--{name.replace('_', '-')}={v} must be a finite number "
                            f"{'> 0' if name == 'tokens' else '>= 0'}")
    if getattr(args, "usd_per_gpu_hour", None) is not None and args.tokens is None:
        raise SpecError("--usd-per-gpu-hour prices a token budget: give --tokens N too")
    return fixed, par, tr, notes


def similar_cells(groups, layouts, placements) -> list:
    """Per group, '+3: zero 1/2, sp 0/1' etc.: how many layouts it merged and the TIE_COLUMNS
    values in which they differ; '' for a group of one."""
    from diffperf.search import COLUMNS

    short = dict(zero_stage="zero", recompute="recompute", sequence_parallel="sp",
                 placement="placement")
    out = []
    for g in groups:
        parts = []
        for c, label in short.items():
            vals = sorted(set(int(v) for v in layouts[g, COLUMNS.index(c)]))
            if len(vals) > 1:
                names = ([_RECOMPUTE[v] for v in vals] if c == "recompute" else
                         ["-".join(placements[v]) for v in vals] if c == "placement" else
                         [str(v) for v in vals])
                parts.append(f"{label} {'/'.join(names)}")
        out.append(f"+{len(g) - 1}: " + ", ".join(parts) if len(g) > 1 else "")
    return out


def write_csv(path, result, layouts, placements, force) -> int:
    """Every layout that fits, fastest first: its columns (recompute and placement by name)
    and RANK_FIELDS; the number of rows."""
    import csv
    import io

    from diffperf.cli.output import write_atomic
    from diffperf.search import COLUMNS, ranked

    order = ranked(result)
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["rank", *COLUMNS, "step_time_s", "memory_GiB", "mfu", "tokens_per_s"])
    step, mem = result.step_time_s, result.memory.total_bytes
    rec, place = COLUMNS.index("recompute"), COLUMNS.index("placement")
    orders = ["-".join(p) for p in placements]
    for r, i in enumerate(order, 1):
        row = [int(v) for v in layouts[i]]
        row[rec], row[place] = _RECOMPUTE[row[rec]], orders[row[place]]
        w.writerow([r, *row, f"{float(step[i]):.6g}", f"{float(mem[i]) / 2**30:.6g}",
                    f"{float(result.mfu[i]):.6g}", f"{float(result.tokens_per_s[i]):.6g}"])
    write_atomic(path, buf.getvalue(), force)
    return len(order)


def budget_of(args, system, result, best):
    """The token budget of the fastest layout (`token_budget`), or None without --tokens."""
    from diffperf.search import token_budget

    if args.tokens is None or best is None:
        return None
    return token_budget(args.tokens, float(result.tokens_per_s[best]), args.gpus,
                        float(system.power_W), args.usd_per_gpu_hour)


def budget_line(b) -> str:
    usd = f", ${b.usd:,.0f}" if b.usd is not None else ""
    return (f"{b.tokens:.4g} tokens with the fastest layout: {b.days:.4g} days, "
            f"{b.gpu_hours:,.0f} GPU-hours, {b.energy_MWh:.4g} MWh of GPU board energy at "
            f"rated power{usd}")
