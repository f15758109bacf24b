"""Hard and smooth max/min/relu with one code path (STYLE.md section 2).

`temperature=None` or 0 gives the exact hard form (correct subgradients, the default for
prediction). A positive temperature gives a smooth, scale-free form used by calibration and the
differentiable search: the p-norm with p = 1 / temperature, so the smoothing is *relative*
(a 1 % temperature blurs the max over about 1 % of its value, whether it is microseconds or
minutes).
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax


def pnorm_max(a, b, p):
    """Smooth max of non-negative a, b:  (a^p + b^p)^(1/p)  >= max(a, b), -> max as p -> inf.

    Computed as m * (1 + (min/m)^p)^(1/p) with m = max(a, b), so nothing overflows for large p
    and the value is exact when one argument is zero.
    """
    scale, hi, ratio = _scaled(a, b)
    return scale * hi * (1.0 + ratio**p) ** (1.0 / p)


def _scaled(a, b):
    """(s, max(a, b) / s, min(a, b) / max(a, b)) with s = max(a, b) held constant under
    differentiation (1 where max(a, b) = 0). Both smooth forms are homogeneous of degree 1,
    F(a, b) = s F(a / s, b / s) for every s > 0, so differentiating s F(a / s, b / s) with s
    held constant gives F's own gradient, and the same values bit for bit (max / s = 1). Why:
    the ratio's derivative in the larger argument is -min / max^2, and max^2 of a time of
    ~1e-20 s underflows float32 (inf, then NaN in the backward pass); scaled, it is
    -ratio / 1. Double-where: the masked branch divides by 1, not by ~0."""
    hi = jnp.maximum(a, b)
    lo = jnp.minimum(a, b)
    scale = lax.stop_gradient(jnp.where(hi > 0, hi, 1.0))
    hi, lo = hi / scale, lo / scale
    safe_hi = jnp.where(hi > 0, hi, 1.0)
    return scale, hi, jnp.where(hi > 0, lo / safe_hi, 0.0)


def smax(a, b, temperature=None):
    """max(a, b) for non-negative times; smooth p-norm with p = 1/temperature when > 0."""
    if not temperature:
        return jnp.maximum(a, b)
    return pnorm_max(a, b, 1.0 / temperature)


def exposed(comm, window, temperature=None):
    """Communication left exposed when `comm` seconds overlap a `window` of compute.

        exposed = max(0, C - K) = max(C, K) - K

    Source: PAPERS.md section 1.1 (Pati et al., overlap), section 2.1 (FSDP). The smooth form
    uses the relative p-norm max, so exposed stays in [0, C] and is differentiable:

        exposed = (C^p + K^p)^(1/p) - K = max(C - K, 0) + m expm1(log1p(r^p) / p)
    with m = max(C, K), r = min(C, K) / m, p = 1 / temperature (the same number: m (1 + r^p)^(1/p)
    = m + m expm1(log1p(r^p) / p), and m - K = max(C - K, 0)). Written so because the
    difference `smax(C, K) - K` cancels when C << K: it is K ((1 + r^p)^(1/p) - 1), ~ K r^p / p,
    a difference of two numbers equal to ~1 + 1e-12 (r = 0.3, p = 20), so its rounding error is
    ~K eps and its relative error unbounded, and so is its gradient's (d smax / dK - 1). The
    compiled float64 gradient then depended on how XLA fused the program: on the check_grads
    case multi-node-llama3-8b-h100 (smooth) the System gradient moved by up to 7.4e-4 relative
    when a division by 1 was put on predict's forward parts, while the eager gradient and the
    finite differences of the value agreed with each other; with this form every program
    gives the finite-difference gradient (benchmarks/README.md "Session 13: the forward pass in
    the backward fusions"). expm1 and log1p keep their relative accuracy at tiny arguments, the
    two terms are non-negative (no cancellation), r <= 1 so r^p cannot overflow, and r = 0
    (C = 0 or K = 0) gives a finite gradient (d r^p / dr = p r^(p-1) = 0 for p > 1). The hard
    form (temperature None or 0) is max(C, K) - K, as before.
    """
    if not temperature:
        return jnp.clip(smax(comm, window, temperature) - window, 0.0, comm)
    p = 1.0 / temperature
    scale, hi, ratio = _scaled(comm, window)  # float32-safe gradient at tiny times (_scaled)
    excess = scale * hi * jnp.expm1(jnp.log1p(ratio**p) / p)
    return jnp.clip(jnp.maximum(comm - window, 0.0) + excess, 0.0, comm)


def smin(a, b, temperature=None):
    """min(a, b) for positive values; smooth as 1 / smax(1/a, 1/b) when temperature > 0."""
    if not temperature:
        return jnp.minimum(a, b)
    safe_a = jnp.where(a > 0, a, 1.0)
    safe_b = jnp.where(b > 0, b, 1.0)
    inv = pnorm_max(jnp.where(a > 0, 1.0 / safe_a, 0.0), jnp.where(b > 0, 1.0 / safe_b, 0.0),
                    1.0 / temperature)
    return jnp.where((a > 0) & (b > 0), 1.0 / jnp.where(inv > 0, inv, 1.0), 0.0)
