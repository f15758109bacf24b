"""Search (DESIGN.md question 2): enumeration, batched evaluation, ranking, the differentiable
soft search, sharding over devices, and `diffperf search`.

The exhaustive reference is a plain Python loop of `diffperf.predict` over the same candidate
table (GPT-2 small on 4 devices: ~1,100 layouts, and 336 more on the AxoNN grid, so the loop
is cheap).
"""

from __future__ import annotations

import functools
import itertools
import json
import os
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest

from diffperf import Parallel, SpecError, load_model, load_system, predict, training
from diffperf.api import _as_float
from diffperf.cli.main import main
from diffperf.search.axonn import axonn_grids
from diffperf.search import (COLUMNS, axonn_mask, enumerate_layouts, pareto_front, parallel_of,
                             ranked, search, soft_best)
from diffperf.specs.batch import anonymous
from diffperf.specs.validate import check_layout
from diffperf.workload.pp import stage_layers

from diffperf.search import kernel as search_kernel  # noqa: E402 (the compiled kernels)

MODEL = load_model("gpt-small")
N_DEVICES, GLOBAL_BATCH = 4, 8
# Capacity cut to 3 GiB so that part of the table does not fit and the ranking must use `fits`.
SYSTEM = load_system("a100-sxm-80gb")
SYSTEM = SYSTEM.replace(hbm_capacity_bytes=3.0 * 2**30)
TRAINING = training("bf16")


@pytest.fixture(scope="module")
def table():
    return enumerate_layouts(MODEL, N_DEVICES, GLOBAL_BATCH)


@pytest.fixture(scope="module")
def result(table):
    return search(MODEL, SYSTEM, TRAINING, table)


@functools.cache
def _reference():
    """`predict` under jit (inputs are tracers, so it skips validation: every row passed
    check_layout) with the XLA:CPU options `predict` itself uses there (api._predict_jit_cpu:
    search_kernel._CPU_QUICK_OPTIONS), which compile faster than the search kernel's: one
    scalar compile serves every row (placement and grid are leaves)."""
    return jax.jit(lambda *args: predict(*args),
                   compiler_options=search_kernel._CPU_QUICK_OPTIONS)


def _predict_rows(rows):
    """(step time, fits) of every row by `diffperf.predict`, one call per layout."""
    args = _as_float((anonymous(MODEL), anonymous(SYSTEM), anonymous(TRAINING)))
    out = [_reference()(args[0], _as_float(parallel_of(row)), *args[1:]) for row in rows]
    return (np.array([float(r.step_time_s) for r in out]),
            np.array([bool(r.fits) for r in out]))


@pytest.fixture(scope="module")
def exhaustive(table):
    return _predict_rows(table)


@pytest.fixture(scope="module")
def grid_table():
    """The table with the AxoNN layouts appended (axonn=True)."""
    return enumerate_layouts(MODEL, N_DEVICES, GLOBAL_BATCH, axonn=True)


def _batch(table):
    return Parallel(**{c: table[:, i].astype(float) for i, c in enumerate(COLUMNS[:-1])})


# --------------------------------------------------------------------------------------------
# Enumeration
# --------------------------------------------------------------------------------------------

def test_every_enumerated_layout_passes_check_layout():
    for name, n, batch in (("gpt3-175b", 1024, 1536), ("mixtral-8x7b", 64, 256),
                           ("llama3-8b", 16, 64)):
        model = load_model(name)
        t = enumerate_layouts(model, n, batch, axonn=True)
        check_layout(model, _batch(t), np.full(len(t), float(n)))  # raises on the first bad row
        assert (t[:, COLUMNS.index("global_batch")] == batch).all()
        sp, tp = t[:, COLUMNS.index("sequence_parallel")], t[:, 0]
        assert not ((sp == 1) & (tp == 1)).any()  # SP only with tp > 1
        # The AxoNN grid: dense models only (llama3-8b's GQA included), after the other rows.
        grid = axonn_mask(t)
        assert grid.any() == (name != "mixtral-8x7b")
        assert not np.any(np.diff(grid.astype(int)) < 0)
    assert t[:, COLUMNS.index("ep")].max() == 1  # dense model: no expert parallelism
    moe = enumerate_layouts(load_model("mixtral-8x7b"), 64, 256)
    assert set(np.unique(moe[:, COLUMNS.index("ep")])) == {1, 2, 4, 8}  # divisors of 8 experts


def test_enumeration_equals_brute_force(table):
    """Every (tp, pp, cp, micro_batch, vp) that check_layout accepts, found by trying them all,
    with vp dividing the largest pipeline stage's layers (the enumeration's choice of chunk
    sizes: `search._degrees`; check_layout also accepts uneven chunks)."""
    L = int(MODEL.n_layers)
    expected = set()
    for tp, pp, cp in itertools.product(range(1, N_DEVICES + 1), repeat=3):
        if N_DEVICES % (tp * pp * cp):
            continue
        dp = N_DEVICES // (tp * pp * cp)
        for mb, vp in itertools.product(range(1, GLOBAL_BATCH + 1), range(1, L + 1)):
            p = Parallel(tp=tp, pp=pp, cp=cp, dp=dp, vp=vp, micro_batch=mb,
                         global_batch=GLOBAL_BATCH)
            try:
                check_layout(MODEL, p, N_DEVICES)
            except SpecError:
                continue
            if max(float(x) for x in stage_layers(MODEL, p)) % vp:
                continue
            for z, r, sp in itertools.product(range(4), range(3), range(2 if tp > 1 else 1)):
                expected.add((tp, pp, dp, cp, 1, vp, mb, GLOBAL_BATCH, 1, 1, 1, z, r, sp))
    got = {tuple(int(v) for v in row[:-1]) for row in table[table[:, -1] == 0]}
    assert got == expected


def test_axonn_layouts_are_every_valid_grid_after_the_other_rows(table, grid_table):
    """axonn=True appends, to the unchanged table, every (gx, gy, gz, dp, micro_batch) that
    check_layout accepts with tp = pp = 1 (found by trying every micro-batch on every grid of
    axonn_grids), times every ZeRO stage and recompute mode, without sequence parallelism, in
    TP's slot of Megatron's order (the second order gives the same strides when pp = 1)."""
    assert (grid_table[:len(table)] == table).all() and not axonn_mask(table).any()
    grid = grid_table[len(table):]
    assert len(grid) and axonn_mask(grid).all() and (grid[:, -1] == 0).all()
    check_layout(MODEL, _batch(grid), np.full(len(grid), float(N_DEVICES)))
    expected = set()
    for gx, gy, gz, dp in axonn_grids(MODEL, N_DEVICES, GLOBAL_BATCH):
        for mb in range(1, GLOBAL_BATCH + 1):
            p = Parallel(gx=gx, gy=gy, gz=gz, dp=dp, micro_batch=mb, global_batch=GLOBAL_BATCH)
            try:
                check_layout(MODEL, p, N_DEVICES)
            except SpecError:
                continue
            if gx * gy * gz > 1:
                expected |= {(1, 1, dp, 1, 1, 1, mb, GLOBAL_BATCH, gx, gy, gz, z, r, 0)
                             for z, r in itertools.product(range(4), range(3))}
    assert {tuple(int(v) for v in row[:-1]) for row in grid} == expected


def test_placements_only_where_they_change_the_strides(table):
    """The second order (pp inside dp) differs from Megatron's only when dp > 1 and pp > 1."""
    second = table[table[:, -1] == 1]
    assert len(second) and (second[:, COLUMNS.index("dp")] > 1).all()
    assert (second[:, COLUMNS.index("pp")] > 1).all()
    first = table[table[:, -1] == 0]
    both = (first[:, COLUMNS.index("dp")] > 1) & (first[:, COLUMNS.index("pp")] > 1)
    assert both.sum() == len(second)


def test_dropped_placements_predict_the_same(table):
    """Where dp = 1 or pp = 1 the two orders give the same strides: evaluating those rows
    under the second order changes nothing, so enumerate_layouts keeps them once.

    Both orders are evaluated as tables of the same size, so by the same compiled program:
    XLA:CPU compiles one program per chunk shape (here 64 outer rows; the whole table takes
    128) and two shapes may round differently (1 float32 ulp in 2 of these rows' step times
    against the whole table's program, 224 leaf values in all; every one equal when the whole
    table is also run in chunks of 64), which is not what this test is about."""
    first = table[table[:, -1] == 0]
    same = (first[:, COLUMNS.index("dp")] == 1) | (first[:, COLUMNS.index("pp")] == 1)
    again = first[same].copy()
    again[:, -1] = 1
    mine, other = (search(MODEL, SYSTEM, TRAINING, rows) for rows in (first[same], again))
    np.testing.assert_array_equal(other.step_time_s, mine.step_time_s)
    np.testing.assert_array_equal(other.memory.total_bytes, mine.memory.total_bytes)


def test_no_valid_layout_is_an_error():
    with pytest.raises(SpecError, match="no valid layout of n_devices=13"):
        # dp = 13 cannot divide a batch of 8, 13 heads or stages of 12 layers do not exist
        enumerate_layouts(MODEL, 13, GLOBAL_BATCH)
    with pytest.raises(SpecError, match="must order each of tp, cp, dp, pp once"):
        enumerate_layouts(MODEL, 4, 8, placements=(("tp", "dp", "pp"),))


# --------------------------------------------------------------------------------------------
# Batched evaluation and ranking
# --------------------------------------------------------------------------------------------

def test_search_equals_predict_on_every_layout(result, exhaustive):
    step, fits = exhaustive
    np.testing.assert_allclose(result.step_time_s, step, rtol=1e-5)
    assert (result.fits == fits).all()
    assert 0 < fits.sum() < len(fits)  # the capacity cut leaves some layouts out


def test_best_layout_is_the_exhaustive_argmin(table, result, exhaustive):
    step, fits = exhaustive
    best = ranked(result, 1)[0]
    hard = np.min(step[fits])
    assert fits[best]
    # Ties (layouts whose differences do not change the step) may be broken either way.
    assert step[best] <= hard * (1 + 1e-6)
    assert best in np.flatnonzero(fits & (step <= hard * (1 + 1e-6)))
    order = ranked(result)
    assert np.all(np.diff(result.step_time_s[order]) >= 0)
    assert len(order) == fits.sum()


def test_axonn_search_equals_predict_and_finds_the_exhaustive_argmin(table, grid_table, result,
                                                                   exhaustive):
    """With the AxoNN rows the search evaluates the grid's terms for every row (one kernel):
    the other rows keep their numbers, every grid row matches `predict`, and the best layout
    (and the best grid layout) is the exhaustive argmin over the same candidates."""
    both = search(MODEL, SYSTEM, TRAINING, grid_table)
    n = len(table)
    np.testing.assert_allclose(both.step_time_s[:n], result.step_time_s, rtol=1e-6)
    assert (both.fits[:n] == result.fits).all()
    g_step, g_fits = _predict_rows(grid_table[n:])
    np.testing.assert_allclose(both.step_time_s[n:], g_step, rtol=1e-5)
    assert (both.fits[n:] == g_fits).all() and 0 < g_fits.sum() < len(g_fits)
    step, fits = np.concatenate([exhaustive[0], g_step]), np.concatenate([exhaustive[1], g_fits])
    order = ranked(both)
    for candidates in (np.arange(len(step)), np.arange(n, len(step))):
        best = order[np.isin(order, candidates)][0]
        hard = np.min(step[candidates][fits[candidates]])
        assert fits[best] and step[best] <= hard * (1 + 1e-6)  # ties may go either way


def test_pareto_front():
    step = np.array([3.0, 1.0, 2.0, 2.0, 4.0, 1.0])
    mem = np.array([1.0, 5.0, 3.0, 2.0, 0.5, 6.0])
    assert pareto_front(step, mem).tolist() == [1, 3, 0, 4]


def test_pareto_front_of_a_search_is_not_dominated(result):
    fit = np.flatnonzero(result.fits)
    step, mem = result.step_time_s[fit], result.memory.total_bytes[fit]
    front = pareto_front(step, mem)
    for i in front:
        assert not np.any((step <= step[i]) & (mem <= mem[i]) & ((step < step[i]) | (mem < mem[i])))
    assert step[front[0]] == step.min()


def _compiled():
    """Entries in the trace caches of the search kernels (`_cache_size`, private in JAX 0.10,
    as tests/test_compile.py uses it)."""
    return sum(getattr(search_kernel, k)._cache_size() for k in (
        "_grid_predict", "_grid_predict_cpu", "_grid_predict_cpu_quick"))


def test_new_hardware_values_do_not_recompile(table, result):
    before = _compiled()
    faster = SYSTEM.replace(hbm_bandwidth_Bps=SYSTEM.hbm_bandwidth_Bps * 2)
    again = search(MODEL, faster, TRAINING, table)
    assert _compiled() == before
    assert np.all(again.step_time_s <= result.step_time_s * (1 + 1e-6))


def test_optimized_and_quick_kernels_agree(table, result):
    """The two XLA:CPU optimisation levels (search.kernel, _CPU_QUICK_OPTIONS) give the same
    numbers; only compile and run times differ."""
    rows = table[table[:, -1] == 0]
    optimized = search(MODEL, SYSTEM, TRAINING, rows, optimize=True)
    np.testing.assert_allclose(optimized.step_time_s, result.step_time_s[table[:, -1] == 0],
                               rtol=1e-6)


# (model, Parallel facts, precision, Training facts, rows where the fact cannot act, rows
# where it can): every per-layout rule of specs.validate.check_facts_act
_INERT_CASES = (
    ("gpt-small", {}, "bf16", dict(cp_torch=1.0), "cp == 1", "cp > 1"),
    ("gpt-small", dict(cp_ring=0.0), "bf16", {}, "cp == 1", "cp > 1"),
    ("gpt-small", dict(tp_overlap=0.5), "bf16", {}, "tp == 1", "tp > 1"),
    ("gpt-small", dict(tp_userbuffers=1.0), "bf16", {}, "tp == 1",
     "(tp > 1) & (sequence_parallel == 1)"),
    ("gpt-small", dict(tp_userbuffers=1.0), "bf16", {}, "(tp > 1) & (sequence_parallel == 0)",
     "(tp > 1) & (sequence_parallel == 1)"),
    ("gpt-small", dict(zero3_copy_out=1.0), "bf16", {}, "zero_stage < 3", "zero_stage == 3"),
    ("gpt-small", dict(zero3_root_unit=1.0), "bf16", {}, "zero_stage < 3", "zero_stage == 3"),
    ("gpt-small", dict(zero3_regather=0.0), "bf16", {}, "zero_stage < 3",
     "(zero_stage == 3) & (recompute == 2)"),
    ("gpt-small", dict(zero3_calls_per_layer=4.0), "bf16", {}, "zero_stage < 3",
     "zero_stage == 3"),
    ("gpt-small", dict(zero3_prefetch_params=1e5), "bf16", {}, "zero_stage < 3",
     "zero_stage == 3"),
    ("gpt-small", dict(zero_shard=2.0), "bf16", {}, "(zero_stage == 0) & (dp * cp % 2 == 0)",
     "(zero_stage >= 1) & (dp * cp % 2 == 0) & (dp * cp > 2)"),
    ("gpt-small", dict(axonn_overlap=0.0), "bf16", {}, "gx * gy * gz == 1", "gx * gy * gz > 1"),
    ("gpt-small", {}, "fp8-current", dict(lowp_param_gather=1.0), "zero_stage == 0",
     "zero_stage >= 1"),
    ("mixtral-8x7b", dict(ep_overlap=1.0), "bf16", {}, "ep == 1", "(ep > 1) & (recompute < 2)"),
    ("mixtral-8x7b", dict(ep_overlap=1.0), "bf16", {}, "(ep > 1) & (recompute == 2)",
     "(ep > 1) & (recompute < 2)"),
    ("mixtral-8x7b", dict(ep_dispatch=1.0), "bf16", {}, "ep == 1", "ep > 1"),
)


def test_a_fact_changes_nothing_on_a_layout_where_it_cannot_act(grid_table):
    """A framework fact on a layout where a per-layout rule of check_facts_act says it cannot
    act (cp_ring=0 at cp 1, zero3_regather=0 below ZeRO-3, ep_overlap under full recompute,
    ...) is inert: every Result leaf equals the layout's prediction without the fact, so a
    search that ranks such rows ranks what the framework runs (docs/guide-search.md). Where
    the rule holds, the fact changes something. `predict` under jit (no validation: the
    file's one reference program; the model, precision and facts are traced leaves). The
    lowp_param_gather case runs FP8 on the file's A100: the algebra of the term, not a
    hardware claim. Was (before searchkeep): ep_overlap's merged schedule acted under full
    recompute and lowp_param_gather's FP8 weights held memory at ZeRO 0."""
    from diffperf.specs.validate import facts_inert

    mixtral = enumerate_layouts(load_model("mixtral-8x7b"), 16, 16)
    col = {c: i for i, c in enumerate(COLUMNS)}
    for name, par, precision, tr, inert, acts in _INERT_CASES:
        model = load_model(name)
        table = grid_table if name == "gpt-small" else mixtral
        env = {c: table[:, i] for c, i in col.items()}
        plain, facts = training(precision), training(precision, **tr)
        m, s = _as_float((anonymous(model), anonymous(SYSTEM)))
        for where, acting in ((inert, False), (acts, True)):
            rows = np.flatnonzero(eval(where, {}, env))
            assert len(rows), (name, where)
            changed = []
            for row in table[rows[np.linspace(0, len(rows) - 1, 3).astype(int)]]:
                lay = parallel_of(row)
                named = facts_inert(model, lay.replace(**par), facts)
                assert ([*par, *tr][0] in named) != acting, (name, where, row)
                a, b = (jax.tree.leaves(_reference()(m, _as_float(p), s, _as_float(anonymous(t))))
                        for p, t in ((lay.replace(**par), facts), (lay, plain)))
                same = all(np.array_equal(x, y, equal_nan=True) for x, y in zip(a, b))
                assert same or acting, (name, where, row)
                changed.append(not same)
            assert any(changed) == acting, (name, par, tr, where)


# --------------------------------------------------------------------------------------------
# Differentiable soft search
# --------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def soft(table):
    """(rows, jitted (soft step time, weights), d/d capacity scale) at (scale, tau)): one
    compilation serves every temperature (tau is traced)."""
    rows = table[table[:, -1] == 0]

    def soft_step(capacity_scale, tau):
        system = SYSTEM.replace(hbm_capacity_bytes=SYSTEM.hbm_capacity_bytes * capacity_scale)
        best = soft_best(MODEL, system, TRAINING, rows, tau)
        return best.step_time_s, best.weights

    return rows, jax.jit(jax.value_and_grad(soft_step, has_aux=True))


def test_soft_optimum_approaches_the_hard_one(soft):
    """J(tau) -> ln min_fits T as tau -> 0 (bounds: min s - tau ln n <= J <= min s)."""
    rows, soft_step = soft
    hard = search(MODEL, SYSTEM, TRAINING, rows)
    best = ranked(hard, 1)[0]
    t_hard = hard.step_time_s[best]
    errors = []
    step = np.asarray(hard.step_time_s, dtype=np.float64)
    margin = np.asarray(hard.fit_margin_frac, dtype=np.float64)
    # The hard best (ZeRO-2 tp 2, mb 2) fits with 0.06 % to spare since ZeRO-3 layouts hold
    # gpt-small's output unit (V h = 38.6 M, 5x a layer: memory.device.nonlayer_unit_bytes):
    # the soft weights settle on it once tau is well below that margin, hence 1e-4.
    for tau in (0.3, 0.1, 0.03, 0.01, 0.003, 0.0001):
        (value, weights), _ = soft_step(1.0, tau)
        errors.append(abs(float(value) / t_hard - 1))
        assert abs(float(np.sum(weights)) - 1) < 1e-4
        # The soft-min's guarantee: min s - tau ln n <= J <= min s (|J/T - 1| itself need not
        # shrink monotonically: near-tied layouts and the feasibility penalty trade places).
        s_min = np.min(np.log(step) + np.logaddexp(0.0, -margin / tau))
        J = np.log(float(value))
        assert s_min - tau * np.log(len(step)) - 1e-4 <= J <= s_min + 1e-4, (tau, J, s_min)
    assert errors[-1] < 0.03 and errors[0] > errors[-1] and errors[-2] < errors[1], errors
    ties = np.flatnonzero(hard.fits & (hard.step_time_s <= t_hard * (1 + 1e-6)))
    assert int(np.argmax(weights)) in ties


def test_soft_best_gives_memory_capacity_a_gradient(soft):
    _, soft_step = soft
    (value, _), grad = soft_step(1.0, 0.1)
    assert np.isfinite(grad) and grad < 0  # more memory lets faster layouts in: never slower
    with pytest.raises(SpecError, match="temperature=0.0 must be > 0"):
        soft_best(MODEL, SYSTEM, TRAINING, soft[0], 0.0)


# --------------------------------------------------------------------------------------------
# Sharded over devices (a subprocess with 4 host devices, so this process keeps one): the
# layout axis of a search, the hardware points of a sweep
# --------------------------------------------------------------------------------------------

# Feasibility and the best layout are identical. Times agree to float32 rounding, not bit for
# bit: XLA's SPMD pipeline (num_partitions > 1) simplifies some products and quotients in
# another order than the single-device one (a one-device mesh is bit-identical). Measured:
# step time at most 1.2e-7 relative; each breakdown part within 1e-6 of the step time
# (overhead_s, a difference t_f - gpu_f of two near-equal times, differs by up to 1.4e-6 of
# its own value, 7e-9 s).
_SHARDED = textwrap.dedent("""
    import jax, numpy as np
    from diffperf import load_model, load_system
    from diffperf.search import enumerate_layouts, ranked, search, search_sharded, sweep
    assert len(jax.devices()) == 4, jax.devices()
    model, system = load_model("gpt-small"), load_system("a100-sxm-80gb")
    system = system.replace(hbm_capacity_bytes=3.0 * 2**30)
    table = enumerate_layouts(model, 4, 8)
    table = table[table[:, -1] == 0]
    one = search(model, system, None, table)
    four = search_sharded(model, system, None, table)
    assert (one.fits == four.fits).all()
    np.testing.assert_allclose(one.step_time_s, four.step_time_s, rtol=3e-7, atol=0)
    step = np.asarray(one.step_time_s)
    for a, b in zip(jax.tree.leaves(one.breakdown), jax.tree.leaves(four.breakdown)):
        assert (np.abs(np.asarray(a) - np.asarray(b)) <= 1e-6 * step).all()
    for a, b in zip(jax.tree.leaves(one.memory), jax.tree.leaves(four.memory)):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=0)
    b1, b4 = ranked(one, 1)[0], ranked(four, 1)[0]
    assert abs(one.step_time_s[b4] / one.step_time_s[b1] - 1) < 1e-6
    # A hardware sweep split over the 4 devices (6 points: one call of 2 points per device,
    # the last device's share padded): each device runs the single-device program on its 2
    # points (the single device on 6), so the same layouts, counts and memory; times to
    # float32 rounding (measured: 1 ulp, XLA fuses the two batch sizes differently).
    axes = {"tiers[0].bandwidth_Bps": [50e9, 300e9, 900e9],
            "hbm_capacity_bytes": [3.0 * 2**30, 8.0 * 2**30]}
    s1 = sweep(model, system, None, table, axes, top=2)
    s4 = sweep(model, system, None, table, axes, top=2, devices=jax.devices())
    np.testing.assert_array_equal(s1.index, s4.index)
    np.testing.assert_array_equal(s1.n_fits, s4.n_fits)
    np.testing.assert_allclose(s1.memory_bytes, s4.memory_bytes, rtol=1e-6, atol=0)
    np.testing.assert_allclose(s1.step_time_s, s4.step_time_s, rtol=3e-7, atol=0)
    assert (s1.index >= 0).all()
    # In several calls (1 point per device: 2 calls, the second padded) through an executable
    # store: the model, table and training are placed on the devices once, the points per call.
    s4c = sweep(model, system, None, table, axes, top=2, devices=jax.devices(),
                points_per_call=1, store={})
    np.testing.assert_array_equal(s1.index, s4c.index)
    np.testing.assert_array_equal(s1.n_fits, s4c.n_fits)
    np.testing.assert_allclose(s1.memory_bytes, s4c.memory_bytes, rtol=1e-6, atol=0)
    np.testing.assert_allclose(s1.step_time_s, s4c.step_time_s, rtol=3e-7, atol=0)
    print("identical", len(table))
""")


def test_sharded_search_equals_unsharded():
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4",
               JAX_PLATFORMS="cpu")
    out = subprocess.run([sys.executable, "-c", _SHARDED], env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "identical" in out.stdout


# --------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------

def test_cli_search_json(capsys, table):
    code = main(["search", "--model", "gpt-small", "--gpus", str(N_DEVICES), "--global-batch",
                 str(GLOBAL_BATCH), "--top", "3", "--no-cache", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    data = json.loads(out)
    assert data["evaluated"] == len(table)
    assert 0 < data["feasible"] <= data["evaluated"] and data["seconds"] > 0
    ranked_ = data["ranked"]
    assert [r["rank"] for r in ranked_] == [1, 2, 3]
    steps = [r["step_time_s"] for r in ranked_]
    assert steps == sorted(steps) and all(r["fits"] for r in ranked_)
    lay = ranked_[0]["layout"]
    assert lay["tp"] * lay["pp"] * lay["dp"] * lay["cp"] == N_DEVICES
    parts = ranked_[0]["breakdown"]
    assert abs(sum(v for k, v in parts.items() if "hidden" not in k) - steps[0]) < 1e-5 * steps[0]
    assert data["pareto"] and data["pareto"][0]["step_time_s"] == pytest.approx(steps[0])


def test_cli_search_axonn_json_and_table(capsys, grid_table):
    """`diffperf search --axonn` adds the grid layouts; JSON and the table show gx, gy, gz."""
    args = ["search", "--model", "gpt-small", "--gpus", str(N_DEVICES), "--global-batch",
            str(GLOBAL_BATCH), "--top", "3", "--no-cache", "--axonn"]
    assert main([*args, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["axonn"] is True and data["evaluated"] == len(grid_table)
    assert data["axonn_layouts"] == int(axonn_mask(grid_table).sum()) > 0
    layouts = [e["layout"] for e in data["ranked"] + data["pareto"]]
    assert all(lay["gx"] * lay["gy"] * lay["gz"] * lay["tp"] * lay["pp"] * lay["dp"]
               * lay["cp"] == N_DEVICES for lay in layouts)
    # The grid rows are ranked with the others: the fastest grid layout that fits, in JSON.
    assert main([*args, "--top", str(data["feasible"]), "--json"]) == 0
    ranked_ = json.loads(capsys.readouterr().out)["ranked"]
    grid = [r["layout"] for r in ranked_ if r["layout"]["gx"] * r["layout"]["gy"]
            * r["layout"]["gz"] > 1]
    assert grid and all(lay["tp"] == lay["pp"] == 1 and lay["sequence_parallel"] == 0
                        for lay in grid)
    assert main(args) == 0
    out = capsys.readouterr().out
    assert all(f" {c} " in out for c in ("gx", "gy", "gz")) and "on the AxoNN grid" in out
    assert main(args[:-1] + ["--json"]) == 0  # default: no grid rows
    data = json.loads(capsys.readouterr().out)
    assert data["axonn"] is False and data["axonn_layouts"] == 0


def test_cli_search_table_and_errors(capsys):
    code = main(["search", "--model", "gpt-small", "--gpus", str(N_DEVICES), "--global-batch",
                 str(GLOBAL_BATCH), "--top", "2", "--no-cache"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "step_time_s" in out and "mem_GiB" in out and "Pareto front" in out
    code = main(["search", "--model", "gpt-small", "--gpus", "13", "--global-batch", "8",
                 "--no-cache"])
    out, err = capsys.readouterr()
    assert code == 2 and err.startswith("error: ") and len(err.strip().splitlines()) == 1
    assert main(["search", "--gpus", "0", "--no-cache"]) == 2


def test_cli_search_trust_columns_robust_and_in_envelope(capsys):
    """The efficiency set and each ranked layout's envelope flag and 95 % interval in JSON;
    --in-envelope keeps to layouts inside; --robust ranks by the interval's top (docs/trust.md)."""
    base = ["search", "--model", "gpt-small", "--gpus", str(N_DEVICES), "--global-batch",
            str(GLOBAL_BATCH), "--top", "5", "--no-cache", "--json"]
    assert main(base) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["efficiency_set"]["name"] == "a100-default"
    assert 0 <= data["feasible_in_envelope"] <= data["feasible"]
    for r in data["ranked"]:
        lo, hi = r["interval_95_s"]
        assert lo < r["step_time_s"] < hi and isinstance(r["inside_envelope"], bool)
        assert (r["envelope_score"] == 1.0) == r["inside_envelope"]
    assert main(base + ["--in-envelope"]) == 0
    inside = json.loads(capsys.readouterr().out)
    assert inside["in_envelope"] and len(inside["ranked"]) == min(5, data["feasible_in_envelope"])
    assert all(r["inside_envelope"] for r in inside["ranked"])
    assert main(base + ["--robust"]) == 0
    robust = json.loads(capsys.readouterr().out)["ranked"]
    tops = [r["interval_95_s"][1] for r in robust]
    assert tops == sorted(tops) and tops[0] <= min(r["interval_95_s"][1] for r in data["ranked"])
    assert main(base[:-1]) == 0
    out = capsys.readouterr().out
    assert "envelope" in out and "hi95_s" in out and "efficiency set: a100-default" in out
