"""Batches of specs: one pytree whose leaves have a leading axis (STYLE.md section 3)."""

from __future__ import annotations

import jax
import numpy as np


def anonymous(spec):
    """The spec with its static labels (names, a system's GPU generation) blanked, so specs
    that differ only by label share one tree structure (and one compilation)."""
    def strip(node):
        if not (hasattr(node, "name") and hasattr(node, "replace")):
            return node
        return node.replace(name="", **({"gpu": ""} if hasattr(node, "gpu") else {}))

    spec = strip(spec)
    if hasattr(spec, "tiers"):
        spec = spec.replace(tiers=tuple(strip(t) for t in spec.tiers))
    return spec


def stack(specs):
    """One pytree with a leading axis from a list of specs of the same structure."""
    specs = [anonymous(s) for s in specs]
    return jax.tree.map(lambda *xs: np.stack([np.asarray(x, dtype=np.float64) for x in xs]),
                        *specs)


def unstack(batch):
    """The list of specs of a batch (inverse of `stack`)."""
    leaves, treedef = jax.tree.flatten(batch)
    n = len(leaves[0])
    return [jax.tree.unflatten(treedef, [leaf[i] for leaf in leaves]) for i in range(n)]
