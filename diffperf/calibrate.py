"""Calibration: fit the efficiency parameters of a System to measured runs by gradient descent.

Loss (DESIGN.md, "calibrate"): mean squared error of log step time over the fitted runs,
plus the same for peak memory where measured, plus kernel microbenchmarks (Pati et al.'s
operator models) when given, plus a weak Gaussian prior on the unconstrained parameters around
their starting values (keeps unidentified parameters where they were). Fractions are fitted
as logits, positive quantities as logs, so every step stays in the valid domain.
The smooth model (temperature > 0) is used while fitting.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct

from diffperf.costs.compute import attention_time_s, gemms_time_s, memory_time_s
from diffperf.intervals import residual_var, ridge_precision
from diffperf.predict import FEATURES, predict_step
from diffperf.specs.system import Efficiency
from diffperf.workload.ops import Gemms

FRACTIONS = ("mm_max", "attn_max", "mem_eff", "coll_eff_intra", "coll_eff_inter",
             "overlap_slowdown", "mem_usable_frac")
STEP_FIELDS = ("mm_max", "mm_half_dim", "mm_exponent", "mm_align_exponent", "attn_max",
               "attn_half_work", "attn_exponent", "attn_half_head_dim", "mem_eff",
               "kernel_s", "host_kernel_s", "host_layer_s", "host_recompute_s",
               "host_coll_peer_s", "microbatch_s", "step_s",
               "coll_base_s", "coll_eff_intra", "coll_eff_inter", "floor_pnorm")
MEMORY_FIELDS = ("mem_reserved_bytes", "act_mem_factor", "mem_usable_frac")
# Fitted only where some run is one XLA-compiled program (Training.xla_compiled): elsewhere
# they have no effect, and leaving them out keeps other fits exactly as they were.
XLA_FIELDS = ("queued_kernel_s",)
_FLOOR = 1e-7  # smallest starting value of a positive parameter (log of 0 is not a start)
# Gaussian priors that hold each unconstrained parameter u (logit or log) near its start u0.
# The loss is the MEAN squared log error over the n fitted runs, plus for each field
#   hardware efficiencies (HARDWARE_FIELDS)   1e-3 (u - u0)^2         (HARDWARE_PRIOR)
#   framework overheads and shape parameters  (c / n) (u - u0)^2,  c = PRIOR_RUNS
# The hardware efficiencies (large-GEMM, HBM, collective efficiency, the GPU's fixed time per
# kernel) are known to some 10-20 % from datasheets and kernel benchmarks, and runs of small
# models identify them only in combination with the overheads (single-node vTrain rows alone
# trade mm_max 0.84 against kernel_s 15 us): their prior keeps a fixed weight. Host and fixed
# times of a framework span orders of magnitude (eager PyTorch against XLA), so their prior
# weighs like c runs and fades as the data grows; c = 0.015 keeps the 1e-3 of the first
# calibrations at 15 fitted runs (an H100 fold). A fixed 1e-3 on these held the vTrain fit
# at its arbitrary start (all-rows held-out 6.06 % against 5.55 %).
HARDWARE_FIELDS = FRACTIONS + ("kernel_s",)
HARDWARE_PRIOR = 1e-3
PRIOR_RUNS = 0.015


def prior_strengths(fields, n_fit) -> dict:
    """Weight of each field's prior in the mean-squared-log-error loss (see HARDWARE_PRIOR,
    PRIOR_RUNS); n_fit = fitted runs with a measured step time."""
    return {f: HARDWARE_PRIOR if f in HARDWARE_FIELDS else PRIOR_RUNS / max(n_fit, 1.0)
            for f in fields}


def to_unconstrained(eff: Efficiency, fields) -> dict:
    """logit of fractions, log of positive parameters."""
    out = {}
    for f in fields:
        v = jnp.asarray(getattr(eff, f), dtype=jnp.float32)
        if f in FRACTIONS:
            v = jnp.clip(v, 1e-4, 1 - 1e-4)
            out[f] = jnp.log(v) - jnp.log1p(-v)
        else:
            out[f] = jnp.log(jnp.maximum(v, _FLOOR))
    return out


def from_unconstrained(base: Efficiency, u: dict) -> Efficiency:
    """Inverse of `to_unconstrained`, on top of `base` for the fields not fitted."""
    vals = {f: (jax.nn.sigmoid(x) if f in FRACTIONS else jnp.exp(x)) for f, x in u.items()}
    return base.replace(**vals)


class RunSet(NamedTuple):
    """Measured runs on one system, batched (leading axis = run)."""

    system: Any
    models: Any
    parallels: Any
    trainings: Any
    log_step: Any      # log measured step time (nan where none)
    log_mem: Any       # log measured peak memory in bytes (nan where none)
    weight: Any        # 1 for fitted runs, 0 for held-out runs
    oom: Any           # 1 where the run ran out of memory, 0 where it ran


class Microbench(struct.PyTreeNode):
    """Kernel measurements: `kind` ('gemm', 'attention', 'memory'), shape columns and the
    measured log time; `bench_time_s` predicts them from a System."""

    columns: tuple       # arrays, by kind: (m, n, k) | (b, s, a, d, causal) | (bytes,)
    log_time: Any
    kind: str = struct.field(pytree_node=False, default="gemm")


def _masked_sq(pred_log, meas_log, weight):
    ok = jnp.isfinite(meas_log) & (weight > 0)
    diff = jnp.where(ok, pred_log - jnp.where(ok, meas_log, 0.0), 0.0)
    return jnp.sum(weight * diff**2), jnp.sum(jnp.where(ok, weight, 0.0))


def set_features(sets) -> frozenset:
    """predict.FEATURES, less 'xla' when no run of the RunSets is one XLA program: its terms
    are then 0 and left out of the traced program, so fits of other frameworks run exactly
    the program they ran before the XLA terms existed."""
    xla = any(float(np.max(np.asarray(rs.trainings.xla_compiled))) > 0 for rs in sets)
    return FEATURES if xla else FEATURES - {"xla"}


def run_predictions(eff, rs: RunSet, temperature, with_margin=False, features=FEATURES):
    """(step time, memory total[, fit margin]) of every run of a RunSet with `eff`."""
    system = rs.system.replace(eff=eff)
    res = jax.vmap(functools.partial(predict_step, features=features),
                   in_axes=(0, 0, None, 0, None))(
        rs.models, rs.parallels, system, rs.trainings, temperature)
    if with_margin:
        return res.step_time_s, res.memory.total_bytes, res.fit_margin_frac
    return res.step_time_s, res.memory.total_bytes


def _feasibility_sq(margin, oom, weight, gap=0.02):
    """Squared hinge on the measured feasibility: a run that ran must fit (margin >= gap), a
    run that ran out of memory must not (margin <= -gap); margin = (capacity - total)/capacity."""
    wrong = jnp.where(oom > 0, jax.nn.relu(margin + gap), jax.nn.relu(gap - margin))
    return jnp.sum(weight * wrong**2)


def loss_fn(u, base, sets, benches, prior, temperature, mem_weight, features=FEATURES):
    """Mean squared log error of step time over the fitted runs, + mem_weight x the same for
    peak memory, + the mean of each microbenchmark's mean squared log error (each data kind
    weighs as a whole, not by its row count), + the prior."""
    eff = from_unconstrained(base, u)
    step_num, step_den, mem_num, mem_den, feas = 0.0, 0.0, 0.0, 0.0, 0.0
    for rs in sets:
        step, mem, margin = run_predictions(eff, rs, temperature, with_margin=True,
                                            features=features)
        n1, d1 = _masked_sq(jnp.log(step), rs.log_step, rs.weight)
        n2, d2 = _masked_sq(jnp.log(mem), rs.log_mem, rs.weight)
        step_num, step_den = step_num + n1, step_den + d1
        mem_num, mem_den = mem_num + n2, mem_den + d2
        feas = feas + _feasibility_sq(margin, rs.oom, rs.weight)
    loss = step_num / jnp.maximum(step_den, 1.0)
    # Feasibility is a hard fact about a run (it ran, or it ran out of memory): weigh a
    # violation like a 10x larger memory error.
    loss = loss + mem_weight * (mem_num + 10.0 * feas) / jnp.maximum(mem_den, 1.0)
    for mb, system in benches:
        pred = bench_time_s(mb, system.replace(eff=eff))
        loss = loss + jnp.mean((jnp.log(pred) - mb.log_time) ** 2) / len(benches)
    u0 = prior["u0"]
    return loss + sum(prior["strength"][f] * jnp.sum((u[f] - u0[f]) ** 2) for f in u)


_value_and_grad = jax.jit(jax.value_and_grad(loss_fn),
                          static_argnames=("temperature", "mem_weight", "features"))


class Fit(NamedTuple):
    eff: Efficiency
    fields: tuple
    loss_history: np.ndarray


def fitted_runs(sets) -> float:
    """Fitted runs (weight > 0) with a measured step time, over RunSets."""
    return sum(float(jnp.sum(jnp.where(jnp.isfinite(rs.log_step), rs.weight, 0.0)))
               for rs in sets)


def fit(base: Efficiency, sets, fields=STEP_FIELDS, benches=(), *, steps=600,
        learning_rate=0.05, temperature=0.02, mem_weight=1.0,
        progress=None) -> Fit:
    """Fit `fields` of the efficiency parameters with Adam (optax) on the smooth model.

    Args:
        base: starting efficiencies (also the prior's centre).
        sets: RunSets (one per system); runs with weight 0 are held out.
        benches: (Microbench, System) pairs: kernel measurements on that system's GPU.
        progress: optional callable(step, loss) for a progress bar.
    """
    u = to_unconstrained(base, fields)
    prior = {"u0": dict(u),
             "strength": {f: jnp.float32(v)
                          for f, v in prior_strengths(fields, fitted_runs(sets)).items()}}
    opt = optax.adam(optax.cosine_decay_schedule(learning_rate, steps, alpha=0.05))
    state = opt.init(u)
    features = set_features(sets)
    history = []
    for i in range(steps):
        loss, g = _value_and_grad(u, base, tuple(sets), tuple(benches), prior,
                                  temperature=temperature, mem_weight=mem_weight,
                                  features=features)
        g = jax.tree.map(lambda x: jnp.where(jnp.isfinite(x), x, 0.0), g)
        updates, state = opt.update(g, state, u)
        u = optax.apply_updates(u, updates)
        history.append(float(loss))
        if progress is not None:
            progress(i, float(loss))
    return Fit(from_unconstrained(base, u), tuple(fields), np.array(history))


def gemm_bench(m, n, k, time_s) -> Microbench:
    """bf16 GEMM microbenchmarks [m,k] @ [k,n] (data/kernels/h100_gemm.csv)."""
    f = lambda x: jnp.asarray(x, jnp.float32)  # noqa: E731
    return Microbench((f(m), f(n), f(k)), jnp.log(f(time_s)), kind="gemm")


def attention_bench(batch, seq, heads, head_dim, causal, fwd_bwd_s) -> Microbench:
    """Flash-attention forward + backward (data/kernels/h100_attention.csv)."""
    f = lambda x: jnp.asarray(x, jnp.float32)  # noqa: E731
    return Microbench(tuple(f(x) for x in (batch, seq, heads, head_dim, causal)),
                      jnp.log(f(fwd_bwd_s)), kind="attention")


def memory_bench(bytes_moved, time_s) -> Microbench:
    """Memory-bound kernels by bytes moved (data/kernels/h100_memory_bw.csv)."""
    f = lambda x: jnp.asarray(x, jnp.float32)  # noqa: E731
    return Microbench((f(bytes_moved),), jnp.log(f(time_s)), kind="memory")


def bench_time_s(mb: Microbench, system):
    """Predicted kernel times, the operator models of Pati et al. (PAPERS.md section 1):

        gemm       roofline(2 m n k, eta_mm(m, n, k)) + kernel_s
        attention  (2 + 0.5 + 1) x forward core (QK^T, AV at kappa, eta_attn) + 3 kernel_s
                   (flash backward = 2.5 x forward; PAPERS.md 5.1)
        memory     bytes / (BW_hbm eta_mem) + kernel_s
    """
    from diffperf.specs.training import Training

    eff, training = system.eff, Training()
    if mb.kind == "gemm":
        m, n, k = mb.columns
        g = Gemms(m=m[:, None], n=n[:, None], k=k[:, None], count=jnp.ones_like(m)[:, None])
        each = jax.vmap(lambda gi: gemms_time_s(gi, system, training, eff.mm_max,
                                                eff.mm_half_dim))(g)
        return each + eff.kernel_s
    if mb.kind == "attention":
        b, s, a, d, c = mb.columns
        kappa = 1.0 - 0.5 * c

        def one(b, s, a, d, kappa):
            g = Gemms(m=jnp.stack([s, s]), n=jnp.stack([s, d]), k=jnp.stack([d, s]),
                      count=jnp.stack([b * a * kappa, b * a * kappa]))
            io = training.activation_bytes * 4.0 * b * s * a * d
            return 3.5 * attention_time_s(g, system, training, io)

        return jax.vmap(one)(b, s, a, d, kappa) + 3.0 * eff.kernel_s
    (nbytes,) = mb.columns
    return memory_time_s(nbytes, system) + eff.kernel_s


def log_jacobian(eff: Efficiency, fields, rs: RunSet, temperature, features=FEATURES):
    """d log(step time) / d u for every run (u = unconstrained fitted parameters)."""
    u = to_unconstrained(eff, fields)

    def f(u):
        step, _ = run_predictions(from_unconstrained(eff, u), rs, temperature,
                                  features=features)
        return jnp.log(step)

    jac = jax.jacrev(f)(u)
    return np.concatenate([np.asarray(jac[k]).reshape(len(np.asarray(rs.log_step)), -1)
                           for k in fields], axis=1)


def _prior_vector(fields, n, k) -> np.ndarray:
    """lambda_f per column of J: `prior_strengths` of the fields (one column each), or the
    hardware prior for every column without fields."""
    return (np.array(list(prior_strengths(fields, n).values())) if fields is not None
            else np.full(k, HARDWARE_PRIOR))


def laplace_covariance(jacobian_fit, residuals_fit, fields=None, precision=None):
    """Laplace approximation of the posterior covariance of u:

        Sigma = s^2 (J^T J + n diag(lambda_f))^-1,   s^2 = sum r^2 / (n - k)
    (Gauss-Newton Hessian of the least-squares fit; MacKay 1992), lambda_f the prior
    strengths of `fit` (`_prior_vector`). `precision`: J^T J + n diag(lambda_f) when the
    caller has built it (`intervals.ridge_precision`), else built here. Returns (Sigma, s^2).
    """
    n, k = jacobian_fit.shape
    s2 = float(np.sum(residuals_fit**2) / max(n - k, 1))
    if precision is None:
        precision = ridge_precision(jacobian_fit, _prior_vector(fields, n, k))
    return s2 * np.linalg.inv(precision), s2


def prediction_interval(jacobian, cov, s2, z=1.96):
    """Half-width in log space of the 95 % prediction interval: z sqrt(j Sigma j^T + s^2),
    s^2 the residual variance (`calibrate_runs` passes `intervals.residual_var`, from the
    leave-one-out residuals of the fitted rows)."""
    var = np.einsum("ij,jk,ik->i", jacobian, cov, jacobian) + s2
    return z * np.sqrt(var)


def run_sets(runs, systems: dict, weight) -> list:
    """One RunSet per system of `runs` (load.Runs); `systems` maps names (or '*')."""
    from diffperf.api import _as_float
    from diffperf.specs.batch import anonymous, stack

    sets = []
    for name in sorted(set(runs.systems)):
        idx = np.array([i for i, s in enumerate(runs.systems) if s == name])
        system = systems.get("*", systems.get(name))
        M, P, T = _as_float((stack([runs.models[i] for i in idx]),
                             stack([runs.parallels[i] for i in idx]),
                             stack([runs.trainings[i] for i in idx])))
        sets.append((idx, RunSet(_as_float(anonymous(system)), M, P, T,
                                 jnp.log(jnp.asarray(runs.step_time_s[idx], jnp.float32)),
                                 jnp.log(jnp.asarray(runs.peak_memory_GB[idx] * 1e9,
                                                     jnp.float32)),
                                 jnp.asarray(np.asarray(weight, float)[idx], jnp.float32),
                                 jnp.asarray(~runs.ran[idx], jnp.float32))))
    return sets


_HOST_START = dict(host_layer_s=1e-3, host_kernel_s=1e-5, microbatch_s=1e-3,
                   host_recompute_s=1e-3, host_coll_peer_s=3e-5)
# The same floor carried by the kernels instead: ~40 eager PyTorch ops of ~25 us per layer.
_HOST_PER_KERNEL = dict(host_layer_s=1e-5, host_kernel_s=3e-5)


def starting_points(eff: Efficiency, fields=STEP_FIELDS) -> list:
    """The given efficiencies, and the same with the host floor active (per-layer and
    per-micro-batch host time of an eager framework) for the host fields being fitted: a
    parameter that starts where the smooth max hides it has a vanishing gradient, so the
    starts are fitted and the lower loss kept. When both the per-layer and the per-kernel
    host times are fitted, a third start puts the floor on the kernels: the two differ only
    on layers whose kernel count differs (TP collectives, Megatron's softmax fallback), a
    weak direction that gradient descent from one end does not cross."""
    active = {k: v for k, v in _HOST_START.items() if k in fields}
    if not active:
        return [eff]
    starts = [eff, eff.replace(**active)]
    if all(k in fields for k in _HOST_PER_KERNEL):
        starts.append(eff.replace(**(active | _HOST_PER_KERNEL)))
    return starts


def _unfitted_to_base(f: Fit, start: Efficiency, base: Efficiency) -> Fit:
    """A field that never moved from its start had no gradient on the fitted data (e.g. the
    TP host sync on single-GPU runs): it was not fitted, so it keeps the base value rather
    than an arbitrary starting point (`starting_points`), and an overlay does not pass it off
    as fitted."""
    unmoved = {k: getattr(base, k) for k in f.fields
               if np.isclose(float(getattr(f.eff, k)), float(getattr(start, k)), rtol=1e-5,
                             atol=0.0)}
    return f._replace(eff=f.eff.replace(**unmoved)) if unmoved else f


def default_fields(runs, fit_mask) -> tuple:
    """The fields a calibration fits, decided by the fitted runs: STEP_FIELDS, + MEMORY_FIELDS
    where one has a measured peak memory, + XLA_FIELDS where one is an XLA program; without
    the host floor (host_*) when every one is (an XLA step is enqueued whole: the host's
    per-kernel and per-layer times are multiplied by 1 - xla_compiled, so they would have no
    gradient and the starts that differ only in them would fit the same thing again)."""
    fit = np.asarray(fit_mask, bool)
    fields = STEP_FIELDS
    if np.isfinite(np.asarray(runs.peak_memory_GB)[fit]).any():
        fields = fields + MEMORY_FIELDS
    xla = np.array([float(np.max(np.asarray(t.xla_compiled))) > 0 for t in runs.trainings])
    if xla[fit].any():
        fields = fields + XLA_FIELDS
    if fit.any() and xla[fit].all():
        fields = tuple(k for k in fields if not k.startswith("host_"))
    return fields


class Calibration(NamedTuple):
    fit: Fit
    step_time_s: np.ndarray     # predicted, every run
    memory_GB: np.ndarray
    fits: np.ndarray
    half_width_log: np.ndarray  # 95 % prediction interval half-width in log step time


def calibrate_runs(runs, systems: dict, fit_mask, *, benches=(), fields=None, steps=400,
                   temperature=0.02, progress=None) -> Calibration:
    """Fit efficiencies on the runs where fit_mask is True; predict every run, with intervals.

    The efficiencies start from the first system's and are shared by all systems (an overlay
    holds efficiencies only, so it transfers to another system's datasheet).
    """
    fit_mask = np.asarray(fit_mask, bool)
    sets = run_sets(runs, systems, fit_mask.astype(float))
    if fields is None:
        fields = default_fields(runs, fit_mask)
    base = sets[0][1].system.eff
    best = best_start = None
    for start in starting_points(base, fields):
        f = fit(start, [rs for _, rs in sets], fields, benches, steps=steps,
                temperature=temperature, progress=progress)
        if best is None or f.loss_history[-1] < best.loss_history[-1]:
            best, best_start = f, start
    best = _unfitted_to_base(best, best_start, base)
    n = len(runs)
    step, mem, fits_, hw = (np.full(n, np.nan), np.full(n, np.nan), np.zeros(n, bool),
                            np.full(n, np.nan))
    jac_all, resid_fit, jac_fit = {}, [], []
    features = set_features([rs for _, rs in sets])
    for idx, rs in sets:
        s, m = run_predictions(best.eff, rs, None, features=features)
        step[idx], mem[idx] = np.asarray(s), np.asarray(m) / 1e9
        cap = rs.system.hbm_capacity_bytes * best.eff.mem_usable_frac
        fits_[idx] = np.asarray(m) <= np.asarray(cap)
        jac = log_jacobian(best.eff, fields, rs, temperature, features)
        jac_all[tuple(idx)] = jac
        ok = fit_mask[idx] & np.isfinite(runs.step_time_s[idx])
        jac_fit.append(jac[ok])
        resid_fit.append(np.log(step[idx][ok]) - np.log(runs.step_time_s[idx][ok]))
    J, r = np.concatenate(jac_fit), np.concatenate(resid_fit)
    lam = _prior_vector(fields, *J.shape)
    A = ridge_precision(J, lam)  # once, for the covariance and the leave-one-out residuals
    cov, _ = laplace_covariance(J, r, fields, precision=A)
    # Residual term from held-out (leave-one-out) residuals, not the in-sample s^2
    # (intervals.py: the model's errors are heavier-tailed than Gaussian).
    s2_heldout = residual_var(J, r, lam, precision=A)
    for idx, jac in jac_all.items():
        hw[list(idx)] = prediction_interval(jac, cov, s2_heldout)
    return Calibration(best, step, mem, fits_, hw)
