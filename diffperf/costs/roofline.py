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
    Example: (8192, 4096, 64) -> 64.0 (the smallest dimension; (128, 128, 128) ->
    3^(-1/4) 128 = 97.3).
    """
    # p = 4 as integer powers and square roots: a general power is an exp and a log per
    # element, and this runs for every GEMM of every layout of a search.
    inv4 = sum(lax.integer_pow(1.0 / x, 4) for x in (m, n, k))
    return 1.0 / jnp.sqrt(jnp.sqrt(inv4))


def alignment_bytes(dim, elem_bytes):
    """Alignment of a row of `dim` elements of `elem_bytes` each: the largest power of two
    (bytes) that divides dim x elem_bytes, capped at 16 (one 128-bit vector access).

        a = min(16, 2^v2(round(dim) q))        a in {1, 2, 4, 8, 16}
    Example: dim 50257, q 2 -> 2 (odd); 12564, q 2 -> 8; 6282 -> 4; 1024 -> 16.
    A property of the (integer) shape, constant in every System leaf.
    """
    nbytes = jnp.round(jnp.asarray(dim) * elem_bytes).astype(jnp.int32)
    lowest_bit = jnp.bitwise_and(nbytes, -nbytes)  # 2^v2(x): the largest power of 2 dividing x
    lowest_bit = jnp.where(nbytes == 0, 16, lowest_bit)  # an empty dimension: nothing to align
    return jnp.minimum(lowest_bit, 16).astype(jnp.result_type(float))


def alignment_factor(n, k, elem_bytes, exponent):
    """Efficiency factor of a GEMM (m x k)(k x n) whose leading dimensions are misaligned:

        phi = (a / 16)^gamma,   a = min(alignment_bytes(n), alignment_bytes(k))
    (1 for a = 16 B). Row-major operands have leading dimensions k (A; dX of the backward) and
    n (B and C; dY of the backward): every pass of the layer touches both (m is never a
    leading dimension: the backward reads X^T through the transpose flag). Tensor-core GEMM
    kernels load tiles with 16-byte vector copies (Ampere cp.async, Hopper TMA) that need
    16-byte aligned rows; with a smaller alignment cuBLAS (>= 11) still uses the tensor cores
    but through narrower, more numerous loads, and older libraries do not use them at all.
    Source: NVIDIA Matrix Multiplication Background User's Guide (DU-09799-001, 2023),
    section 2.2 "Tensor Core Requirements" (performance is best with M, N, K multiples of
    16 bytes); cuBLAS documentation, "Tensor Core Usage" (alignment restrictions) [B].
    Example: the GPT-2 vocabulary (50257, odd) as the N of a 16-bit logits GEMM: a = 2 B,
    phi = (1/8)^gamma (0.44 at gamma = 0.4); the vTrain A100 runs at tp = 1 show the output
    layer running at ~100 TFLOP/s where the tp = 2 shard (25128, a = 16 B) runs at ~220 [D].
    """
    a = jnp.minimum(alignment_bytes(n, elem_bytes), alignment_bytes(k, elem_bytes))
    return (a / 16.0) ** exponent


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
