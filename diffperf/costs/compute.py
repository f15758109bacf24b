"""GPU time of a layer's and of the output layer's operations on one device.

Each op: roofline (costs.roofline) with a shape-dependent efficiency, plus a fixed time per
kernel. Source: PAPERS.md sections 3.2 (NERSC: 20 us per op, 0.8 efficiency) [C] and 5.10.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from diffperf.costs.xla import kernel_fixed_s
from diffperf.costs.roofline import (alignment_factor, gemm_size, roofline_time_s,
                                     saturating_efficiency)
from diffperf.costs.smooth import smax
from diffperf.workload.flops import (lowp_pass_fracs, lowp_quantize_bytes,
                                     lowp_quantize_kernels, quantized_elem_bytes)


# Large-GEMM throughput / datasheet peak of the generation the shipped matmul efficiency
# (Efficiency.mm_max 0.8, the NERSC default; the fitted H100 sets) describes: H100 SXM, cuBLAS
# BF16 8192^3 at 797.5 TFLOP/s of 989.4 (zzc0721/torch-performance-test-data issue #79,
# PyTorch 2.7 / CUDA 12.8) = 0.806. A100 (PAPERS.md 3.2: ~0.8 of 312) is the same fraction.
REFERENCE_GEMM_FRAC = 797.5 / 989.4


def sustained_scale(measured_frac):
    """Sustained tensor-core rate of a GPU as a multiple of its datasheet peak, relative to
    the reference generation whose fraction the efficiencies (mm_max) already hold:

        s = f / f_ref   (f > 0: a published large-GEMM measurement of this GPU),   1 otherwise
    f = measured TFLOP/s of the largest GEMMs / datasheet peak of that precision (System.
    matmul_*_sustained_frac, configs/systems), f_ref = REFERENCE_GEMM_FRAC (H100 BF16, 0.806).
    Why: datasheet peaks are the boost-clock rate; how much of it a GPU sustains under its
    power cap and with its kernels differs by generation and precision (B200 at 1000 W: BF16
    1512.8 of 2250 = 0.672, FP8 2544.7 of 4500 = 0.566; configs/systems/dgx-b200.yaml), and a
    shape efficiency fitted on H100 does not know it. Example: f = 0.566 -> s = 0.702.
    """
    f = jnp.asarray(measured_frac)
    measured = f > 0
    # double where: the unmeasured branch must give no NaN or infinite gradient
    return jnp.where(measured, jnp.where(measured, f, REFERENCE_GEMM_FRAC) / REFERENCE_GEMM_FRAC,
                     1.0)


def matmul_peak(system, training):
    """F_peak of the precision the matmuls run in (16-bit tensor cores, or TF32/fp32): the
    datasheet figure, the denominator of MFU."""
    return jnp.where(training.matmul_fp32 > 0, system.matmul_fp32_flops_per_s,
                     system.matmul_flops_per_s)


def matmul_rate(system, training):
    """F of the matmuls' roofline: `matmul_peak` x `sustained_scale` of the 16-bit
    measurement (TF32 / fp32 matmuls: no measurement, scale 1)."""
    s = sustained_scale(system.matmul_sustained_frac)
    return matmul_peak(system, training) * jnp.where(training.matmul_fp32 > 0, 1.0, s)


def lowp_peak(system, training):
    """F_peak of the low-precision GEMMs: the dense FP4 peak when training.lowp_fp4 (NVFP4),
    else the dense FP8 peak (System.matmul_fp8_flops_per_s / matmul_fp4_flops_per_s, from
    the datasheets, configs/systems). A device without that peak (0: no FP8 / FP4 tensor
    cores) falls back to the 16-bit peak here so that every time stays finite under tracing;
    `specs.validate.check_precision` refuses such a run before it gets here.
    """
    lp = jnp.where(training.lowp_fp4 > 0, system.matmul_fp4_flops_per_s,
                   system.matmul_fp8_flops_per_s)
    return jnp.where(lp > 0, lp, matmul_peak(system, training))


def lowp_rate(system, training):
    """F of the low-precision GEMMs' roofline: `lowp_peak` x `sustained_scale` of the
    published FP4 (training.lowp_fp4) or FP8 large-GEMM measurement; `matmul_rate` on a
    device without that peak (refused before it gets here, see `lowp_peak`)."""
    lp = jnp.where(training.lowp_fp4 > 0, system.matmul_fp4_flops_per_s,
                   system.matmul_fp8_flops_per_s)
    s = jnp.where(training.lowp_fp4 > 0, sustained_scale(system.matmul_fp4_sustained_frac),
                  sustained_scale(system.matmul_fp8_sustained_frac))
    return jnp.where(lp > 0, lp * s, matmul_rate(system, training))


def lowp_gemm_times_s(gemms, system, training, eff_max, half_dim, temperature=None):
    """Per-GEMM  count x roofline time with both inputs quantized (one per row), as
    `gemm_times_s` but

        t = roofline(2 m n k, e_q (m k + k n) + q m n;  F_lp, eta(d))
    F_lp = `lowp_rate` (the FP8 or FP4 peak x its `sustained_scale`), eta the same shape
    efficiency as the 16-bit GEMM (the same tile and wave quantization),
    e_q = `workload.flops.quantized_elem_bytes` per input element, q =
    training.activation_bytes per output element (TE's FP8 GEMMs write BF16).
    Example: an 8192^3 FP8 GEMM on an H100 SXM (1978.9 TFLOP/s dense FP8), eta = 0.8 x
    1 / (1 + (64 / 8192)^1.5) = 0.79945: 2 x 8192^3 / (1978.9e12 x 0.79945) = 0.695 ms
    (1.390 ms in BF16 at 989.4 TFLOP/s).
    Source: Transformer Engine user guide, FP8 primer (the FP8 tensor-core GEMM at twice the
    BF16 rate on Hopper); NVIDIA datasheets for the peaks (configs/systems) [B].
    """
    m, n, k = (jnp.maximum(x, 1.0) for x in (gemms.m, gemms.n, gemms.k))
    eff = saturating_efficiency(gemm_size(m, n, k), eff_max, half_dim, system.eff.mm_exponent)
    eff = eff * alignment_factor(gemms.n, gemms.k, training.activation_bytes,
                                 system.eff.mm_align_exponent)
    flops = 2.0 * m * n * k
    bytes_moved = quantized_elem_bytes(training) * (m * k + k * n) + (
        training.activation_bytes * m * n)
    each = roofline_time_s(flops, bytes_moved, lowp_rate(system, training), eff,
                           system.hbm_bandwidth_Bps, system.eff.mem_eff, temperature)
    return gemms.count * each


def layer_pass_gemm_times_s(ops, system, training, temperature=None, lowp=True, rows=None):
    """(fprop, dgrad, wgrad) times of a layer's dense GEMMs, one per row, one micro-batch:

        t_pass[r] = t16[r] + l_pass[r] (t_lp[r] - t16[r])
    t16 = `gemm_times_s` (16-bit), t_lp = `lowp_gemm_times_s`, l_pass =
    `workload.flops.lowp_pass_fracs` (0 for every row in the 16-bit presets, so each pass is
    exactly t16: the backward's dgrad + wgrad = 2 x forward, as before). dgrad (dY W) and
    wgrad (X^T dY) have the forward's FLOPs and are timed at its shape (PAPERS.md 5.1).
    lowp=False (static): the caller knows every l_pass is 0 (`predict.features_of`, feature
    'lowp'); t_lp is not computed (see `_gemm_rows_and_lowp_gain`). rows (static): the
    [start, stop) blocks of rows whose count can be non-zero (`workload.flops.
    DENSE_ROW_BLOCKS`); the others are 0 without being timed (None: every row is timed).
    """
    t16, diff = _gemm_rows_and_lowp_gain(ops, system, training, temperature, lowp, rows)
    return tuple(t16 + frac * diff for frac in lowp_pass_fracs(training))


def _take_rows(gemms, rows):
    """The rows of a Gemms table (rows on axis 0) in the [start, stop) blocks `rows`."""
    return jax.tree.map(lambda x: jnp.concatenate([x[a:b] for a, b in rows]), gemms)


def _put_rows(times, rows, n):
    """Per-row times of the blocks `rows` (`_take_rows`) back at their places among n rows,
    exact zeros elsewhere."""
    out, at, pos = [], 0, 0
    for a, b in rows:
        if a > pos:
            out.append(jnp.zeros((a - pos,) + times.shape[1:], times.dtype))
        out.append(times[at:at + b - a])
        at, pos = at + b - a, b
    if n > pos:
        out.append(jnp.zeros((n - pos,) + times.shape[1:], times.dtype))
    return jnp.concatenate(out)


def _gemm_rows_and_lowp_gain(ops, system, training, temperature=None, lowp=True, rows=None):
    """(t16, t_lp - t16): a layer's 16-bit dense GEMM times and the change each row takes
    when it runs in low precision (one per row, one micro-batch). lowp=False (static: every
    row's low-precision fraction is 0, so the change is multiplied by an exact 0): the change
    is taken as 0 instead of computed, the same sums bit for bit (t16 + 0 x finite = t16 +
    0) and a smaller program (the low-precision GEMM rows were ~40 % of a calibration step on
    the 16-bit vTrain runs). rows: the blocks of rows timed (`layer_pass_gemm_times_s`); a
    row left out has a count of exactly 0, so its time is the same exact 0 (count x finite)
    and the other two thirds of the rows of a dense model without MLA are not computed."""
    e = system.eff
    dense = ops.dense if rows is None else _take_rows(ops.dense, rows)
    t16 = gemm_times_s(dense, system, training, e.mm_max, e.mm_half_dim, temperature)
    if lowp:
        tlp = lowp_gemm_times_s(dense, system, training, e.mm_max, e.mm_half_dim, temperature)
        diff = tlp - t16
    else:
        diff = jnp.zeros_like(t16)
    if rows is not None:
        n = ops.dense.count.shape[0]
        t16, diff = _put_rows(t16, rows, n), _put_rows(diff, rows, n)
    return t16, diff


def layer_dense_times_s(ops, system, training, temperature=None, lowp=True, rows=None):
    """(forward, backward) dense GEMM seconds of a layer, one micro-batch:

        t_f = sum_r t16[r] + sum_r l_f[r] dt[r]
        t_b = 2 sum_r t16[r] + sum_r (l_d[r] + l_w[r]) dt[r]
    dt = t_lp - t16 (`layer_pass_gemm_times_s`'s terms, summed). Written so that the 16-bit
    presets (every l = 0) compute exactly sum t16 and 2 sum t16, the forward and backward of
    the 16-bit model, bit for bit (adding an exact 0 to one reduction). lowp, rows: as in
    `layer_pass_gemm_times_s`.
    """
    t16, diff = _gemm_rows_and_lowp_gain(ops, system, training, temperature, lowp, rows)
    f, d, w = lowp_pass_fracs(training)
    base = jnp.sum(t16)
    return base + jnp.sum(f * diff), 2.0 * base + jnp.sum((d + w) * diff)


def gemms_time_s(gemms, system, training, eff_max, half_dim, temperature=None):
    """Sum over GEMMs of  count x roofline(2 m n k, q (m k + k n + m n)),
    efficiency eta(d) = phi_align(n, k) eff_max / (1 + (d_half / d)^gamma),
    d = soft-min(m, n, k), phi_align the leading-dimension alignment factor
    (`roofline.alignment_factor`, 1 for dimensions that are multiples of 16 bytes)."""
    return jnp.sum(gemm_times_s(gemms, system, training, eff_max, half_dim, temperature))


def gemm_times_s(gemms, system, training, eff_max, half_dim, temperature=None):
    """Per-GEMM  count x roofline time (the terms `gemms_time_s` sums), one per row."""
    q = training.activation_bytes
    # Unused op kinds (MoE rows of a dense model) have zero dimensions: clamp to 1 so that
    # the efficiency stays finite; their count of 0 removes them from the sum.
    m, n, k = (jnp.maximum(x, 1.0) for x in (gemms.m, gemms.n, gemms.k))
    eff = saturating_efficiency(gemm_size(m, n, k), eff_max, half_dim, system.eff.mm_exponent)
    eff = eff * alignment_factor(gemms.n, gemms.k, q, system.eff.mm_align_exponent)
    flops = 2.0 * m * n * k
    bytes_moved = q * (m * k + k * n + m * n)
    each = roofline_time_s(flops, bytes_moved, matmul_rate(system, training), eff,
                           system.hbm_bandwidth_Bps, system.eff.mem_eff, temperature)
    return gemms.count * each


def attention_efficiency(work, head_dim, eff, rows=None, backward=False):
    """Flash-attention efficiency (of the matmul peak) by work and head size:

        eta = eta_max / [ (1 + (W_half / W)^gamma) (1 + d_half / d_h) ]

    W = b (a/t) s_q s_kv kappa score elements: the kernel tiles the score matrix over the SMs,
    so too little work leaves SMs idle (wave quantization, like small GEMMs); a small head_dim
    is a small inner dimension of both matmuls. Fitted to the H100 flash-attention kernels
    (data/kernels/h100_attention.csv): ~440 TFLOP/s at d_h 64 and ~550 at 128 for long
    sequences, ~20-80 TFLOP/s at b a s^2 ~ 1e7 [D].

    Two-factor form, when `rows` R = b (a/t)(s/c) query rows are given and
    eff.attn_half_rows > 0 (default 0: the form above, unchanged):

        eta = eta_max / [ (1 + R_half / R) (1 + d_half / d_h) ]  x  kv / (kv + k_pass)
    kv = W / R keys per query row (s_kv kappa), k_pass = eff.attn_half_keys (forward) or
    attn_half_keys_bwd (`backward`). W = R kv conflates the kernel's parallelism (R / B_r
    query tiles over the SMs: a wave term, exponent 1, so one partial wave costs one tile's
    time) with its loop length: each query tile loads Q_i, streams its kv keys and writes O_i
    (FlashAttention-2, Dao 2023, arXiv:2307.08691, section 3.1, Algorithms 1 and 2; the
    backward per key tile writes dK_j dV_j, accumulates dQ), t_tile = n_kv t_kv + t_0, so the
    rate is kv / (kv + k) with k = (t_0 / t_kv) B_c. A 128-key window (kv ~252 at attn_tile
    128) pays the fixed part on few keys, a full causal layer (kv ~s/2) amortises it. Fitted
    on this project's 154 H100 cuDNN kernels (calibration/attn_keys.py --fit-on all-host,
    docs/accuracy-gptoss.md "Session 15: attention by keys per query row"): eta_max 0.893,
    R_half 33,490, d_half 47.0, k 253 / 648 keys; not set in any shipped set yet.
    Example: R = 262,144, kv = 252, d_h = 64 at those constants: 0.893 / (1.12775 x
    1.73438) x 252 / 505 = 0.22783 forward, x 252 / 900 instead: 0.12784 backward.
    Turning it on: an efficiency overlay's keys attn_half_rows, attn_half_keys,
    attn_half_keys_bwd (counts, >= 0: load.efficiency_from_dict, specs.validate). `calibrate`
    does NOT fit them (not in calibrate.STEP_FIELDS; its h100_attention bench passes rows but
    has no per-eager-call host time, which the fit above needed: t_h 43 us); at attn_half_rows
    = 0 the gradient with respect to all three is exactly 0 (the where), so a fit would have to
    start above 0. kv is the keys per row of ONE kernel over the whole s_kv: under ring context
    parallelism (cp_ring 1) Transformer Engine runs c kernels per layer, each over one K/V chunk
    (<= s / c keys per row: TE context_parallel.py, AttnFuncWithCPAndKVP2P, one fused_attn_fwd
    per ring step), so the form overstates kv / (kv + k) there (the all-to-all form,
    a / (t c) heads of all s rows, has the same R and kv as priced).
    """
    head = 1.0 + eff.attn_half_head_dim / head_dim
    wave_w = (eff.attn_half_work / work) ** eff.attn_exponent
    if rows is None:
        return eff.attn_max / ((1.0 + wave_w) * head)
    # One expression for both forms, switched term by term (not two whole forms under one
    # where, whose backward carries both: compile time). Off: the wave term is the work
    # form's and k = 0, so kv / (kv + k) = kv / kv = 1 exactly: bit-identical to the work
    # form. Double where: r_half = 1 off, so the unused branch has no NaN or infinite
    # gradient.
    on = eff.attn_half_rows > 0
    r_half = jnp.where(on, eff.attn_half_rows, 1.0)
    rows = jnp.maximum(rows, 1.0)
    kv = work / rows
    k = jnp.where(on, eff.attn_half_keys_bwd if backward else eff.attn_half_keys, 0.0)
    wave = jnp.where(on, r_half / rows, wave_w)
    return eff.attn_max / ((1.0 + wave) * head) * (kv / (kv + k))


def attention_kernel_factor(head_dim, system, training, backward=False, work=None, rows=None):
    """Factor on the attention efficiency for the kernel the run ran (1: the set's kernel):

        r = min(1, c_pass / eta_inf(d_h)),   eta_inf(d_h) = eta_max / (1 + d_half / d_h)
    when training.attention_fa2 = 1 and the GPU has a published FlashAttention-2 rate
    c_pass > 0 (System.attn_fa2_fwd_frac, attn_fa2_bwd_frac for the backward), else 1.
    eta_inf is the long-sequence plateau of the set's curve (`attention_efficiency` at
    W -> inf), so  eta_attn r  keeps the set's fall-off with work (wave quantization of the
    score tiles, the same grid) and plateaus at c_pass of the peak at every head size.
    Why: FlashAttention-2 issues Ampere's warp-level mma.sync and synchronous loads; on
    Hopper the full tensor rate needs WGMMA and TMA (FlashAttention-3, Shah et al. 2024,
    arXiv:2407.08608, sections 1 and 3), so FA2 plateaus near a third of the H100's peak at
    every head size (its Figs. 5 and 6, H100 SXM5 BF16, sequence 16k: FA2 forward 299 /
    335 / 298 TFLOP/s causal and 324 / 370 / 326 non-causal at d_h 64 / 128 / 256, backward
    322 at d_h 128), while cuDNN / FA3 reach 539 / 616 (causal) and 595 / 648 forward,
    516 / 561 backward at d_h 128. The set's curve on
    H100 was measured with cuDNN (PyTorch 2.11, cuDNN 9.19; data/kernels/h100_attention.csv).
    Example: H100 set (eta_max 0.7833, d_half 49.83), d_h 128: eta_inf = 0.5638; FA2
    forward c = 335 / 989.4 = 0.3386 -> r = 0.6005 (the paper's FA2 / cuDNN ratio at 16k:
    335 / 539 = 0.622).

    FA2's own fall-off (System.attn_fa2_half_flop F_f > 0 and `work` W = score elements
    given): FA2 does not fall off with work as the set's cuDNN curve does, so
        eta_attn r = min(eta_inf, c_pass) / (1 + (F_f / F)^gamma_f),   F = 4 W d_h
        r = min(eta_inf, c_pass) / [ (1 + (F_f / F)^gamma_f) eta_attn(W, d_h) ]
    F = the forward's matmul FLOPs (QK^T and PV), gamma_f = System.attn_fa2_exponent. FLOPs,
    not score elements: the FA3 paper's FA2 bars fall off alike with s at head dims 64 /
    128 / 256 (32 / 16 / 8 heads, the same FLOPs; score elements 4x apart). F_f, gamma_f by
    closed form from two bars of the FA3 paper's Fig. 5(d) (FA2 forward, causal, head dim
    128, 16 heads, b s = 16k: F = 16384 / s x 16 x s^2 x 0.5 x 512), with c = 335 / 989.4
    the 16k plateau: y_i = c_TF / TF_i - 1,
        gamma_f = ln(y_1 / y_2) / ln(F_2 / F_1),   F_f = F_1 y_1^(1 / gamma_f);
    s = 512: 191 TFLOP/s, F_1 = 3.4360e10, y_1 = 0.75393; s = 2k: 298, F_2 = 1.3744e11,
    y_2 = 0.12416 -> gamma_f = 1.3011, F_f = 2.7655e10 (configs/systems/h100-sxm-80gb.yaml).
    The backward takes the same shape at its own plateau (Fig. 6's per-length FA2 bars
    were not read). Without F_f (0) or `work`: the set's fall-off, as above.
    Example: H100, s = 1k causal of the paper (F = 6.8719e10): 335 / (1 + (2.7655e10 /
    6.8719e10)^1.3011) = 256.5 TFLOP/s (paper: 260).
    """
    e = system.eff
    c = system.attn_fa2_bwd_frac if backward else system.attn_fa2_fwd_frac
    plateau = e.attn_max / (1.0 + e.attn_half_head_dim / head_dim)
    on = (training.attention_fa2 > 0) & (c > 0)
    # double where: the unmeasured branch must give no NaN or infinite gradient
    c_on = jnp.where(on, c, 1.0)
    r = jnp.where(on, jnp.minimum(1.0, c_on / plateau), 1.0)
    if work is None:
        return r
    own = on & (system.attn_fa2_half_flop > 0)
    f_f = jnp.where(own, system.attn_fa2_half_flop, 1.0)
    flops = 4.0 * work * head_dim
    fa2_eta = jnp.minimum(plateau, c_on) / (1.0 + (f_f / flops) ** system.attn_fa2_exponent)
    return jnp.where(own, fa2_eta / attention_efficiency(work, head_dim, e, rows, backward), r)


# Work of the flash-attention backward per unit of forward work: 2 x (dQ, dK, dV GEMMs)
# + 0.5 x (the recomputed scores QK^T); predict._layer_parts scales `attention_time_s(...,
# backward=True)` by it (FlashAttention-2 paper, Dao 2023, arXiv:2307.08691, section 3.1).
FLASH_BACKWARD_WORK = 2.5


def attention_sink_backward_s(rows, sinks, system, training):
    """Time the learned-sink gradient adds to one layer's fused attention backward:

        t_sink = phi_flash x sinks x R x tau_row
    R = b (a / t) (s / c) query rows (`workload.flops.query_rows`), sinks = Model.
    attention_sinks (1: one learned logit per head in the softmax denominator, GPT-OSS),
    tau_row = System.attn_sink_bwd_row_s (0 where not measured: no change), phi_flash =
    Training.flash_attention (the unfused path's sink column is elementwise work instead).
    Added once to the backward (the forward's sink is one more logit per row: the
    measurement shows no forward cost), beside the 2.5 x forward work of the backward kernel.

    Source: cuDNN's SDPA graph with `set_sink_token` / `set_dsink_token` (Transformer Engine
    `fused_attn_f16_arbitrary_seqlen.cu` v2.9-v2.16, the kernel the Megatron-Bridge GPT-OSS
    rows run; cudnn-frontend notes that the sink gradient is accumulated non-deterministically,
    i.e. by atomics into the h per-head sums), measured on one H100 SXM (cuDNN 9.19.0,
    data/kernels/h100_gptoss_attention.csv, `calibration/device_h100_attention.py`): backward
    with the sink minus without, 64 query / 8 KV heads of 64, bf16: 0.385 / 0.395 ms (window 128
    / full causal, b 1 s 4096, R = 262,144), 1.747 / 1.567 ms (b 4 s 4096) and 1.751 / 1.373 ms
    (b 2 s 8192, R = 1,048,576 each): linear in R, not in the scores (a window layer pays as
    much as a full one), 1.31-1.67 ns per row, mean 1.52 ns (configs/systems/h100-sxm-80gb.yaml).
    Example: GPT-OSS on one H100 (b 1, s 4096, t 1): R = 64 x 4096 = 262,144, t_sink = 262,144
    x 1.52 ns = 0.398 ms per layer backward (its flash price, attn_tile = 128: 0.86 ms full,
    0.23 ms window).

    Per head (R divided by t): the same graphs at 64 / 32 / 16 / 8 query heads (8 / 4 / 2 / 1
    KV heads, GPT-OSS at t = 1, 2, 4, 8; data/kernels/h100_sink_heads.csv, calibration/
    device_h100_sink_heads.py) cost 1.47-1.73 ns per b h s row (means 1.53 / 1.58 / 1.61 /
    1.67 ns by head count: within 15 % of tau_row), while per b s they fall ~7x from 64 to 8
    heads (docs/accuracy-gptoss.md, "Review of the sink term"). With CP,
    Transformer Engine 2.9-2.16 run sinks only in the all-to-all form (context_parallel.py,
    attn_forward_func_with_cp: non-vanilla softmax needs cp_comm_type "a2a"), a / (t c) heads
    of all s rows per rank: the same R; diffperf's CP forms (ring, all-gather) are not it."""
    return training.flash_attention * sinks * rows * system.attn_sink_bwd_row_s


def attention_exp_floor_s(score_elements, system, backward=False):
    """Floor of the fused attention kernel set by its exponentials, seconds per pass, in
    units of the forward work (as `attention_time_s` returns it):

        t_exp = N_exp / R_exp                       forward  (softmax: exp of every score)
        t_exp = N_exp / (R_exp x 2.5)               backward (the caller scales by 2.5)
    N_exp = b (a/t) (s/c) s kappa = the score elements the kernel computes (`count m n` of
    the QK^T row: causal half, sliding-window tiles under attn_tile, per head); the forward
    takes one exponential per element (P = exp(S - m)), the backward one more (it recomputes
    P from S and the saved log-sum-exp; FlashAttention-2 paper, Algorithm 2), so both passes
    take N_exp exponentials while the backward does 2.5x the forward's tensor work.
    R_exp = System.sfu_exp_per_s (MUFU.EX2 results per second); 0: no floor (returns 0).
    Why a floor: the special-function units run beside the tensor cores, far slower:
    FlashAttention-3 (Shah et al. 2024, arXiv:2407.08608, section 3): "the H100 SXM5 GPU has
    989 TFLOPS of FP16 matmul but only 3.9 TFLOPS of special functions"; FlashAttention-4
    (Zadouri, Hoehnerbach, Shah, Liu, Thakkar, Dao 2026, arXiv:2603.05451): B200 MMA 8192
    FLOP/clock/SM but MUFU 16 exp/clock/SM, so a 128 x 128 tile at d_h 128 takes as long in
    exponentials (1024 clocks) as in its forward GEMMs (4 x 128^2 x 128 / 8192), twice as
    long at d_h 64. Blackwell Ultra doubles the MUFU rate (NVIDIA technical blog "Inside
    NVIDIA Blackwell Ultra", 2025: 10.7 TeraExponentials/s vs 5 for Blackwell).
    Example: B200 (R_exp 4.5e12), one layer of Llama 3 8B at b 1, s 8192, causal (kappa
    0.5), 32 heads: N_exp = 32 x 8192^2 x 0.5 = 1.0737e9 -> t_exp = 0.2386 ms forward.
    """
    r = system.sfu_exp_per_s
    on = r > 0
    per_pass = jnp.where(backward, FLASH_BACKWARD_WORK, 1.0)
    # double where: no rate must give no NaN or infinite gradient
    return jnp.where(on, score_elements / (jnp.where(on, r, 1.0) * per_pass), 0.0)


def attention_time_s(attention, system, training, io_bytes, temperature=None,
                     backward=False, rows=None):
    """Attention core forward (QK^T and AV of `attention` Gemms, rows 0 and 1).

    Flash attention: one fused kernel,
        t = max( sum 2 m n k count / (F_peak eta_attn r),  io_bytes / (BW_hbm eta_mem),
                 t_exp )
    r = `attention_kernel_factor` (1 unless the run ran FlashAttention-2 on a GPU with a
    published FA2 rate; `backward=True`: at the backward's rate, the forward's FLOPs and
    bytes, which the caller scales by the backward's 2.5x work). t_exp =
    `attention_exp_floor_s` (0 on a GPU without a published exponential rate): a max, not a
    sum, because the kernels overlap the exponentials of one tile with the GEMMs of another
    (FlashAttention-3 section 3.1: ping-pong scheduling of two warpgroups and intra-warpgroup
    softmax / GEMM pipelining; FlashAttention-4 and cuDNN on Blackwell: softmax warpgroups
    beside an asynchronous tcgen05 MMA warp), so the slower unit sets the time.
    Unfused (flash_attention = 0): two batched GEMMs at the GEMM-shape efficiency; the
    materialised scores' traffic is in the layer's elementwise bytes (its softmax is a
    memory-bound kernel there, no floor here).
    """
    e = system.eff
    work = jnp.maximum(attention.count[0] * attention.m[0] * attention.n[0], 1.0)
    eta = attention_efficiency(work, attention.k[0], e, rows, backward) * \
        attention_kernel_factor(attention.k[0], system, training, backward, work, rows)
    flops = jnp.sum(attention.flops)
    fused = roofline_time_s(flops, io_bytes, matmul_rate(system, training), eta,
                            system.hbm_bandwidth_Bps, e.mem_eff, temperature)
    fused = smax(fused, attention_exp_floor_s(work, system, backward), temperature)
    unfused = gemms_time_s(attention, system, training, e.mm_max, e.mm_half_dim, temperature)
    flash = training.flash_attention
    return flash * fused + (1.0 - flash) * unfused


def attention_by_kind_time_s(kinds, system, training, io_bytes, temperature=None,
                             backward=False, rows=None):
    """Attention core forward of the mean layer when full and sliding-window layers are
    separate kernels (training.attn_tile > 0; `workload.flops.attention_by_kind`):

        t = (1 - f_win) t_attn(full) + f_win t_attn(window)
    t_attn = `attention_time_s` of each layer's own score tiles, so that each kernel runs at
    the efficiency of its own work (a window layer's few tiles per row block run at the
    lower efficiency of a small kernel) and each reads Q, K, V and writes O (io_bytes).
    Example: GPT-OSS on one H100 (b 1, s 4096, 64 heads of 64, B 128): the full layer's
    137.9 GFLOP and the window layer's 16.4 GFLOP forward; see tests/test_golden.py.
    `backward=True`: each kernel at the backward's rate (`attention_time_s`).
    """
    full, window, f_win = kinds
    t_full = attention_time_s(full, system, training, io_bytes, temperature, backward, rows)
    t_win = attention_time_s(window, system, training, io_bytes, temperature, backward, rows)
    return (1.0 - f_win) * t_full + f_win * t_win


def memory_time_s(bytes_moved, system):
    """Memory-bound op: bytes / (BW_hbm eta_mem)."""
    return bytes_moved / (system.hbm_bandwidth_Bps * system.eff.mem_eff)


def layer_times_s(ops, system, training, attn_io_bytes, temperature=None, rows=None):
    """(dense GEMMs one per row, attention core, memory-bound + vector + kernel fixed)
    forward times of one layer, one micro-batch; the dense time is the sum of the rows
    (`gemm_times_s`: rows are kept for the callers that weigh them, e.g. XLA's remat).
    Attention uses its own efficiency (`attention_efficiency`) and is at least its Q/K/V/O
    traffic time."""
    e = system.eff
    dense = gemm_times_s(ops.dense, system, training, e.mm_max, e.mm_half_dim, temperature)
    attn = attention_time_s(ops.attention, system, training, attn_io_bytes, temperature,
                            rows=rows)
    other = (memory_time_s(ops.elementwise_bytes, system)
             + ops.vector_flops / system.vector_flops_per_s
             + ops.n_kernels * kernel_fixed_s(system, training))
    return dense, attn, other


def lowp_quantize_times_s(dense, system, training, n_microbatches, te_rows=None):
    """(forward, backward) seconds of a layer's quantization kernels, one micro-batch:

        t_f = [B_X + B_W / m_w] / (BW_hbm eta_mem) + (K_X + K_W / m_w) t_k
        t_b = B_dY / (BW_hbm eta_mem) + K_dY t_k
    B_X, B_dY, B_W = `workload.flops.lowp_quantize_bytes` (inputs, output gradients, weights),
    K = `lowp_quantize_kernels`, t_k = the fixed time per kernel (`costs.xla.kernel_fixed_s`),
    te_rows = `workload.flops.te_quantize_rows` (Transformer Engine's per-row counts; None: 0),
    m_w = m micro-batches when the quantized weights are cached for the step
    (training.lowp_weight_cache = 1: TE casts them in the first micro-batch, here spread
    over the m), 1 otherwise. Memory-bound kernels (cast, cast-transpose, amax): PAPERS.md
    5.2, intensity << 1 FLOP/B. Both 0 for the 16-bit presets.
    Example: fp8-current, one 8192 x 8192 BF16 input quantized row- and column-wise:
    402.7 MB / (3350 GB/s x 0.85) = 0.1414 ms on an H100 SXM.
    """
    fwd, bwd, wts = lowp_quantize_bytes(dense, training, te_rows)
    k_f, k_b, k_w = lowp_quantize_kernels(dense, training, te_rows)
    per_step = jnp.where(training.lowp_weight_cache > 0, 1.0 / n_microbatches, 1.0)
    k_s = kernel_fixed_s(system, training)
    return (memory_time_s(fwd + per_step * wts, system) + (k_f + per_step * k_w) * k_s,
            memory_time_s(bwd, system) + k_b * k_s)
