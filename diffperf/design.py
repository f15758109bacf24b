"""Hardware co-design by gradient: the hardware that minimizes time-to-train or cost per token.

The continuous hardware parameters (FLOP/s, HBM bandwidth and capacity, each tier's bandwidth,
the fast domain size relaxed to a real number) are optimized with optax through the soft-min
over layouts of `sensitivity` (search.soft_best's formula: ln T plus a soft memory-feasibility
penalty), under a user-given linear cost or power model per device:

    C(theta) = base + sum_k p_k (theta_k - theta_k^min)       (USD or W per device)

theta^min is 1 device for a domain size and 0 otherwise. With a budget B the parameters are
the spend shares of the money (or watts) above the base, so C <= B holds at every step:

    p_k (theta_k - theta_k^min) = (B - base) softmax(z)_k      (one extra share stays unspent)

and optax runs on z (for a domain size, on the log of the devices beyond the first).
Without a budget (cost per token only) z_k = ln p_k (theta_k - theta_k^min), unconstrained.

Objectives, with T = exp(J) the soft-min step time, n devices, B s tokens per step:
    time_to_train_s = T tokens / (B s)
    cost_per_token  = n C T / (B s) / lifetime_s   (USD: capex amortized over the lifetime)
                    = n C T / (B s)                (W: joules per token)
The matrix peak scales the fp32 and vector peaks with it (one chip, same proportions).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct

from diffperf.api import DEFAULT_STORE, _as_float, default_store
from diffperf.errors import SpecError, closest
from diffperf.search import COLUMNS, PLACEMENTS
from diffperf.executables import executable
from diffperf.predict import features_of
from diffperf.sensitivity import (DEFAULT_CANDIDATES, _quick_jit, _soft_log_step, candidates,
                                  hard_best)
from diffperf.specs.batch import anonymous
from diffperf.specs.paths import leaf_paths, leaf_values
from diffperf.load import _check_keys, _number, typed_values
from diffperf.specs.training import Training

OBJECTIVES = ("time_to_train", "cost_per_token")
UNITS = ("USD", "W")
COST_KEYS = ("name", "description", "illustrative", "sources", "unit", "base",
             "matmul_per_TFLOPs", "hbm_bandwidth_per_GBps", "hbm_capacity_per_GiB", "tiers",
             "budget", "lifetime_years")
TIER_COST_KEYS = ("name", "bandwidth_per_GBps", "domain_size_per_device")
_SECONDS_PER_YEAR = 365.25 * 24 * 3600.0
# scale with matmul_flops_per_s (a faster tensor core is faster in every format it has)
_LINKED = ("matmul_fp32_flops_per_s", "vector_flops_per_s", "matmul_fp8_flops_per_s",
           "matmul_fp4_flops_per_s")


@dataclasses.dataclass(frozen=True)
class CostModel:
    """A linear cost (USD) or power (W) model of one device; prices per human unit."""

    unit: str                          # "USD" or "W"
    base: float                        # fixed part per device
    matmul_per_TFLOPs: float = 0.0     # per TFLOP/s of dense 16-bit matrix peak
    hbm_bandwidth_per_GBps: float = 0.0
    hbm_capacity_per_GiB: float = 0.0
    tier_bandwidth_per_GBps: tuple = ()   # per tier, innermost first
    tier_domain_per_device: tuple = ()    # per device of fast domain beyond the first
    budget: float | None = None        # per device, in `unit`
    lifetime_years: float = 4.0        # amortization of USD for cost per token
    name: str = "cost"


def cost_model_from_dict(d: dict, where: str = "cost") -> CostModel:
    """A validated CostModel from the YAML schema of configs/design/README.md."""
    _check_keys(d, COST_KEYS, where)
    typed_values(d, ("base", "matmul_per_TFLOPs", "hbm_bandwidth_per_GBps",
                     "hbm_capacity_per_GiB", "budget", "lifetime_years"), (), where)
    unit = str(d.get("unit", ""))
    if unit not in UNITS:
        raise SpecError(f"{where}.unit={d.get('unit')!r} is not allowed{closest(unit, UNITS)} "
                        f"(allowed: {', '.join(UNITS)})")
    price = lambda k, w=where, t=d: _number(t, k, w, minimum=0.0, default=0.0)  # noqa: E731
    tiers = d.get("tiers") or []
    if not isinstance(tiers, list):
        raise SpecError(f"{where}.tiers must be a list, innermost tier first (got "
                        f"{type(tiers).__name__} {tiers!r})")
    for i, t in enumerate(tiers):
        _check_keys(t, TIER_COST_KEYS, f"{where}.tiers[{i}]")
        typed_values(t, TIER_COST_KEYS[1:], (), f"{where}.tiers[{i}]")
    budget = d.get("budget")
    return CostModel(
        unit=unit, base=price("base"), matmul_per_TFLOPs=price("matmul_per_TFLOPs"),
        hbm_bandwidth_per_GBps=price("hbm_bandwidth_per_GBps"),
        hbm_capacity_per_GiB=price("hbm_capacity_per_GiB"),
        tier_bandwidth_per_GBps=tuple(price("bandwidth_per_GBps", f"{where}.tiers[{i}]", t)
                                      for i, t in enumerate(tiers)),
        tier_domain_per_device=tuple(price("domain_size_per_device", f"{where}.tiers[{i}]", t)
                                     for i, t in enumerate(tiers)),
        budget=None if budget is None else _number(d, "budget", where, positive=True),
        lifetime_years=_number(d, "lifetime_years", where, positive=True, default=4.0),
        name=str(d.get("name", where)))


def _knobs(cost: CostModel, system) -> list:
    """[(leaf path, price per SI unit, theta_min)] of the priced (designed) parameters."""
    n = len(system.tiers)
    if len(cost.tier_bandwidth_per_GBps) not in (0, n):
        raise SpecError(f"{cost.name}.tiers has {len(cost.tier_bandwidth_per_GBps)} entries; "
                        f"system {system.name} has {n} tiers "
                        f"({', '.join(t.name for t in system.tiers)})")
    knobs = [("matmul_flops_per_s", cost.matmul_per_TFLOPs / 1e12, 0.0),
             ("hbm_bandwidth_Bps", cost.hbm_bandwidth_per_GBps / 1e9, 0.0),
             ("hbm_capacity_bytes", cost.hbm_capacity_per_GiB / 2.0**30, 0.0)]
    for i, (bw, dom) in enumerate(zip(cost.tier_bandwidth_per_GBps,
                                      cost.tier_domain_per_device)):
        knobs.append((f"tiers[{i}].bandwidth_Bps", bw / 1e9, 0.0))
        if i < n - 1:
            knobs.append((f"tiers[{i}].domain_size", dom, 1.0))
    if cost.tier_domain_per_device and cost.tier_domain_per_device[-1] > 0:
        raise SpecError(f"{cost.name}.tiers[{n - 1}].domain_size_per_device="
                        f"{cost.tier_domain_per_device[-1]:g} must be 0: the last tier spans "
                        f"the whole cluster, its domain is not a design choice")
    knobs = [k for k in knobs if k[1] > 0]
    if not knobs:
        raise SpecError(f"{cost.name}: prices nothing, so there is nothing to design "
                        f"(give matmul_per_TFLOPs, hbm_*_per_*, or tiers[i] prices)")
    return knobs


def _budget(cost: CostModel, budget):
    """The budget per device: the given one, else the cost model's; None for none (inf)."""
    budget = cost.budget if budget is None else budget
    return None if budget is not None and np.isinf(budget) else budget


def _job(model, layouts) -> tuple:
    """(n, B s) of a job: its devices n = tp pp dp cp gx gy gz and its tokens per step, from
    the first row of its layout table (every row has the same devices and global batch)."""
    row = dict(zip(COLUMNS, np.asarray(layouts)[0]))
    n = float(np.prod([row[c] for c in ("tp", "pp", "dp", "cp", "gx", "gy", "gz")]))
    return n, float(row["global_batch"]) * float(model.seq_len)


def _lifetime_s(cost: CostModel) -> float:
    """Seconds over which a USD cost is amortized (lifetime_years); 1 for a power model (W:
    the cost per token is then in J/token)."""
    return cost.lifetime_years * _SECONDS_PER_YEAR if cost.unit == "USD" else 1.0


def device_cost(cost: CostModel, system) -> float:
    """C(theta) = base + sum_k p_k (theta_k - theta_k^min) of one device, in cost.unit."""
    values = dict(zip(leaf_paths(system), jax.tree.leaves(system)))
    return float(cost.base + sum(p * (values[k] - lo) for k, p, lo in _knobs(cost, system)))


class _Shape(NamedTuple):
    """The static part of a design problem (one compilation per shape): which leaves are
    designed, their theta_min, the objective, and whether a budget caps the spend."""

    paths: tuple
    lows: tuple
    objective: str
    budgeted: bool


def _system_of(spend, prices, system0, shape):
    """system0 with every knob at theta_min + spend / price (linked peaks scaled along)."""
    paths = leaf_paths(system0)
    leaves = dict(zip(paths, jax.tree.leaves(system0)))
    new = {k: lo + spend[i] / prices[i] for i, (k, lo) in enumerate(zip(shape.paths,
                                                                        shape.lows))}
    if "matmul_flops_per_s" in new:
        ratio = new["matmul_flops_per_s"] / leaves["matmul_flops_per_s"]
        new |= {k: leaves[k] * ratio for k in _LINKED}
    return jax.tree.unflatten(jax.tree.structure(system0), [new.get(k, leaves[k])
                                                            for k in paths])


def _parts(z, system0, prices, consts, shape):
    """(System, ln(objective / T), cost per device) at the optimizer's z.

        spend = room softmax(z)[:-1] (budget; the last share is unspent) or exp(z)
        ln(objective / T) = ln(tokens / (B s))                  time_to_train
                          = ln(n C / (B s lifetime))            cost_per_token
    consts: {base, room, n, tokens_per_step, tokens, life_s} (life_s = 1 for a power model).
    """
    c = consts
    spend = c["room"] * jax.nn.softmax(z)[:-1] if shape.budgeted else jnp.exp(z)
    cost = c["base"] + jnp.sum(spend)
    if shape.objective == "time_to_train":
        log_scale = jnp.log(c["tokens"] / c["tokens_per_step"])
    else:
        log_scale = jnp.log(cost * c["n"] / (c["tokens_per_step"] * c["life_s"]))
    return _system_of(spend, prices, system0, shape), log_scale, cost


def _log_objective(z, system0, prices, consts, model, batch, mask, training, tau, shape,
                   smooth, features):
    """(ln objective = J + ln(objective / T), (J, ln(objective / T), cost, ln T_i, m_i)) at
    the optimizer's z: `_parts`, then the soft-min of sensitivity._soft_log_step."""
    system, log_scale, cost = _parts(z, system0, prices, consts, shape)
    j, (log_t, margin, _) = _soft_log_step(system, model, batch, mask, training, tau, smooth,
                                           features)
    return j + log_scale, (j, log_scale, cost, log_t, margin)


def _segment(z, state, n_eval, n_update, system0, prices, consts, model, batch, mask,
             training, tau, *, shape, learning_rate, smooth, features, length):
    """Optimizer steps between two re-selections of the candidates, in one program: at step
    i < n_eval (at most `length`), the objective and its gradient in z at z_i, then, for
    i < n_update, one Adam step (optax). Returns (z, Adam state, objective at each step
    [length] (NaN past n_eval), (J, ln(objective / T), cost, ln T_i, m_i) at the first)."""
    opt = optax.adam(learning_rate)
    value_and_grad = jax.value_and_grad(_log_objective, has_aux=True)
    dtype = z.dtype
    first = (jnp.zeros((), dtype),) * 3 + (jnp.zeros(mask.shape, dtype),) * 2

    def step(i, carry):
        z, state, history, first = carry
        (log_obj, aux), g = value_and_grad(z, system0, prices, consts, model, batch, mask,
                                           training, tau, shape, smooth, features)
        history = history.at[i].set(jnp.exp(log_obj))
        first = jax.tree.map(lambda a, b: jnp.where(i == 0, a, b), aux, first)
        updates, new_state = opt.update(g, state, z)
        live = i < n_update
        z, state = jax.tree.map(lambda a, b: jnp.where(live, a, b),
                                (optax.apply_updates(z, updates), new_state), (z, state))
        return z, state, history, first

    history = jnp.full(length, jnp.nan, dtype)
    return jax.lax.fori_loop(0, n_eval, step, (z, state, history, first))


_parts_jit = _quick_jit(_parts, static_argnames=("shape",))
_SEGMENT_STATIC = ("shape", "learning_rate", "smooth", "features", "length")
# On XLA:CPU the design's program compiles with LLVM -O1 and the classic emitters where the
# run is long (candidates x steps >= OPTIMIZE_FROM), with the quick options below that. Measured
# for the default job (GPT-3 175B on 1,024 A100s, 2 x 1,024 candidates, 2 cores): a step
# 7.9 ms of CPU instead of 21 ms, the compile 8.9 s instead of 4.2 s (the program store
# keeps it for the next process: `optimize_design(store=...)`).
_CPU_SEGMENT_OPTIONS = {"xla_cpu_use_fusion_emitters": False, "xla_backend_optimization_level": 1}
OPTIMIZE_FROM = 200_000


@functools.cache
def _segment_programs() -> dict:
    from diffperf.search.kernel import _CPU_QUICK_OPTIONS

    jit = functools.partial(jax.jit, _segment, static_argnames=_SEGMENT_STATIC)
    return {"plain": jit(), "cpu": jit(compiler_options=_CPU_SEGMENT_OPTIONS),
            "quick": jit(compiler_options=_CPU_QUICK_OPTIONS)}


def _segment_program(work):
    """(jitted `_segment`, name) for a design of `work` candidate-steps."""
    if jax.default_backend() != "cpu":
        return _segment_programs()["plain"], "design-segment"
    kind = "cpu" if work >= OPTIMIZE_FROM else "quick"
    return _segment_programs()[kind], f"design-segment-{kind}"


class Design(struct.PyTreeNode):
    """What `optimize_design` returns (objectives in s, USD/token or J/token)."""

    system: Any             # the optimized System (the input's names and structure)
    start: Any              # the starting System (the input, scaled into the budget)
    parameters: tuple = struct.field(pytree_node=False)  # designed leaf paths
    history: Any = None     # soft objective at every step, then at the result
    before: Any = None      # {objective, objective_hard, step_time_s, step_time_hard_s, cost,
    after: Any = None       #  best_index} at the start and at the result
    start_scale: float = 1.0  # factor applied to the priced parts to meet the budget
    budget: Any = None        # per device in the cost model's unit (None: unconstrained)


def _check(objective, budget, steps, temperature, learning_rate, tokens, refresh):
    if objective not in OBJECTIVES:
        raise SpecError(f"objective={objective!r} is not allowed{closest(objective, OBJECTIVES)}"
                        f" (allowed: {', '.join(OBJECTIVES)})")
    if objective == "time_to_train" and budget is None:
        raise SpecError("objective=time_to_train requires a budget (per device, in the cost "
                        "model's unit): more hardware is always faster; give --budget or "
                        "budget: in the cost model")
    for name, v in (("temperature", temperature), ("learning_rate", learning_rate),
                    ("tokens", tokens)):
        if not float(v) > 0:
            raise SpecError(f"{name}={v} must be > 0")
    if int(steps) != steps or steps < 0:
        raise SpecError(f"steps={steps} must be a whole number >= 0")
    if int(refresh) != refresh or refresh < 1:
        raise SpecError(f"refresh={refresh} must be a whole number >= 1")


def _start(knobs, values, base, budget):
    """(spend [k], optax start z, scale applied to meet the budget, room above the base)."""
    spend = np.array([p * (values[k] - lo) for k, p, lo in knobs])
    spend = np.maximum(spend, 1e-6 * max(spend.sum(), 1e-30))  # ln 0: a domain of 1 device
    if budget is None:
        return spend, np.log(spend), 1.0, None
    room = budget - base
    if not room > 0:
        raise SpecError(f"budget={budget:g} must exceed the cost model's base={base:g} "
                        f"(the fixed part of every device)")
    scale = min(1.0, 0.999 * room / spend.sum())
    spend = spend * scale
    shares = np.append(spend, max(room - spend.sum(), 1e-3 * room)) / room
    return spend, np.log(shares), scale, room


def _summary(j, log_t, margin, cands, log_scale, cost) -> dict:
    best = hard_best(log_t, margin)
    hard = float(log_t[best]) if best >= 0 else np.inf
    return dict(objective=float(jnp.exp(j + log_scale)), objective_hard=float(
        np.exp(hard + float(log_scale))), step_time_s=float(jnp.exp(j)),
        step_time_hard_s=float(np.exp(hard)), cost=float(cost),
        best_index=int(cands.index[best]) if best >= 0 else -1)


def optimize_design(model, system, training, layouts, cost_model: CostModel,
                    objective="time_to_train", *, budget=None, steps=200, temperature=0.05,
                    learning_rate=0.05, tokens=300e9, placements=PLACEMENTS, smooth=None,
                    max_candidates=DEFAULT_CANDIDATES, refresh=50,
                    store=DEFAULT_STORE) -> Design:
    """Adam on the priced hardware parameters (module docstring) for `steps` steps.

    Args:
        layouts: the layout table of the job (search.enumerate_layouts); its devices and
            global batch fix n and B.
        cost_model: prices per device (`cost_model_from_dict`); unpriced leaves stay fixed.
        objective: "time_to_train" (needs a budget) or "cost_per_token".
        budget: per device in cost_model.unit (default: cost_model.budget; inf: none). A
            start above it is scaled into it (`Design.start_scale`).
        temperature: tau of the soft-min over layouts; tokens: for time_to_train.
        refresh: steps between re-selections of the candidates (when the table was pruned):
            each run of `refresh` steps is one call of one compiled program (`_segment`).
        store: where the compiled program is kept between processes (as for `predict`:
            the default on-disk store, None, or a mapping key -> bytes).
    Returns:
        `Design` with the optimized System, the objective history and before/after figures
        (soft, and exact: the best layout that fits).
    """
    budget = _budget(cost_model, budget)
    _check(objective, budget, steps, temperature, learning_rate, tokens, refresh)
    training = Training() if training is None else training
    layouts = np.asarray(layouts)
    knobs = _knobs(cost_model, system)
    system0 = _as_float(anonymous(system))
    values = leaf_values(system0)
    spend0, z, scale, room = _start(knobs, values, cost_model.base, budget)
    shape = _Shape(tuple(k for k, _, _ in knobs), tuple(lo for _, _, lo in knobs), objective,
                   budget is not None)
    dtype = jnp.result_type(float)
    prices = jnp.asarray([p for _, p, _ in knobs], dtype)
    n, tokens_per_step = _job(model, layouts)
    consts = {k: jnp.asarray(v, dtype) for k, v in dict(
        base=cost_model.base, room=room or 0.0, tokens=tokens, life_s=_lifetime_s(cost_model),
        n=n, tokens_per_step=tokens_per_step).items()}
    start = _system_of(jnp.asarray(spend0, dtype), prices, system0, shape)
    store = default_store() if isinstance(store, str) and store == DEFAULT_STORE else store
    select = functools.partial(candidates, model, training=training, layouts=layouts,
                               temperature=temperature, placements=placements, smooth=smooth,
                               max_candidates=max_candidates, optimize=True, store=store)
    cands = select(system=start)
    pruned = len(cands.index) < len(layouts)
    z = jnp.asarray(z, dtype)
    state = optax.adam(learning_rate).init(z)
    steps, refresh = int(steps), int(refresh)
    fixed = _as_float((anonymous(model), anonymous(training)))
    program, name = _segment_program(int(cands.mask.size) * steps)
    history, before, step = [], None, 0
    while True:  # one call per segment between candidate refreshes, then the final point
        if pruned and step and (step % refresh == 0 or step == steps):
            sys_k, _, _ = _parts_jit(z, system0, prices, consts, shape=shape)
            cands = select(system=sys_k)
        n_update = min(refresh - step % refresh, steps - step)
        static = dict(shape=shape, learning_rate=float(learning_rate), smooth=smooth,
                      features=features_of(model, cands.batch, training), length=refresh)
        args = (z, state, jnp.int32(max(n_update, 1)), jnp.int32(n_update), system0, prices,
                consts, fixed[0], cands.batch, cands.mask, fixed[1],
                jnp.asarray(temperature, dtype))
        call = (program if store is None or jax.config.jax_disable_jit else
                executable(program, name, args, static, store))
        z, state, hist, (j, log_scale, cost, log_t, margin) = (
            call(*args, **static) if call is program else call(*args))
        history.extend(np.asarray(hist)[:max(n_update, 1)].tolist())
        real = np.asarray(cands.mask) > 0
        log_t, margin = np.asarray(log_t)[real], np.asarray(margin)[real]
        if step == 0:
            before = _summary(j, log_t, margin, cands, log_scale, cost)
        if n_update == 0:
            break
        step += n_update
    sys_k, _, _ = _parts_jit(z, system0, prices, consts, shape=shape)
    treedef = jax.tree.structure(system)
    named = lambda s: jax.tree.unflatten(treedef, [float(v) for v in jax.tree.leaves(s)])  # noqa
    return Design(system=named(sys_k), start=named(start),
                  parameters=tuple(k for k, _, _ in knobs), history=np.asarray(history),
                  before=before, after=_summary(j, log_t, margin, cands, log_scale, cost),
                  start_scale=float(scale), budget=budget)
