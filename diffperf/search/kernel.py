"""The search kernel: `predict_step` over a grid of layouts in one jitted, nested vmap.

Factored evaluation: `predict_step` is vmapped twice, the outer axis over the degrees (tp, pp,
dp, cp, ep, vp, micro_batch, global_batch, the AxoNN grid gx, gy, gz) and the placement, the
inner axis over the 24 combinations of ZeRO stage, recompute and sequence parallelism (code
6 z + 2 r + sp). vmap batches an intermediate only along the axes its inputs vary on, so the
GEMM and attention times (functions of tp, cp, ep and the micro-batch) are computed once per
outer row rather than once per layout: the same hoisting that XLA does for the unbatched model
and system. Every layout still gets its own full prediction; only shared sub-expressions are
shared (benchmarks/README.md). Splitting the inner axis into three vmaps (4 x 3 x 2) was
measured and is slower on XLA:CPU (0.6-0.7x: fusion recomputes the smaller intermediates
inside the larger loops, and the broadcasts cost more than they save).

Outputs: `fields` keeps only some Result leaves (RANK_FIELDS: what ranking needs). Whether
that is faster depends on how XLA fuses the prediction: measured on 2 cores, 1.9-3.4x the
layouts/s of the whole Result before the uneven stages, ZeRO-3 and HSDP terms were merged,
0.6-0.9x after (XLA then fuses expensive intermediates into several loops instead of keeping
them once: benchmarks/README.md).

Static features: the kernel traces only the terms that some row of the table needs
(`predict.features_of` of its outer keys). A table without AxoNN grid rows traces the program
it had before the grid existed (gx, gy, gz stay unbatched scalars of 1, the grid's terms are
left out); a table with grid rows traces the grid's terms for every row, in one compilation.
Measured on GPT-3 175B / 1024 A100 with the grid (a cold `search` call, 2-core CPU): one
kernel for all 493,920 rows, 4.5 s; a second kernel for the 27,600 grid rows alone, 6.2 s
(its compilation costs more than the ~10% of run time it saves the Megatron rows).

Compiled programs can be kept across processes (`executables`).
"""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from diffperf.predict import features_of, predict_step
from diffperf.executables import executable
from diffperf.search.enumerate import COLUMNS, INNER, INNER_GRID, KEYS, OUTER, _placement_codes
from diffperf.specs.parallel import GRID, Parallel
from diffperf.specs.paths import leaf_path

_NO_GRID = tuple(k for k in KEYS if k not in GRID)  # batched when no row has the grid
DEFAULT_CHUNK = 1 << 16  # layouts per call: amortises dispatch, ~7 MB out, little padding
# XLA:CPU options of the search kernel, measured on 2 cores (benchmarks/README.md). XLA's
# fusion emitters at LLVM -O1 run the prediction 1.5x faster than the legacy loop emitter
# (GPT-3 table, idle machine, in turns: 10.6 against 7.0 M layouts/s; -O2 gives the same) and
# compile ~0.6 s slower (2.2 against 1.6 s), which the executable store pays once. The quick
# kernel (LLVM -O0, legacy emitter: it compiles ~2x faster again but runs ~8x slower) pays
# off for searches below QUICK_BELOW layouts (compile time saved > run time lost) when the
# compiled program is not kept (`executable`). Other backends keep their defaults. None of
# these changes a result (tests/test_search.py).
_CPU_COMPILER_OPTIONS = {"xla_cpu_use_fusion_emitters": True,
                         "xla_backend_optimization_level": 1}
_CPU_QUICK_OPTIONS = {"xla_cpu_use_fusion_emitters": False,
                      "xla_backend_optimization_level": 0}
QUICK_BELOW = 1_500_000
# What ranking the layouts of a table needs (search's `fields`): time, feasibility, memory
# (the Pareto front and the "no layout fits" message), MFU and throughput of every row.
RANK_FIELDS = ("step_time_s", "fits", "memory.total_bytes", "memory.capacity_bytes", "mfu",
               "tokens_per_s")


def _axes(batched) -> Parallel:
    """vmap in_axes: 0 for the fields in `batched`, None for the others."""
    return Parallel(**{f: (0 if f in batched else None) for f in Parallel.__dataclass_fields__})


def _batched(features) -> tuple:
    """The outer fields that vary between rows: KEYS, less gx, gy, gz when no row has the
    AxoNN grid (then they stay scalars of 1, and the program is the one without the grid)."""
    return KEYS if "axonn" in features else _NO_GRID


def _grid_predict_impl(model, parallel, system, training, temperature, features,
                       fields=None):
    """predict_step on an [outer, 24] grid: outer fields [n_o], INNER fields [24]; `fields`
    (Result leaf paths) keeps only those outputs, the others None (`_pruned`)."""
    f = jax.vmap(predict_step, in_axes=(None, _axes(INNER), None, None, None, None))
    f = jax.vmap(f, in_axes=(None, _axes(_batched(features)), None, None, None, None))
    return _pruned(f(model, parallel, system, training, temperature, features), fields)


def _pruned(result, fields):
    """The result with only the leaves at `fields` (paths such as 'step_time_s',
    'memory.total_bytes'), the others None; all of them for fields=None."""
    if fields is None:
        return result
    flat, treedef = jax.tree_util.tree_flatten_with_path(result)
    return jax.tree.unflatten(treedef, [x if leaf_path(p) in fields else None for p, x in flat])


_STATIC = ("temperature", "features", "fields")
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


def _chunk_parallel(keys: np.ndarray, dtype, features=frozenset(), base=None) -> Parallel:
    """The outer keys of one call as a Parallel: the `_batched(features)` columns [n], the
    inner grid [24]; the kernel must be called with the same `features`. The other fields
    are those of `base` (default: Parallel's defaults; float leaves, unbatched: a new value
    is not a new shape), so a new Parallel field needs no edit here."""
    base = Parallel() if base is None else base
    fields = {f: np.asarray(getattr(base, f), dtype) for f in Parallel.__dataclass_fields__}
    fields |= {c: np.asarray(keys[:, KEYS.index(c)], dtype=dtype) for c in _batched(features)}
    fields |= {c: np.asarray(INNER_GRID[:, i], dtype=dtype) for i, c in enumerate(INNER)}
    return Parallel(**fields)


def _grid(layouts, placements, chunk, n_dev):
    """(padded outer keys [n_o, len(KEYS)], cell index of each row, outer rows per call)."""
    keys, cell = _factor(layouts, _placement_codes(placements))
    per = _outer_per_chunk(chunk, len(keys), n_dev)
    pad = -(-len(keys) // per) * per - len(keys)
    return np.concatenate([keys, np.repeat(keys[-1:], pad, axis=0)]), cell, per


def _table_features(model, keys, training=None, base=None) -> frozenset:
    """predict.features_of for a table's outer keys (its ep, cp, gx, gy, gz columns), the
    framework facts of `base` (`_chunk_parallel`'s: e.g. tp_userbuffers, whose term is a
    feature) and the training (None: Training(), no XLA terms)."""
    base = Parallel() if base is None else base
    cols = {c: keys[:, KEYS.index(c)] for c in ("ep", "cp", *GRID)}
    return features_of(model, base.replace(**cols), training)


def _kernel_fn(devices, optimize=True):
    """(jitted grid kernel, its name) for the devices' backend (None: the default one);
    optimize=False picks the quick-compiling XLA:CPU variant (see _CPU_QUICK_OPTIONS)."""
    backend = jax.default_backend() if devices is None else devices[0].platform
    if backend != "cpu":
        return _grid_predict, "grid"
    if optimize:
        return _grid_predict_cpu, "grid-cpu-fusion-O1"
    return _grid_predict_cpu_quick, "grid-cpu-legacy-O0"


def _mesh(devices, axis: str) -> Mesh:
    return Mesh(np.asarray(devices), (axis,))


def _shardings(devices, axes_tree, axis="layouts"):
    """(whole, tree): the replicated NamedSharding over a 1-D mesh of the devices, and the
    shardings of a pytree whose leaves are 0 (split along their first axis) or None
    (replicated)."""
    mesh = _mesh(devices, axis)
    split = NamedSharding(mesh, PartitionSpec(axis))
    whole = NamedSharding(mesh, PartitionSpec())
    return whole, jax.tree.map(lambda ax: split if ax == 0 else whole, axes_tree,
                               is_leaf=lambda ax: ax is None)


def _kernel(devices, optimize=True, store=None):
    """fn(model, parallel, system, training, temperature, features) on the devices (None: the
    default one).

    With devices, each call's outer axis is split over a 1-D mesh (`NamedSharding`) and the
    rest replicated; jit partitions the computation from its inputs' shardings. With a
    `store`, the compiled program comes from it when it is there (`executable`).
    """
    fn, name = _kernel_fn(devices, optimize)

    def run(model, parallel, system, training, temperature, features, fields=None):
        args = (model, parallel, system, training)
        if devices is not None:
            whole, spec = _shardings(devices, _axes(_batched(features)))
            args = (jax.device_put(model, whole), jax.device_put(parallel, spec),
                    jax.device_put(system, whole), jax.device_put(training, whole))
        static = dict(temperature=temperature, features=features, fields=fields)
        if store is None:
            return fn(*args, **static)
        return executable(fn, name, args, static, store)(*args)

    return run
