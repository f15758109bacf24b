"""Time of compute and memory-bound operations on one device (roofline with shape efficiency).

Source: Williams, Waterman & Patterson (CACM 2009), the roofline model; PAPERS.md sections 5.2
and 5.10. Efficiencies are smooth functions of the operation's shape (STYLE.md section 2).
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from diffperf.costs.smooth import smax



def gemm_size(m, n, k):
    """Effective size of a GEMM (m x k)(k x n): a soft minimum of its three dimensions.

        d = (m^-p + n^-p + k^-p)^(-1/p),   p = 4

    The smallest dimension decides tile quantization and wave efficiency; DESIGN.md reports that
    efficiency as a function of the smallest GEMM dimension transfers to other scales far better
    than efficiency as a function of FLOPs (7.1 % vs 13.7 % multi-node error).
    Example: (8192, 4096, 64) -> 64.0 (the smallest dimension; (128, 128, 128) -> 3^(-1/4) 128 = 97.3).
    """
    # p = 4 as integer powers and square roots: a general power is an exp and a log per
    # element, and this runs for every GEMM of every layout of a search.
    inv4 = sum(lax.integer_pow(1.0 / x, 4) for x in (m, n, k))
    return 1.0 / jnp.sqrt(jnp.sqrt(inv4))


def saturating_efficiency(size, eff_max, half_size, exponent):
    """Efficiency that rises with operation size and saturates:

        eta(d) = eta_max / (1 + (d_half / d)^gamma)

    a sigmoid of log d (STYLE.md: "matmul efficiency as a sigmoid of log(size)").
    Example: d = d_half gives eta_max / 2; d = 8 d_half, gamma = 1.5 gives 0.957 eta_max.
    """
    return eff_max / (1.0 + (half_size / size) ** exponent)


def roofline_time_s(flops, bytes_moved, peak_flops_per_s, eff_compute, hbm_Bps, eff_mem,
                    temperature=None):
    """Roofline time of one operation:

        t = max( FLOP / (F_peak eta_c),  bytes / (BW_hbm eta_mem) )

    Source: PAPERS.md section 5.10. Fixed per-kernel time is added by the caller.
    Example: 1 TFLOP at 989 TFLOP/s x 0.7 and 1 GB at 3.35 TB/s x 0.85 -> max(1.444 ms, 0.351 ms).
    """
    return smax(flops / (peak_flops_per_s * eff_compute), bytes_moved / (hbm_Bps * eff_mem),
                temperature)
