"""Sensitivity: elasticities d ln T / d ln theta of the step time to every System leaf.

    e_theta = (theta / T) dT/dtheta      "+10 % theta gives (1.1^e - 1) x 100 % step time"

At one layout, `jax.grad` of ln T through `predict_step`. At the optimum, the gradient of the
soft-min over layouts of `search.soft_best` (the same formula, evaluated on candidate batches
that are data, so one compilation serves every table and every hardware value):

    J = -tau ln sum_i exp(-s_i / tau),  s_i = ln T_i + softplus(-m_i / tau),  e = dJ / d ln theta

m_i = fit margin of layout i, so memory capacity gets a gradient through which layouts fit.
Beside it, the hard answer: ln min_{fits} T re-optimized at theta e^{+h} and theta e^{-h}
(central finite difference, h = ln 1.1), which is piecewise constant in the capacity.

Annealing. J sits below the best layout's ln T by up to tau ln N_eff (N_eff near-ties among the
candidates), and above it by softplus(-m/tau) when the best layout fits with a margin m of the
order of tau: at tau = 0.05 over thousands of layouts exp(J) was 17-24 % below the best step
time. `elasticities_at_optimum` therefore lowers tau (tau <- tau x max(0.1, min(0.5,
0.9 tol / |J - ln T_best|))) until |exp(J) / T_best - 1| <= tol (2 %), so the soft
elasticities are those of a soft-min that is the optimum to within tol. A memory leaf that acts
only through which layouts fit (zero elasticity at the best layout held fixed: HBM capacity,
the usable fraction, the reserved bytes) has a soft gradient that grows like 1/tau where a
layout sits on the capacity edge; its worth is reported from the exact re-search instead
(`OptimumSensitivity.method` says which).

Dimensional check (tests/test_sensitivity.py): scaling every rate (FLOP/s, bytes/s) by lambda
and every fixed time by 1/lambda scales T by 1/lambda, so  sum_rates e - sum_times e = -1.

`goodput_elasticities` asks the same of the effective throughput under failures,
checkpoints and restarts (Result.goodput, schedule.goodput), X = tokens/s x goodput fraction:

    e_theta = d ln X / d ln theta = -d ln T / d ln theta + d ln G / d ln theta
so the reliability leaves (failure rate, storage bandwidth, restart time), which do not touch
T, get their worth: "+10 % storage bandwidth gives +x % effective tokens/s"; a better MTBF is
a lower failure rate (+10 % MTBF = failure rate / 1.1).

Switches. A System leaf that is a 0/1 switch (specs.system.SWITCHES: fp8_non_tn_gemm) has no
derivative: +10 % of it is not a value it takes. Every table here (`elasticities`,
`goodput_elasticities`, `elasticities_at_optimum`) leaves the switches out; their worth is the
difference of two predictions, the switch at 0 and at 1. The device counts of the tiers
(`tiers[i].domain_size`) stay: the model reads them continuously (members of a group in a
domain = clip(domain / stride, 1, n), costs.tiers), the relaxation `design` optimizes, and
their elasticity is the slope of that relaxation.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from diffperf.api import _as_float, _normalize
from diffperf.errors import SpecError, closest
from diffperf.predict import FEATURES, features_of, predict_step
from diffperf.search import _CPU_QUICK_OPTIONS, COLUMNS, PLACEMENTS, parallel_of, search
from diffperf.specs.batch import anonymous
from diffperf.specs.parallel import Parallel, placement_index
from diffperf.specs.paths import leaf_paths, leaf_values  # noqa: F401 - public here too
from diffperf.specs.system import SWITCHES
from diffperf.specs.training import Training
from diffperf.specs.validate import check_facts_act, check_inputs

BATCHED = COLUMNS[:-1] + ("placement",)  # Parallel fields that vary between candidates
HARD_STEP = float(np.log(1.1))  # log step of the re-optimized finite difference: +-10 %
SOFT_TOLERANCE = 0.02  # |soft-min step time / best step time - 1| the annealing reaches
MIN_TEMPERATURE = 1e-5  # the annealing stops here (float32 keeps J exact to ~1e-7 / tau)
METHOD_SOFT = "soft-min gradient"
METHOD_RESEARCH = "exact re-search (feasibility constraint)"
DEFAULT_CANDIDATES = 1024  # candidates per placement order in the soft-min (lowest scores)
# What the candidates' scores s_i need of the hard search. Measured on GPT-3's 474,720
# layouts (2 cores, warm): 0.49 s of CPU per search instead of 1.16 s with every Result
# field (quick kernel), 0.145 s with the optimized kernel (design's refreshes); step times
# equal to float32 rounding (3e-7), fit margins equal.
SCORE_FIELDS = ("step_time_s", "fit_margin_frac")
# The System leaves that the fit margin depends on (memory.device.device_memory).
MEMORY_LEAVES = ("hbm_capacity_bytes", "eff.mem_usable_frac", "eff.mem_reserved_bytes",
                 "eff.act_mem_factor")


def _quick_jit(fn, **kwargs):
    """`jax.jit` with XLA:CPU's quick-compiling options on CPU (search._CPU_QUICK_OPTIONS):
    a sensitivity runs each kernel a few times, so compile time dominates. Measured on 2
    cores: the soft-min gradient over 4,096 GPT-3 layouts compiled in 2.0 s instead of 8.2 s
    at -O1 and ran in 0.13 s either way; the forward of predict compiles in 0.7 s, not 9 s."""
    quick = jax.jit(fn, compiler_options=_CPU_QUICK_OPTIONS, **kwargs)
    plain = jax.jit(fn, **kwargs)
    return lambda *a, **k: (quick if jax.default_backend() == "cpu" else plain)(*a, **k)


def leaf_label(path: str, system) -> str:
    """The path with the tier's name: 'tiers[0].bandwidth_Bps (nvlink)'."""
    if path.startswith("tiers["):
        i = int(path[6:path.index("]")])
        return f"{path} ({system.tiers[i].name})"
    return path


def step_change_frac(elasticity, change=0.10):
    """Relative step-time change when a leaf grows by `change`: (1 + change)^e - 1."""
    return (1.0 + change) ** np.asarray(elasticity) - 1.0


def parameter_values(system) -> dict:
    """{path: value} of the System leaves that have an elasticity: every leaf but the 0/1
    switches (specs.system.SWITCHES; module docstring)."""
    return {p: v for p, v in leaf_values(system).items() if p not in SWITCHES}


def switch_values(system) -> dict:
    """{path: 0.0 or 1.0} of the System's switches, which have no elasticity."""
    return {p: v for p, v in leaf_values(system).items() if p in SWITCHES}


def _times_theta(grad, system) -> dict:
    """{path: theta dF/dtheta} from a gradient pytree of F = ln T, the switches left out."""
    return {p: float(g) * float(v) for p, g, v in
            zip(leaf_paths(system), jax.tree.leaves(grad), jax.tree.leaves(system))
            if p not in SWITCHES}


def _log_step_time(system, model, parallel, training, temperature, features, checked=False):
    return jnp.log(predict_step(model, parallel, system, training, temperature,
                                features, checked).step_time_s)


def _log_effective_tokens(system, model, parallel, training, temperature, features,
                          checked=False):
    return jnp.log(predict_step(model, parallel, system, training, temperature,
                                features, checked).goodput.effective_tokens_per_s)


_LOG_STEP_GRAD = _quick_jit(jax.value_and_grad(_log_step_time),
                            static_argnames=("temperature", "features", "checked"))
_LOG_GOODPUT_GRAD = _quick_jit(jax.value_and_grad(_log_effective_tokens),
                               static_argnames=("temperature", "features", "checked"))


def _value_and_elasticities(fn, model, parallel, system, training, temperature):
    """(exp F, {leaf path: dF / d ln theta}) of F = ln(quantity) by `fn` (a jitted
    value_and_grad), at one layout, validated."""
    training = Training() if training is None else training
    parallel = _normalize(parallel)
    if temperature is not None and not temperature >= 0:
        raise SpecError(f"temperature={temperature} must be >= 0 (or None for the exact model)")
    check_inputs(model, parallel, system, training)
    system = _as_float(anonymous(system))
    log_v, grad = fn(system, *_as_float((anonymous(model), anonymous(parallel),
                                         anonymous(training))),
                     temperature=temperature or None,
                     features=FEATURES,  # one program for every layout
                     checked=True)  # check_inputs above: no in-program valid_mask
    return float(jnp.exp(log_v)), _times_theta(grad, system)


def step_time_and_elasticities(model, parallel, system, training=None, temperature=None):
    """(step time in s, {leaf path: d ln T / d ln theta}) at one layout (see `elasticities`)."""
    return _value_and_elasticities(_LOG_STEP_GRAD, model, parallel, system, training,
                                   temperature)


def goodput_elasticities(model, parallel, system, training=None, temperature=None):
    """(effective tokens/s, {leaf path: d ln X / d ln theta}) at one layout, X =
    Result.goodput.effective_tokens_per_s (module docstring): what every System leaf, the
    reliability leaves included, is worth in throughput under failures and checkpoints.

    Positive is good: more matmul FLOP/s or storage bandwidth raise X; a higher failure rate
    or a longer restart lowers it. Args as for `elasticities`.
    Example: GPT-3 175B, tp 8 pp 8 dp 16 on 1024 A100 80GB (MTBF 49.5 h): matmul FLOP/s
    +0.83 (= minus its step-time elasticity), reliability.failure_rate_per_s -0.0052 (+10 %
    MTBF: +0.05 % effective tokens/s), restart_s -0.0034 (= -R/M: ln G holds -R/M and
    Daly's interval does not depend on R), storage_write_Bps +0.0019.
    """
    return _value_and_elasticities(_LOG_GOODPUT_GRAD, model, parallel, system, training,
                                   temperature)


def elasticities(model, parallel, system, training=None, temperature=None) -> dict:
    """d ln T / d ln theta for every System leaf at one layout, by `jax.grad` of ln T.

    Args:
        model, parallel, system, training: specs as for `predict` (validated).
        temperature: None for the exact model (subgradients at kinks), > 0 for the smooth one.
    Returns:
        {leaf path: elasticity}, e.g. {'tiers[0].bandwidth_Bps': -0.094, ...}; 0 for a leaf
        that does not touch the step time (capacity, power) or whose value is 0. The 0/1
        switches (specs.system.SWITCHES) are left out: they have no derivative.
    Example: GPT-3 175B, tp 8 pp 8 dp 16 on 1024 A100 80GB: matmul FLOP/s -0.84, NVLink
    bandwidth -0.094 ("+10 % NVLink bandwidth: -0.9 % step time").
    """
    return step_time_and_elasticities(model, parallel, system, training, temperature)[1]


# ------------------------------------------------------------------------------------------
# The soft-min over candidate layouts (search.soft_best's formula, layouts as data)
# ------------------------------------------------------------------------------------------

_IN_AXES = Parallel(**{f: (0 if f in BATCHED else None) for f in Parallel.__dataclass_fields__})


def _soft_log_step(system, model, batch, mask, training, tau, smooth, features):
    """(J, (ln T_i, m_i, w_i)) over the candidates (every placement in one batch).

        s_i = ln T_i + softplus(-m_i / tau),  J = -tau logsumexp(-s / tau),  w = softmax(-s/tau)
    Padded candidates (mask 0) repeat a real row, so their values are finite; their logits
    are -inf and carry neither weight nor gradient.
    """
    r = jax.vmap(predict_step, in_axes=(None, _IN_AXES, None, None, None, None))(
        model, batch, system, training, smooth, features)
    log_t, margin = jnp.log(r.step_time_s), r.fit_margin_frac
    scores = log_t + jax.nn.softplus(-margin / tau)
    logits = jnp.where(mask > 0, -scores / tau, -jnp.inf)
    lse = jax.nn.logsumexp(logits)
    return -tau * lse, (log_t, margin, jnp.exp(logits - lse))


_SOFT_GRAD = _quick_jit(jax.value_and_grad(_soft_log_step, has_aux=True),
                        static_argnames=("smooth", "features"))


class Candidates(struct.PyTreeNode):
    """The layouts a soft-min runs over: rows of the table, padded per placement order."""

    index: Any      # int [n] rows of the layout table, in batch order (padding excluded)
    batch: Any      # Parallel batch [size] (every placement order; placement is a leaf)
    mask: Any       # float [size] (1 = real candidate, 0 = padding)
    dropped_weight: float = struct.field(pytree_node=False, default=0.0)


def _pow2(n: int) -> int:
    return 1 << int(np.ceil(np.log2(max(n, 8))))


def candidates(model, system, training, layouts, temperature, *, placements=PLACEMENTS,
               smooth=None, max_candidates=DEFAULT_CANDIDATES, optimize=None,
               store=None) -> Candidates:
    """Every layout of the table, or, where a placement order has more than
    `max_candidates`, its `max_candidates` lowest soft scores s_i (by a hard `search`).

    A row on which a fact of `training` cannot act (cp_torch at cp 1:
    `search.facts_inert_rows`) is a candidate as the framework runs it, without the fact.
    Each order's rows are padded to a fixed size (a power of two, at most max_candidates),
    so a table keeps its shapes when the hardware changes (no recompilation).
    `dropped_weight` is the soft-min weight of the rows left out (exact, from the search):
    the pruned J differs from the full one by -tau ln(1 - dropped_weight).
    optimize, store: of that search (`search.search`): a caller that selects candidates
    many times (`design`: every `refresh` steps) passes optimize=True and the program store.
    """
    layouts = np.asarray(layouts)
    dtype = jnp.result_type(float)
    check_facts_act(model, None, training or Training(), layout=False)
    groups = [np.flatnonzero(layouts[:, -1] == j) for j in np.unique(layouts[:, -1])]
    dropped = 0.0
    if any(len(g) > max_candidates for g in groups):
        r = search(model, system, training, layouts, placements=placements,
                   temperature=smooth, validate=False, fields=SCORE_FIELDS,
                   optimize=optimize, store=store)
        s = np.log(r.step_time_s) + np.logaddexp(0.0, -r.fit_margin_frac / temperature)
        w = np.exp(-(s - s.min()) / temperature)
        groups = [g[np.argsort(s[g], kind="stable")[:max_candidates]] for g in groups]
        dropped = float(1.0 - sum(w[g].sum() for g in groups) / w.sum())
    codes = np.array([placement_index(p) for p in placements])
    rows, masks = [], []
    for g in groups:
        size = min(_pow2(len(g)), _pow2(max_candidates))
        rows.append(layouts[np.concatenate([g, np.full(size - len(g), g[0])])])
        masks.append(np.arange(size) < len(g))
    rows = np.concatenate(rows)
    fields = {c: rows[:, i] for i, c in enumerate(COLUMNS[:-1])}
    batch = _as_float(Parallel(**fields, placement=codes[rows[:, -1]]))
    return Candidates(index=np.concatenate(groups), batch=batch,
                      mask=np.asarray(np.concatenate(masks), dtype), dropped_weight=dropped)


def soft_min_and_grad(model, system, training, cands: Candidates, temperature, smooth=None):
    """(J = ln soft-min step time, dJ/dSystem, per candidate (ln T, fit margin, weight)).

    The gradient has the structure of `anonymous(system)` (names blanked).
    """
    model, system, training = _as_float((anonymous(model), anonymous(system),
                                         anonymous(training)))
    (j, aux), grad = _SOFT_GRAD(system, model, cands.batch, cands.mask, training,
                                jnp.asarray(temperature, jnp.result_type(float)), smooth=smooth,
                                features=features_of(model, cands.batch, training))
    real = np.asarray(cands.mask) > 0
    return j, grad, tuple(np.asarray(a)[real] for a in aux)


def hard_best(log_t, margin) -> int:
    """Position of the fastest candidate that fits (-1 when none does)."""
    t = np.where(margin >= 0, log_t, np.inf)
    return int(np.argmin(t)) if np.isfinite(t).any() else -1


def grad_of(tree, path: str) -> float:
    """The value of the leaf at `path` of a System-shaped pytree."""
    return float(dict(zip(leaf_paths(tree), jax.tree.leaves(tree)))[path])


def scale_leaf(system, path: str, factor):
    """The system with the leaf at `path` multiplied by `factor`."""
    paths = leaf_paths(system)
    if path not in paths:
        raise SpecError(f"unknown System leaf '{path}'{closest(path, paths)} "
                        f"(allowed: {', '.join(paths)})")
    if path in SWITCHES:
        raise SpecError(f"System leaf '{path}' is a switch (allowed: 0 or 1), not a "
                        f"parameter to scale (x {float(factor):g}): compare predictions at 0 and 1")
    leaves, treedef = jax.tree.flatten(system)
    return jax.tree.unflatten(treedef, [v * factor if p == path else v
                                        for p, v in zip(paths, leaves)])


# ------------------------------------------------------------------------------------------
# At the optimum
# ------------------------------------------------------------------------------------------

class OptimumSensitivity(struct.PyTreeNode):
    """Elasticities at the optimal layout of a table (each {leaf path: elasticity})."""

    soft: Any              # dJ / d ln theta, J = ln of the soft-min step time (capacity too)
    hard: Any              # re-optimized: [ln T*(theta e^h) - ln T*(theta e^-h)] / 2h
    at_best: Any           # at the hard best layout, held fixed (envelope theorem: = hard
                           # wherever the best layout does not change)
    soft_step_time_s: float  # exp J
    best_step_time_s: float  # min over the layouts that fit (exact model)
    best_index: int          # row of the layout table
    n_candidates: int
    dropped_weight: float    # soft-min weight of the layouts pruned (Candidates), at the
                             # starting temperature
    temperature: float       # tau of `soft` after annealing (module docstring)
    temperature_start: float = 0.0  # tau asked for
    optimum: Any = None      # {leaf: the elasticity at the optimum}: `soft`, except for the
                             # feasibility-only memory leaves, which take `hard`
    method: Any = None       # {leaf: METHOD_SOFT or METHOD_RESEARCH}: where `optimum` comes from


def _log_best(model, system, training, cands, tau, smooth) -> float:
    _, _, (log_t, margin, _) = soft_min_and_grad(model, system, training, cands, tau, smooth)
    i = hard_best(log_t, margin)
    return float(log_t[i]) if i >= 0 else np.inf


def _reoptimized(model, system, training, cands, tau, smooth, path, base, h) -> float:
    """Central difference of ln min_fits T in ln theta (one-sided where a side has no
    layout that fits, NaN where neither has)."""
    up = _log_best(model, scale_leaf(system, path, np.exp(h)), training, cands, tau, smooth)
    dn = _log_best(model, scale_leaf(system, path, np.exp(-h)), training, cands, tau, smooth)
    if np.isfinite(up) and np.isfinite(dn):
        return (up - dn) / (2 * h)
    if np.isfinite(up) or np.isfinite(dn):
        return (up - base) / h if np.isfinite(up) else (base - dn) / h
    return float("nan")


def elasticities_at_optimum(model, system, training, layouts, temperature, *,
                            placements=PLACEMENTS, smooth=None,
                            max_candidates=DEFAULT_CANDIDATES, hard_step=HARD_STEP,
                            hard_leaves=None) -> OptimumSensitivity:
    """Elasticities of the best step time over a layout table, three ways.

    soft: gradient of the soft-min of `search.soft_best` (module docstring), the temperature
    annealed from tau until the soft-min step time is within SOFT_TOLERANCE (2 %) of the best
    layout's; the memory capacity enters through the feasibility penalty. hard: the best
    layout that fits, re-optimized among the candidates at theta e^{+-h} (h = ln 1.1 by
    default). at_best: `elasticities` at the hard best layout. optimum: `soft`, but `hard`
    for a memory leaf that acts only as a feasibility constraint (0 at the best layout held
    fixed), `method` naming which.
    Args:
        layouts: an int table [n, len(COLUMNS)] (search.enumerate_layouts).
        temperature: tau > 0 of the soft-min (a relative spread in step time) to start the
            annealing from.
        smooth: the model's own temperature inside each prediction (None: exact).
        max_candidates: rows per placement order kept for the soft-min (see `candidates`).
        hard_leaves: leaf paths for the re-optimized difference (None: every leaf with a
            value and a gradient; the others get None, or 0.0 where the leaf or its
            gradient is 0). The feasibility-only memory leaves are always re-searched.
    Raises:
        SpecError when tau <= 0 or no layout of the table fits in memory.
    """
    if not float(temperature) > 0:
        raise SpecError(f"temperature={temperature} must be > 0 for the soft-min over layouts")
    training = Training() if training is None else training
    layouts = np.asarray(layouts)
    cands = candidates(model, system, training, layouts, temperature, placements=placements,
                       smooth=smooth, max_candidates=max_candidates)
    system_f = _as_float(anonymous(system))
    tau = float(temperature)
    while True:  # anneal until the soft-min is the best step time to within SOFT_TOLERANCE
        j, grad, (log_t, margin, _) = soft_min_and_grad(model, system_f, training, cands, tau,
                                                        smooth)
        best = hard_best(log_t, margin)
        if best < 0:
            raise SpecError(f"no layout of the {len(layouts)} given fits in memory on "
                            f"{system.name}: the optimum is undefined (more devices or "
                            f"capacity)")
        gap = float(j) - float(log_t[best])  # ln(soft-min / best)
        if abs(np.expm1(gap)) <= SOFT_TOLERANCE or tau <= MIN_TEMPERATURE:
            break
        tau = max(tau * max(0.1, min(0.5, 0.9 * SOFT_TOLERANCE / abs(gap))), MIN_TEMPERATURE)
    row = int(cands.index[best])
    at_best = elasticities(model, parallel_of(layouts[row], placements), system, training,
                           smooth)
    values, soft = parameter_values(system_f), _times_theta(grad, system_f)
    # A memory leaf with no effect at the best layout held fixed acts only through which
    # layouts fit: its worth is the exact re-search's (module docstring).
    feasibility = {p for p in MEMORY_LEAVES if p in values and at_best[p] == 0}
    # A leaf with no gradient changes no candidate's time or fit margin, so its re-optimized
    # change is 0 too; the memory leaves are re-searched anyway, as the weight of a layout
    # that does not fit can underflow to 0 while +-10 % would let it in.
    moves = {p: grad_of(grad, p) != 0 or p in MEMORY_LEAVES for p in values}
    wanted = [p for p, v in values.items() if v != 0 and moves[p] and (
        hard_leaves is None or p in hard_leaves or p in feasibility)]
    hard = {p: (_reoptimized(model, system_f, training, cands, tau, smooth, p,
                             float(log_t[best]), hard_step) if p in wanted
                else 0.0 if values[p] == 0 or not moves[p] else None)
            for p in values}
    method = {p: METHOD_RESEARCH if p in feasibility else METHOD_SOFT for p in values}
    optimum = {p: hard[p] if p in feasibility else soft[p] for p in values}
    return OptimumSensitivity(
        soft=soft, hard=hard, at_best=at_best,
        soft_step_time_s=float(jnp.exp(j)), best_step_time_s=float(np.exp(log_t[best])),
        best_index=row, n_candidates=len(cands.index), dropped_weight=cands.dropped_weight,
        temperature=tau, temperature_start=float(temperature), optimum=optimum, method=method)
