"""Hardware sweeps: the best layouts of a table at every point of a grid of hardware values.

A sweep evaluates every layout of a table (`enumerate_layouts`) at every point of a grid over
System leaves (the outer product of one list of values per leaf: bandwidths, FLOP/s, HBM,
domain sizes, efficiencies) and keeps, per hardware point, only the `top` fastest layouts
that fit, their step time and memory, and how many fit: never the layouts x points results,
so 10^9 points need a few MB.

One call of the kernel evaluates a block of hardware points (the swept leaves batched, vmap)
against the whole table, scanning it in chunks of the factored grid (`search.kernel`) with a
running top-k per point (`lax.scan`): memory is one chunk's. vmap batches an intermediate only
along the axes its inputs vary on, so a sweep over network leaves computes the GEMM times once
per chunk, not once per point. With several devices each call's hardware points are split
over a 1-D mesh (`jax.sharding`, `shard_map`): every device runs the single-device program on
its share, with no communication, so throughput grows linearly with the devices.
Ties in step time keep the layout that comes first in the table (as `ranked` does).
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jax.sharding import PartitionSpec

from diffperf.api import _as_float
from diffperf.errors import SpecError
from diffperf.search.enumerate import KEYS, PLACEMENTS
from diffperf.search.evaluate import _check_table
from diffperf.executables import executable
from diffperf.search.hardware import (_check_axes, _check_tied, _in_axes, _points,
                                      _with_leaves)
from diffperf.search.kernel import (_CPU_COMPILER_OPTIONS, INNER_GRID, _batched,
                                    _chunk_parallel, _grid, _grid_predict_impl, _mesh, _shardings,
                                    _table_features)
from diffperf.specs.batch import anonymous
from diffperf.specs.paths import leaf_path
from diffperf.specs.training import Training
from diffperf.specs.validate import check_facts_act, check_precision

_SWEEP_FIELDS = ("step_time_s", "fits", "memory.total_bytes")  # what a point keeps
SWEEP_CELLS = 1 << 16  # grid cells (layouts x hardware points) per scan step and device
POINTS_PER_CALL = 8    # hardware points per call and device (most: fewer when H is small)


class Sweep(struct.PyTreeNode):
    """The best layouts at every point of a hardware grid (shape = one axis per swept leaf)."""

    paths: tuple = struct.field(pytree_node=False)  # swept System leaves, slowest axis first
    values: tuple          # numpy [n_k] per path, SI units
    step_time_s: Any       # [*shape, top]: fastest layouts that fit (inf: fewer fit)
    index: Any             # int [*shape, top]: their rows of the layout table (-1: none)
    memory_bytes: Any      # [*shape, top]: their memory per device (nan: none)
    n_fits: Any            # int [*shape]: layouts of the table that fit
    n_layouts: int = struct.field(pytree_node=False, default=0)

    @property
    def shape(self) -> tuple:
        return tuple(len(v) for v in self.values)

    @property
    def n_points(self) -> int:
        """Layouts x hardware points evaluated."""
        return self.n_layouts * int(np.prod(self.shape))


def _chunk_top(t, mem, ids, top):
    """(times [top], cells [top], memory [top]) of the `top` smallest times of one point's
    chunk, ties to the lower cell: `top` rounds of min, then mask it out. No reshape of the
    [per, 24] grid (reshaping the kernel's outputs inside the program made XLA:CPU's kernel
    2-4x slower)."""
    big = jnp.iinfo(jnp.int32).max
    out_t, out_i, out_m = [], [], []
    for _ in range(top):
        t_min = jnp.min(t)
        i = jnp.min(jnp.where(t == t_min, ids, big))
        out_t.append(t_min)
        out_i.append(i)
        out_m.append(jnp.sum(jnp.where(ids == i, mem, 0.0)))
        t = jnp.where(ids == i, jnp.inf, t)
    return jnp.stack(out_t), jnp.stack(out_i), jnp.stack(out_m)


def _block_best(model, keys, valid, system, training, temperature, features, top, swept):
    """(step [h, top], cell [h, top], memory [h, top], n_fits [h]) of a block of h hardware
    points (the swept leaves [h]) over the table's grid, scanned chunk by chunk.

    keys [c, per, len(KEYS)] outer keys, valid [c, per, 24] (cells that are rows of the
    table). Each chunk's top-k is merged with the running one, which comes first, so
    ties keep the earlier cell (lax.top_k puts the lower index first among equal values).
    """
    per = keys.shape[1]
    n_h = next(np.shape(x)[0] for x in jax.tree.leaves(system) if np.ndim(x))
    axes = _in_axes(system, swept)
    ids = jnp.arange(per * len(INNER_GRID), dtype=jnp.int32).reshape(per, -1)

    def one_chunk(carry, xs):
        k, ok, base = xs
        parallel = _chunk_parallel(np.zeros((0, len(KEYS))), keys.dtype, features)
        parallel = parallel.replace(**{c: k[:, KEYS.index(c)] for c in _batched(features)})

        def at(sys):
            r = _grid_predict_impl(model, parallel, sys, training, temperature, features,
                                   _SWEEP_FIELDS)
            t = jnp.where(r.fits & ok, r.step_time_s, jnp.inf)
            return (*_chunk_top(t, r.memory.total_bytes, ids, top),
                    jnp.sum(jnp.isfinite(t), dtype=jnp.int32))

        t, i, mem, n = jax.vmap(at, in_axes=(axes,))(system)  # [h, top] (n: [h])
        best_t, best_c, best_m, count = carry
        neg, j = jax.lax.top_k(-jnp.concatenate([best_t, t], axis=1), top)
        pick = lambda a, b: jnp.take_along_axis(jnp.concatenate([a, b], axis=1), j, axis=1)  # noqa
        return (-neg, pick(best_c, base + i), pick(best_m, mem), count + n), None

    init = (jnp.full((n_h, top), jnp.inf, keys.dtype), jnp.full((n_h, top), -1, jnp.int32),
            jnp.full((n_h, top), jnp.nan, keys.dtype), jnp.zeros((n_h,), jnp.int32))
    bases = jnp.arange(keys.shape[0], dtype=jnp.int32) * (per * len(INNER_GRID))
    out, _ = jax.lax.scan(one_chunk, init, (keys, valid, bases))
    return out


def _sweep_impl(model, keys, valid, system, training, temperature, features, top, swept,
                mesh=None):
    """`_block_best`, with the hardware points split over the mesh's devices (shard_map:
    each runs the single-device program on its share) when there is a mesh."""
    best = functools.partial(_block_best, temperature=temperature, features=features, top=top,
                             swept=swept)
    if mesh is None:
        return best(model, keys, valid, system, training)
    split, whole = PartitionSpec("points"), PartitionSpec()
    flat, treedef = jax.tree_util.tree_flatten_with_path(system)
    specs = jax.tree.unflatten(treedef, [split if leaf_path(p) in swept else whole
                                         for p, _ in flat])
    return jax.shard_map(best, mesh=mesh, in_specs=(whole, whole, whole, specs, whole),
                         out_specs=split, check_vma=False)(model, keys, valid, system, training)


_SWEEP_STATIC = ("temperature", "features", "top", "swept", "mesh")
_sweep_jit = jax.jit(_sweep_impl, static_argnames=_SWEEP_STATIC)
_sweep_jit_cpu = jax.jit(_sweep_impl, static_argnames=_SWEEP_STATIC,
                         compiler_options=_CPU_COMPILER_OPTIONS)


def _table_grid(layouts, placements, cells, dtype):
    """(outer keys [c, per, len(KEYS)], valid cells [c, per, 24], table row of each cell
    (-1: none), features) of a table, in chunks of `cells` grid cells."""
    keys, cell, per = _grid(layouts, placements, cells, 1)
    n_cells = len(keys) * len(INNER_GRID)
    valid = np.zeros(n_cells, dtype=bool)
    valid[cell] = True
    row_of = np.full(n_cells, -1, dtype=np.int64)
    row_of[cell] = np.arange(len(cell))
    c = len(keys) // per
    return (keys.reshape(c, per, len(KEYS)).astype(dtype), valid.reshape(c, per, -1), row_of,
            keys)


def _placers(devices, system, swept):
    """(put_whole, put_system): functions that place a call's arguments on the devices, the
    model, table and training replicated, the system's swept leaves split (without devices:
    the default device, and the system as it is). The fixed arguments are placed once per
    sweep, not copied again with every block; the system, once per block."""
    if devices is None:
        return jax.device_put, (lambda s: s)
    whole, spec = _shardings(devices, _in_axes(system, swept), axis="points")
    return (lambda x: jax.device_put(x, whole)), (lambda s: jax.device_put(s, spec))


def sweep(model, system, training, layouts, axes, *, placements=PLACEMENTS, top=1,
          temperature=None, devices=None, validate=True, cells=SWEEP_CELLS,
          points_per_call=POINTS_PER_CALL, progress=None, store=None, tied=None) -> Sweep:
    """The `top` fastest layouts that fit at every point of a hardware grid.

    Args:
        model, system, training: specs (training defaults to `Training()`).
        layouts: a layout table (`enumerate_layouts`); every row at every point.
        axes: {System leaf path: values (SI)}, e.g. {'tiers[1].bandwidth_Bps': [25e9, 5e10],
            'hbm_capacity_bytes': [...]}: the grid is their outer product, first axis slowest
            (paths as `specs.paths.leaf_paths` names them).
        top: layouts kept per point.
        temperature: None for the exact model, > 0 for its smooth variant.
        devices: None for the default device; a list of devices splits each call's hardware
            points over a 1-D mesh of them (`NamedSharding`, `shard_map`).
        validate: check every row with `check_layout`.
        cells: layouts x points per scan step and device (bounds memory).
        points_per_call: hardware points per call and device (a call scans the whole table).
        progress: optional callable(done, total), in layout x hardware points, after a call.
        store: optional executable store, as for `search`.
        tied: {System leaf path: (swept path, factor)}: leaves that follow a swept one
            (e.g. the fp32 and vector peaks with the 16-bit matrix peak, one chip).
    Returns:
        `Sweep` with arrays of shape [*grid] (n_fits) and [*grid, top]. A row on which a
        fact of `training` cannot act (`search.facts_inert_rows`) is counted and ranked as
        the framework runs it, without the fact; a fact that no row can meet is refused.
    Example: GPT-3 175B on 1024 A100 (474,720 layouts) x 32 InfiniBand bandwidths x 64 HBM
    bandwidths: 972 M points, of which the sweep keeps 2,048 x 4 numbers.
    """
    axes = _check_axes(system, axes)
    tied = _check_tied(system, axes, tied)
    if int(top) != top or top < 1:
        raise SpecError(f"top={top} must be a whole number >= 1")
    layouts = _check_table(model, layouts, placements) if validate else np.asarray(layouts)
    training = Training() if training is None else training
    check_precision(system, training)
    check_facts_act(model, None, training, layout=False)
    model_, system_, training_ = _as_float((anonymous(model), anonymous(system),
                                           anonymous(training)))
    dtype = jnp.result_type(float)
    points = _points(axes, tied)
    paths = tuple(points)
    n_h = len(points[paths[0]])
    devices = None if devices is None else list(devices)
    n_dev = 1 if devices is None else len(devices)
    h_dev = max(1, min(int(points_per_call), -(-n_h // n_dev)))
    h_call = h_dev * n_dev
    keys, valid, row_of, flat_keys = _table_grid(layouts, placements,
                                                 max(len(INNER_GRID), int(cells) // h_dev), dtype)
    features = _table_features(model_, flat_keys, training_)
    cpu = (jax.default_backend() if devices is None else devices[0].platform) == "cpu"
    fn, name = (_sweep_jit_cpu, "sweep-cpu-fusion-O1") if cpu else (_sweep_jit, "sweep-default")
    mesh = None if devices is None else _mesh(devices, "points")
    static = dict(temperature=temperature, features=features, top=int(top), swept=paths,
                  mesh=mesh)
    out = [np.empty((n_h, top), dtype), np.empty((n_h, top), np.int64),
           np.empty((n_h, top), dtype), np.empty(n_h, np.int64)]
    total, n = n_h * len(layouts), len(layouts)

    def collect(i, result):
        m = min(h_call, n_h - i)
        for dst, src in zip(out, result):
            dst[i:i + m] = np.asarray(src)[:m]
        if progress is not None:
            progress((i + m) * n, total)

    put_whole, put_system = _placers(devices, system_, paths)
    fixed = tuple(put_whole(x) for x in (model_, keys, valid))
    training_ = put_whole(training_)
    pending = None
    for i in range(0, n_h, h_call):
        block = {p: np.resize(v[i:i + h_call], h_call) if n_h - i < h_call else v[i:i + h_call]
                 for p, v in points.items()}
        args = (*fixed, put_system(_with_leaves(system_, block)), training_)
        result = (fn(*args, **static) if store is None
                  else executable(fn, name, args, static, store)(*args))
        if pending is not None:
            collect(*pending)
        pending = (i, result)
    collect(*pending)
    step_t, cell, mem, n_fits = out
    index = np.where(np.isfinite(step_t) & (cell >= 0), row_of[np.maximum(cell, 0)], -1)
    shape = tuple(len(v) for _, v in axes)
    return Sweep(paths=tuple(p for p, _ in axes), values=tuple(v for _, v in axes),
                 step_time_s=step_t.reshape(*shape, top), index=index.reshape(*shape, top),
                 memory_bytes=np.where(index >= 0, mem, np.nan).reshape(*shape, top),
                 n_fits=n_fits.reshape(shape), n_layouts=n)
