"""GPU time of a layer's and of the output layer's operations on one device.

Each op: roofline (costs.roofline) with a shape-dependent efficiency, plus a fixed time per
kernel. Source: PAPERS.md sections 3.2 (NERSC: 20 us per op, 0.8 efficiency) [C] and 5.10.
"""

from __future__ import annotations

import jax.numpy as jnp

from diffperf.costs.smooth import smax
from diffperf.costs.roofline import gemm_size, roofline_time_s, saturating_efficiency


def matmul_peak(system, training):
    """F_peak of the precision the matmuls run in (16-bit tensor cores, or TF32/fp32)."""
    return jnp.where(training.matmul_fp32 > 0, system.matmul_fp32_flops_per_s,
                     system.matmul_flops_per_s)


def gemms_time_s(gemms, system, training, eff_max, half_dim, temperature=None):
    """Sum over GEMMs of  count x roofline(2 m n k, q (m k + k n + m n)),
    efficiency eta(d) = eff_max / (1 + (d_half / d)^gamma), d = soft-min(m, n, k)."""
    q = training.activation_bytes
    # Unused op kinds (MoE rows of a dense model) have zero dimensions: clamp to 1 so that
    # the efficiency stays finite; their count of 0 removes them from the sum.
    m, n, k = (jnp.maximum(x, 1.0) for x in (gemms.m, gemms.n, gemms.k))
    eff = saturating_efficiency(gemm_size(m, n, k), eff_max, half_dim, system.eff.mm_exponent)
    flops = 2.0 * m * n * k
    bytes_moved = q * (m * k + k * n + m * n)
    each = roofline_time_s(flops, bytes_moved, matmul_peak(system, training), eff,
                           system.hbm_bandwidth_Bps, system.eff.mem_eff, temperature)
    return jnp.sum(gemms.count * each)


def memory_time_s(bytes_moved, system):
    """Memory-bound op: bytes / (BW_hbm eta_mem)."""
    return bytes_moved / (system.hbm_bandwidth_Bps * system.eff.mem_eff)


def layer_times_s(ops, system, training, attn_io_bytes, temperature=None):
    """(dense GEMMs, attention core, memory-bound + vector + kernel fixed) forward times
    of one layer, one micro-batch. Attention uses its own efficiency curve on (s_q, s_kv, d_h)
    and is at least its Q/K/V/O traffic time."""
    e = system.eff
    dense = gemms_time_s(ops.dense, system, training, e.mm_max, e.mm_half_dim, temperature)
    attn_mm = gemms_time_s(ops.attention, system, training, e.attn_max, e.attn_half_dim,
                           temperature)
    attn = smax(attn_mm, memory_time_s(attn_io_bytes, system), temperature)
    other = (memory_time_s(ops.elementwise_bytes, system)
             + ops.vector_flops / system.vector_flops_per_s
             + ops.n_kernels * e.kernel_s)
    return dense, attn, other
