"""Batches of specs: one pytree whose leaves have a leading axis (STYLE.md section 3)."""

from __future__ import annotations

import jax
import numpy as np


def anonymous(spec):
    """The spec with its static labels (names) blanked, so specs that differ only by name share
    one tree structure (and one compilation)."""
    def strip(node):
        return node.replace(name="") if hasattr(node, "name") and hasattr(node, "replace") else node

    spec = strip(spec)
    if hasattr(spec, "tiers"):
        spec = spec.replace(tiers=tuple(strip(t) for t in spec.tiers))
    return spec


def _numeric(spec):
    """A Parallel's names as the numbers of its leaves: recompute 'selective' -> 1 (also a
    Recompute or ZeroStage enum -> int), placement 'tp-cp-pp-dp' -> its ORDERS index, as
    `predict` accepts them; any other spec unchanged."""
    from diffperf.errors import SpecError
    from diffperf.specs.parallel import Parallel, Recompute, placement_index

    if not isinstance(spec, Parallel):
        return spec
    rec, place = spec.recompute, spec.placement
    if isinstance(rec, str):
        names = {r.name.lower(): int(r) for r in Recompute}
        if rec not in names:
            raise SpecError(f"parallel.recompute={rec!r} is not allowed (allowed: "
                            f"{', '.join(names)})")
        spec = spec.replace(recompute=names[rec])
    if isinstance(place, (str, tuple, list)):
        spec = spec.replace(placement=placement_index(place))
    return spec.replace(**{f: int(getattr(spec, f)) for f in ("recompute", "zero_stage")
                           if isinstance(getattr(spec, f), int)})


def stack(specs):
    """One pytree with a leading axis from a list of specs of the same structure (a
    Parallel's recompute and placement may be names, as `predict` takes them)."""
    specs = [anonymous(_numeric(s)) for s in specs]
    return jax.tree.map(lambda *xs: np.stack([np.asarray(x, dtype=np.float64) for x in xs]),
                        *specs)


def unstack(batch):
    """The list of specs of a batch (inverse of `stack`)."""
    leaves, treedef = jax.tree.flatten(batch)
    n = len(leaves[0])
    return [jax.tree.unflatten(treedef, [leaf[i] for leaf in leaves]) for i in range(n)]
