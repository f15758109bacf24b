"""Search: every valid parallel layout of a job, evaluated in one jitted, batched computation.

A layout table (numpy integers, one row a layout, columns `COLUMNS`) is enumerated from the
rules of `specs.validate.check_layout`, evaluated by `predict_step` in fixed-size chunks (one
compile per chunk shape: the placement is a numeric leaf of `Parallel`) and ranked by step
time among the layouts that fit in memory. `soft_best` is the differentiable soft-min over
the same table.

Factored evaluation: `predict_step` is vmapped twice, the outer axis over the degrees
(tp, pp, dp, cp, ep, vp, micro_batch, global_batch, and the AxoNN grid gx, gy, gz) and the
placement, the inner axis over the 24 combinations of ZeRO stage, recompute and sequence
parallelism. vmap batches an intermediate only along the
axes its inputs vary on, so the GEMM and attention times (functions of tp, cp, ep and the
micro-batch) are computed once per outer row rather than once per layout: the same hoisting
that XLA does for the unbatched model and system. Every layout still gets its own full
prediction; only shared sub-expressions are shared (benchmarks/README.md: about 10x the
layouts/s of a flat vmap on a 2-core CPU).

Static features: the kernel traces only the terms that some row of the table needs
(`predict.features_of` of its outer keys). A table without AxoNN grid rows traces the program
it had before the grid existed (gx, gy, gz stay unbatched scalars of 1, the grid's terms are
left out); a table with grid rows traces the grid's terms for every row, in one compilation.
Measured on GPT-3 175B / 1024 A100 with the grid (a cold `search` call, 2-core CPU): one
kernel for all 493,920 rows, 4.5 s; a second kernel for the 27,600 grid rows alone, 6.2 s
(its compilation costs more than the ~10% of run time it saves the Megatron rows).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from diffperf.api import _as_float, _is_concrete
from diffperf.errors import SpecError
from diffperf.predict import features_of, predict_step
from diffperf.specs.batch import anonymous
from diffperf.specs.parallel import GRID, PLACED, Parallel, placement_index
from diffperf.specs.training import Training
from diffperf.specs.validate import check_layout, stage_counts, stages_hold

# The placement stays the last column (callers select rows by `layouts[:, -1]`).
COLUMNS = ("tp", "pp", "dp", "cp", "ep", "vp", "micro_batch", "global_batch", "gx", "gy", "gz",
           "zero_stage", "recompute", "sequence_parallel", "placement")
OUTER = COLUMNS[:COLUMNS.index("zero_stage")]  # the degrees (and the grid)
KEYS = OUTER + ("placement",)  # the outer axis: degrees and the rank order (ORDERS index)
_NO_GRID = tuple(k for k in KEYS if k not in GRID)  # batched when no row has the grid
INNER = ("zero_stage", "recompute", "sequence_parallel")
# Placement orders (innermost first, specs.parallel.ORDERS): Megatron-LM's default, and the
# pipeline inside data parallelism (DP outermost, as AxoNN places it; PAPERS.md section 4.1).
PLACEMENTS = (("tp", "cp", "dp", "pp"), ("tp", "cp", "pp", "dp"))
# Every (zero_stage, recompute, sequence_parallel): the inner axis; code = 6 z + 2 r + sp.
INNER_GRID = np.array([(z, r, sp) for z in range(4) for r in range(3) for sp in range(2)])
DEFAULT_CHUNK = 1 << 16  # layouts per call: amortises dispatch, ~7 MB out, little padding
# XLA:CPU options of the search kernel, measured on 2 cores (benchmarks/README.md). The legacy
# loop emitter at LLVM -O1 compiles the prediction ~1.5-2x faster than XLA's default with the
# same steady-state speed; at -O0 it compiles ~2.5x faster again but runs ~8x slower, which
# pays off for searches below QUICK_BELOW layouts (compile time saved > run time lost).
# Other backends keep their defaults. None of these changes a result (tests/test_search.py).
_CPU_COMPILER_OPTIONS = {"xla_cpu_use_fusion_emitters": False,
                         "xla_backend_optimization_level": 1}
_CPU_QUICK_OPTIONS = _CPU_COMPILER_OPTIONS | {"xla_backend_optimization_level": 0}
QUICK_BELOW = 1_500_000


def _divisors(x: int) -> np.ndarray:
    r = np.arange(1, x + 1, dtype=np.int64)
    return r[x % r == 0]


def _whole(x, name: str) -> int:
    v = float(np.asarray(x))
    if v != int(v) or v < 1:
        raise SpecError(f"{name}={v:g} must be a whole number >= 1")
    return int(v)


def _expand(rows: dict, name: str, values, keep=None) -> dict:
    """Every row times every value of a new column `name` (it varies fastest), filtered."""
    values = np.asarray(values, dtype=np.int64)
    n = len(next(iter(rows.values())))
    out = {c: np.repeat(v, len(values)) for c, v in rows.items()}
    out[name] = np.tile(values, n)
    return out if keep is None else _keep(out, keep(out))


def _keep(rows: dict, mask) -> dict:
    return {c: v[mask] for c, v in rows.items()}


def _strides(rows: dict, order) -> np.ndarray:
    """Rank stride of tp, cp, dp, pp under a placement order (workload.groups.stride); 0 for
    a group of one device, whose stride changes nothing. The AxoNN grid sits in TP's slot
    (predict._placed), so the slot's size is tp x gx x gy x gz."""
    size = dict(rows, tp=rows["tp"] * rows["gx"] * rows["gy"] * rows["gz"])
    out, s = {}, np.ones_like(rows["tp"])
    for d in order:
        out[d] = np.where(size[d] > 1, s, 0)
        s = s * size[d]
    return np.stack([out[d] for d in PLACED], axis=1)


def _placement_codes(placements) -> np.ndarray:
    """specs.parallel.ORDERS index of each placement (SpecError for a bad one)."""
    return np.array([placement_index(p) for p in placements], dtype=np.int64)


def _model_ints(model) -> dict:
    return {f: int(round(float(np.asarray(getattr(model, f))))) for f in (
        "n_layers", "n_heads", "n_kv_heads", "ffn_hidden", "seq_len", "n_experts", "hidden",
        "head_dim")}


def _degrees(M: dict, n: int, B: int) -> dict:
    """(tp, pp, cp, dp, micro_batch, vp, ep) rows that satisfy check_layout's rules."""
    d = _divisors(n)
    kv = M["n_kv_heads"]
    tp_ok = (M["n_heads"] % d == 0) & (M["ffn_hidden"] % d == 0) & (
        (kv % d == 0) | (d % kv == 0))
    rows = {"tp": d[tp_ok]}
    # Every pp up to the layers: stages need not be equal (workload.pp.stage_layers).
    rows = _expand(rows, "pp", d[d <= M["n_layers"]], lambda r: n % (r["tp"] * r["pp"]) == 0)
    rows = _expand(rows, "cp", d[M["seq_len"] % d == 0],
                   lambda r: n % (r["tp"] * r["pp"] * r["cp"]) == 0)
    rows["dp"] = n // (rows["tp"] * rows["pp"] * rows["cp"])
    rows = _expand(rows, "micro_batch", _divisors(B),
                   lambda r: B % (r["micro_batch"] * r["dp"]) == 0)

    def vp_ok(r):
        """Interleaving needs pp > 1 and pp | m; enumerated: vp dividing the largest stage's
        layers (whole chunks there; the first and last stage, a layer short when the stages
        are uneven, fill one chunk less), and check_layout's stage sizes."""
        m = B // (r["micro_batch"] * r["dp"])
        zero = np.zeros_like(r["pp"])
        P = dict(pp=r["pp"], vp=r["vp"], pp_first_layers=zero, pp_last_layers=zero)
        first, _, mid_max, last = stage_counts(P, {"n_layers": M["n_layers"]})
        largest = np.maximum(np.maximum(first, last), np.where(r["pp"] > 2, mid_max, 0))
        return (r["vp"] == 1) | ((r["pp"] > 1) & (m % r["pp"] == 0) & (largest % r["vp"] == 0)
                                 & stages_hold(P, {"n_layers": M["n_layers"]}))

    rows = _expand(rows, "vp", _divisors(M["n_layers"]), vp_ok)
    experts = _divisors(M["n_experts"]) if M["n_experts"] > 0 else np.array([1])
    rows = _expand(rows, "ep", experts, lambda r: r["dp"] % r["ep"] == 0)
    return rows | {g: np.ones_like(rows["tp"]) for g in GRID}


def _grid_degrees(M: dict, n: int, B: int) -> dict:
    """AxoNN grid rows (gx, gy, gz, dp, micro_batch) that satisfy check_layout's grid rules
    (specs.validate._check_grid; PAPERS.md sections 4.1, 4.4), with tp = pp = cp = ep = vp = 1
    (the 4D algorithm: no pipeline, the grid in place of Megatron TP):

        G = gx gy gz > 1, dp = n / G; gx | hidden; gy | num_heads, gy | ffn_hidden, and gy |
        num_kv_heads or the reverse; gz | (n_out k_in)/(gx gy) of the attention-output
        (h x a d_h) and MLP (h x f) weights; micro_batch x dp x gz | global_batch.
    No rows for an MoE model (the grid shards dense weights only).
    """
    d = _divisors(n)
    if M["n_experts"] > 0:
        d = d[:0]
    h, a, kv, f, dh = (M[k] for k in ("hidden", "n_heads", "n_kv_heads", "ffn_hidden",
                                      "head_dim"))
    gy = d[(a % d == 0) & (f % d == 0) & ((kv % d == 0) | (d % kv == 0))]
    rows = _expand({"gx": d[h % d == 0]}, "gy", gy, lambda r: n % (r["gx"] * r["gy"]) == 0)

    def gz_ok(r):
        xy, G = r["gx"] * r["gy"], r["gx"] * r["gy"] * r["gz"]
        return (n % G == 0) & (G > 1) & ((h * a * dh // xy) % r["gz"] == 0) & (
            (h * f // xy) % r["gz"] == 0)

    rows = _expand(rows, "gz", d, gz_ok)
    rows["dp"] = n // (rows["gx"] * rows["gy"] * rows["gz"])
    rows = _expand(rows, "micro_batch", _divisors(B),
                   lambda r: B % (r["micro_batch"] * r["dp"] * r["gz"]) == 0)
    return rows | {c: np.ones_like(rows["gx"]) for c in ("tp", "pp", "cp", "ep", "vp")}


def _tables(deg: dict, inner: np.ndarray, placements) -> list:
    """The degree rows x inner grid, one table per placement; a row is kept under an order
    only when its group strides differ from those under every earlier order."""
    outer = np.stack([deg[c] for c in OUTER], axis=1)
    strides = [_strides(deg, order) for order in placements]
    tables = []
    for j in range(len(placements)):
        new = np.ones(len(outer), dtype=bool)
        for i in range(j):
            new &= (strides[j] != strides[i]).any(axis=1)
        tables.append(_product(outer[new], inner, j))
    return tables


def _inner_grid(zero_stages, recompute, sequence_parallel) -> np.ndarray:
    """The (zero_stage, recompute, sequence_parallel) rows asked for, in INNER_GRID order."""
    for name, values, hi in (("zero_stages", zero_stages, 3), ("recompute", recompute, 2),
                             ("sequence_parallel", sequence_parallel, 1)):
        bad = [v for v in values if v not in range(hi + 1)]
        if bad or not len(values):
            raise SpecError(f"{name}={tuple(values)} must be a non-empty subset of "
                            f"0..{hi}")
    keep = (np.isin(INNER_GRID[:, 0], zero_stages) & np.isin(INNER_GRID[:, 1], recompute)
            & np.isin(INNER_GRID[:, 2], sequence_parallel))
    return INNER_GRID[keep]


def _product(outer: np.ndarray, inner: np.ndarray, placement: int) -> np.ndarray:
    """Rows outer x inner (inner fastest) with the placement index; SP only where tp > 1."""
    table = np.empty((len(outer) * len(inner), len(COLUMNS)), dtype=np.int32)
    table[:, :len(OUTER)] = np.repeat(outer, len(inner), axis=0)
    table[:, len(OUTER):-1] = np.tile(inner, (len(outer), 1))
    table[:, -1] = placement
    sp, tp = table[:, COLUMNS.index("sequence_parallel")], table[:, 0]
    return table[(sp == 0) | (tp > 1)]


def enumerate_layouts(model, n_devices, global_batch, *, placements=PLACEMENTS,
                      zero_stages=(0, 1, 2, 3), recompute=(0, 1, 2),
                      sequence_parallel=(0, 1), axonn=False) -> np.ndarray:
    """Every structurally valid layout of `n_devices` for the model, as an int32 table.

    Rules (those of `specs.validate.check_layout`): tp x pp x cp x dp = n_devices; tp divides
    num_heads and ffn_hidden, and num_kv_heads or the reverse; pp <= num_layers (stages
    balanced automatically, uneven when pp does not divide them), vp divides the largest
    stage's layers (`_degrees`) and every stage holds enough of them (check_layout); cp
    divides seq_len; micro_batch x dp divides global_batch; vp > 1 needs pp > 1 and the
    micro-batches m a multiple of pp; ep divides dp and moe_experts (MoE models only);
    sequence parallelism only with tp > 1. Placement `j` is `placements[j]`; an order that
    gives a layout the same group strides as an earlier one is dropped (it is the same job).
    With `axonn`, the AxoNN 4D layouts follow (`_grid_degrees`: gx x gy x gz x dp =
    n_devices, tp = pp = 1, sequence parallelism off, every ZeRO stage and recompute mode
    asked for; the grid takes TP's slot of each placement order, so with pp = 1 the default
    orders give one placement).
    Returns:
        int32 array [n_layouts, len(COLUMNS)]: the layouts without the grid (gx = gy = gz =
        1), rows sorted by placement, then degrees, with (zero_stage, recompute,
        sequence_parallel) varying fastest; then, with `axonn`, the grid layouts in the same
        order (`axonn_mask` tells them apart).
    Example: gpt3-175b on 1024 devices with global batch 1536: 272,280 layouts in Megatron's
    placement and 194,040 more with the pipeline inside data parallelism; `axonn=True` adds
    27,600 grid layouts.
    """
    n, B = _whole(n_devices, "n_devices"), _whole(global_batch, "global_batch")
    _placement_codes(placements)
    inner = _inner_grid(zero_stages, recompute, sequence_parallel)
    M = _model_ints(model)
    tables = []
    for deg in (_degrees(M, n, B), _grid_degrees(M, n, B)) if axonn else (_degrees(M, n, B),):
        deg["global_batch"] = np.full_like(deg["tp"], B)
        tables += _tables(deg, inner, placements)
    table = np.concatenate(tables)
    if not len(table):
        raise SpecError(
            f"no valid layout of n_devices={n} with global_batch={B}: tp x pp x cp x dp must "
            f"equal n_devices with tp dividing num_heads={M['n_heads']}, pp at most "
            f"num_layers={M['n_layers']}, cp dividing seq_len={M['seq_len']} and "
            f"micro_batch x dp dividing global_batch")
    return table


def axonn_mask(layouts) -> np.ndarray:
    """True for the rows of a layout table that use the AxoNN grid (gx x gy x gz > 1)."""
    layouts = np.asarray(layouts)
    return np.prod(layouts[:, [COLUMNS.index(g) for g in GRID]], axis=1) > 1


def parallel_of(row, placements=PLACEMENTS) -> Parallel:
    """One row of a layout table as a `Parallel` (float leaves; placement as an ORDERS index)."""
    fields = {c: float(row[i]) for i, c in enumerate(COLUMNS[:-1])}
    return Parallel(**fields, placement=placement_index(placements[int(row[-1])]))


# ------------------------------------------------------------------------------------------
# Factored evaluation
# ------------------------------------------------------------------------------------------

def _axes(batched) -> Parallel:
    """vmap in_axes: 0 for the fields in `batched`, None for the others."""
    return Parallel(**{f: (0 if f in batched else None) for f in Parallel.__dataclass_fields__})


def _batched(features) -> tuple:
    """The outer fields that vary between rows: KEYS, less gx, gy, gz when no row has the
    AxoNN grid (then they stay scalars of 1, and the program is the one without the grid)."""
    return KEYS if "axonn" in features else _NO_GRID


def _grid_predict_impl(model, parallel, system, training, temperature, features):
    """predict_step on an [outer, inner] grid: outer fields [n_o], inner fields [24]."""
    f = jax.vmap(predict_step, in_axes=(None, _axes(INNER), None, None, None, None))
    f = jax.vmap(f, in_axes=(None, _axes(_batched(features)), None, None, None, None))
    return f(model, parallel, system, training, temperature, features)


_STATIC = ("temperature", "features")
_grid_predict = jax.jit(_grid_predict_impl, static_argnames=_STATIC)
_grid_predict_cpu = jax.jit(_grid_predict_impl, static_argnames=_STATIC,
                            compiler_options=_CPU_COMPILER_OPTIONS)
_grid_predict_cpu_quick = jax.jit(_grid_predict_impl, static_argnames=_STATIC,
                                  compiler_options=_CPU_QUICK_OPTIONS)


def _factor(rows: np.ndarray, codes: np.ndarray):
    """(outer keys [n_o, len(KEYS)], cell index of each row in the [n_o, 24] grid).

    One outer key (degrees, ORDERS index of the placement) per run of rows with equal keys:
    exact for any table (a key repeated in two runs is evaluated twice), one key per degree
    combination and placement for `enumerate_layouts`'s order, and linear time
    (np.unique(axis=0) sorts and costs seconds at 10^6 rows).
    """
    degrees = np.concatenate([rows[:, :len(OUTER)], codes[rows[:, -1]][:, None]], axis=1)
    start = np.ones(len(rows), dtype=bool)
    start[1:] = (degrees[1:] != degrees[:-1]).any(axis=1)
    outer = np.cumsum(start) - 1
    z, r, sp = (rows[:, COLUMNS.index(c)] for c in INNER)
    return degrees[start], outer * len(INNER_GRID) + (6 * z + 2 * r + sp).astype(np.int64)


def _outer_per_chunk(chunk: int, n_outer: int, n_dev: int) -> int:
    """Outer rows per call: chunk / 24 per device, or the next power of two above the job
    when smaller (few distinct shapes, so few compiles; the last call is padded)."""
    per = max(1, min(chunk // len(INNER_GRID), 1 << int(np.ceil(np.log2(max(n_outer, 1))))))
    return per * n_dev


def _chunk_parallel(keys: np.ndarray, dtype, features=frozenset()) -> Parallel:
    """The outer keys of one call as a Parallel: the `_batched(features)` columns [n], the
    inner grid [24]; the kernel must be called with the same `features`."""
    fields = {c: np.asarray(keys[:, KEYS.index(c)], dtype=dtype) for c in _batched(features)}
    inner = {c: np.asarray(INNER_GRID[:, i], dtype=dtype) for i, c in enumerate(INNER)}
    return Parallel(**fields, **inner, dp_overlap=np.asarray(1.0, dtype),
                    tp_overlap=np.asarray(0.0, dtype))


def _kernel(devices, optimize=True):
    """fn(model, parallel, system, training, temperature, features) on the devices (None: the
    default one).

    With devices, each call's outer axis is split over a 1-D mesh (`NamedSharding`) and the
    rest replicated; jit partitions the computation from its inputs' shardings. optimize=False
    picks the quick-compiling XLA:CPU variant (see _CPU_QUICK_OPTIONS).
    """
    backend = jax.default_backend() if devices is None else devices[0].platform
    fn = _grid_predict if backend != "cpu" else (
        _grid_predict_cpu if optimize else _grid_predict_cpu_quick)
    if devices is None:
        return fn
    mesh = Mesh(np.asarray(devices), ("layouts",))
    split = NamedSharding(mesh, PartitionSpec("layouts"))
    whole = NamedSharding(mesh, PartitionSpec())

    def run(model, parallel, system, training, temperature, features):
        spec = jax.tree.map(lambda ax: split if ax == 0 else whole,
                            _axes(_batched(features)))
        return fn(jax.device_put(model, whole), jax.device_put(parallel, spec),
                  jax.device_put(system, whole), jax.device_put(training, whole),
                  temperature=temperature, features=features)

    return run


def _grid(layouts, placements, chunk, n_dev):
    """(padded outer keys [n_o, len(KEYS)], cell index of each row, outer rows per call)."""
    keys, cell = _factor(layouts, _placement_codes(placements))
    per = _outer_per_chunk(chunk, len(keys), n_dev)
    pad = -(-len(keys) // per) * per - len(keys)
    return np.concatenate([keys, np.repeat(keys[-1:], pad, axis=0)]), cell, per


def _table_features(model, keys, training=None) -> frozenset:
    """predict.features_of for a table's outer keys (its ep, cp, gx, gy, gz columns)."""
    cols = {c: keys[:, KEYS.index(c)] for c in ("ep", "cp", *GRID)}
    return features_of(model, Parallel(**cols), training)


def _evaluate(args, keys, per, temperature, devices, optimize, progress) -> list:
    """Results (device arrays [per, 24]) of the calls over the chunks of the outer keys."""
    model, system, training = args
    features = _table_features(model, keys, training)
    dtype = jnp.result_type(float)
    fn = _kernel(devices, optimize)
    outs = []
    for i in range(0, len(keys), per):
        parallel = _chunk_parallel(keys[i:i + per], dtype, features)
        outs.append(fn(model, parallel, system, training, temperature, features))
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


def search(model, system, training=None, layouts=None, *, placements=PLACEMENTS,
           chunk=DEFAULT_CHUNK, temperature=None, devices=None, validate=True, optimize=None,
           progress=None):
    """Predictions of every layout of a table, one entry per row (a `Result` of numpy arrays).

    One jitted nested vmap of `predict_step` (module docstring) for every placement, called on
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
        optimize: XLA:CPU code optimization of the kernel; None: only for tables of
            QUICK_BELOW layouts or more (smaller ones finish sooner with quick compilation).
        progress: optional callable(done, total), in grid cells, after each chunk.
    Returns:
        `Result` whose leaves are numpy arrays [n_layouts] in table order.
    """
    if layouts is None:
        raise SpecError("search needs a layout table (see enumerate_layouts)")
    layouts = _check_table(model, layouts, placements) if validate else np.asarray(layouts)
    training = Training() if training is None else training
    args = _as_float((anonymous(model), anonymous(system), anonymous(training)))
    devices = None if devices is None else list(devices)
    keys, cell, per = _grid(layouts, placements, int(chunk),
                            1 if devices is None else len(devices))
    total = len(keys) * len(INNER_GRID)
    done = [0]

    def tick(n):
        done[0] += n
        progress(done[0], total)

    optimize = len(layouts) >= QUICK_BELOW if optimize is None else optimize
    outs = _evaluate(args, keys, per, temperature, devices, optimize, progress and tick)
    return _gather(cell, outs)


def search_sharded(model, system, training=None, layouts=None, *, devices=None, **kwargs):
    """`search` with the layout axis sharded over `devices` (default: all of `jax.devices()`).

    On one host with `XLA_FLAGS=--xla_force_host_platform_device_count=N` each CPU device is
    a thread, so this also spreads one search over the cores; across hosts, after
    `jax.distributed.initialize()`, `jax.devices()` spans them all. Results equal `search`'s
    (times to 2 float32 ulps).
    """
    return search(model, system, training, layouts, devices=devices or jax.devices(), **kwargs)


def ranked(result, k=None) -> np.ndarray:
    """Indices of the layouts that fit, fastest first (ties keep the table order)."""
    step = np.where(np.asarray(result.fits), np.asarray(result.step_time_s), np.inf)
    order = np.argsort(step, kind="stable")
    order = order[np.isfinite(step[order])]
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


# ------------------------------------------------------------------------------------------
# Differentiable soft search
# ------------------------------------------------------------------------------------------

class SoftBest(struct.PyTreeNode):
    """Soft-min over layouts: differentiable in the model, system and training leaves."""

    step_time_s: Any  # exp(J): the soft-min step time; -> the best feasible one as tau -> 0
    weights: Any      # softmax weight of each layout (table order), sums to 1


def _soft_scores_impl(model, keys, system, training, tau, smooth, features):
    """s = ln T + softplus(-margin / tau) on the [chunks, outer, 24] grid; each chunk is
    rematerialised in the backward pass (jax.checkpoint), so memory stays one chunk's."""
    dtype = keys.dtype

    def one(k):
        parallel = _chunk_parallel(np.zeros((0, len(KEYS))), dtype, features)
        parallel = parallel.replace(**{c: k[:, KEYS.index(c)] for c in _batched(features)})
        r = _grid_predict_impl(model, parallel, system, training, smooth, features)
        return jnp.log(r.step_time_s) + jax.nn.softplus(-r.fit_margin_frac / tau)

    return jax.lax.map(jax.checkpoint(one), keys)


_soft_scores = jax.jit(_soft_scores_impl, static_argnames=("smooth", "features"))
_soft_scores_cpu = jax.jit(_soft_scores_impl, static_argnames=("smooth", "features"),
                           compiler_options=_CPU_COMPILER_OPTIONS)


def soft_best(model, system, training, layouts, temperature, *, placements=PLACEMENTS,
              smooth=None, chunk=1 << 13) -> SoftBest:
    """Soft-min over layouts of the log step time, with a soft memory-feasibility penalty:

        J = -tau log sum_i exp(-s_i / tau),   s_i = ln T_i + softplus(-m_i / tau)

    T_i = step time, m_i = `Result.fit_margin_frac` ((capacity - total) / capacity) of layout
    i. As tau -> 0 the penalty vanishes for layouts that fit and grows as -m_i / tau for those
    that do not, so J -> ln min_{fits} T_i, with min s - tau ln n <= J <= min s. For tau > 0
    the memory capacity gets a gradient (DESIGN.md, differentiable search).
    Args:
        temperature: tau > 0 (dimensionless: a relative spread in step time).
        smooth: the model's own temperature (None: exact model) inside each prediction.
        chunk: layouts per rematerialised block of the backward pass.
    Returns:
        `SoftBest` (step_time_s = exp J, weights = softmax(-s / tau)).
    """
    tau = temperature
    if not isinstance(tau, jax.core.Tracer) and not float(tau) > 0:
        raise SpecError(f"temperature={tau} must be > 0 for the soft search")
    layouts = np.asarray(layouts)
    training = Training() if training is None else training
    model, system, training = _as_float((anonymous(model), anonymous(system),
                                         anonymous(training)))
    dtype = jnp.result_type(float)
    # compiler_options are allowed on a top-level jit only, not inside the caller's jit.
    top = _is_concrete((model, system, training, tau))
    fn = _soft_scores_cpu if top and jax.default_backend() == "cpu" else _soft_scores
    keys, cell, per = _grid(layouts, placements, int(chunk), 1)
    features = _table_features(model, keys, training)
    grid = fn(model, keys.reshape(-1, per, len(KEYS)).astype(dtype), system, training, tau,
              smooth=smooth, features=features)
    scores = grid.reshape(-1)[cell]
    logits = -scores / tau
    lse = jax.nn.logsumexp(logits)
    return SoftBest(step_time_s=jnp.exp(-tau * lse), weights=jnp.exp(logits - lse))
