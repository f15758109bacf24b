"""The hardware system: peak rates, memory, network tiers and the efficiency parameters.

Every number is an array leaf so that `jax.grad` gives the sensitivity of a step to it and
calibration can fit it. The number of tiers is tree structure (a tuple), hence static.
"""

from __future__ import annotations

from typing import Any

from flax import struct


class Tier(struct.PyTreeNode):
    """One level of the network: a domain of `domain_size` devices joined at `bandwidth_Bps`.

    Tiers are nested innermost first (NVLink node, then the scale-out fabric); the last tier's
    domain holds the whole cluster. Bandwidth is per device and per direction (PAPERS.md
    section 0): NICs per node x NIC rate / devices per node for a scale-out tier.
    """

    domain_size: Any    # devices reachable on this tier (n_i); continuous for co-design
    bandwidth_Bps: Any  # per device, one direction
    latency_s: Any      # per message step (alpha_i)
    name: str = struct.field(pytree_node=False, default="tier")


class Efficiency(struct.PyTreeNode):
    """Efficiency parameters that calibration fits; defaults are uncalibrated, physical guesses.

    Each is a smooth parametric function input, never a step table (STYLE.md section 2).
    """

    mm_max: Any = 0.80          # matmul efficiency of large GEMMs (NERSC default 0.8, PAPERS 3.2)
    mm_half_dim: Any = 64.0     # GEMM size (soft-min of m, n, k) at which efficiency halves
    mm_exponent: Any = 1.5      # steepness of the small-GEMM fall-off
    mm_align_exponent: Any = 0.4  # GEMM slowdown (16 B / alignment)^this for leading dims
                                  # not a multiple of 16 bytes (costs.roofline.alignment_factor)
    attn_max: Any = 0.75        # flash-attention efficiency with large work and head_dim
    attn_half_work: Any = 9e7   # score elements b (a/t) s_q s_kv kappa at which it halves
    attn_exponent: Any = 1.2    # steepness of the fall-off with work
    attn_half_head_dim: Any = 40.0  # head_dim penalty: eta ~ 1 / (1 + d_half / d_h)
    mem_eff: Any = 0.85         # achieved / peak HBM bandwidth of memory-bound kernels
    kernel_s: Any = 4e-6        # GPU-side fixed time per kernel (launch, tail, sync)
    queued_kernel_s: Any = 3e-6  # the same for a kernel of one compiled program (XLA) whose
                                 # queue runs ahead of the GPU: dependent-kernel gap and tail
                                 # (costs.xla.kernel_fixed_s)
    host_kernel_s: Any = 5e-6   # host-side dispatch time per kernel (eager frameworks: ~10 us)
    host_layer_s: Any = 5e-5    # host-side time per layer pass (framework hooks, checkpointing)
    host_recompute_s: Any = 5e-5  # host time of re-entering a checkpointed layer (RNG, graph)
    host_coll_peer_s: Any = 2e-6  # host/sync time per TP collective call per peer rank (t - 1)
    microbatch_s: Any = 0.0     # fixed time per micro-batch (data loading, schedule bookkeeping)
    step_s: Any = 5e-3          # fixed time per step (optimizer launch, logging, sync)
    floor_pnorm: Any = 6.0      # p of the p-norm smooth max between GPU time and host floor
    coll_base_s: Any = 15e-6    # fixed cost per collective call (launch + synchronisation)
    coll_eff_intra: Any = 0.80  # achieved / link bandwidth on the innermost tier (NCCL busbw)
    coll_eff_inter: Any = 0.80  # achieved / link bandwidth on the outer tiers
    overlap_slowdown: Any = 0.10  # compute slows by this fraction of the communication it hides
    mem_usable_frac: Any = 0.95   # fraction of HBM capacity usable by tensors (fragmentation)
    mem_reserved_bytes: Any = 1.5e9  # runtime workspace (CUDA context, cuBLAS, NCCL buffers)
    act_mem_factor: Any = 1.0     # framework's saved activations / the Korthikanti count


class System(struct.PyTreeNode):
    """A cluster of identical accelerators (all leaves in SI units)."""

    matmul_flops_per_s: Any       # dense 16-bit tensor-core peak F_peak
    matmul_fp32_flops_per_s: Any  # dense TF32 / fp32 matrix peak
    vector_flops_per_s: Any       # fp32 vector (non-tensor) peak
    hbm_bandwidth_Bps: Any        # device memory bandwidth BW_hbm
    hbm_capacity_bytes: Any       # device memory capacity
    tiers: tuple                  # Tier, innermost first (their number is static structure)
    eff: Efficiency = Efficiency()
    power_W: Any = 700.0          # board power, for energy per token
    name: str = struct.field(pytree_node=False, default="system")
