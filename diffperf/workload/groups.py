"""Rank strides of the parallel groups, from the placement (rank order, innermost first).

Megatron-LM orders ranks tp, cp, (ep within) dp, pp by default: TP neighbours are adjacent
ranks and fill an NVLink node first; PP is outermost. The stride of a dimension is the product
of the degrees placed inside it. Source: Megatron-Core `parallel_state` rank ordering; PAPERS.md
section 4.1 (AxoNN: X innermost, data parallel outermost) [C].

The placement is a numeric leaf (`Parallel.placement`, an index into `ORDERS`), so layouts of
different rank orders share one vmap and one compilation.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from diffperf.specs.parallel import ORDERS, PLACED

# _INSIDE[k, i, j] = 1 when dimension PLACED[j] is placed inside PLACED[i] in ORDERS[k].
_INSIDE = np.array([[[float(o.index(b) < o.index(a)) for b in PLACED] for a in PLACED]
                    for o in ORDERS])


def stride(parallel, dim: str):
    """Rank distance between neighbouring members of the `dim` group (ep shares dp's stride):

        stride(d) = prod_{d' placed inside d} degree(d')
    """
    dim = "dp" if dim == "ep" else dim
    if dim not in PLACED:
        raise ValueError(f"dimension {dim!r} is not placed (placed: {', '.join(PLACED)})")
    i = PLACED.index(dim)
    k = parallel.placement
    if isinstance(k, (int, np.integer)):  # a Python constant: no gather in the program
        s = 1.0
        for j, d in enumerate(PLACED):
            s = s * getattr(parallel, d) if _INSIDE[k, i, j] else s
        return s
    inside = jnp.asarray(_INSIDE[:, i])[jnp.asarray(k).astype(jnp.int32)]  # [..., 4] of 0/1
    degrees = [jnp.asarray(getattr(parallel, d)) for d in PLACED]
    if len({x.shape for x in degrees}) > 1:
        degrees = jnp.broadcast_arrays(*degrees)
    degrees = jnp.stack(degrees, -1)
    return jnp.prod(inside * degrees + (1.0 - inside), axis=-1)  # degree or exactly 1
