"""Sensitivity and co-design (DESIGN.md question 3; STYLE.md section 7, kinds 4 and 7).

- elasticities d ln T / d ln theta by jax.grad equal central finite differences of
  `diffperf.predict` in log coordinates (float32: relative 1e-2), at layouts away from kinks;
- physical signs, and two exact identities: an efficiency that multiplies a rate has that
  rate's elasticity, and the dimensional sum rule sum_rates e - sum_times e = -1;
- at the optimum: the soft-min gradient matches finite differences of the soft-min itself, and
  memory capacity has an elasticity when it binds and none when it does not;
- design: the optimizer lowers its objective and never leaves the budget;
- the `sensitivity` and `design` commands' --json output parses.

Compilation dominates: the kernels are jitted once (quick XLA:CPU options) and every case
below reuses them (one layout table, one placement order, one padded candidate size).
"""

from __future__ import annotations

import dataclasses
import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from diffperf import Parallel, Training, load_model, load_system, predict
from diffperf.api import _as_float
from diffperf.cli.design_cmd import load_cost
from diffperf.cli.main import main
from diffperf.design import CostModel, device_cost, optimize_design
from diffperf.errors import SpecError
from diffperf.search import PLACEMENTS, enumerate_layouts
from diffperf.sensitivity import (_quick_jit, candidates, elasticities,
                                  elasticities_at_optimum, grad_of, leaf_paths, leaf_values,
                                  parameter_values, scale_leaf, soft_min_and_grad,
                                  step_change_frac, step_time_and_elasticities, switch_values)
from diffperf.specs.batch import anonymous
from diffperf.specs.system import SWITCHES

# Layouts away from every kink of the hard model (tests/test_gradients.py CHECK_GRAD_CASES):
# no group fills a network domain exactly, no overlap window ties its communication.
CASES = {
    "single-node-1.7b-a100": ("megatron-1.7b", "a100-sxm-80gb", dict(
        tp=2, pp=1, dp=2, micro_batch=2, global_batch=32, zero_stage=1, recompute=1,
        sequence_parallel=1), dict(microbatch_s=1e-3)),
    "multi-node-gpt-small-a100-4nic": ("gpt-small", "a100-4nic", dict(
        tp=1, pp=1, dp=16, micro_batch=2, global_batch=64), {}),
    "multi-node-llama3-8b-h100": ("llama3-8b", "h100-sxm-80gb", dict(
        tp=4, pp=2, dp=4, micro_batch=1, global_batch=64, zero_stage=3, recompute=2,
        sequence_parallel=1, tp_overlap=0.5), {}),
}
H = 1e-3  # log step of the finite differences: float32 error ~1e-7 / H, far below 1e-2 e
RATES = ("_flops_per_s", "_Bps")  # suffixes of leaves that are rates
TAU = 0.05
# The soft-min table: gpt-small on 4 GPUs, global batch 8, Megatron placement (1,020
# layouts, one padded batch of 1,024 candidates: no pruning, no search).
GPUS, BATCH, ONE_ORDER, CANDIDATES, N_LAYOUTS = 4, 8, PLACEMENTS[:1], 1024, 1020


@functools.lru_cache(maxsize=None)
def _case(name):
    model_name, system_name, layout, eff = CASES[name]
    system = load_system(system_name)
    return load_model(model_name), Parallel(**layout), system.replace(
        eff=system.eff.replace(**eff))


@functools.lru_cache(maxsize=None)
def _elasticities(name):
    return elasticities(*_case(name), Training())


def _step_times(model, parallel, systems, training):
    """diffperf.predict's step time at a batch of systems (vmap over the leading axis)."""
    return jax.vmap(lambda s: predict(model, parallel, s, training).step_time_s)(systems)


_STEP_TIMES = _quick_jit(_step_times)


def _perturbed(system, h):
    """Systems [2 n]: leaf i x e^{+h} at 2i, x e^{-h} at 2i + 1."""
    leaves, treedef = jax.tree.flatten(_as_float(anonymous(system)))
    base = np.array([float(v) for v in leaves])
    n = len(base)
    signs = np.repeat(np.eye(n), 2, axis=0) * np.tile([h, -h], n)[:, None]
    batch = base[None, :] * np.exp(signs)
    dtype = jnp.result_type(float)
    return jax.tree.unflatten(treedef, [np.asarray(batch[:, i], dtype) for i in range(n)])


# ---------------------------------------------------------------------- at a layout

@pytest.mark.parametrize("name", sorted(CASES))
def test_elasticities_match_finite_differences_of_predict(name):
    """d ln T / d ln theta (jax.grad) = [ln T(theta e^h) - ln T(theta e^-h)] / 2h, where
    T is `diffperf.predict`'s step time, for every System leaf (float32, rel 1e-2)."""
    model, parallel, system = _case(name)
    elast = _elasticities(name)
    floats = _as_float((anonymous(model), anonymous(parallel), anonymous(Training())))
    t = np.asarray(_STEP_TIMES(floats[0], floats[1], _perturbed(system, H), floats[2]),
                   dtype=np.float64)
    fd = (np.log(t[0::2]) - np.log(t[1::2])) / (2 * H)
    assert list(elast) == [p for p in leaf_paths(system) if p not in SWITCHES]
    fd = dict(zip(leaf_paths(system), fd))
    for path, e in elast.items():
        d = fd[path]
        assert abs(e - d) <= 1e-2 * abs(e) + 2e-4, f"{name}: {path}: grad {e:.6g}, fd {d:.6g}"
    assert abs(elast["matmul_flops_per_s"]) > 0.1  # the check is not vacuous


def test_switches_have_no_elasticity():
    """A 0/1 switch (specs.system.SWITCHES) has no derivative: the tables leave it out, at 0
    (Hopper) and at 1 (Blackwell's fp8_non_tn_gemm), the compiled program of the H100 case
    reused (only the leaf's value changes)."""
    name = "multi-node-llama3-8b-h100"
    model, parallel, system = _case(name)
    on = system.replace(fp8_non_tn_gemm=1.0)
    t, e = step_time_and_elasticities(model, parallel, on, Training())
    assert t > 0 and "fp8_non_tn_gemm" not in e and "fp8_non_tn_gemm" not in _elasticities(name)
    assert e["matmul_flops_per_s"] == pytest.approx(_elasticities(name)["matmul_flops_per_s"])
    assert switch_values(on) == {"fp8_non_tn_gemm": 1.0}
    assert set(parameter_values(on)) == set(e)


@pytest.mark.parametrize("name", sorted(CASES))
def test_signs_and_identities(name):
    """Rates never slow a step (e <= 0), times never speed it up (e >= 0); an efficiency
    that multiplies a rate has its elasticity; capacity does not change a step time."""
    _, _, system = _case(name)
    e = _elasticities(name)
    for path, v in e.items():
        if path.endswith(RATES) or path.startswith("eff.") and path.endswith(("_max", "_eff")):
            assert v <= 1e-7, (path, v)
        if path.endswith("latency_s") or path.startswith("eff.") and path.endswith("_s"):
            # fixed times (eff.*_s, latencies); no eff.* leaf is a rate in /s
            assert v >= -1e-7, (path, v)
    assert e["eff.mem_eff"] == pytest.approx(e["hbm_bandwidth_Bps"], rel=1e-4, abs=1e-9)
    assert e["eff.coll_eff_intra"] == pytest.approx(e["tiers[0].bandwidth_Bps"], rel=1e-4,
                                                    abs=1e-9)
    outer = sum(e[f"tiers[{i}].bandwidth_Bps"] for i in range(1, len(system.tiers)))
    assert e["eff.coll_eff_inter"] == pytest.approx(outer, rel=1e-4, abs=1e-9)
    assert e["hbm_capacity_bytes"] == 0 and e["power_W"] == 0
    assert float(step_change_frac(-1.0)) == pytest.approx(1 / 1.1 - 1)


@pytest.mark.parametrize("name", sorted(CASES))
def test_dimensional_sum_rule(name):
    """Rates x lambda and fixed times / lambda give T / lambda (no other leaf is in seconds
    or per second), so sum_rates e - sum_times e = -1."""
    e = _elasticities(name)
    rates = sum(v for p, v in e.items() if p.endswith(RATES))
    times = sum(v for p, v in e.items() if p.endswith("_s") and not p.endswith("_per_s"))
    assert rates - times == pytest.approx(-1.0, abs=2e-4)


# ------------------------------------------------------------------------- at the optimum

@pytest.fixture(scope="module")
def soft_case():
    """(model, table, roomy system, tight system): the tight system's capacity leaves the
    fastest layout a 2 % fit margin, so capacity binds; the roomy one has 10x more."""
    model, system = load_model("gpt-small"), load_system("a100-sxm-80gb")
    table = enumerate_layouts(model, GPUS, BATCH, placements=ONE_ORDER)
    roomy = system.replace(hbm_capacity_bytes=10 * system.hbm_capacity_bytes)
    cands = candidates(model, roomy, None, table, TAU, placements=ONE_ORDER,
                       max_candidates=CANDIDATES)
    assert len(cands.index) == len(table) == N_LAYOUTS and cands.dropped_weight == 0
    _, _, (log_t, margin, _) = soft_min_and_grad(model, _as_float(anonymous(roomy)),
                                                 Training(), cands, TAU)
    fastest = int(np.argmin(log_t))
    need = float(roomy.hbm_capacity_bytes) * (1 - margin[fastest])  # usable bytes it needs
    tight = system.replace(hbm_capacity_bytes=need / 0.98 / float(system.eff.mem_usable_frac))
    return model, table, roomy, tight


def test_capacity_elasticity_only_when_it_binds(soft_case):
    model, table, roomy, tight = soft_case
    hw = ("hbm_capacity_bytes", "matmul_flops_per_s", "tiers[0].bandwidth_Bps")
    loose = elasticities_at_optimum(model, roomy, None, table, TAU, placements=ONE_ORDER,
                                    max_candidates=CANDIDATES, hard_leaves=hw)
    bound = elasticities_at_optimum(model, tight, None, table, TAU, placements=ONE_ORDER,
                                    max_candidates=CANDIDATES, hard_leaves=hw)
    assert abs(loose.soft["hbm_capacity_bytes"]) < 1e-4
    assert loose.hard["hbm_capacity_bytes"] == 0
    assert bound.soft["hbm_capacity_bytes"] < -1e-2  # more memory lets faster layouts in
    assert bound.hard["hbm_capacity_bytes"] < 0      # -10 %: the fastest layout no longer fits
    # J <= min_i s_i, and s_i = ln T_i where the penalty vanishes (margins >> tau).
    assert loose.soft_step_time_s <= loose.best_step_time_s * (1 + 1e-6)
    for opt in (loose, bound):
        assert opt.soft["matmul_flops_per_s"] < -0.1
        # At the best layout held fixed, capacity changes nothing: its soft elasticity comes
        # only from which layouts fit.
        assert opt.at_best["hbm_capacity_bytes"] == 0
        assert opt.at_best["matmul_flops_per_s"] < -0.1
        # a 0/1 switch (specs.system.SWITCHES) has no elasticity in any of the four tables
        for table_ in (opt.soft, opt.hard, opt.at_best, opt.optimum, opt.method):
            assert not set(SWITCHES) & set(table_)


def test_optimum_is_within_two_percent_of_the_exact_best_and_capacity_is_re_searched(
        soft_case):
    """Issue 21 item 5: the annealed soft-min step time is within 2 % of the exact search's
    best step time (at the starting tau 0.05 it is not: the check is not vacuous), its
    elasticities agree with those at the best layout, and capacity -- which acts only through
    which layouts fit -- takes its worth from the exact re-search, labeled so."""
    from diffperf.search import search
    from diffperf.sensitivity import METHOD_RESEARCH, METHOD_SOFT, SOFT_TOLERANCE

    model, table, _, tight = soft_case
    hw = ("hbm_capacity_bytes", "matmul_flops_per_s")
    opt = elasticities_at_optimum(model, tight, None, table, TAU, placements=ONE_ORDER,
                                  max_candidates=CANDIDATES, hard_leaves=hw)
    exact = search(model, tight, None, table, placements=ONE_ORDER, validate=False)
    best = float(np.min(np.where(exact.fits, exact.step_time_s, np.inf)))
    assert opt.best_step_time_s == pytest.approx(best, rel=1e-5)
    assert abs(opt.soft_step_time_s / best - 1) <= SOFT_TOLERANCE == 0.02
    assert opt.temperature < opt.temperature_start == TAU
    # At the starting temperature the soft-min is further than 2 % from the best.
    cands = candidates(model, tight, None, table, TAU, placements=ONE_ORDER,
                       max_candidates=CANDIDATES)
    j0 = float(soft_min_and_grad(model, _as_float(anonymous(tight)), Training(), cands,
                                 TAU)[0])
    assert abs(np.exp(j0) / best - 1) > 0.02
    # Capacity: the exact re-search's value, labeled; the rates: the soft-min gradient, close
    # to the elasticity at the best layout held fixed.
    assert opt.method["hbm_capacity_bytes"] == METHOD_RESEARCH
    assert opt.optimum["hbm_capacity_bytes"] == opt.hard["hbm_capacity_bytes"] < 0
    assert opt.method["matmul_flops_per_s"] == METHOD_SOFT
    assert opt.optimum["matmul_flops_per_s"] == opt.soft["matmul_flops_per_s"]
    assert opt.optimum["matmul_flops_per_s"] == pytest.approx(
        opt.at_best["matmul_flops_per_s"], rel=0.05)


def test_soft_elasticities_match_finite_differences_of_the_soft_min(soft_case):
    """dJ / d ln theta (one gradient through every layout) = central differences of J."""
    model, table, _, tight = soft_case
    cands = candidates(model, tight, None, table, TAU, placements=ONE_ORDER,
                       max_candidates=CANDIDATES)
    system = _as_float(anonymous(tight))
    _, grad, _ = soft_min_and_grad(model, system, Training(), cands, TAU)
    values = leaf_values(system)
    for path in ("hbm_capacity_bytes", "matmul_flops_per_s", "hbm_bandwidth_Bps",
                 "tiers[0].bandwidth_Bps", "eff.mm_max"):
        j = [float(soft_min_and_grad(model, scale_leaf(system, path, np.exp(s)), Training(),
                                     cands, TAU)[0]) for s in (H, -H)]
        fd = (j[0] - j[1]) / (2 * H)
        e = grad_of(grad, path) * values[path]
        assert abs(e - fd) <= 2e-2 * abs(e) + 1e-3, (path, e, fd)


def test_optimum_needs_a_positive_temperature_and_a_fitting_layout(soft_case):
    model, table, roomy, _ = soft_case
    with pytest.raises(SpecError, match="temperature=0 must be > 0"):
        elasticities_at_optimum(model, roomy, None, table, 0)
    full = roomy.replace(hbm_capacity_bytes=1e6)
    with pytest.raises(SpecError, match=f"no layout of the {N_LAYOUTS} given fits in memory"):
        elasticities_at_optimum(model, full, None, table, TAU, placements=ONE_ORDER,
                                max_candidates=CANDIDATES)


# -------------------------------------------------------------------------------- design

def _design(system, cost, objective, steps=12, **kwargs):
    model = load_model("gpt-small")
    table = enumerate_layouts(model, GPUS, BATCH, placements=ONE_ORDER)
    return optimize_design(model, system, None, table, cost, objective, steps=steps,
                           placements=ONE_ORDER, max_candidates=CANDIDATES, **kwargs)


def test_design_lowers_time_to_train_within_the_budget():
    system, cost = load_system("a100-sxm-80gb"), load_cost("illustrative-usd")
    d = _design(system, cost, "time_to_train")
    assert d.history[-1] < 0.98 * d.history[0]
    assert d.after["objective"] < d.before["objective"]
    assert d.start_scale == 1 and d.before["cost"] == pytest.approx(device_cost(cost, system))
    for s in (d.start, d.system):
        assert device_cost(cost, s) <= cost.budget * (1 + 1e-6)
    values = leaf_values(d.system)
    assert all(values[p] > 0 for p in d.parameters) and values["tiers[0].domain_size"] >= 1
    # Unpriced leaves keep their values; the fp32 and vector peaks follow the matrix peak.
    start = leaf_values(system)
    assert values["tiers[1].latency_s"] == pytest.approx(start["tiers[1].latency_s"])
    ratio = values["matmul_flops_per_s"] / start["matmul_flops_per_s"]
    assert values["vector_flops_per_s"] == pytest.approx(start["vector_flops_per_s"] * ratio,
                                                         rel=1e-5)


def test_design_scales_an_expensive_start_into_the_budget_and_lowers_cost_per_token():
    system = load_system("a100-sxm-80gb")
    cost = dataclasses.replace(load_cost("illustrative-power"), budget=300.0)
    d = _design(system, cost, "cost_per_token", steps=8)
    assert d.start_scale < 1 and device_cost(cost, d.start) <= 300 * (1 + 1e-6)
    assert device_cost(cost, d.system) <= 300 * (1 + 1e-6)
    assert d.history[-1] < d.history[0]
    free = dataclasses.replace(cost, budget=None)  # cost per token needs no budget
    assert _design(system, free, "cost_per_token", steps=8).history[-1] < d.history[0]
    with pytest.raises(SpecError, match="time_to_train requires a budget"):
        _design(system, free, "time_to_train")
    with pytest.raises(SpecError, match="prices nothing"):
        _design(system, CostModel(unit="USD", base=1.0, budget=2.0), "time_to_train")


# --------------------------------------------------------------------------- command line

def _run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_sensitivity_help_names_the_switches(capsys):
    """The help names every switch from specs.system.SWITCHES (the single list) and prints no
    '%%' (argparse does not %-format a description: review13g)."""
    from diffperf.cli.main import _parser

    with pytest.raises(SystemExit):
        _parser().parse_args(["sensitivity", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "%%" not in text and "'+10% NVLink bandwidth gives x% step time'" in text
    assert f"The 0/1 switches of a system ({', '.join(SWITCHES)}) are not differentiable" in text


def test_cli_sensitivity_json(capsys):
    code, out, err = _run(capsys, "sensitivity", "--model", "gpt-small", "--gpus", str(GPUS),
                          "--tp", "2", "--pp", "1", "--micro-batch", "2", "--global-batch",
                          str(BATCH), "--optimum", "--placements", "tp-cp-dp-pp",
                          "--max-candidates", str(CANDIDATES), "--json")
    assert code == 0, err
    data = json.loads(out)
    rows = {r["leaf"]: r for r in data["elasticities"]}
    assert set(rows) == set(leaf_paths(load_system("a100-sxm-80gb"))) - set(SWITCHES)
    assert data["switches"] == {"fp8_non_tn_gemm": 0.0}  # listed apart, no elasticity
    nvlink = rows["tiers[0].bandwidth_Bps"]
    assert nvlink["label"] == "tiers[0].bandwidth_Bps (nvlink)" and nvlink["unit"] == "GB/s"
    assert nvlink["value_human"] == pytest.approx(300)
    assert nvlink["plus_10pct_step_frac"] == pytest.approx(1.1 ** nvlink["elasticity"] - 1)
    assert rows["matmul_flops_per_s"]["elasticity"] < -0.1
    opt = data["optimum"]
    assert opt["layouts"] == opt["candidates"] == N_LAYOUTS and opt["step_time_s"] > 0
    assert rows["hbm_capacity_bytes"]["optimum_reoptimized"] == 0
    assert abs(opt["soft_vs_best_frac"]) <= 0.02
    assert opt["soft_step_time_s"] == pytest.approx(opt["step_time_s"] * (
        1 + opt["soft_vs_best_frac"]))
    cap = rows["hbm_capacity_bytes"]
    assert cap["optimum_method"] == "exact re-search (feasibility constraint)"
    assert cap["optimum_method"] in opt["methods"] and cap["optimum"] == 0
    assert rows["matmul_flops_per_s"]["optimum_method"] == "soft-min gradient"


def test_cli_sensitivity_goodput_json(capsys):
    """--goodput: elasticities of the effective throughput; the reliability leaves have an
    effect, with the physical sign, in their human units (the default layout)."""
    code, out, err = _run(capsys, "sensitivity", "--goodput", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["objective"] == "effective_tokens_per_s" and data["effective_tokens_per_s"] > 0
    rows = {r["leaf"]: r for r in data["elasticities"]}
    rate, write = rows["reliability.failure_rate_per_s"], rows["reliability.storage_write_Bps"]
    assert rate["elasticity"] < 0 < write["elasticity"]
    assert rows["reliability.restart_s"]["elasticity"] < 0
    assert rate["unit"] == "per device-hour" and rate["value_human"] == pytest.approx(
        419 / (54 * 24 * 16384))  # Llama 3's rate (configs/README.md)
    assert write["plus_10pct_effective_frac"] == pytest.approx(1.1 ** write["elasticity"] - 1)
    assert rows["matmul_flops_per_s"]["elasticity"] > 0.1  # faster: more tokens/s


def test_cli_design_json_and_errors(capsys):
    args = ("design", "--model", "gpt-small", "--gpus", str(GPUS), "--global-batch",
            str(BATCH), "--cost", "illustrative-usd", "--steps", "5", "--placements",
            "tp-cp-dp-pp", "--max-candidates", str(CANDIDATES))
    code, out, err = _run(capsys, *args, "--json")
    assert code == 0, err
    data = json.loads(out)
    assert len(data["history"]) == 6 and data["unit"] == "USD"
    assert data["after"]["cost"] <= data["budget"] * (1 + 1e-6)
    assert {p["parameter"] for p in data["parameters"]} >= {"matmul_flops_per_s",
                                                           "tiers[0].domain_size"}
    code, _, err = _run(capsys, *args[:-6], "--cost", "illustrative-usb")
    assert code == 2 and "did you mean 'illustrative-usd'" in err and "Traceback" not in err


def test_design_segments_change_nothing_and_compile_once():
    """The optimizer's steps run `refresh` at a time in one compiled program
    (design._segment): cutting 7 steps into 3 + 3 + 1 gives the same design as one run of
    7 (nothing is pruned here, so no candidate changes between segments), and a second
    design of the same shapes traces nothing again."""
    from diffperf import design

    system, cost = load_system("a100-sxm-80gb"), load_cost("illustrative-usd")
    programs = design._segment_programs().values()
    for p in programs:
        p.clear_cache()
    cut = _design(system, cost, "time_to_train", steps=7, refresh=3, store=None)
    assert sum(p._cache_size() for p in programs) == 1
    again = _design(system, cost, "time_to_train", steps=7, refresh=3, store=None)
    assert sum(p._cache_size() for p in programs) == 1
    np.testing.assert_array_equal(again.history, cut.history)
    whole = _design(system, cost, "time_to_train", steps=7, refresh=50, store=None)
    assert len(cut.history) == len(whole.history) == 8
    np.testing.assert_allclose(cut.history, whole.history, rtol=1e-6)
    for k in ("objective", "cost", "best_index"):
        assert cut.after[k] == pytest.approx(whole.after[k], rel=1e-6)
