"""Enumeration: every structurally valid layout of a job, as a table of integers.

A layout table (numpy integers, one row a layout, columns `COLUMNS`) follows the rules of
`specs.validate.check_layout` (divisibility, product = devices): memory feasibility is data
(`Result.fits`), not a filter. The rows come in the order the evaluation factors them
(`search.kernel`): for each placement, each combination of degrees (the outer key), then
(zero_stage, recompute, sequence_parallel) varying fastest.
"""

from __future__ import annotations


import numpy as np

from diffperf.errors import SpecError
from diffperf.specs.parallel import GRID, PLACED, Parallel, placement_index
from diffperf.specs.validate import divisors, stage_counts, stages_hold

# The placement stays the last column (callers select rows by `layouts[:, -1]`).
COLUMNS = ("tp", "pp", "dp", "cp", "ep", "vp", "micro_batch", "global_batch", "gx", "gy", "gz",
           "zero_stage", "recompute", "sequence_parallel", "placement")
OUTER = COLUMNS[:COLUMNS.index("zero_stage")]  # the degrees (and the grid)
KEYS = OUTER + ("placement",)  # the outer axis: degrees and the rank order (ORDERS index)
INNER = ("zero_stage", "recompute", "sequence_parallel")
# Placement orders (innermost first, specs.parallel.ORDERS): Megatron-LM's default, and the
# pipeline inside data parallelism (DP outermost, as AxoNN places it; PAPERS.md section 4.1).
PLACEMENTS = (("tp", "cp", "dp", "pp"), ("tp", "cp", "pp", "dp"))
# Every (zero_stage, recompute, sequence_parallel): the inner axis; code = 6 z + 2 r + sp.
INNER_GRID = np.array([(z, r, sp) for z in range(4) for r in range(3) for sp in range(2)])


def _divisors(x: int) -> np.ndarray:
    """The divisors of x, ascending, as an array (specs.validate.divisors: O(sqrt(x)))."""
    return np.asarray(divisors(x), dtype=np.int64)


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


def _pp_values(M: dict, n: int) -> np.ndarray:
    """The pipeline degrees a table enumerates: every divisor of n up to num_layers (stages
    need not be equal: workload.pp.stage_layers). The one place that decides them."""
    d = _divisors(n)
    return d[d <= M["n_layers"]]


def _allowed(values, fixed: dict, name: str) -> np.ndarray:
    """The candidate values of one column that `fixed` allows (all without an entry)."""
    values = np.asarray(values, dtype=np.int64)
    return values if name not in fixed else values[np.isin(values, fixed[name])]


def _degrees(M: dict, n: int, B: int, fixed=None) -> dict:
    """(tp, pp, cp, dp, micro_batch, vp, ep) rows that satisfy check_layout's rules, and the
    values `fixed` allows ({column: allowed values}; none: every valid value)."""
    fixed = fixed or {}
    d = _divisors(n)
    kv = M["n_kv_heads"]
    tp_ok = (M["n_heads"] % d == 0) & (M["ffn_hidden"] % d == 0) & (
        (kv % d == 0) | (d % kv == 0))
    rows = {"tp": _allowed(d[tp_ok], fixed, "tp")}
    rows = _expand(rows, "pp", _allowed(_pp_values(M, n), fixed, "pp"),
                   lambda r: n % (r["tp"] * r["pp"]) == 0)
    rows = _expand(rows, "cp", _allowed(d[M["seq_len"] % d == 0], fixed, "cp"),
                   lambda r: n % (r["tp"] * r["pp"] * r["cp"]) == 0)
    rows["dp"] = n // (rows["tp"] * rows["pp"] * rows["cp"])
    rows = _keep(rows, np.isin(rows["dp"], fixed.get("dp", rows["dp"])))
    rows = _expand(rows, "micro_batch", _allowed(_divisors(B), fixed, "micro_batch"),
                   lambda r: B % (r["micro_batch"] * r["dp"]) == 0)
    whole_chunks = "vp" not in fixed

    def vp_ok(r):
        """Interleaving needs pp > 1 and pp | m, and check_layout's stage sizes (every
        middle stage holds >= vp layers, the first and last >= vp - 1). By default the
        enumeration also asks vp to divide the largest stage's layers (whole chunks there;
        the first and last stage, a layer short when the stages are uneven, fill one chunk
        less: Llama 3 405B's pp 16, vp 8 on 126 layers); vp values given in `fixed` are
        taken wherever check_layout takes them (chunks of a stage may then differ)."""
        m = B // (r["micro_batch"] * r["dp"])
        zero = np.zeros_like(r["pp"])
        P = dict(pp=r["pp"], vp=r["vp"], pp_first_layers=zero, pp_last_layers=zero)
        first, _, mid_max, last = stage_counts(P, {"n_layers": M["n_layers"]})
        largest = np.maximum(np.maximum(first, last), np.where(r["pp"] > 2, mid_max, 0))
        whole = (largest % r["vp"] == 0) | (not whole_chunks)
        return (r["vp"] == 1) | ((r["pp"] > 1) & (m % r["pp"] == 0) & whole
                                 & stages_hold(P, {"n_layers": M["n_layers"]}))

    rows = _expand(rows, "vp", _allowed(np.arange(1, M["n_layers"] + 1), fixed, "vp"), vp_ok)
    experts = _divisors(M["n_experts"]) if M["n_experts"] > 0 else np.array([1])
    rows = _expand(rows, "ep", _allowed(experts, fixed, "ep"), lambda r: r["dp"] % r["ep"] == 0)
    grid = {g: np.ones_like(rows["tp"]) for g in GRID}
    return _keep(rows | grid, np.all([np.isin(grid[g], fixed.get(g, 1)) for g in GRID], axis=0))


def _grid_degrees(M: dict, n: int, B: int, fixed=None) -> dict:
    """AxoNN grid rows (gx, gy, gz, dp, micro_batch) that satisfy check_layout's grid rules
    (specs.validate._check_grid; PAPERS.md sections 4.1, 4.4), with tp = pp = cp = ep = vp = 1
    (the 4D algorithm: no pipeline, the grid in place of Megatron TP):

        G = gx gy gz > 1, dp = n / G; gx | hidden; gy | num_heads, gy | ffn_hidden, and gy |
        num_kv_heads or the reverse; gz | (n_out k_in)/(gx gy) of the attention-output
        (h x a d_h) and MLP (h x f) weights; micro_batch x dp x gz | global_batch.
    No rows for an MoE model (the grid shards dense weights only). `fixed`: as `_degrees`.
    """
    fixed = fixed or {}
    d = _divisors(n)
    if M["n_experts"] > 0:
        d = d[:0]
    h, a, kv, f, dh = (M[k] for k in ("hidden", "n_heads", "n_kv_heads", "ffn_hidden",
                                      "head_dim"))
    gy = _allowed(d[(a % d == 0) & (f % d == 0) & ((kv % d == 0) | (d % kv == 0))], fixed,
                  "gy")
    rows = _expand({"gx": _allowed(d[h % d == 0], fixed, "gx")}, "gy", gy,
                   lambda r: n % (r["gx"] * r["gy"]) == 0)

    def gz_ok(r):
        xy, G = r["gx"] * r["gy"], r["gx"] * r["gy"] * r["gz"]
        return (n % G == 0) & (G > 1) & ((h * a * dh // xy) % r["gz"] == 0) & (
            (h * f // xy) % r["gz"] == 0)

    rows = _expand(rows, "gz", _allowed(d, fixed, "gz"), gz_ok)
    rows["dp"] = n // (rows["gx"] * rows["gy"] * rows["gz"])
    rows = _keep(rows, np.isin(rows["dp"], fixed.get("dp", rows["dp"])))
    rows = _expand(rows, "micro_batch", _allowed(_divisors(B), fixed, "micro_batch"),
                   lambda r: B % (r["micro_batch"] * r["dp"] * r["gz"]) == 0)
    ones = {c: np.ones_like(rows["gx"]) for c in ("tp", "pp", "cp", "ep", "vp")}
    return _keep(rows | ones, np.all([np.isin(ones[c], fixed.get(c, 1)) for c in ones],
                                     axis=0))


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
                      sequence_parallel=(0, 1), axonn=False, fixed=None) -> np.ndarray:
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
    `fixed` ({column: allowed values}, columns of COLUMNS but global_batch and placement)
    keeps only the layouts whose values are allowed, e.g. {"tp": (8,), "pp": (2, 4, 8)}:
    what a planner already knows (`diffperf search --tp 8 --pp 2-8`). Values no valid layout
    takes are simply absent; vp values given there are taken wherever check_layout takes
    them (otherwise vp divides the largest stage: `_degrees`).
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
    fixed = _check_fixed(fixed)
    # an INNER column in `fixed` replaces the argument of the same name
    inner = _inner_grid(*(fixed.get(c, v) for c, v in zip(
        INNER, (zero_stages, recompute, sequence_parallel))))
    M = _model_ints(model)
    tables = []
    for deg in ((_degrees(M, n, B, fixed), _grid_degrees(M, n, B, fixed)) if axonn
                else (_degrees(M, n, B, fixed),)):
        deg["global_batch"] = np.full_like(deg["tp"], B)
        tables += _tables(deg, inner, placements)
    table = np.concatenate(tables)
    if not len(table):
        given = "".join(f", {c} in {{{', '.join(str(v) for v in vals)}}}"
                        for c, vals in fixed.items())
        raise SpecError(
            f"no valid layout of n_devices={n} with global_batch={B}{given}: tp x pp x cp x "
            f"dp must equal n_devices with tp dividing num_heads={M['n_heads']}, pp at most "
            f"num_layers={M['n_layers']}, cp dividing seq_len={M['seq_len']} and "
            f"micro_batch x dp dividing global_batch")
    return table


FIXABLE = tuple(c for c in COLUMNS if c not in ("global_batch", "placement"))


def _check_fixed(fixed) -> dict:
    """{column: sorted tuple of ints} of `fixed`, checked (a known column, whole values)."""
    out = {}
    for name, values in (fixed or {}).items():
        if name not in FIXABLE:
            raise SpecError(f"fixed: unknown layout column '{name}' (allowed: "
                            f"{', '.join(FIXABLE)})")
        values = np.atleast_1d(np.asarray(values, dtype=np.float64))
        if not len(values) or np.any(values != np.round(values)) or np.any(values < 0):
            raise SpecError(f"fixed {name}={tuple(values.tolist())} must be whole numbers "
                            f">= 0, at least one")
        out[name] = tuple(sorted(set(int(v) for v in values)))
    return out


def axonn_mask(layouts) -> np.ndarray:
    """True for the rows of a layout table that use the AxoNN grid (gx x gy x gz > 1)."""
    layouts = np.asarray(layouts)
    return np.prod(layouts[:, [COLUMNS.index(g) for g in GRID]], axis=1) > 1


def parallel_of(row, placements=PLACEMENTS) -> Parallel:
    """One row of a layout table as a `Parallel` (float leaves; placement as an ORDERS index)."""
    fields = {c: float(row[i]) for i, c in enumerate(COLUMNS[:-1])}
    return Parallel(**fields, placement=placement_index(placements[int(row[-1])]))

