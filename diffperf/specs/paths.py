"""Leaf paths of a spec pytree: the names by which sweeps, designs and sensitivities address
the leaves of a System ('matmul_flops_per_s', 'tiers[1].bandwidth_Bps', 'eff.mm_max') and
search keeps the leaves of a Result ('memory.total_bytes'). One place builds them, below
search, sensitivity and design, so that every one of them names a leaf alike."""

from __future__ import annotations

import jax


def leaf_path(key_path) -> str:
    """The path of one leaf from its key path (`jax.tree_util.tree_flatten_with_path`):
    `jax.tree_util.keystr` without the leading dot, e.g. 'tiers[0].bandwidth_Bps'."""
    return jax.tree_util.keystr(key_path).lstrip(".")


def leaf_paths(tree) -> list[str]:
    """Paths of the leaves in tree order: 'matmul_flops_per_s', 'tiers[0].bandwidth_Bps',
    'eff.mm_max', ... for a System (`leaf_path`)."""
    return [leaf_path(p) for p, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]


def leaf_values(tree) -> dict:
    """{path: value} of every leaf as a Python float (SI units for a System)."""
    return dict(zip(leaf_paths(tree), (float(v) for v in jax.tree.leaves(tree))))
