"""The hardware grid of a sweep: System leaves and their values, checked, as points.

A grid is the outer product of one list of values per System leaf (paths as
`specs.paths.leaf_paths` names them: 'tiers[1].bandwidth_Bps', 'eff.mm_max', ...), first axis
slowest; tied leaves follow a swept one by a factor (the fp32 and vector peaks with the 16-bit
matrix peak, one chip).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from diffperf.errors import SpecError, closest
from diffperf.specs.paths import leaf_path, leaf_paths
from diffperf.specs.system import SWITCHES

# Leaves that must stay > 0 (a rate, a capacity or a domain); every other leaf is >= 0.
_POSITIVE = ("_Bps", "_per_s", "hbm_capacity_bytes", "domain_size")


def _check_axes(system, axes) -> tuple:
    """((path, values [n]) per axis), checked: System leaves, finite, >= 0 (> 0 for a rate,
    capacity or domain), each leaf once, and tier domains nested at every point."""
    paths = leaf_paths(system)
    if not axes:
        raise SpecError("a sweep needs at least one axis {System leaf path: values}, e.g. "
                        "{'tiers[1].bandwidth_Bps': [25e9, 50e9]}")
    out = []
    for path, values in dict(axes).items():
        if path not in paths:
            raise SpecError(f"sweep: unknown System leaf '{path}'{closest(path, paths)} "
                            f"(allowed: {', '.join(paths)})")
        v = np.asarray(values, dtype=np.float64).reshape(-1)
        low = 0.0 if not path.endswith(_POSITIVE) else np.finfo(np.float32).tiny
        bad = v[~np.isfinite(v) | (v < low)]
        if not len(v) or len(bad):
            rule = "> 0" if low > 0 else ">= 0"
            raise SpecError(f"sweep: {path}={bad[0] if len(bad) else '[]'} must be a finite "
                            f"number {rule} (a non-empty list of values)")
        off = v[(v != 0) & (v != 1)] if path in SWITCHES else v[:0]
        if len(off):
            raise SpecError(f"sweep: {path}={off[0]:g} is a switch (allowed: 0 or 1)")
        out.append((path, v))
    _check_nested(system, out)
    return tuple(out)


def _check_nested(system, axes) -> None:
    """Tiers are nested (innermost first): domain_size must not shrink outwards at any
    point of the grid (only the swept domains vary, so their outer product is checked)."""
    base = [float(t.domain_size) for t in system.tiers]
    dom = {f"tiers[{i}].domain_size": i for i in range(len(base))}
    swept = [(dom[p], v) for p, v in axes if p in dom]
    if not swept:
        return
    grids = np.meshgrid(*[v for _, v in swept], indexing="ij")
    sizes = [np.full(grids[0].shape, b) for b in base]
    for (i, _), g in zip(swept, grids):
        sizes[i] = g
    for i in range(1, len(sizes)):
        bad = np.argwhere(sizes[i] < sizes[i - 1])
        if len(bad):
            j = tuple(bad[0])
            raise SpecError(f"sweep: tiers[{i}].domain_size={sizes[i][j]:g} must be >= "
                            f"tiers[{i - 1}].domain_size={sizes[i - 1][j]:g} (tiers are "
                            f"nested, innermost first)")


def _points(axes, tied=None) -> dict:
    """{path: values [H]} of every grid point (first axis slowest) in the system's dtype, the
    tied leaves included (`tied`: {path: (swept path, factor)}, path = factor x swept)."""
    grids = np.meshgrid(*[v for _, v in axes], indexing="ij")
    out = {p: g.reshape(-1) for (p, _), g in zip(axes, grids)}
    out |= {p: factor * out[src] for p, (src, factor) in (tied or {}).items()}
    dtype = jnp.result_type(float)
    return {p: v.astype(dtype) for p, v in out.items()}


def _check_tied(system, axes, tied) -> dict:
    """{path: (swept path, factor)}: System leaves not swept themselves, tied to swept ones."""
    paths, swept = leaf_paths(system), [p for p, _ in axes]
    for path, (src, factor) in (tied or {}).items():
        if path in SWITCHES:
            raise SpecError(f"sweep: tied={{{path!r}: ({src!r}, {factor})}}: {path} is a switch "
                            f"(allowed: 0 or 1), not a leaf that follows a swept one by a "
                            f"factor; sweep it itself over 0 and 1")
        if path not in paths or path in swept or src not in swept or not factor > 0:
            raise SpecError(f"sweep: tied={{{path!r}: ({src!r}, {factor})}} must tie a System "
                            f"leaf that is not swept to a swept one ({', '.join(swept)}) by a "
                            f"factor > 0")
    return dict(tied or {})


def _with_leaves(system, leaves: dict):
    """The system with the leaves at the given paths replaced."""
    flat, treedef = jax.tree_util.tree_flatten_with_path(system)
    return jax.tree.unflatten(treedef, [leaves.get(leaf_path(p), x) for p, x in flat])


def _in_axes(system, swept):
    """vmap in_axes of the system: 0 for the swept leaves, None for the others."""
    flat, treedef = jax.tree_util.tree_flatten_with_path(system)
    return jax.tree.unflatten(treedef, [0 if leaf_path(p) in swept else None
                                        for p, _ in flat])
