"""Calibration: fit the efficiency parameters of a System to measured runs by gradient descent.

Loss (DESIGN.md, "calibrate"): mean squared error of log step time over the fitted runs,
plus the same for peak memory where measured, plus kernel microbenchmarks (Pati et al.'s
operator models) when given, plus a weak Gaussian prior on the unconstrained parameters around
their starting values (keeps unidentified parameters where they were). Fractions are fitted
as logits, positive quantities as logs, so every step stays in the valid domain.
The smooth model (temperature > 0) is used while fitting.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.flatten_util import ravel_pytree
from flax import struct

from diffperf.costs.compute import attention_time_s, gemms_time_s, memory_time_s
from diffperf.intervals import residual_var, ridge_precision
from diffperf.predict import FEATURES, features_of, predict_step
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
    """The predict.FEATURES whose terms can be non-zero for some run of the RunSets
    (`predict.features_of`, over every run): the others are 0 for every run and left out of
    the traced program, which changes no prediction (features_of) but makes the fit's
    program smaller and faster. For the vTrain CSV (dense GPT models, no CP, EP, AxoNN grid,
    HSDP or XLA runs) it is empty: measured on 2 cores, the fit's compile 17 s of CPU instead
    of 22 s and a step of its 18 fits 53 ms instead of 95 ms; the Jacobian's compile 9 s
    instead of 18 s."""
    return frozenset().union(*(features_of(rs.models, rs.parallels, rs.trainings)
                               for rs in sets))


@functools.partial(jax.jit, static_argnames=("temperature", "with_margin", "features"))
def run_predictions(eff, rs: RunSet, temperature, with_margin=False, features=FEATURES):
    """(step time, memory total[, fit margin]) of every run of a RunSet with `eff`; jitted
    (one compile per shape: called eagerly, the vmapped model would compile op by op, ~100 s
    for the vTrain CSV), inlined where it is traced (`loss_fn`)."""
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


class Fit(NamedTuple):
    eff: Efficiency
    fields: tuple
    loss_history: np.ndarray


def fitted_runs(sets) -> float:
    """Fitted runs (weight > 0) with a measured step time, over RunSets."""
    return sum(float(jnp.sum(jnp.where(jnp.isfinite(rs.log_step), rs.weight, 0.0)))
               for rs in sets)


def _optimizer(learning_rate, steps):
    """Adam with a cosine decay of the learning rate to 5 % over `steps`."""
    return optax.adam(optax.cosine_decay_schedule(learning_rate, steps, alpha=0.05))


CHUNK_STEPS = 40  # optimizer steps per call of the compiled fit (a progress update each)


def _chunking(steps) -> tuple:
    """(calls, steps per call): about CHUNK_STEPS steps a call, the same number in every call
    (one compiled program); the last call runs at most calls - 1 steps past `steps`, which
    change nothing (`_fit_chunk`)."""
    calls = -(-steps // CHUNK_STEPS)
    return calls, -(-steps // calls)


def _fit_chunk(u, state, weights, prior, base, done, sets, benches, *, length, learning_rate,
               steps, temperature, mem_weight, features):
    """`length` Adam steps (optimizer steps done + 1 ... done + length; those past `steps`
    leave u and the optimizer's state as they were) of a batch of fits, one per leading
    index of u, state, weights (one array per RunSet: the runs each fit weighs, e.g. a fold
    of a cross-validation), prior and base (the efficiencies not fitted): one compiled
    program (lax.scan of the steps, vmap of the fits) for every start and every fold of a
    calibration. Non-finite gradient entries are taken as 0. Returns (u, state, loss before
    each step [fits, length])."""
    opt = _optimizer(learning_rate, steps)
    grad = jax.value_and_grad(loss_fn)

    def one(u, state, weights, prior, base):
        fsets = tuple(rs._replace(weight=w) for rs, w in zip(sets, weights))

        def step(carry, i):
            u, state = carry
            loss, g = grad(u, base, fsets, benches, prior, temperature, mem_weight, features)
            g = jax.tree.map(lambda x: jnp.where(jnp.isfinite(x), x, 0.0), g)
            updates, new_state = opt.update(g, state, u)
            new_u = optax.apply_updates(u, updates)
            live = done + i < steps
            keep = lambda new, old: jax.tree.map(  # noqa: E731
                lambda a, b: jnp.where(live, a, b), new, old)
            return (keep(new_u, u), keep(new_state, state)), loss

        (u, state), losses = jax.lax.scan(step, (u, state), jnp.arange(length))
        return u, state, losses

    return jax.vmap(one)(u, state, weights, prior, base)


_FIT_STATIC = ("length", "learning_rate", "steps", "temperature", "mem_weight", "features")
# The fit's options on XLA:CPU: LLVM -O1 with the classic emitters. Measured on 2 cores for
# the vTrain CSV's 5-fold CV (18 fits x 1,549 runs, no optional features: set_features):
#   options                               compile (CPU s)   40 steps of the 18 fits (CPU s)
#   XLA's defaults (fusion emitters)           17.3              2.10
#   fusion emitters, -O1                       16.4              2.15
#   classic emitters, -O1 (these)              10.8              2.45
#   classic emitters, -O2                      11.7              2.50
#   classic emitters, -O0 (quick)               3.5              7.8
# (a step of a fit: 3.4 ms, of which ~0.1 ms the memory terms). Below this many run-steps
# (runs x fits x steps) the quick options win (compile 7 s less, a run-step 4.8 us more:
# break-even ~1.5 M; vTrain's 5-fold CV: 11 M). Since the features 'lowp' and 'mla' (no
# low-precision GEMM times, 4 GEMM rows of 12 for the vTrain runs: predict.features_of) a
# step costs less than half (session 9, CPU s under load 1-6, in turns):
#   classic emitters, -O1 (these)         9.3-12.7            1.3-1.5
#   fusion emitters, -O1                     17.8              1.13-1.20
#   classic emitters, -O0 (quick)             3.0              4.1-4.2
# (break-even of the quick options now ~2.6 M run-steps; FIT_QUICK_BELOW is left as it was,
# since the two option sets do not give the same fit to rounding: their losses after 80
# steps of the vTrain fits differ by up to 3 %).
_CPU_FIT_OPTIONS = {"xla_cpu_use_fusion_emitters": False, "xla_backend_optimization_level": 1}
FIT_QUICK_BELOW = 1_300_000


@functools.cache
def _fit_programs() -> dict:
    """The jitted `_fit_chunk`: 'optimized' (XLA's default options), and, on CPU, 'cpu'
    (_CPU_FIT_OPTIONS) and 'quick' (search._CPU_QUICK_OPTIONS)."""
    from diffperf.search.kernel import _CPU_QUICK_OPTIONS

    return {"optimized": jax.jit(_fit_chunk, static_argnames=_FIT_STATIC),
            "cpu": jax.jit(_fit_chunk, static_argnames=_FIT_STATIC,
                           compiler_options=_CPU_FIT_OPTIONS),
            "quick": jax.jit(_fit_chunk, static_argnames=_FIT_STATIC,
                             compiler_options=_CPU_QUICK_OPTIONS)}


def fit_program(run_steps: int):
    """The compiled fit for a calibration of `run_steps` (see FIT_QUICK_BELOW)."""
    if jax.default_backend() != "cpu":
        return _fit_programs()["optimized"]
    return _fit_programs()["quick" if run_steps < FIT_QUICK_BELOW else "cpu"]


def fit_many(starts, weights, sets, fields=STEP_FIELDS, benches=(), *, steps=600,
             learning_rate=0.05, temperature=0.02, mem_weight=1.0, progress=None,
             on_traced=None) -> list:
    """`fit` from each of `starts` with the run weights of the same index (weights[i]: one
    array per RunSet; the sets' own weights are ignored), all at once: one compiled program
    (`_fit_chunk`) whatever the number of starts and folds. Returns one Fit per start.

    progress: optional callable(steps) called after each chunk of CHUNK_STEPS optimizer
    steps with the steps every fit has advanced.
    on_traced: optional callable() called once the fit's program is traced and lowered,
    before XLA compiles it (`calibrate_folds` starts compiling its later programs then).
    """
    sets = tuple(sets)
    us = [to_unconstrained(s, fields) for s in starts]
    priors = [{"u0": dict(u), "strength": {
        f: jnp.float32(v) for f, v in prior_strengths(fields, fitted_runs(
            [rs._replace(weight=jnp.asarray(w, jnp.float32)) for rs, w in zip(sets, ws)])
        ).items()}} for u, ws in zip(us, weights)]
    stack = lambda trees: jax.tree.map(lambda *x: jnp.stack(x), *trees)  # noqa: E731
    u, prior = stack(us), stack(priors)
    w = tuple(jnp.stack([jnp.asarray(ws[k], jnp.float32) for ws in weights])
              for k in range(len(sets)))
    state = jax.vmap(_optimizer(learning_rate, steps).init)(u)
    base = stack([jax.tree.map(lambda x: jnp.asarray(x, jnp.result_type(float)), s)
                  for s in starts])
    calls, length = _chunking(steps)
    rows = sum(int(np.asarray(rs.log_step).shape[0]) for rs in sets)
    program = fit_program(rows * len(starts) * steps)
    static = dict(length=length, learning_rate=learning_rate, steps=steps,
                  temperature=temperature, mem_weight=mem_weight, features=set_features(sets))
    if on_traced is not None:
        # Trace and lower now (jit keeps both for the call below, which then only compiles):
        # the callback's threads trace (holding the GIL) while XLA compiles (releasing it).
        program.lower(u, state, w, prior, base, jnp.int32(0), sets, tuple(benches), **static)
        on_traced()
    history = []
    for c in range(calls):
        u, state, losses = program(u, state, w, prior, base, jnp.int32(c * length), sets,
                                   tuple(benches), **static)
        history.append(np.asarray(losses))
        if progress is not None:
            progress(min(steps, (c + 1) * length) - min(steps, c * length))
    history = np.concatenate(history, axis=1)[:, :steps]
    return [Fit(from_unconstrained(start, jax.tree.map(lambda x: x[i], u)), tuple(fields),
                history[i]) for i, start in enumerate(starts)]


def fit(base: Efficiency, sets, fields=STEP_FIELDS, benches=(), *, steps=600,
        learning_rate=0.05, temperature=0.02, mem_weight=1.0,
        progress=None) -> Fit:
    """Fit `fields` of the efficiency parameters with Adam (optax) on the smooth model.

    Args:
        base: starting efficiencies (also the prior's centre).
        sets: RunSets (one per system); runs with weight 0 are held out.
        benches: (Microbench, System) pairs: kernel measurements on that system's GPU.
        progress: optional callable(steps) for a progress bar (see `fit_many`).
    """
    return fit_many([base], [tuple(rs.weight for rs in sets)], sets, fields, benches,
                    steps=steps, learning_rate=learning_rate, temperature=temperature,
                    mem_weight=mem_weight, progress=progress)[0]


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
            return 3.5 * attention_time_s(g, system, training, io, rows=b * a * s)

        return jax.vmap(one)(b, s, a, d, kappa) + 3.0 * eff.kernel_s
    (nbytes,) = mb.columns
    return memory_time_s(nbytes, system) + eff.kernel_s


def _quick_jit(fn, **kwargs):
    """`jax.jit` with XLA:CPU's quick-compiling options on CPU (search._CPU_QUICK_OPTIONS),
    for the programs a calibration runs once per fold after the fit (predictions, Jacobian):
    their compilation, not their run, is what takes time (as in sensitivity._quick_jit).
    The jitted functions are the callable's `programs` (quick, plain)."""
    from diffperf.search.kernel import _CPU_QUICK_OPTIONS

    quick = jax.jit(fn, compiler_options=_CPU_QUICK_OPTIONS, **kwargs)
    plain = jax.jit(fn, **kwargs)

    def call(*a, **k):
        return (quick if jax.default_backend() == "cpu" else plain)(*a, **k)

    call.programs = (quick, plain)
    return call


def _jacobian_impl(eff: Efficiency, fields, rs: RunSet, temperature, features):
    u = to_unconstrained(eff, fields)
    flat, unravel = ravel_pytree(u)

    def column(tangent):  # d log(step time) / d u . tangent, every run
        def f(v):
            step, _ = run_predictions(from_unconstrained(eff, unravel(v)), rs, temperature,
                                      features=features)
            return jnp.log(step)

        return jax.jvp(f, (flat,), (tangent,))[1]

    # Forward mode: one tangent per fitted field (~20) against one cotangent per run (1,549
    # for vTrain) in reverse mode, whose compile XLA:CPU reports as "very slow". The tangents
    # one after the other (lax.map), not batched (jacfwd's vmap): the program is one JVP.
    # Measured for the vTrain CSV on 2 cores (quick options): compile 2.0 s of CPU against
    # 9.3 s for jacfwd, the 20 passes 0.2 s; the same Jacobian to float32 rounding (2e-7).
    cols = jax.lax.map(column, jnp.eye(flat.size, dtype=flat.dtype))  # [fields, runs]
    return jax.vmap(unravel)(cols.T)


_jacobian = _quick_jit(_jacobian_impl, static_argnames=("fields", "temperature", "features"))
_exact_predictions = _quick_jit(run_predictions.__wrapped__,
                                static_argnames=("temperature", "with_margin", "features"))


def log_jacobian(eff: Efficiency, fields, rs: RunSet, temperature, features=FEATURES):
    """d log(step time) / d u for every run (u = unconstrained fitted parameters)."""
    jac = _jacobian(eff, tuple(fields), rs, temperature, features)
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
    return calibrate_folds(runs, systems, [fit_mask], benches=benches, fields=fields,
                           steps=steps, temperature=temperature, progress=progress)[0]


def _compile_after_fit(base, sets, groups, temperature) -> threading.Thread:
    """Compile, in a thread started now, the programs `_predict_with_intervals` runs after
    the fit (`_exact_predictions`, `_jacobian` for each group of fields), by calling them on
    the starting efficiencies (the fitted ones have the same types and shapes, so the later
    calls find them compiled). XLA compiles without holding the GIL: the compilation runs
    beside the fit's on the other core instead of after the fit (measured for the vTrain
    CSV on 2 cores: ~6 s of CPU, the Jacobian's trace and compile most of it).
    `calibrate_folds` starts it once the fit's program is traced (`fit_many`'s on_traced),
    so that the two traces do not take turns on the GIL (~2 s of the vTrain fit's trace and
    compile). A failure here is left to the later call, which compiles again and raises."""
    features = set_features([rs for _, rs in sets])

    def work():
        with contextlib.suppress(Exception):
            for _, rs in sets:
                jax.block_until_ready(_exact_predictions(base, rs, None, features=features))
                for fields in groups:
                    jax.block_until_ready(_jacobian(base, tuple(fields), rs, temperature,
                                                    features))

    thread = threading.Thread(target=work, name="diffperf-calibrate-compile", daemon=True)
    thread.start()
    return thread


def calibrate_folds(runs, systems: dict, fit_masks, *, benches=(), fields=None, steps=400,
                    temperature=0.02, progress=None) -> list:
    """`calibrate_runs` for each of `fit_masks` (the folds of a cross-validation, and the
    fit on every row), one Calibration each: the fits of every mask and every starting point
    run together, one compiled program for all of them (`fit_many`; masks whose fitted rows
    call for other fields, `default_fields`, are fitted in a batch of their own).

    progress: optional callable(steps) (see `fit_many`); every fit advances `steps` in all,
    so a bar's total is steps x (number of batches: 1 where the masks' fields agree).
    """
    masks = [np.asarray(m, bool) for m in fit_masks]
    sets = run_sets(runs, systems, masks[0].astype(float))
    idxs, rsets = [i for i, _ in sets], tuple(rs for _, rs in sets)
    base = rsets[0].system.eff
    fields_of = [tuple(fields) if fields is not None else default_fields(runs, m)
                 for m in masks]
    best = [None] * len(masks)
    compiling = []

    def start_compiling():  # once, when the first batch's fit program is traced
        if not compiling:
            compiling.append(_compile_after_fit(base, sets, tuple(dict.fromkeys(fields_of)),
                                                temperature))

    for group in dict.fromkeys(fields_of):
        jobs = [(k, start) for k, m in enumerate(masks) if fields_of[k] == group
                for start in starting_points(base, group)]
        fits = fit_many([s for _, s in jobs],
                        [tuple(m[i].astype(np.float32) for i in idxs)
                         for m in (masks[k] for k, _ in jobs)],
                        rsets, group, benches, steps=steps, temperature=temperature,
                        progress=progress, on_traced=start_compiling)
        for (k, start), f in zip(jobs, fits):
            if best[k] is None or f.loss_history[-1] < best[k][0].loss_history[-1]:
                best[k] = (f, start)
    for thread in compiling:
        thread.join()
    return [_predict_with_intervals(runs, sets, m, _unfitted_to_base(f, start, base),
                                    fields_of[k], temperature)
            for k, (m, (f, start)) in enumerate(zip(masks, best))]


def _predict_with_intervals(runs, sets, fit_mask, best: Fit, fields, temperature):
    """Every run predicted with the fitted efficiencies (exact model), with the 95 %
    prediction intervals of the Laplace approximation (`laplace_covariance`)."""
    n = len(runs)
    step, mem, fits_, hw = (np.full(n, np.nan), np.full(n, np.nan), np.zeros(n, bool),
                            np.full(n, np.nan))
    jac_all, resid_fit, jac_fit = {}, [], []
    features = set_features([rs for _, rs in sets])
    for idx, rs in sets:
        s, m = _exact_predictions(best.eff, rs, None, features=features)
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
