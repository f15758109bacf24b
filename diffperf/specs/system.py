"""The hardware system: peak rates, memory, network tiers and the efficiency parameters.

Every number is an array leaf so that `jax.grad` gives the sensitivity of a step to it and
calibration can fit it. The number of tiers is tree structure (a tuple), hence static.
"""

from __future__ import annotations

from typing import Any

from flax import struct


class Tier(struct.PyTreeNode):
    """One level of the network: a domain of `domain_size` devices joined at `bandwidth_Bps`.

    Tiers are nested innermost first (NVLink node, then the levels of the scale-out fabric:
    rack or rail leaf, pod / spine, core); the last tier's domain holds the whole cluster.
    Bandwidth is per device and per direction (PAPERS.md section 0): NICs per node x NIC rate
    / devices per node for a scale-out tier; an oversubscribed level divides it.
    """

    domain_size: Any    # devices reachable on this tier (n_i); continuous for co-design
    bandwidth_Bps: Any  # per device, one direction (its NIC share, or link rate)
    latency_s: Any      # per message step (alpha_i)
    name: str = struct.field(pytree_node=False, default="tier")
    oversubscription: Any = 1.0  # >= 1: devices' injection bandwidth below this tier's
                                 # switches / its uplink capacity (1 = non-blocking; Meta's
                                 # Llama 3 cluster: 7 at the aggregation layer). Traffic that
                                 # crosses this tier gets bandwidth_Bps / oversubscription
                                 # when every device sends at once (costs.tiers)


# Host seconds per eager PyTorch call, measured by this project on one H100 80GB HBM3 host
# (x86 Intel Xeon, 16 CPUs, PyTorch 2.11.0+cu130): time.perf_counter over 300 calls issued
# while the GPU sleeps, Python dispatch included (data/kernels/h100_host_launch.csv; provenance
# in data/README.md, "Measured on one NVIDIA H100: host launch time and host syncs").
HOST_GEMM_CALL_S = (21.42652e-6 + 18.767993e-6) / 2.0  # torch.mm BF16, torch._scaled_mm FP8
HOST_POINTWISE_CALL_S = 6.9071567e-6                    # Tensor.add BF16
# A dense pre-norm layer's forward launches as workload.flops.layer_ops counts them (n_kernels
# = 4 + 1 + 5 + 1 with a gated MLP): 5 library calls (QKV, out, fc1, fc2 GEMMs and the fused
# attention) and 6 pointwise ones (two norms, two residual adds, the activation, the gate).
LAYER_LIBRARY_CALLS = 5.0
LAYER_POINTWISE_CALLS = 6.0


def eager_launch_host_s(gemm_call_s=HOST_GEMM_CALL_S, pointwise_call_s=HOST_POINTWISE_CALL_S,
                        n_library=LAYER_LIBRARY_CALLS, n_pointwise=LAYER_POINTWISE_CALLS):
    """t_k: host seconds per counted launch of an eager layer, the launch-weighted mean of the
    measured host time per call of its two classes,

        t_k = (n_lib t_gemm + n_pw t_pw) / (n_lib + n_pw)
            = (5 x 20.097 + 6 x 6.907) / 11 us = 12.90 us        (the defaults)

    t_gemm: a cuBLAS(Lt) GEMM call (the attention call is taken at the GEMM's host time; it was
    not measured), t_pw: a pointwise op; both this project's H100-host measurement above. The
    Efficiency default of `host_kernel_s`. Cross-check: Transformer Engine issue #2053
    (github.com/NVIDIA/TransformerEngine/issues/2053, 2025-08-11) measures 13.48 us of CPU time
    per torch.nn.Linear forward on a DGX H100 (Xeon Platinum 8480C), 37.08 us on GB200 and
    33.17 us on GH200 (NVIDIA Grace): one benchmark, not applied as a per-system factor."""
    return (n_library * gemm_call_s + n_pointwise * pointwise_call_s) / (n_library + n_pointwise)


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
    attn_half_rows: Any = 0.0   # > 0: attention efficiency by query rows x keys per row
                                # (costs.compute.attention_efficiency's two-factor form): the
                                # query rows b (a/t) (s/c) at which the wave term halves it;
                                # 0 = the work form above (no change)
    attn_half_keys: Any = 0.0   # with attn_half_rows: keys per query row whose streaming
                                # costs what a forward query tile's fixed part costs
    attn_half_keys_bwd: Any = 0.0  # the same for the backward (per key tile: dK dV, dQ)
    mem_eff: Any = 0.85         # achieved / peak HBM bandwidth of memory-bound kernels
    kernel_s: Any = 4e-6        # GPU-side fixed time per kernel (launch, tail, sync)
    queued_kernel_s: Any = 3e-6  # the same for a kernel of one compiled program (XLA) whose
                                 # queue runs ahead of the GPU: dependent-kernel gap and tail
                                 # (costs.xla.kernel_fixed_s)
    host_kernel_s: Any = eager_launch_host_s()  # host time per eager launch, 12.90 us: the
                                # measured GEMM / pointwise call times, weighted by a dense
                                # layer's launches (eager_launch_host_s above)
    host_layer_s: Any = 5e-5    # host-side time per layer pass (framework hooks, checkpointing)
    host_recompute_s: Any = 5e-5  # host time of re-entering a checkpointed layer (RNG, graph)
    host_coll_peer_s: Any = 2e-6  # host/sync time per TP collective call per peer rank (t - 1)
    microbatch_s: Any = 0.0     # fixed time per micro-batch (data loading, schedule bookkeeping)
    step_s: Any = 5e-3          # fixed time per step (optimizer launch, logging, sync)
    floor_pnorm: Any = 6.0      # p of the p-norm smooth max between GPU time and host floor
    coll_base_s: Any = 15e-6    # fixed cost per collective call (launch + synchronisation)
    coll_eff_intra: Any = 0.80  # achieved / link bandwidth on the innermost tier (NCCL busbw)
    coll_eff_inter: Any = 0.80  # achieved / link bandwidth on the outer tiers
    overlap_slowdown: Any = 0.19  # compute slows by this fraction of the communication it hides:
                                  # 18.9 % average compute slowdown under overlapped
                                  # collectives on A100 / H100 / MI250 / MI210 (arXiv:2507.03114,
                                  # 2025, abstract); schedule.overlap.dp_hidden_slowdown_s
    mem_usable_frac: Any = 0.95   # fraction of HBM capacity usable by tensors (fragmentation)
    mem_reserved_bytes: Any = 1.5e9  # runtime workspace (CUDA context, cuBLAS, NCCL buffers)
    act_mem_factor: Any = 1.0     # framework's saved activations / the Korthikanti count


# Llama 3 405B pre-training (Dubey et al. 2024, "The Llama 3 Herd of Models", arXiv:2407.21783,
# section 3.3.4): 419 unexpected job interruptions in a 54-day snapshot on 16,384 H100 GPUs.
# Spread over the GPU-hours of that snapshot (all 16,384 GPUs for all 54 days, an upper bound
# on the GPU-hours, so a lower bound on the rate): 419 / (54 x 24 x 16,384) per GPU-hour.
LLAMA3_FAILURES_PER_DEVICE_HOUR = 419.0 / (54.0 * 24.0 * 16384.0)  # 1.973e-5


class Reliability(struct.PyTreeNode):
    """What failures cost a job: how often one device interrupts it, how fast its state is
    saved, how long it takes to train again (schedule.goodput; defaults: configs/README.md).

    Every field is a leaf, so `jax.grad` of the goodput gives what a better MTBF, faster
    storage or a faster restart is worth.
    """

    failure_rate_per_s: Any = LLAMA3_FAILURES_PER_DEVICE_HOUR / 3600.0
    # lambda: job-interrupting failures per device per second, all causes (GPU, HBM, host,
    # network, software) normalised per device, so a job of n devices fails at n lambda.
    # Default: Llama 3's 419 unexpected interruptions (above); the 47 planned ones (firmware
    # upgrades, operator changes) are announced and lose no work.
    storage_write_Bps: Any = 2e12
    # B: checkpoint write bandwidth of the storage, for the whole job (not per device).
    # Default: Llama 3's Tectonic file system, 2 TB/s sustained (7 TB/s peak), section 3.3.1.
    restart_s: Any = 600.0
    # R: from a failure to training again (detect, reschedule, relaunch, load the checkpoint).
    # ESTIMATE: 10 min, the restart time of Daly's (2006) worked examples; optimized
    # recovery systems report 20 s (TrainMover, 1024 GPUs) to 150 s (FlashRecovery, 4,800
    # devices), a relaunch by the scheduler takes minutes (configs/README.md).


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
    reliability: Reliability = Reliability()  # failures, checkpoints, restarts (goodput)
    matmul_fp8_flops_per_s: Any = 0.0  # dense FP8 (E4M3 / E5M2) tensor-core peak; 0: the
                                       # device has no FP8 tensor cores (A100, MI250, TPU v5p)
    matmul_fp4_flops_per_s: Any = 0.0  # dense FP4 (E2M1, block-scaled NVFP4 / MXFP4) peak;
                                       # 0: none. Non-zero also marks block-scaled tensor
                                       # cores (Blackwell's MX / NVFP4 MMA), which MXFP8 needs
    # Published large-GEMM throughput / datasheet peak of THIS GPU per precision (cuBLAS /
    # CUTLASS benchmarks, configs/systems sources); 0: not measured, the GPU sustains its peak
    # as the reference generation does (costs.compute.sustained_scale, REFERENCE_GEMM_FRAC).
    matmul_sustained_frac: Any = 0.0      # 16-bit GEMMs
    matmul_fp8_sustained_frac: Any = 0.0  # FP8 GEMMs
    matmul_fp4_sustained_frac: Any = 0.0  # FP4 GEMMs
    # Published long-sequence throughput of FlashAttention-2 on THIS GPU / its 16-bit peak,
    # forward and backward (costs.compute.attention_kernel_factor; runs with
    # Training.attention_fa2 = 1). 0: not measured, or FA2 is the kernel the efficiency set's
    # attention curve describes on this GPU (A100): no change. Hopper: FA2 has no WGMMA / TMA
    # and plateaus near a third of the peak (FlashAttention-3 paper, configs/systems sources)
    attn_fa2_fwd_frac: Any = 0.0
    attn_fa2_bwd_frac: Any = 0.0
    # FlashAttention-2's own fall-off with work on THIS GPU: rate = c_pass / (1 + (F_half /
    # F)^gamma), F = the attention forward's matmul FLOPs (costs.compute.attention_kernel_factor),
    # from the same paper's bars at shorter sequences. 0 (F_half): the set's fall-off.
    attn_fa2_half_flop: Any = 0.0
    attn_fa2_exponent: Any = 1.0
    # Exponentials per second of the special-function units (MUFU.EX2) of THIS GPU: a floor
    # on the fused attention kernel, one exponential per computed score element per pass
    # (costs.compute.attention_exp_floor_s). 0: no published rate, no floor (no change)
    sfu_exp_per_s: Any = 0.0
    # Seconds per query row (b heads s) that the learned-sink gradient adds to THIS GPU's
    # fused attention backward (cuDNN's SDPA with `set_dsink_token`, what Transformer Engine
    # runs for softmax_type = "learnable"): costs.compute.attention_sink_backward_s, read only
    # for a model with attention_sinks. 0: not measured (no change)
    attn_sink_bwd_row_s: Any = 0.0
    # Streaming multiprocessors of THIS GPU (CUDA's multiProcessorCount, from its whitepaper /
    # a device query: configs/systems sources), which Transformer Engine divides between a
    # userbuffers comm kernel and the GEMM beside it (tp_userbuffers = 2: predict.
    # _tp_userbuffers_parts' SM margin). 0: unknown (tp_userbuffers = 2 refused)
    gpu_sms: Any = 0.0
    # 1: THIS GPU's FP8 GEMMs take every operand layout, not only TN (Transformer Engine
    # `nvte_is_non_tn_fp8_gemm_supported()`, common/transformer_engine.cpp v2.7-v2.16: compute
    # capability 10.x-11.x or >= 13.0, i.e. Blackwell B200 / GB200 sm100, B300 / GB300 sm103), so
    # a per-tensor FP8 tensor keeps one data buffer for its row- and column-wise usages
    # (workload.flops.te_quantize_rows, read under Training.lowp_te_quantizer). 0: Hopper /
    # unknown, a transposed FP8 copy per column-wise usage (no change)
    fp8_non_tn_gemm: Any = 0.0
    name: str = struct.field(pytree_node=False, default="system")
    gpu: str = struct.field(pytree_node=False, default="")  # GPU generation ('a100', 'h100',
    # ...; '' unknown): picks the shipped default efficiency set (diffperf.trust)


# System leaves that are switches (0 or 1, the YAML's `true` / `false`: load._flag; checked 0/1
# by specs.validate.check_system): a switch has no derivative, so `sensitivity` lists no
# elasticity for it and a sweep takes only 0 and 1. The cost functions still read it as a
# number (a factor 0 or 1), so jax.grad gives it a value: one without a meaning, as
# theta e^{+-h} is not a value the switch takes. tests/test_errors.py checks that this tuple
# holds every System key that the loader reads as a flag.
SWITCHES = ("fp8_non_tn_gemm",)
