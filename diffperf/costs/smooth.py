"""Hard and smooth max/min/relu with one code path (STYLE.md section 2).

`temperature=None` or 0 gives the exact hard form (correct subgradients, the default for
prediction). A positive temperature gives a smooth, scale-free form used by calibration and the
differentiable search: the p-norm with p = 1 / temperature, so the smoothing is *relative*
(a 1 % temperature blurs the max over about 1 % of its value, whether it is microseconds or
minutes).
"""

from __future__ import annotations

import jax.numpy as jnp


def pnorm_max(a, b, p):
    """Smooth max of non-negative a, b:  (a^p + b^p)^(1/p)  >= max(a, b), -> max as p -> inf.

    Computed as m * (1 + (min/m)^p)^(1/p) with m = max(a, b), so nothing overflows for large p
    and the value is exact when one argument is zero.
    """
    hi = jnp.maximum(a, b)
    lo = jnp.minimum(a, b)
    # Double-where: the masked branch divides by 1, not by ~0, so its gradient stays finite
    # (a tiny denominator squares to 0 in float32 and gives 0/0 = NaN in the backward pass).
    safe_hi = jnp.where(hi > 0, hi, 1.0)
    ratio = jnp.where(hi > 0, lo / safe_hi, 0.0)
    return hi * (1.0 + ratio**p) ** (1.0 / p)


def smax(a, b, temperature=None):
    """max(a, b) for non-negative times; smooth p-norm with p = 1/temperature when > 0."""
    if not temperature:
        return jnp.maximum(a, b)
    return pnorm_max(a, b, 1.0 / temperature)


def exposed(comm, window, temperature=None):
    """Communication left exposed when `comm` seconds overlap a `window` of compute.

        exposed = max(0, C - K) = max(C, K) - K

    Source: PAPERS.md section 1.1 (Pati et al., overlap), section 2.1 (FSDP). The smooth form
    uses the relative p-norm max, so exposed stays in [0, C] and is differentiable.
    """
    return jnp.clip(smax(comm, window, temperature) - window, 0.0, comm)


def smin(a, b, temperature=None):
    """min(a, b) for positive values; smooth as 1 / smax(1/a, 1/b) when temperature > 0."""
    if not temperature:
        return jnp.minimum(a, b)
    safe_a = jnp.where(a > 0, a, 1.0)
    safe_b = jnp.where(b > 0, b, 1.0)
    inv = pnorm_max(jnp.where(a > 0, 1.0 / safe_a, 0.0), jnp.where(b > 0, 1.0 / safe_b, 0.0),
                    1.0 / temperature)
    return jnp.where((a > 0) & (b > 0), 1.0 / jnp.where(inv > 0, inv, 1.0), 0.0)
