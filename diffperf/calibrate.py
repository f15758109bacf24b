"""Calibration: fit the efficiency parameters of a System to measured runs by gradient descent.

Loss (DESIGN.md, "calibrate"): mean squared error of log step time over the fitted runs,
plus the same for peak memory where measured, plus kernel microbenchmarks (Pati et al.'s
operator models) when given, plus a weak Gaussian prior on the unconstrained parameters around
their starting values (keeps unidentified parameters where they were). Fractions are fitted
as logits, positive quantities as logs, so every step stays in the valid domain.
The smooth model (temperature > 0) is used while fitting.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from diffperf.costs.compute import gemms_time_s, memory_time_s
from diffperf.predict import predict_step
from diffperf.specs.system import Efficiency
from diffperf.workload.ops import Gemms

FRACTIONS = ("mm_max", "attn_max", "mem_eff", "coll_eff_intra", "coll_eff_inter",
             "overlap_slowdown", "mem_usable_frac")
STEP_FIELDS = ("mm_max", "mm_half_dim", "mm_exponent", "attn_max", "attn_half_dim", "mem_eff",
               "kernel_s", "host_kernel_s", "host_layer_s", "microbatch_s", "step_s",
               "coll_base_s", "coll_eff_intra", "coll_eff_inter", "floor_pnorm")
MEMORY_FIELDS = ("mem_reserved_bytes", "act_mem_factor")
_FLOOR = 1e-7  # smallest starting value of a positive parameter (log of 0 is not a start)


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


class Microbench(NamedTuple):
    """Kernel measurements (log time) and a function predicting them from a System."""

    log_time: Any
    predict_s: Callable  # Efficiency -> predicted seconds, same shape as log_time


def _masked_sq(pred_log, meas_log, weight):
    ok = jnp.isfinite(meas_log) & (weight > 0)
    diff = jnp.where(ok, pred_log - jnp.where(ok, meas_log, 0.0), 0.0)
    return jnp.sum(weight * diff**2), jnp.sum(jnp.where(ok, weight, 0.0))


def run_predictions(eff, rs: RunSet, temperature):
    """(step time, memory total) of every run of a RunSet with efficiencies `eff`."""
    system = rs.system.replace(eff=eff)
    res = jax.vmap(predict_step, in_axes=(0, 0, None, 0, None))(
        rs.models, rs.parallels, system, rs.trainings, temperature)
    return res.step_time_s, res.memory.total_bytes


def loss_fn(u, base, sets, benches, temperature, prior, mem_weight):
    """Mean squared log error over runs (+ memory, + microbenchmarks) + prior."""
    eff = from_unconstrained(base, u)
    num, den = 0.0, 0.0
    for rs in sets:
        step, mem = run_predictions(eff, rs, temperature)
        n1, d1 = _masked_sq(jnp.log(step), rs.log_step, rs.weight)
        n2, d2 = _masked_sq(jnp.log(mem), rs.log_mem, rs.weight)
        num, den = num + n1 + mem_weight * n2, den + d1 + mem_weight * d2
    for mb in benches:
        pred = mb.predict_s(eff)
        num = num + jnp.sum((jnp.log(pred) - mb.log_time) ** 2)
        den = den + mb.log_time.size
    u0 = prior["u0"]
    reg = sum(jnp.sum((u[f] - u0[f]) ** 2) for f in u)
    return num / jnp.maximum(den, 1.0) + prior["strength"] * reg


class Fit(NamedTuple):
    eff: Efficiency
    fields: tuple
    loss_history: np.ndarray


def fit(base: Efficiency, sets, fields=STEP_FIELDS, benches=(), *, steps=600,
        learning_rate=0.05, temperature=0.02, prior_strength=1e-3, mem_weight=1.0,
        progress=None) -> Fit:
    """Fit `fields` of the efficiency parameters with Adam (optax) on the smooth model.

    Args:
        base: starting efficiencies (also the prior's centre).
        sets: RunSets (one per system); runs with weight 0 are held out.
        benches: Microbench terms (kernel measurements), weighted like one run each.
        progress: optional callable(step, loss) for a progress bar.
    """
    u = to_unconstrained(base, fields)
    prior = {"u0": dict(u), "strength": prior_strength}
    value_and_grad = jax.jit(jax.value_and_grad(
        lambda u: loss_fn(u, base, sets, benches, temperature, prior, mem_weight)))
    opt = optax.adam(optax.cosine_decay_schedule(learning_rate, steps, alpha=0.05))
    state = opt.init(u)
    history = []
    for i in range(steps):
        loss, g = value_and_grad(u)
        g = jax.tree.map(lambda x: jnp.where(jnp.isfinite(x), x, 0.0), g)
        updates, state = opt.update(g, state, u)
        u = optax.apply_updates(u, updates)
        history.append(float(loss))
        if progress is not None:
            progress(i, float(loss))
    return Fit(from_unconstrained(base, u), tuple(fields), np.array(history))


def gemm_bench(m, n, k, time_s, system, training) -> Microbench:
    """bf16 GEMM microbenchmarks: t = roofline(2 m n k, eta_mm(m, n, k)) + kernel_s."""
    g = Gemms(m=jnp.asarray(m, jnp.float32), n=jnp.asarray(n, jnp.float32),
              k=jnp.asarray(k, jnp.float32), count=jnp.ones(len(m), jnp.float32))

    def predict(eff):
        sysm = system.replace(eff=eff)
        each = jax.vmap(lambda gi: gemms_time_s(
            Gemms(gi.m[None], gi.n[None], gi.k[None], gi.count[None]), sysm, training,
            eff.mm_max, eff.mm_half_dim, None))(g)
        return each + eff.kernel_s

    return Microbench(jnp.log(jnp.asarray(time_s, jnp.float32)), predict)


def attention_bench(batch, seq, heads, head_dim, causal, fwd_bwd_s, system,
                    training) -> Microbench:
    """Flash-attention forward+backward: 3.5 x the forward core (QK^T, AV with kappa) at the
    attention efficiency, + 3 kernels (PAPERS.md 5.1: flash backward ~ 2.5 x forward)."""
    b, s, a, d, c = (jnp.asarray(x, jnp.float32) for x in (batch, seq, heads, head_dim, causal))
    kappa = 1.0 - 0.5 * c

    def predict(eff):
        sysm = system.replace(eff=eff)

        def one(b, s, a, d, kappa):
            g = Gemms(m=jnp.stack([s, s]), n=jnp.stack([s, d]), k=jnp.stack([d, s]),
                      count=jnp.stack([b * a * kappa, b * a * kappa]))
            return 3.5 * gemms_time_s(g, sysm, training, eff.attn_max, eff.attn_half_dim)

        return jax.vmap(one)(b, s, a, d, kappa) + 3.0 * eff.kernel_s

    return Microbench(jnp.log(jnp.asarray(fwd_bwd_s, jnp.float32)), predict)


def memory_bench(bytes_moved, time_s, system) -> Microbench:
    """Memory-bound kernels: t = bytes / (BW_hbm eta_mem) + kernel_s."""
    nb = jnp.asarray(bytes_moved, jnp.float32)

    def predict(eff):
        return memory_time_s(nb, system.replace(eff=eff)) + eff.kernel_s

    return Microbench(jnp.log(jnp.asarray(time_s, jnp.float32)), predict)


def log_jacobian(eff: Efficiency, fields, rs: RunSet, temperature):
    """d log(step time) / d u for every run (u = unconstrained fitted parameters)."""
    u = to_unconstrained(eff, fields)

    def f(u):
        step, _ = run_predictions(from_unconstrained(eff, u), rs, temperature)
        return jnp.log(step)

    jac = jax.jacrev(f)(u)
    return np.concatenate([np.asarray(jac[k]).reshape(len(np.asarray(rs.log_step)), -1)
                           for k in fields], axis=1)


def laplace_covariance(jacobian_fit, residuals_fit, prior_strength=1e-3):
    """Laplace approximation of the posterior covariance of u:

        Sigma = s^2 (J^T J + lambda I)^-1,   s^2 = sum r^2 / (n - k)
    (Gauss-Newton Hessian of the least-squares fit; MacKay 1992). Returns (Sigma, s^2).
    """
    n, k = jacobian_fit.shape
    s2 = float(np.sum(residuals_fit**2) / max(n - k, 1))
    lam = prior_strength * n
    cov = s2 * np.linalg.inv(jacobian_fit.T @ jacobian_fit + lam * np.eye(k))
    return cov, s2


def prediction_interval(jacobian, cov, s2, z=1.96):
    """Half-width in log space of the 95 % prediction interval: z sqrt(j Sigma j^T + s^2)."""
    var = np.einsum("ij,jk,ik->i", jacobian, cov, jacobian) + s2
    return z * np.sqrt(var)
