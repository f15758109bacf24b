"""Hardware sweeps (issue 14): the best layouts at every point of a grid of hardware values,
`diffperf search --sweep`, the sweep's FIELD=VALUES parsing, and the executable store.

The reference is `search` at each hardware point, ranked: GPT-2 small on 4 devices (1,128
layouts) on a 3 x 3 grid of NVLink bandwidth and HBM capacity, with the capacity cut so that
at one value nothing fits and at the others part of the table does.
"""

from __future__ import annotations

import json
import re

import jax
import numpy as np
import pytest

from diffperf import SpecError, load_model, load_system, training
from diffperf.cli.main import main
from diffperf.load import (sweep_axes, sweep_fields, system_from_dict, system_names,
                           system_to_dict)
from diffperf.search import enumerate_layouts, ranked, search, sweep
from diffperf import executables as search_executables

MODEL = load_model("gpt-small")
SYSTEM = load_system("a100-sxm-80gb").replace(hbm_capacity_bytes=3.0 * 2**30)
TRAINING = training("bf16")
N_DEVICES, GLOBAL_BATCH = 4, 8
NVLINK = [50e9, 300e9, 900e9]
CAPACITY = [2.0 * 2**30, 3.0 * 2**30, 8.0 * 2**30]  # 2 GiB: nothing fits
AXES = {"tiers[0].bandwidth_Bps": NVLINK, "hbm_capacity_bytes": CAPACITY}


def _raises(message):
    return pytest.raises(SpecError, match=re.escape(message))


@pytest.fixture(scope="module")
def table():
    return enumerate_layouts(MODEL, N_DEVICES, GLOBAL_BATCH)


@pytest.fixture(scope="module")
def swept(table):
    return sweep(MODEL, SYSTEM, TRAINING, table, AXES, top=3)


def _at(bw, cap):
    inner, outer = SYSTEM.tiers
    return SYSTEM.replace(hbm_capacity_bytes=cap, tiers=(inner.replace(bandwidth_Bps=bw), outer))


def test_sweep_equals_search_at_every_point(table, swept):
    """At each point: the same fastest layouts (rows of the table, ties in table order), the
    same step times and memory, and the same number of layouts that fit, as `search` at that
    point ranked by `ranked`."""
    assert swept.shape == (3, 3) and swept.step_time_s.shape == (3, 3, 3)
    assert swept.n_points == 9 * len(table)
    for i, bw in enumerate(NVLINK):
        for j, cap in enumerate(CAPACITY):
            r = search(MODEL, _at(bw, cap), TRAINING, table)
            best = ranked(r, 3)
            assert swept.n_fits[i, j] == int(np.sum(r.fits))
            if not len(best):  # 2 GiB: nothing fits
                assert (swept.index[i, j] == -1).all() and np.isinf(swept.step_time_s[i, j]).all()
                assert np.isnan(swept.memory_bytes[i, j]).all()
                continue
            np.testing.assert_array_equal(swept.index[i, j], best)
            np.testing.assert_allclose(swept.step_time_s[i, j], r.step_time_s[best], rtol=1e-6)
            np.testing.assert_allclose(swept.memory_bytes[i, j], r.memory.total_bytes[best],
                                       rtol=1e-6)
    assert (swept.n_fits[:, 0] == 0).all() and (swept.n_fits[:, 1] < swept.n_fits[:, 2]).all()
    # More NVLink bandwidth never slows the best layout; more memory never removes one.
    assert (np.diff(swept.step_time_s[:, 1:, 0], axis=0) <= 0).all()


def test_sweep_blocks_and_chunks_do_not_change_the_result(table, swept):
    """One hardware point per call and small scan steps (the top-k merged across many chunks
    and calls) give the same answer as the default blocking."""
    small = sweep(MODEL, SYSTEM, TRAINING, table, AXES, top=3, points_per_call=1, cells=24 * 64)
    np.testing.assert_array_equal(small.index, swept.index)
    np.testing.assert_array_equal(small.n_fits, swept.n_fits)
    np.testing.assert_allclose(small.step_time_s, swept.step_time_s, rtol=1e-6)


def test_sweep_arguments_are_checked(table):
    with _raises("a sweep needs at least one axis {System leaf path: values}, e.g. "
                 "{'tiers[1].bandwidth_Bps': [25e9, 50e9]}"):
        sweep(MODEL, SYSTEM, TRAINING, table, {})
    with _raises("sweep: unknown System leaf 'hbm_bandwith_Bps'; did you mean "
                 "'hbm_bandwidth_Bps'? (allowed: matmul_flops_per_s, "):
        sweep(MODEL, SYSTEM, TRAINING, table, {"hbm_bandwith_Bps": [1e12]})
    with _raises("sweep: tiers[1].bandwidth_Bps=0.0 must be a finite number > 0 (a non-empty "
                 "list of values)"):
        sweep(MODEL, SYSTEM, TRAINING, table, {"tiers[1].bandwidth_Bps": [25e9, 0.0]})
    with _raises("sweep: eff.kernel_s=[] must be a finite number >= 0 (a non-empty list of "
                 "values)"):
        sweep(MODEL, SYSTEM, TRAINING, table, {"eff.kernel_s": []})
    with _raises("sweep: fp8_non_tn_gemm=0.5 is a switch (allowed: 0 or 1)"):
        sweep(MODEL, SYSTEM, TRAINING, table, {"fp8_non_tn_gemm": [0, 0.5, 1]})
    with _raises("sweep: tiers[1].domain_size=8 must be >= tiers[0].domain_size=16 (tiers are "
                 "nested, innermost first)"):
        sweep(MODEL, SYSTEM, TRAINING, table, {"tiers[0].domain_size": [8, 16],
                                               "tiers[1].domain_size": [8, 64]})
    with _raises("top=0 must be a whole number >= 1"):
        sweep(MODEL, SYSTEM, TRAINING, table, AXES, top=0)


# --------------------------------------------------------------------------------------------
# FIELD=VALUES (system YAML keys in their units)
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", system_names())
def test_system_to_dict_reads_back(name):
    """system_to_dict is system_from_dict's inverse on every shipped system (a key the loader
    learns and system_to_dict does not would make this fail)."""
    import jax

    system = load_system(name)
    again = system_from_dict(system_to_dict(system), name)
    assert jax.tree.structure(again) == jax.tree.structure(system)
    np.testing.assert_allclose(jax.tree.leaves(again), jax.tree.leaves(system), rtol=1e-12)


def test_sweep_axes_units_and_spacing():
    s = load_system("a100-sxm-80gb")
    (key, leaf, human, si), (_, leaf2, human2, si2), (_, _, h3, _) = sweep_axes(s, [
        "tiers[1].bandwidth_GBps=12.5:400:32", "hbm_capacity_GiB=1:64:7:log",
        "efficiency.mm_max = 0.6,0.8"])
    assert (key, leaf) == ("tiers[1].bandwidth_GBps", "tiers[1].bandwidth_Bps")
    np.testing.assert_allclose(human, 12.5 * np.arange(1, 33))  # 12.5 GB/s steps
    np.testing.assert_allclose(si, human * 1e9)
    assert leaf2 == "hbm_capacity_bytes"
    np.testing.assert_allclose(human2, 2.0 ** np.arange(7))  # 1, 2, 4, ... 64 GiB
    np.testing.assert_allclose(si2, human2 * 2**30)
    np.testing.assert_allclose(h3, [0.6, 0.8])
    assert "tiers[0].latency_us" in sweep_fields(s) and "efficiency.kernel_s" in sweep_fields(s)


@pytest.mark.parametrize("item,message", [
    ("tiers[1].bandwidth_GBps", "--sweep 'tiers[1].bandwidth_GBps' must look like "
                                "FIELD=START:STOP:N, FIELD=START:STOP:N:log or FIELD=V1,V2,..."),
    ("tiers[2].bandwidth_GBps=1", "--sweep: unknown field 'tiers[2].bandwidth_GBps'; did you "
                                  "mean 'tiers[1].bandwidth_GBps'? (allowed: matmul_TFLOPs, "),
    ("hbm_capacity_GiB=1:2", "--sweep hbm_capacity_GiB='1:2' must be START:STOP:N, "
                             "START:STOP:N:log or V1,V2,..."),
    ("hbm_capacity_GiB=a,2", "--sweep.hbm_capacity_GiB='a' must be a number"),
    ("hbm_capacity_GiB=1:2:0", "--sweep.hbm_capacity_GiB N=0 must be > 0"),
    ("hbm_capacity_GiB=1:2:3:geo", "--sweep hbm_capacity_GiB: spacing 'geo' is not allowed "
                                   "(allowed: lin, log)"),
    ("hbm_capacity_GiB=0:2:3:log", "--sweep hbm_capacity_GiB=0:2:3:log: a log grid needs "
                                   "START > 0 and STOP > 0"),
    ("tiers[1].bandwidth_GBps=0:400:3", "--sweep.tiers[1].bandwidth_GBps=0 must be > 0"),
    ("efficiency.mm_max=0.5:1.5:3", "--sweep.efficiency.mm_max=1.5 must be in [0.001, 1]"),
])
def test_sweep_field_errors(item, message):
    with _raises(message):
        sweep_axes(load_system("a100-sxm-80gb"), [item])


def test_design_grid_errors_name_the_grid_option():
    """`design --grid` takes --sweep's strings; its errors said '--sweep'."""
    with _raises("--grid.tiers[1].bandwidth_GBps=0 must be > 0"):
        sweep_axes(load_system("a100-sxm-80gb"), ["tiers[1].bandwidth_GBps=0:400:3"],
                   flag="--grid")
    with pytest.raises(SpecError, match=r"^--grid: unknown field 'foo' \(allowed: matmul_TFLOPs"
                       r", .*; or a System leaf path in SI such as matmul_flops_per_s; tiers by "
                       r"index or name: 0 or nvlink, 1 or infiniband\)$"):
        sweep_axes(load_system("a100-sxm-80gb"), ["foo=1"], flag="--grid")


def test_sweep_field_given_twice():
    with _raises("--sweep power_W is given twice; give each field once"):
        sweep_axes(load_system("a100-sxm-80gb"), ["power_W=400", "power_W=500"])


# --------------------------------------------------------------------------------------------
# diffperf search --sweep
# --------------------------------------------------------------------------------------------

# --calibration none: the library fixtures use the physics efficiencies; without it search
# (and its sweeps) takes the shipped A100 set (docs/trust.md).
JOB = ["search", "--model", "gpt-small", "--gpus", str(N_DEVICES), "--global-batch",
       str(GLOBAL_BATCH), "--no-cache", "--calibration", "none"]


def test_cli_sweep_json_and_table(capsys, table, swept):
    """JSON lists every point with its best layouts (those of `sweep`); the table prints one
    row per point and layout, and the count of layout x hardware points."""
    argv = JOB + ["--sweep", "tiers[0].bandwidth_GBps=50,300,900", "--sweep",
                  "hbm_capacity_GiB=2,3,8", "--top", "3"]
    assert main(argv + ["--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["hardware_points"] == 9 and data["layouts"] == len(table)
    assert data["evaluated"] == 9 * len(table)
    assert [a["field"] for a in data["axes"]] == ["tiers[0].bandwidth_GBps", "hbm_capacity_GiB"]
    point = data["points"][5]  # 300 GB/s, 8 GiB (first axis slowest)
    assert point["point"] == {"tiers[0].bandwidth_GBps": 300.0, "hbm_capacity_GiB": 8.0}
    assert point["feasible"] == swept.n_fits[1, 2]
    steps = [b["step_time_s"] for b in point["best"]]
    np.testing.assert_allclose(steps, swept.step_time_s[1, 2], rtol=1e-6)
    lay = point["best"][0]["layout"]
    assert lay["tp"] * lay["pp"] * lay["dp"] * lay["cp"] == N_DEVICES
    assert data["points"][0]["best"] == [] and data["points"][0]["feasible"] == 0
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "best layout at each hardware point" in out and "none fits" in out
    assert f"({len(table):,} layouts x 9 points)" in out


def test_cli_sweep_errors(capsys):
    assert main(JOB + ["--sweep", "hbm_bandwith_GBps=1,2"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --sweep: unknown field 'hbm_bandwith_GBps'; did you mean "
                          "'hbm_bandwidth_GBps'?") and len(err.strip().splitlines()) == 1


def test_plot_search_refuses_a_sweep(capsys, tmp_path):
    code = main(["plot", "search", "--out", str(tmp_path / "s.png"), "--sweep", "power_W=1"])
    assert code == 2
    assert "--sweep is for diffperf search (plot search draws the layouts of one system)" in (
        capsys.readouterr().err)


# --------------------------------------------------------------------------------------------
# The executable store
# --------------------------------------------------------------------------------------------

def test_executable_store_round_trip(table):
    """A search with a store compiles once and keeps the program; a process that has not
    loaded it (the in-process cache cleared) gets it from the store, without compiling, and
    the same numbers; an entry that no longer loads is compiled again."""
    class Store(dict):  # counts writes: a program is written only when it was compiled
        writes = 0

        def __setitem__(self, key, value):
            Store.writes += 1
            super().__setitem__(key, value)

    rows = table[table[:, -1] == 0]
    store, quick = Store(), dict(optimize=False)  # LLVM -O0: works alike, compiles faster
    first = search(MODEL, SYSTEM, TRAINING, rows, store=store, **quick)
    assert len(store) == 1 and Store.writes == 1
    search_executables._LOADED.clear()
    jax.clear_caches()  # a fresh process: JAX's in-memory programs gone too
    again = search(MODEL, SYSTEM, TRAINING, rows, store=store, **quick)
    assert Store.writes == 1  # loaded from the store, not compiled
    np.testing.assert_array_equal(again.step_time_s, first.step_time_s)
    np.testing.assert_array_equal(again.memory.total_bytes, first.memory.total_bytes)
    search_executables._LOADED.clear()
    jax.clear_caches()
    key = next(iter(store))
    store[key] = b"not an executable"
    third = search(MODEL, SYSTEM, TRAINING, rows, store=store, **quick)
    np.testing.assert_array_equal(third.step_time_s, first.step_time_s)
    assert store[key] != b"not an executable" and Store.writes == 3


def test_tied_leaves_are_checked(table):
    with _raises("sweep: tied={'vector_flops_per_s': ('hbm_bandwidth_Bps', 0.5)} must tie a "
                 "System leaf that is not swept to a swept one (tiers[0].bandwidth_Bps, "
                 "hbm_capacity_bytes) by a factor > 0"):
        sweep(MODEL, SYSTEM, TRAINING, table, AXES,
              tied={"vector_flops_per_s": ("hbm_bandwidth_Bps", 0.5)})
    # a 0/1 switch cannot follow a swept leaf (a factor would make it 0.5, 2, ...)
    with _raises("sweep: tied={'fp8_non_tn_gemm': ('hbm_capacity_bytes', 1.0)}: fp8_non_tn_gemm "
                 "is a switch (allowed: 0 or 1), not a leaf that follows a swept one by a "
                 "factor; sweep it itself over 0 and 1"):
        sweep(MODEL, SYSTEM, TRAINING, table, AXES,
              tied={"fp8_non_tn_gemm": ("hbm_capacity_bytes", 1.0)})


# --------------------------------------------------------------------------------------------
# diffperf design --grid
# --------------------------------------------------------------------------------------------

def test_grid_design_prices_every_point_and_picks_the_best_within_the_budget(table):
    """Cost C = base + sum p (theta - theta_min) at each point (here the matrix peak and the
    InfiniBand bandwidth are priced, the rest at the system's values); time to train =
    T tokens / (B s) with T the best step of `search` at that point, the fp32 and vector
    peaks scaled with the 16-bit one; the best point is the argmin within the budget."""
    from diffperf.design import CostModel, device_cost
    from diffperf.design_grid import grid_design

    cost = CostModel(unit="USD", base=4000.0, matmul_per_TFLOPs=20.0,
                     tier_bandwidth_per_GBps=(0.0, 60.0), tier_domain_per_device=(0.0, 0.0),
                     budget=12000.0)
    flops, ib = [150e12, 300e12, 600e12], [12.5e9, 50e9]
    g = grid_design(MODEL, SYSTEM, TRAINING, table, cost,
                    {"matmul_flops_per_s": flops, "tiers[1].bandwidth_Bps": ib}, tokens=1e9)
    tokens_per_step = GLOBAL_BATCH * float(MODEL.seq_len)
    for i, f in enumerate(flops):
        for j, b in enumerate(ib):
            r = f / float(SYSTEM.matmul_flops_per_s)
            s = SYSTEM.replace(matmul_flops_per_s=f,
                               matmul_fp32_flops_per_s=SYSTEM.matmul_fp32_flops_per_s * r,
                               vector_flops_per_s=SYSTEM.vector_flops_per_s * r,
                               tiers=(SYSTEM.tiers[0], SYSTEM.tiers[1].replace(bandwidth_Bps=b)))
            assert g.cost[i, j] == pytest.approx(device_cost(cost, s), rel=1e-9)
            res = search(MODEL, s, TRAINING, table)
            t = res.step_time_s[ranked(res, 1)[0]]
            assert g.objective[i, j] == pytest.approx(t * 1e9 / tokens_per_step, rel=1e-6)
            assert g.within[i, j] == (device_cost(cost, s) <= 12000.0)
    masked = np.where(g.within, g.objective, np.inf)
    assert g.best == int(np.argmin(masked)) and np.isfinite(masked.reshape(-1)[g.best])
    assert not g.within.all() and g.within.any()  # the budget leaves the top corner out


def test_cli_design_grid_json(capsys):
    argv = ["design", "--model", "gpt-small", "--gpus", "8", "--global-batch", "16", "--cost",
            "illustrative-usd", "--grid", "matmul_TFLOPs=150:600:4", "--grid",
            "tiers[1].bandwidth_GBps=12.5,50", "--top", "3", "--no-cache"]
    assert main(argv + ["--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["hardware_points"] == 8 and 0 < data["within_budget"] < 8
    ranked_ = data["ranked"]
    assert len(ranked_) == 3 and ranked_[0] == data["best"]
    assert all(p["within_budget"] and p["cost"] <= data["budget"] for p in ranked_)
    assert [p["objective"] for p in ranked_] == sorted(p["objective"] for p in ranked_)
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "design grid" in out and "hardware points within the budget" in out


def test_search_fields_computes_only_those(table):
    """fields=RANK_FIELDS: the same values for those leaves (to float32 rounding: the smaller
    program is fused differently), None for the others."""
    from diffperf.search import RANK_FIELDS

    rows = table[table[:, -1] == 0]
    full = search(MODEL, SYSTEM, TRAINING, rows)
    part = search(MODEL, SYSTEM, TRAINING, rows, fields=RANK_FIELDS)
    np.testing.assert_allclose(part.step_time_s, full.step_time_s, rtol=1e-6)
    np.testing.assert_array_equal(part.fits, full.fits)
    np.testing.assert_allclose(part.memory.total_bytes, full.memory.total_bytes, rtol=1e-6)
    np.testing.assert_allclose(part.mfu, full.mfu, rtol=1e-6)
    assert part.breakdown.compute_s is None and part.memory.weights_bytes is None
    with _raises("fields='step_time' must name Result fields (allowed: step_time_s, "):
        search(MODEL, SYSTEM, TRAINING, rows, fields=("step_time",))
