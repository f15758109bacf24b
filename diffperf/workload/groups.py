"""Rank strides of the parallel groups, from the placement order (innermost first).

Megatron-LM orders ranks tp, cp, (ep within) dp, pp by default: TP neighbours are adjacent
ranks and fill an NVLink node first; PP is outermost. The stride of a dimension is the product
of the degrees placed inside it. Source: Megatron-Core `parallel_state` rank ordering; PAPERS.md
section 4.1 (AxoNN: X innermost, data parallel outermost) [C].
"""

from __future__ import annotations


def stride(parallel, dim: str):
    """Rank distance between neighbouring members of the `dim` group (ep shares dp's stride)."""
    dim = "dp" if dim == "ep" else dim
    s = 1.0
    for d in parallel.order:
        if d == dim:
            return s
        s = s * getattr(parallel, d)
    raise ValueError(f"dimension {dim!r} is not in parallel.order={parallel.order}")
