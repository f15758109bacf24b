"""Validation of a layout against its model (and device count), on concrete values.

Works on one configuration or a batch (leaves with a leading axis): the first invalid entry
is reported with its index. Called by `predict` before tracing; never inside jit.
"""

from __future__ import annotations

import numpy as np

from diffperf.errors import SpecError
from diffperf.specs.parallel import DIMENSIONS


def _arr(x):
    return np.asarray(x, dtype=np.float64)


def _divisors(x: float) -> str:
    """Divisors of x, listed (trial division up to sqrt(x))."""
    x = int(x)
    small = [i for i in range(1, int(np.sqrt(x)) + 1) if x % i == 0]
    return ", ".join(str(i) for i in sorted(set(small + [x // i for i in small])))


def _fail(mask, where, message):
    """Raise SpecError for the first True entry of mask; message(i) formats it."""
    mask = np.atleast_1d(mask)
    if mask.any():
        i = int(np.argmax(mask))
        at = f"[{i}]" if mask.size > 1 else ""
        raise SpecError(f"{where}{at}: {message(i)}")


def _divides(a, b):
    """a divides b exactly (whole numbers held as floats: exact up to 2^53)."""
    a, b = np.round(a), np.round(b)
    return np.mod(b, np.maximum(a, 1.0)) == 0.0


def check_layout(model, parallel, n_devices=None, where: str = "parallel",
                 devices_field: str = "number of devices") -> None:
    """Raise SpecError unless the layout is structurally valid for the model.

    Rules: degrees are whole numbers >= 1; tp divides num_heads and ffn_hidden, and
    num_kv_heads or the reverse (KV heads replicated); pp x vp divides num_layers; cp divides
    seq_len; ep divides dp and moe_experts (ep > 1 needs an MoE model); micro_batch x dp
    divides global_batch; interleaving needs pp > 1 and micro-batches a multiple of pp;
    zero_stage in 0..3; recompute in 0..2; tp x cp x dp x pp = n_devices when given.
    """
    P = {f: np.atleast_1d(_arr(getattr(parallel, f))) for f in (
        *DIMENSIONS, "vp", "micro_batch", "global_batch", "zero_stage", "recompute",
        "sequence_parallel", "dp_overlap", "tp_overlap")}
    M = {f: np.atleast_1d(_arr(getattr(model, f))) for f in (
        "n_heads", "n_kv_heads", "ffn_hidden", "n_layers", "seq_len", "n_experts")}
    pick = lambda a, i: a[i] if a.size > 1 else a[0]  # noqa: E731
    for f in (*DIMENSIONS, "vp", "micro_batch", "global_batch"):
        v = P[f]
        _fail((v < 1) | (v != np.round(v)), where,
              lambda i, f=f: f"{f}={pick(P[f], i):g} must be a whole number >= 1")
    for f, hi in (("zero_stage", 3), ("recompute", 2), ("sequence_parallel", 1),
                  ("dp_overlap", 1)):
        v = P[f]
        _fail((v < 0) | (v > hi) | (v != np.round(v)), where,
              lambda i, f=f, hi=hi: f"{f}={pick(P[f], i):g} is not allowed (allowed: "
                                    f"{', '.join(str(k) for k in range(hi + 1))})")
    _fail((P["tp_overlap"] < 0) | (P["tp_overlap"] > 1), where,
          lambda i: f"tp_overlap={pick(P['tp_overlap'], i):g} must be in [0, 1]")
    tp, heads = P["tp"], M["n_heads"]
    _fail(~_divides(tp, heads), where, lambda i: (
        f"tp={pick(tp, i):g} must divide model.num_heads={pick(heads, i):g}; "
        f"allowed tp: {_divisors(pick(heads, i))}"))
    kv = M["n_kv_heads"]
    _fail(~(_divides(tp, kv) | _divides(kv, tp)), where, lambda i: (
        f"tp={pick(tp, i):g} and model.num_kv_heads={pick(kv, i):g}: one must divide the "
        f"other (KV heads are split, or replicated, across TP ranks)"))
    _fail(~_divides(tp, M["ffn_hidden"]), where, lambda i: (
        f"tp={pick(tp, i):g} must divide model.ffn_hidden={pick(M['ffn_hidden'], i):g}"))
    stages = P["pp"] * P["vp"]
    _fail(~_divides(stages, M["n_layers"]), where, lambda i: (
        f"pp x vp={pick(stages, i):g} must divide model.num_layers={pick(M['n_layers'], i):g}; "
        f"allowed: {_divisors(pick(M['n_layers'], i))}"))
    _fail(~_divides(P["cp"], M["seq_len"]), where, lambda i: (
        f"cp={pick(P['cp'], i):g} must divide model.seq_len={pick(M['seq_len'], i):g}"))
    ep = P["ep"]
    _fail((ep > 1) & (M["n_experts"] == 0), where, lambda i: (
        f"ep={pick(ep, i):g} needs an MoE model (model.moe_experts=0); allowed ep: 1"))
    _fail(~_divides(ep, P["dp"]), where, lambda i: (
        f"ep={pick(ep, i):g} must divide dp={pick(P['dp'], i):g}"))
    _fail((M["n_experts"] > 0) & ~_divides(ep, np.maximum(M["n_experts"], 1)), where,
          lambda i: f"ep={pick(ep, i):g} must divide model.moe_experts="
                    f"{pick(M['n_experts'], i):g}")
    per_step = P["micro_batch"] * P["dp"]
    _fail(~_divides(per_step, P["global_batch"]), where, lambda i: (
        f"global_batch={pick(P['global_batch'], i):g} must be a multiple of micro_batch x dp="
        f"{pick(P['micro_batch'], i):g} x {pick(P['dp'], i):g}"))
    m = P["global_batch"] / per_step
    inter = P["vp"] > 1
    _fail(inter & (P["pp"] < 2), where, lambda i: f"vp={pick(P['vp'], i):g} needs pp > 1")
    _fail(inter & ~_divides(P["pp"], m), where, lambda i: (
        f"interleaved schedule (vp={pick(P['vp'], i):g}) needs micro-batches per step "
        f"m={pick(m, i):g} to be a multiple of pp={pick(P['pp'], i):g}"))
    if n_devices is not None:
        total = P["tp"] * P["cp"] * P["dp"] * P["pp"]
        nd = np.atleast_1d(_arr(n_devices))
        _fail(total != nd, where, lambda i: (
            f"tp x cp x dp x pp = {pick(total, i):g} must equal {devices_field}="
            f"{pick(nd, i):g}"))
