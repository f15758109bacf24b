"""Evaluation: the predictions of every layout of a table, and their ranking.

A layout table (`search.enumerate`) is factored into outer keys and evaluated by the grid
kernel (`search.kernel`) in fixed-size chunks (one compile per chunk shape: the placement is a
numeric leaf of `Parallel`), then put back in table order and ranked by step time among the
layouts that fit in memory.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from diffperf.api import _as_float
from diffperf.errors import SpecError, closest
from diffperf.result import Result
from diffperf.search.enumerate import COLUMNS, INNER_GRID, PLACEMENTS, _placement_codes
from diffperf.search.kernel import (DEFAULT_CHUNK, QUICK_BELOW, _chunk_parallel, _grid, _kernel,
                                    _table_features)
from diffperf.specs.batch import anonymous
from diffperf.specs.parallel import Parallel
from diffperf.specs.training import Training
from diffperf.specs.validate import (check_facts_act, check_job, check_layout, check_model,
                                     check_precision, check_search_facts, check_system,
                                     check_training, check_tp_userbuffers_precision,
                                     check_tp_userbuffers_system, facts_inert)


def _evaluate(args, keys, per, temperature, devices, optimize, progress, store=None,
              fields=None, base=None) -> list:
    """Results (device arrays [per, 24]) of the calls over the chunks of the outer keys."""
    model, system, training = args
    features = _table_features(model, keys, training, base)
    dtype = jnp.result_type(float)
    fn = _kernel(devices, optimize, store)
    outs = []
    for i in range(0, len(keys), per):
        parallel = _chunk_parallel(keys[i:i + per], dtype, features, base)
        outs.append(fn(model, parallel, system, training, temperature, features, fields))
        if progress is not None:
            jax.block_until_ready(outs[-1])
            progress(per * len(INNER_GRID))
    return outs


def _gather(cell, outs):
    """The grid results put back in table order: a Result of numpy [n]."""
    treedef = jax.tree.structure(outs[0])
    columns = []
    for j in range(treedef.num_leaves):
        grid = [np.asarray(jax.tree.leaves(c)[j]).reshape(-1) for c in outs]
        grid = grid[0] if len(grid) == 1 else np.concatenate(grid)
        columns.append(np.take(grid, cell))
    return jax.tree.unflatten(treedef, columns)


def _check_table(model, layouts, placements):
    layouts = np.asarray(layouts)
    if layouts.ndim != 2 or layouts.shape[1] != len(COLUMNS) or not len(layouts):
        raise SpecError(f"layouts must be a non-empty table [n, {len(COLUMNS)}] with columns "
                        f"{', '.join(COLUMNS)}, got shape {layouts.shape}")
    place = layouts[:, -1]
    bad = np.flatnonzero((place < 0) | (place >= len(placements)))
    if len(bad):
        raise SpecError(f"layouts[{bad[0]}].placement={place[bad[0]]} must index placements "
                        f"(allowed: 0..{len(placements) - 1})")
    _placement_codes(placements)
    fields = {c: layouts[:, i].astype(np.float64) for i, c in enumerate(COLUMNS[:-1])}
    check_layout(model, Parallel(**fields), where="layouts")
    return layouts


def _check_inputs(model, system, training, layouts) -> None:
    """Model, system and training (specs.validate), and the largest job of the table
    against the system's last network tier, and the precision recipe against the device's
    tensor cores, before anything is traced."""
    check_model(model)
    check_system(system)
    check_training(training)
    check_precision(system, training)
    cols = {c: np.asarray(layouts)[:, i].astype(np.float64)
            for i, c in enumerate(COLUMNS[:-1]) if c in Parallel.__dataclass_fields__}
    check_job(Parallel(**cols), system, where="layouts")


def _check_fields(fields):
    """A sorted tuple of Result leaf paths (hashable: a static argument), or None."""
    if fields is None:
        return None
    fields = tuple(sorted(set([fields] if isinstance(fields, str) else fields)))
    top = Result.__dataclass_fields__
    bad = [f for f in fields if f.split(".")[0] not in top]
    if bad or not fields:
        raise SpecError(f"fields={bad[0] if bad else '()'!r} must name Result fields "
                        f"(allowed: {', '.join(top)}, and breakdown.X / memory.X)")
    return fields


def _base_parallel(fields):
    """A Parallel of the framework facts (fields that are not table columns), or None."""
    if not fields:
        return None
    staged = [k for k in fields if k in ("pp_first_layers", "pp_last_layers")]
    if staged:
        raise SpecError(f"parallel: '{staged[0]}' depends on pp, which the table varies; "
                        f"the search balances the stages automatically (give it to predict)")
    columns = [k for k in fields if k in COLUMNS]
    if columns:
        raise SpecError(f"parallel: '{columns[0]}' is a column of the layout table; fix it in "
                        f"the table (enumerate_layouts' fixed)")
    bad = [k for k in fields if k not in Parallel.__dataclass_fields__]
    if bad:
        allowed = [f for f in Parallel.__dataclass_fields__ if f not in COLUMNS]
        raise SpecError(f"parallel: '{bad[0]}' is not a Parallel field"
                        f"{closest(str(bad[0]), allowed)} (allowed: {', '.join(allowed)})")
    return Parallel(**{k: float(v) for k, v in fields.items()})


def search(model, system, training=None, layouts=None, *, placements=PLACEMENTS,
           chunk=DEFAULT_CHUNK, temperature=None, devices=None, validate=True, optimize=None,
           progress=None, store=None, fields=None, parallel=None):
    """Predictions of every layout of a table, one entry per row (a `Result` of numpy arrays).

    One jitted nested vmap of `predict_step` (search.kernel) for every placement, called on
    fixed-size chunks (the last one padded) so that every call has the same shapes.
    Args:
        model, system, training: specs (training defaults to `Training()`); never batched.
        layouts: a table [n, len(COLUMNS)] of integers, e.g. from `enumerate_layouts`.
        chunk: layouts per call (bounds memory: about 120 bytes of output per layout).
        temperature: None for the exact model, > 0 for its smooth variant.
        devices: None for the default device; a list of devices shards each chunk's outer
            axis over a 1-D mesh of them (`jax.sharding.NamedSharding`). Same feasibility
            and ranking; times equal to 2 float32 ulps (XLA's multi-device pipeline
            reassociates a few products), tests/test_search.py.
        validate: check every row with `check_layout` (tables from `enumerate_layouts` are
            valid by construction).
        optimize: XLA:CPU code optimization of the kernel; None: with a `store`, or for
            tables of QUICK_BELOW layouts or more (smaller ones finish sooner with quick
            compilation when the program is not kept).
        progress: optional callable(done, total), in grid cells, after each chunk.
        store: optional mapping (key -> bytes) that keeps compiled kernels across processes
            (`search.kernel.executable`): a later call with the same shapes skips tracing
            and compiling. The caller keys it by the version of the code.
        fields: Result leaf paths to compute ('step_time_s', 'memory.total_bytes', ...; e.g.
            `RANK_FIELDS`, what ranking needs), the others None; None: every field. Fewer
            outputs make the kernel several times faster.
        parallel: optional mapping of the Parallel fields that are not table columns (the
            framework facts: tp_overlap, dp_overlap, cp_ring, ...) for every layout; None:
            Parallel's defaults. The table's columns cannot be given here.
    Returns:
        `Result` whose leaves are numpy arrays [n_layouts] in table order. A framework fact
        of `training` or `parallel` describes the framework, not a layout: on a row where it
        cannot act (`facts_inert_rows`: cp_torch at cp 1, tp_overlap at tp 1, zero3_* below
        ZeRO-3, ...) its term is zero, and the row is predicted and ranked as the framework
        runs it, without the fact. A fact that acts on no layout whatever the row (an MoE
        fact on a dense model, a low-precision fact with a 16-bit precision) is a SpecError.
    """
    if layouts is None:
        raise SpecError("search needs a layout table (see enumerate_layouts)")
    layouts = _check_table(model, layouts, placements) if validate else np.asarray(layouts)
    fields = _check_fields(fields)
    training = Training() if training is None else training
    _check_inputs(model, system, training, layouts)
    # the facts that cannot act whatever the row (the model's and the precision's rules);
    # those tied to a row's tp, cp, ep or ZeRO stage act on their own rows
    check_facts_act(model, _base_parallel(parallel), training, layout=False)
    args = _as_float((anonymous(model), anonymous(system), anonymous(training)))
    devices = None if devices is None else list(devices)
    keys, cell, per = _grid(layouts, placements, int(chunk),
                            1 if devices is None else len(devices))
    total = len(keys) * len(INNER_GRID)
    done = [0]

    def tick(n):
        done[0] += n
        progress(done[0], total)

    if optimize is None:
        optimize = store is not None or len(layouts) >= QUICK_BELOW
    base = _base_parallel(parallel)
    if base is not None:
        check_search_facts(model, base)
        check_tp_userbuffers_precision(base, training)
        check_tp_userbuffers_system(base, system)
    outs = _evaluate(args, keys, per, temperature, devices, optimize, progress and tick, store,
                     fields, base)
    return _gather(cell, outs)


def facts_inert_rows(model, training, layouts, parallel=None) -> dict:
    """The rows of a layout table on which each framework fact (`parallel`, a mapping of
    Parallel facts as `search` takes it, and `training`) cannot act, by check_facts_act's
    per-layout rules, each row with its own tp, cp, ep, grid, zero_stage, recompute and
    sequence_parallel (`specs.validate.facts_inert`): {field: (boolean mask over the rows,
    [each failing rule's FactRule, for the first of its rows])}, only the facts inert on some
    row. `search` ranks those rows as the framework runs them, without the fact (its term is
    zero there); the CLI says how many. A fact that no layout can meet is
    `check_facts_act(..., layout=False)`'s error."""
    table = np.asarray(layouts)
    base = _base_parallel(parallel) or Parallel()
    check_facts_act(model, base, training, layout=False)
    cols = {c: table[:, COLUMNS.index(c)].astype(np.float64)
            for c in ("tp", "cp", "ep", "gx", "gy", "gz", "zero_stage", "recompute",
                      "sequence_parallel")}
    return {f: (np.array(np.broadcast_to(mask, len(table)), dtype=bool), texts)
            for f, (mask, texts) in facts_inert(model, base.replace(**cols), training).items()}


def search_sharded(model, system, training=None, layouts=None, *, devices=None, **kwargs):
    """`search` with the layout axis sharded over `devices` (default: all of `jax.devices()`).

    On one host with `XLA_FLAGS=--xla_force_host_platform_device_count=N` each CPU device is
    a thread, so this also spreads one search over the cores; across hosts, after
    `jax.distributed.initialize()`, `jax.devices()` spans them all. Results equal `search`'s
    (times to 2 float32 ulps).
    """
    return search(model, system, training, layouts, devices=devices or jax.devices(), **kwargs)


def ranked(result, k=None, key=None, keep=None) -> np.ndarray:
    """Indices of the layouts that fit, fastest first (ties keep the table order).

    `key` (one number a layout; default the step time) ranks in place of the step time, and
    `keep` (a boolean mask) leaves out the layouts where it is False: `diffperf search
    --robust` ranks by the top of each 95 % interval, `--in-envelope` keeps those inside."""
    key = np.asarray(result.step_time_s if key is None else key)
    keep = np.asarray(result.fits) & (True if keep is None else np.asarray(keep, dtype=bool))
    key = np.where(keep, key, np.inf)
    order = np.argsort(key, kind="stable")
    order = order[np.isfinite(key[order])]
    return order if k is None else order[:k]


def pareto_front(step_s, mem_bytes) -> np.ndarray:
    """Indices of the points no other point beats in both step time and memory, by step time.

    Sort by (step, memory); a point is on the front when its memory is below that of every
    faster point (ties in step time keep the smaller memory only).
    """
    step_s, mem_bytes = np.asarray(step_s), np.asarray(mem_bytes)
    order = np.lexsort((mem_bytes, step_s))
    mem = mem_bytes[order]
    best_before = np.minimum.accumulate(np.concatenate([[np.inf], mem[:-1]]))
    return order[mem < best_before]


# Columns in which the layouts of one near-tie group may differ (`merged`): the choices that
# leave the degrees, the micro-batch and so the work per device as they are.
TIE_COLUMNS = ("zero_stage", "recompute", "sequence_parallel", "placement")


def merged(result, layouts, k=None, tie=0.005, key=None, keep=None) -> list:
    """Groups of near-tied layouts among those that fit, first group first.

    Two layouts are near-tied when they differ only in TIE_COLUMNS (ZeRO stage, recompute,
    sequence parallelism, placement: the same degrees and micro-batch) and the step time of
    the slower is within `tie` (relative: 0.005 = 0.5 %) of the group's fastest layout,
    which represents the group. Walking the ranking (`ranked`), a layout joins the open group
    of its degrees when it is within `tie` of that group's fastest, else it opens a group.
    tie = 0: every layout its own group (the ranking). `key` and `keep` as in `ranked` (the
    tie then compares keys: `diffperf search --robust` merges layouts whose intervals' tops
    are within `tie`). Returns a list of at most `k` (None: all) int arrays of table
    indices, each best first.
    """
    order = ranked(result, key=key, keep=keep)
    score = np.asarray(result.step_time_s if key is None else key)
    same = np.ones(len(COLUMNS), dtype=bool)
    same[[COLUMNS.index(c) for c in TIE_COLUMNS]] = False
    degrees = np.asarray(layouts)[:, same]
    groups, open_group = [], {}
    for i in order:
        if k is not None and len(groups) >= k and score[i] > score[groups[-1][0]] * (1 + tie):
            break  # no later layout joins a listed group
        d = degrees[i].tobytes()
        g = open_group.get(d)
        if tie > 0 and g is not None and score[i] <= score[groups[g][0]] * (1 + tie):
            groups[g].append(i)
        elif k is None or len(groups) < k:
            open_group[d] = len(groups)
            groups.append([i])
    return [np.asarray(g, dtype=np.int64) for g in groups]
