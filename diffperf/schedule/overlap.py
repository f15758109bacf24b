"""Which communication hides behind which computation, and how much stays exposed.

Exposed = max(0, C - K) per overlap window (PAPERS.md section 1.1); hidden = C - exposed.
"""

from __future__ import annotations

import jax.numpy as jnp

from diffperf.costs.smooth import exposed, pnorm_max, smax
from diffperf.specs.parallel import UB_PIPE_COMM_SMS


def split_exposed(comm_s, window_s, temperature=None):
    """(exposed, hidden) seconds of `comm_s` overlapped with a `window_s` compute window."""
    e = exposed(comm_s, window_s, temperature)
    return e, comm_s - e


def zero3_layer_exposed_s(gather_s, reduce_s, fwd_window_s, bwd_window_s, prefetch_frac,
                          gathers_bwd, overlap, temperature=None):
    """(forward exposed, forward hidden, backward exposed, backward hidden) of one layer's
    ZeRO-3 / FSDP collectives in one micro-batch:

        forward:  C_f = AG                      exposed_f = max(C_f - o K_f, (1 - f) C_f)
        backward: C_b = g_b AG + RS             exposed_b = max(C_b - o K_b, (1 - f) g_b AG)
    AG = the layer's parameter all-gather, RS = its gradient reduce-scatter (+ the replicas'
    all-reduce under HSDP), g_b = gathers in the backward (1, or 2 when full recompute
    gathers again for the recomputed forward), K_f, K_b = the layer's forward and backward
    (+ recompute) time not hiding its own collectives, f = the prefetch fraction
    (`workload.dp.zero3_prefetch_frac`: the part of each gather issued ahead of use; the rest
    waits on the critical path whatever the compute), o = dp_overlap. The gathers of a layer
    prefetch behind the layer before it and its reduce-scatter runs behind the layer after
    it (one layer window each way); the first gather and the last reduce-scatter of each
    micro-batch have none (`zero3_microbatch_edge_s` moves them to exposed).
    Source: Rajbhandari et al. SC20 (ZeRO-3 volumes), Zhao et al. VLDB 2023 (FSDP prefetch),
    PAPERS.md sections 5.5 and 2.1 [D].
    Example: AG = 30 ms, RS = 30 ms, K_f = 20 ms, K_b = 60 ms, f = 1, g_b = 2: forward 10 ms
    exposed, backward 30 ms; with f = 0.25: forward max(10, 22.5) = 22.5 ms, backward
    max(30, 45) = 45 ms.
    """
    c_f = gather_s
    c_b = gathers_bwd * gather_s + reduce_s
    wait = 1.0 - prefetch_frac
    e_f = jnp.minimum(smax(exposed(c_f, overlap * fwd_window_s, temperature), wait * c_f,
                           temperature), c_f)
    e_b = jnp.minimum(smax(exposed(c_b, overlap * bwd_window_s, temperature),
                           wait * gathers_bwd * gather_s, temperature), c_b)
    return e_f, c_f - e_f, e_b, c_b - e_b


def zero3_microbatch_edge_s(fwd_hidden_s, bwd_hidden_s, reduce_s):
    """Seconds of one micro-batch's ZeRO-3 collectives that `zero3_layer_exposed_s` counts as
    hidden on every layer but that no compute hides at the micro-batch's two edges: the first
    layer's gather (nothing runs before it) and the last layer's reduce-scatter (the next
    micro-batch waits for it: FSDP's end-of-backward wait). They move from hidden to exposed:

        edge = H_f + min(RS, H_b)
    H_f, H_b = one layer's hidden forward / backward ZeRO-3 seconds (`zero3_layer_exposed_s`),
    RS = the layer's reduce-scatter (+ HSDP all-reduce): at most that much of H_b is the
    reduce-scatter.
    Source: Zhao et al. VLDB 2023 (FSDP: the first all-gather is issued on demand, the
    backward waits for the last reduce-scatter before the optimizer / next iteration);
    PAPERS.md section 5.5 [D].
    Example: H_f = 20 ms, H_b = 60 ms, RS = 30 ms: 20 + min(30, 60) = 50 ms per micro-batch.
    """
    return fwd_hidden_s + jnp.minimum(reduce_s, bwd_hidden_s)


def zero3_root_unit_s(gather_s, reduce_s, copy_s, parallel):
    """Exposed seconds per micro-batch of FSDP's root unit (Parallel.zero3_root_unit = 1),
    the parameters outside the transformer layers (`workload.dp.root_unit_params`: embedding,
    final norm, output layer):

        T_root = r [z3] (AG_root + RS_root + C_root)
    r = parallel.zero3_root_unit, [z3] = 1 under ZeRO-3. AG_root, RS_root = the ring all-gather
    of the root unit's weights and reduce-scatter (+ the replicas' all-reduce under HSDP) of
    its gradients over the shard group, C_root = its FSDP2 copy-out and reduce-scatter copy-in
    (`zero3_copy_out_bytes` / `zero3_rs_copy_in_bytes` of Psi_root; 0 without zero3_copy_out).
    Nothing hides them: the root's pre-forward gathers it before the embedding lookup, the
    first kernel of the micro-batch (the first layer's own gather comes after it and is
    counted by `zero3_microbatch_edge_s`), and the root's post-backward reduce-scatter is
    issued from FSDP's final backward callback, after the embedding's gradient, the last
    kernel of the backward, and the optimizer step waits for it. The root is not resharded
    after the forward (FSDP2 keeps the root's parameters for the backward), so one gather
    per micro-batch.
    Sources: TorchTitan parallelize_llama.apply_fsdp at 1ea476e9f (2024-04), 3faaa1a
    (2024-08), 9dec370 (2024-12), 820504e (2025-06): every TransformerBlock gets its own
    fully_shard, then fully_shard(model) makes tok_embeddings, norm and output one root
    unit; PyTorch FSDP2 `FSDPState._lazy_init` ("For the root, do not reshard after forward
    since for training, the parameters would be freed and all-gathered immediately":
    post_forward_mesh_info = None) and FSDP1 `_runtime_utils._post_forward_reshard` ("Do not
    free the root's parameters in the post-forward for FULL_SHARD"); fms-fsdp main_training.py
    (FSDP1, transformer_auto_wrap_policy on the block class) [D].
    Example: Llama 3 8B on 8 H100 (TorchTitan): Psi_root = 1.050e9, bf16 gather 2.10 GB and
    fp32 reduce-scatter 4.20 GB over NVLink: ~5 ms + ~10 ms per step.
    """
    z3 = jnp.where(parallel.zero_stage == 3, 1.0, 0.0)
    return parallel.zero3_root_unit * z3 * (gather_s + reduce_s + copy_s)


def dp_hidden_slowdown_s(dp_hidden_s, overlap_slowdown):
    """Compute time lost to the data-parallel / ZeRO collectives that hide behind it:

        T_slow = sigma H_dp
    H_dp = the step's hidden DP seconds (gradient reduction behind the backward, ZeRO-3
    gathers and reduce-scatters behind the layers), sigma = Efficiency.overlap_slowdown, or
    under Training.gemm_wave_split `overlap_sigma` at the layer's GEMM share (predict.
    _layer_parts; the hidden TP / CP / EP / AxoNN communication costs the same way): an
    NCCL kernel that runs beside a GEMM takes SMs and HBM bandwidth from it, whichever
    parallel dimension issued it. Measured: compute overlapped with collectives runs 18.9 %
    slower on average (max 40 %) on 4 A100 / H100 / MI250 / MI210 for GPT and Llama layers
    (arXiv:2507.03114, "Characterizing Compute-Communication Overlap in GPU-Accelerated
    Distributed Deep Learning: Performance and Power Implications", 2025, abstract and
    Section 5); with the collective shorter than the compute it hides behind, the slowed
    compute lasts about H_dp, hence sigma x H_dp.
    Example: H_dp = 0.387 s, sigma = 0.1: 38.7 ms.
    """
    return overlap_slowdown * dp_hidden_s


def overlap_sigma(overlap_slowdown, gemm_share, wave_split):
    """Fraction of compute progress lost per second of communication hidden behind it:

        sigma = sigma_0                                                  (wave_split = 0)
        sigma = 1 - (1 - sigma_0) / (g w (1 - sigma_0) + 1 - g)          (wave_split = 1)
        w = max(2, 1 / (1 - sigma_0))
    sigma_0 = Efficiency.overlap_slowdown (every kernel beside an NCCL kernel runs at 1 -
    sigma_0 of its speed), g = the GEMMs' share of the compute seconds the communication
    hides behind (predict._layer_parts: the layer's GEMM share for the DP / ZeRO, EP and AxoNN
    collectives, 0 for the CP exchange hidden behind the attention; the TP collectives as TE
    userbuffers runs them, `tp_userbuffers_sigmas`), wave_split = Training.gemm_wave_split.
    Why: on Hopper cuBLAS runs its GEMMs as statically scheduled persistent kernels, one CTA
    per SM (132 on an H100 SXM), each CTA looping over its share of the output tiles. An NCCL
    kernel beside it holds ~10 % of the SMs (24 CTAs in the forum measurement below), so only
    N_SM - c CTAs fit and the c others wait for a second wave: ceil(N_SM / (N_SM - c)) = 2
    waves for 1 <= c <= N_SM / 2, twice the GEMM's time ("the matmuls take 2x as long to
    complete when they are overlapped with a NCCL kernel", FSDP on H100, pytorch issue
    143988, 2024-12-30; pytorch PR 144974 / 147966, 2025: "This 'wave quantization' can
    double the latency of the matmul kernels", which adds an opt-in SM carve-out the runs
    here did not use; NVIDIA/cutlass issue 2471: Hopper's tile schedulers are static, dynamic
    scheduling only on Blackwell; NVIDIA developer forum thread 337991, H100: a 132-block GEMM
    beside a 24-block all-gather, 80 % -> 47 % MFU). The other kernels (FlashAttention-2,
    element-wise) launch many waves of CTAs and keep sigma_0. In one second of overlap the
    GPU then completes 1 / (w g + (1 - g) / (1 - sigma_0)) seconds of nominal work, and the
    loss is 1 minus that: the formula above, sigma_0 at g = 0. w is the GEMM's time factor:
    the two waves, and never less than what a many-wave kernel loses beside NCCL (a sigma_0
    above one half, as a fit may give, would otherwise make the fact cheapen the hidden
    seconds); w = 2 for sigma_0 <= 1/2, the shipped 0.19 included. Ampere's cuBLAS kernels
    are not persistent (no fact is set on A100 runs).
    Example: g = 0.8, sigma_0 = 0.19: 1 - 0.81 / (1.296 + 0.2) = 1 - 0.541444 = 0.458556.
    wave_split 0 gives sigma_0 exactly (sigma_0 + 0 x finite).
    """
    s0, g = overlap_slowdown, gemm_share
    r = 1.0 / (1.0 - s0)
    w = 0.5 * (2.0 + r + abs(r - 2.0))  # max(2, r), Python floats stay Python floats
    split = 1.0 - (1.0 - s0) / (w * g * (1.0 - s0) + 1.0 - g)
    return s0 + wave_split * (split - s0)


# Share of the counted backward TP collectives that Megatron-Bridge's H100 userbuffers
# configurations run in TE's bulk mode without an SM margin (tp_userbuffers_sigmas)
UB_BULK_BACKWARD_SHARE = 0.5


def tp_userbuffers_sigmas(overlap_slowdown, wave_split):
    """(forward, backward) compute lost per second of TP communication hidden behind the
    GEMMs (Parallel.tp_overlap), as Transformer Engine's userbuffers TP overlap runs it:

        sigma_TP,f = sigma_0
        sigma_TP,b = (1 - u) sigma_0 + u overlap_sigma(sigma_0, 1, wave_split),   u = 1/2
    sigma_0 = Efficiency.overlap_slowdown, wave_split = Training.gemm_wave_split
    (`overlap_sigma`: at g = 1 the GEMM beside a comm kernel that holds SMs runs two waves).
    Why: userbuffers (TE `CommOverlapBase` / `CommOverlapP2PBase`, common/comm_gemm_overlap/
    comm_gemm_overlap.cpp, v2.7 to v2.16) launches each overlapped GEMM with `_math_sms =
    set_sm_margin ? sm_count - num_comm_sm : sm_count` CTAs (passed to cuBLASLt as
    CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, common/gemm/cublaslt_gemm.cu), so with an SM margin
    the persistent GEMM fits beside the comm kernel in one wave; the ring-exchange mode moves
    its chunks with the copy engine (`use_ce`, default True; userbuffers.cu
    `userbuffers_send`: cudaMemcpyAsync, a one-thread flag kernel) and holds no SMs.
    Megatron-Bridge's H100 configurations (`src/megatron/bridge/training/comm_overlap.py`,
    userbuffers_{bf16,fp8}_h100_h8192_tp4_mbs1_seqlen8192 / _h16384_tp8_cp2_mbs1_seqlen8192,
    identical at v0.1.0rc3 ... v0.5.0 and 4ab94dfad) run: forward, the all-gathers in ring
    exchange (qkv_fprop, fc1_fprop) and the reduce-scatters in pipeline or ring exchange with
    set_sm_margin=True (proj_fprop, fc2_fprop): no wave split, sigma_0; backward, the
    all-gather of the output gradient in ring exchange (proj_dgrad, fc2_dgrad: no split) and
    the reduce-scatter of the input gradient in bulk mode beside the weight-gradient GEMM
    (qkv_wgrad, fc1_wgrad: BulkOverlapCfg(num_sm=24 / 4 / 2, set_sm_margin=False)), whose
    GEMM takes all sm_count SMs while the comm kernel holds num_sm of them: two waves. Of the
    two equal-size backward collectives per block that diffperf counts (workload.tp: the
    all-reduce equivalent = all-gather + reduce-scatter under SP) one is bulk: u = 1/2. (The
    re-gather of the input for the weight gradient, bulk qkv_dgrad / fc1_dgrad with
    set_sm_margin=False, is not a counted collective: `tp_calls_per_all_reduce`.) TE's own
    defaults (`initialize_ub` without a configuration, pytorch/module/base.py) set the margin
    for bulk and pipeline and use the copy engine for ring exchange: u = 0 there. Megatron-
    Core runs the bulk overlaps by default (ModelParallelConfig tp_comm_bulk_wgrad /
    tp_comm_bulk_dgrad True, tp_comm_overlap_rs_dgrad False; TE layernorm_linear.py: "Overlap
    dgrad reduce-scatter with wgrad compute"). u follows Megatron-Bridge's configurations:
    the wave-split fact is set on Hopper Megatron-Bridge rows, the ones that run them.
    Example: sigma_0 = 0.19, wave_split 1: (0.19, 0.5 x 0.19 + 0.5 x 0.5 = 0.345); wave_split
    0: (0.19, 0.19).
    """
    s0 = overlap_slowdown
    u = UB_BULK_BACKWARD_SHARE
    return s0, (1.0 - u) * s0 + u * overlap_sigma(s0, 1.0, wave_split)


def tp_userbuffers_block_s(ag_f_s, ag_b_s, rs_s, ag_wgrad_s, reduce_s, col_fprop_s,
                           row_fprop_s, col_dgrad_s, col_wgrad_s, row_dgrad_s, tp,
                           temperature=None, pipe=None):
    """(forward exposed, forward hidden, backward exposed, backward hidden, backward hidden in
    bulk overlaps) seconds of one tensor-parallel block (a column-parallel linear, then a
    row-parallel one: QKV -> output projection, fc1 -> fc2) under sequence parallelism, one
    micro-batch, as Transformer Engine's userbuffers overlap runs Megatron-Bridge's FP8
    configurations (Parallel.tp_userbuffers):

        forward   AG_f ring exchange beside the column GEMM:
                                                  e1 = (t-1) max(0, AG_f/(t-1) - G_c/t)
                  RS ring exchange beside the row GEMM:
                                                  e2 = (t-1) max(0, RS/(t-1) - G_r/t)
                  + the reduction kernel R after the exchange (exposed whole)
        backward  AG_b ring exchange beside the row dgrad GEMM:
                                                  e3 = (t-1) max(0, AG_b/(t-1) - D_r/t)
                  AG_w (MXFP8: the column-wise output gradient for the row wgrad GEMM) after
                  the ring, beside the last dgrad chunk:        e4 = max(0, AG_w - D_r/t)
                  bulk AG_f (input re-gathered for the column wgrad) beside the column dgrad
                  GEMM:                                          e5 = max(0, AG_f - D_c)
                  bulk RS of the input gradient beside the column wgrad GEMM:
                                                                 e6 = max(0, RS - W_c)
        exposed_f = e1 + e2 + R,  hidden_f = AG_f + RS - e1 - e2
        exposed_b = e3 + e4 + e5 + e6,  hidden_b = AG_b + AG_w + AG_f + RS - exposed_b,
        hidden in bulk = AG_f + RS - e5 - e6
    AG_f, AG_b, RS = one collective's time at the sizes `workload.tp.tp_ub_message_bytes`
    gives (a ring step moves one chunk S / t, so a ring-exchange step costs 1/(t - 1) of the
    ring collective); G, D, W = the fprop, dgrad, wgrad GEMM seconds of the linear (c column,
    r row), t = tp. Ring exchange (TE `CommOverlapP2PBase::split_overlap_ag`, common/
    comm_gemm_overlap/comm_gemm_overlap.cpp v2.7-v2.16): t GEMMs on the t chunks; chunk i + 1
    is received while chunk i's GEMM runs, the local chunk first, so each of the t - 1 steps
    takes max(chunk GEMM, chunk exchange) and the last GEMM has no exchange beside it.
    `split_overlap_rs`: t chunk GEMMs, chunk i sent to its owner while chunk i + 1 is
    computed, the local chunk last (its GEMM hides the last send), then `reduce_bf16` sums the
    t chunks on the main stream. The chunks move by copy engine (`use_ce`, default True;
    userbuffers_send: cudaMemcpyAsync), the GEMMs keep their SMs (set_sm_margin False, or
    True with num_sm = 1 for the reduce-scatters: 1 of 132-148 SMs, < 1 %, not counted).
    Bulk (`CommOverlapBase::bulk_overlap`): the whole collective (userbuffers' SM kernels,
    num_sm 2-32) launched beside one GEMM, hidden up to that GEMM's time; the GEMM takes all
    SMs (set_sm_margin False in every Bridge configuration), so on Hopper it runs two waves
    (`overlap_sigma`; predict prices the bulk hidden seconds at g = 1). TE's linear backward
    (pytorch/module/linear.py, layernorm_linear.py v2.9): the row-parallel linear gathers its
    output gradient for the dgrad GEMM in ring exchange (proj_dgrad, fc2_dgrad); the gathered
    FP8 data serves the wgrad GEMM too, but a row-scaled MXFP8 gradient cannot, so under MXFP8
    the column-wise copy is gathered again on the dgrad streams after the ring
    (`bulk_overlap_ag_with_external_gemm`; AG_w = 0 otherwise); the column-parallel linear
    re-gathers its saved input beside its dgrad GEMM (ub_bulk_dgrad, qkv_dgrad / fc1_dgrad)
    and reduce-scatters the dgrad output beside its wgrad GEMM (ub_bulk_wgrad, qkv_wgrad /
    fc1_wgrad). Megatron-Bridge's configurations userbuffers_fp8_{h100_h8192_tp4_mbs1,
    h100_h16384_tp8_cp2_mbs1, b200_h8192_tp2_mbs1, b200_h16384_tp4_cp2_mbs1}_seqlen8192
    (src/megatron/bridge/training/comm_overlap.py, identical at v0.1.0rc3, v0.2.0 and v0.5.0):
    qkv_fprop / fc1_fprop / proj_dgrad / fc2_dgrad RingExchangeOverlapCfg(aggregate=False),
    proj_fprop / fc2_fprop RingExchangeOverlapCfg(num_sm=1, set_sm_margin=True), the four
    bulk cfgs BulkOverlapCfg(set_sm_margin=False) [S]. A ring-exchange chunk GEMM is taken
    as 1/t of the G_c, G_r, D_r given (predict._tp_userbuffers_parts passes t x one chunk
    GEMM timed at m / t rows). Not modelled: the bulk kernels' rate at few SMs (timed at the
    collective's rate), atomic GEMM and aggregate (not used there).
    Example (ms): t = 4, AG_f = 0.6, AG_b = 0.6, RS = 1.2, AG_w = 0, R = 0.05, G_c = 1.6,
    G_r = 1.2, D_c = 1.6, W_c = 1.6, D_r = 1.2: e1 = 3 max(0, 0.2 - 0.4) = 0, e2 = 3 max(0,
    0.4 - 0.3) = 0.3, forward exposed 0.35, hidden 1.5; e3 = 0, e5 = 0, e6 = 0, backward
    exposed 0, hidden 2.4, of it bulk 1.8.
    pipe = (on, e_p, h_p) or None: where on > 0 the forward reduce-scatter runs as TE 1.8's
    pipelined overlap instead (NeMo Framework Launcher 24.07's H100 FP8 configuration,
    Parallel.tp_userbuffers = 2): its exposed and hidden seconds e_p, h_p
    (`tp_pipeline_rs_s`) replace e2 + R and RS - e2 in the forward; the backward is unchanged.
    """
    steps = jnp.maximum(tp - 1.0, 1.0)
    e1 = steps * exposed(ag_f_s / steps, col_fprop_s / tp, temperature)
    e2 = steps * exposed(rs_s / steps, row_fprop_s / tp, temperature)
    e3 = steps * exposed(ag_b_s / steps, row_dgrad_s / tp, temperature)
    e4 = exposed(ag_wgrad_s, row_dgrad_s / tp, temperature)
    e5 = exposed(ag_f_s, col_dgrad_s, temperature)
    e6 = exposed(rs_s, col_wgrad_s, temperature)
    bulk = ag_f_s + rs_s - e5 - e6
    e_b = e3 + e4 + e5 + e6
    e_f, h_f = e1 + e2 + reduce_s, ag_f_s + rs_s - e1 - e2
    if pipe is not None:
        on, e_p, h_p = pipe
        e_f, h_f = jnp.where(on > 0, e1 + e_p, e_f), jnp.where(on > 0, ag_f_s - e1 + h_p, h_f)
    return (e_f, h_f, e_b,
            ag_b_s + ag_wgrad_s + ag_f_s + rs_s - e_b, bulk)


# TE 1.8's pipelined reduce-scatter as NeMo Framework Launcher 24.07 configures it for H100
# FP8 (launcher_scripts/conf/training/tp_overlap/ub_cfg_h100_fp8_h8192_tp4_mbs1_seqlen8192.yaml,
# tag 24.07: proj_fprop num_sm 24, fc2_fprop num_sm 16, both method pipeline, num_splits 4,
# set_sm_margin 1, fp8_buf 1) [S]; the GPU's own SM count is System.gpu_sms (ub_pipe_sm_margin)
UB_PIPE_SPLITS = 4.0
# UB_PIPE_COMM_SMS (proj_fprop, fc2_fprop) = (24, 16) lives in specs.parallel: the spec check
# (specs.validate.check_tp_userbuffers_system) reads it too, and specs sit below schedule


def ub_pipe_sm_margin(gpu_sms):
    """Slowdown of the GEMM chunks beside TE 1.8's pipelined reduce-scatter, one per comm
    kernel of UB_PIPE_COMM_SMS (proj_fprop, fc2_fprop):

        margin_k = S / (S - num_sm_k)        S = System.gpu_sms > num_sm_k; else 1
    Why: with set_sm_margin the GEMM is launched on `_math_sms = prop.multiProcessorCount -
    num_comm_sm` SMs (TE v1.8 comm_gemm_overlap.h, UbufCommOverlap), the comm kernel taking
    num_sm of them, and a GEMM large enough to fill the GPU runs in proportion to the SMs it
    gets [S for the SM split, D for the proportional rate]. S <= num_sm (0: the count unknown)
    gives 1, no margin: `specs.validate.check_tp_userbuffers_system` refuses such a system
    for tp_userbuffers = 2 before anything is traced; the guard keeps traced values finite.
    Example: H100 SXM5, S = 132: 132 / 108 = 1.222 (proj), 132 / 116 = 1.138 (fc2); B200,
    S = 148: 148 / 124 = 1.194, 148 / 132 = 1.121.
    """
    s = jnp.asarray(gpu_sms)
    out = []
    for x in UB_PIPE_COMM_SMS:
        ok = s > x
        out.append(jnp.where(ok, s / jnp.where(ok, s - x, 1.0), 1.0))
    return jnp.stack(out)


def tp_pipeline_rs_s(rs_s, gemm_s, n_splits, temperature=None):
    """(exposed, hidden) seconds of a reduce-scatter that Transformer Engine's userbuffers runs
    as a pipelined overlap ("pipeline" method) with the GEMM that produces it:

        c = RS / n,   g = G / n
        exposed = c + (n - 1) max(0, c - g),   hidden = RS - exposed
    RS = the reduce-scatter's time, G = the producing GEMM's time as it runs in the overlap
    (its n chunks, on the SMs the comm kernel leaves: the caller's), n = num_splits. Why
    (TE v1.8 `UbufCommOverlap::split_overlap_rs`, transformer_engine/pytorch/csrc/
    comm_gemm_overlap.h, called with gemm_overlap=True by cpp_extensions/gemm.py for
    SPLIT_PIPELINED_RS): the GEMM is cut into n chunks (m / num_splits rows of the weight,
    i.e. a 1/n slice of the output), launched back to back on the compute streams with
    `_math_sms = sm_count - num_comm_sm` (set_sm_margin); chunk i's reduce-scatter
    (`reducescatter2_userbuff_stridedoutput[_fp8]`, userbuffers' SM kernel on num_sm SMs, the
    sum done in the kernel: no separate reduction) waits for chunk i's GEMM and runs on the
    comm stream beside chunk i + 1's GEMM; the last chunk's reduce-scatter runs after the last
    GEMM (with UB_MAX_SM SMs), exposed. A two-stage pipeline of n items: total = g + c +
    (n - 1) max(g, c), the GEMMs alone n g. The comm kernel's rate at num_sm SMs is taken as
    the collective's (not modelled separately, as the bulk overlaps in
    `tp_userbuffers_block_s`).
    Example (ms): RS = 0.4, G = 1.2, n = 4: c = 0.1, g = 0.3: exposed 0.1, hidden 0.3;
    RS = 2.0, G = 1.2: c = 0.5, exposed 0.5 + 3 x 0.2 = 1.1, hidden 0.9.
    """
    n = jnp.maximum(n_splits, 1.0)
    c, g = rs_s / n, gemm_s / n
    e = c + (n - 1.0) * exposed(c, g, temperature)
    return e, rs_s - e


def dp_step_exposed_s(reduce_s, gather_s, bwd_window_s, parallel, temperature=None):
    """(exposed, hidden) data-parallel communication of one step outside ZeRO-3's per-layer
    collectives (`zero3_layer_exposed_s`), by ZeRO stage:

        ZeRO 0, 1: gradient AR (ZeRO-1: RS) once per step, behind the last micro-batch's
                   backward (bucketed DDP; Li et al. VLDB 2020): max(0, T_red - o K_bwd)
        ZeRO 2:    gradient RS every micro-batch, behind that micro-batch's backward (the
                   gradients are kept sharded, so they cannot accumulate unreduced:
                   DeepSpeed stage 2, FSDP SHARD_GRAD_OP): m max(0, T_red - o K_bwd)
        ZeRO 1, 2: parameter AG after the optimizer step, exposed
        ZeRO 3:    0 here
    K_bwd = the stage's backward time not hiding its own collectives, o = dp_overlap.
    Source: PAPERS.md section 5.5 (Rajbhandari et al. SC20) [D].
    """
    z = parallel.zero_stage
    e, h = split_exposed(reduce_s, parallel.dp_overlap * bwd_window_s, temperature)
    times = jnp.where(z == 2, parallel.n_microbatches, 1.0)
    gather = jnp.where((z >= 1) & (z <= 2), gather_s, 0.0)
    return jnp.where(z == 3, 0.0, times * e + gather), jnp.where(z == 3, 0.0, times * h)


def ring_exposed_s(step_s, n_steps, block_window_s, temperature=None):
    """(exposed, hidden) of a ring exchange whose every step hides behind one block's compute:

        exposed = (c - 1) max(0, T_step - K_block),   hidden = (c - 1) T_step - exposed
    Ring attention (PAPERS.md section 5.7 [D]; Liu et al. 2023): while rank r computes the
    attention of its queries against the K/V block it holds (K_block = attention / c), it
    passes that block on and receives the next; hidden iff the block is large enough,
    s/c >= a_kv q_a F / (2 kappa a BW). Example: c = 4, T_step = 30 us, K_block = 20 us:
    3 x 10 us exposed, 3 x 20 us hidden.
    """
    e, h = split_exposed(step_s, block_window_s, temperature)
    return n_steps * e, n_steps * h


def axonn_exposed_s(fwd_ar_s, z_gather_s, bwd_ar_s, z_scatter_s, dw_windows_s, fwd_window_s,
                    bwd_window_s, overlap, temperature=None):
    """(forward exposed, forward hidden, backward exposed, backward hidden) AxoNN collectives
    of one layer, one micro-batch (PAPERS.md section 4.3 [C for what overlaps, D for timing]):

        forward:  all-reduces of partial outputs (X or Y) on the critical path;
                  all-gather of W over Z prefetched behind the layer's forward compute:
                  max(0, T_AG - o K_f)
        backward: all-reduce of dX (Y or X) of linear l behind its dW GEMM (OVERLAP_ALL_REDUCE):
                  sum_l max(0, T_AR,l - o t_dW,l);
                  re-gather of W and reduce-scatter of dW over Z behind the rest of the
                  layer's backward (prefetch, OVERLAP_REDUCE_SCATTER):
                  max(0, T_AG + T_RS - (o K_b - hidden_AR))
    o = `overlap` (1 on, 0 off: then everything is exposed). Arrays [4] (one per linear) for
    the all-reduces and dW windows. Never slower with o = 1 than with o = 0.
    """
    e_ag, h_ag = split_exposed(z_gather_s, overlap * fwd_window_s, temperature)
    e_ar, h_ar = split_exposed(bwd_ar_s, overlap * dw_windows_s, temperature)
    rest = jnp.maximum(overlap * bwd_window_s - jnp.sum(h_ar), 0.0)
    e_z, h_z = split_exposed(z_gather_s + z_scatter_s, rest, temperature)
    return (jnp.sum(fwd_ar_s) + e_ag, h_ag, jnp.sum(e_ar) + e_z, jnp.sum(h_ar) + h_z)


def ep_two_step_exposed_s(c1_s, c2_s, k1_s, k1w_s, k2_s, temperature=None):
    """(exposed by the first all-to-all, exposed by the second) seconds of one step of
    Megatron-Core's merged EP schedule: the communication stream runs c1 then c2, the compute
    stream k1, then k1w, then k2; c2 waits for k1 (its input is k1's output), k2 waits for c1,
    k1w (a deferred weight gradient) waits for nothing on the other stream:

        end     = max(max(c1, k1) + c2, max(c1, k1 + k1w) + k2)
        exposed = end - (k1 + k1w + k2) = e2 + max(0, e1 + c2 - e2 - (k1w + k2))
        e1 = max(0, c1 - k1),  e2 = max(0, c1 - k1 - k1w)
    e2 (c1 outlasting all the compute before k2) is c1's; the rest, min(., c2), c2's.
    Source: Megatron-Core `pipeline_parallel/utils.py` `ScheduleNode` (each node waits for the
    event its micro-batch's previous node recorded and records it when done, on its own
    stream; `stream_acquire_context`), `models/gpt/fine_grained_callables.py`
    `TransformerLayerNode.backward_dw` (the weight gradient runs on the current, compute,
    stream outside any event: nothing on the communication stream waits for it),
    core_v0.14.0-core_v0.16.0 [S].
    Example: c1 = c2 = 1, k1 = 0.5, k1w = 0.5, k2 = 1 (ms): end = max(1 + 1, 1 + 1) = 2,
    exposed 0 (the form max(2 c, K) gives 0 too); k1 = 1.5, k1w = 0, k2 = 0.5: end =
    max(2.5, 1.5 + 0.5) = 2.5, exposed 0.5, all c2's (max(2 c, K) would give 0).
    """
    e1 = exposed(c1_s, k1_s, temperature)
    e2 = exposed(c1_s, k1_s + k1w_s, temperature)
    rest = exposed(e1 + c2_s - e2, k1w_s + k2_s, temperature)
    return e2, jnp.minimum(rest, c2_s)


def ep_merged_1f1b_exposed_s(a2a_s, extra_bwd_s, attn_f_s, mlp_f_s, mlp_b_s, attn_b_s,
                             overlap, temperature=None, mlp_bw_s=0.0, attn_bw_s=0.0):
    """(forward exposed, forward hidden, backward exposed, backward hidden) of one MoE
    layer's token all-to-alls under Megatron-Core's EP all-to-all overlap, which merges the
    forward of one micro-batch with the backward of the previous one, layer by layer, on two
    streams (`overlap_moe_expert_parallel_comm`):

        comm stream:     combine_bwd  | dispatch_fwd -> dispatch_bwd  | combine_fwd
        compute stream:  A_f          | M_b -> M_b,w -> M_f           | A_b -> A_b,w
    Each node waits for its own micro-batch's previous node (dispatch_bwd for M_b's input
    gradient, M_f for dispatch_fwd, A_b for dispatch_bwd, the next layer's A_f for combine_fwd,
    its combine_bwd for A_b), not for the other micro-batch's, and a deferred weight gradient
    (M_b,w, A_b,w: `delay_wgrad_compute`) for none. So a layer is two steps of
    `ep_two_step_exposed_s` (two all-to-alls, the first hidden behind the compute before the
    second one's input is ready, the second behind what follows):
          step 1: c1 = c (dispatch_fwd), c2 = c (dispatch_bwd),
                  k1 = M_b - M_b,w, k1w = M_b,w, k2 = M_f
          step 2: c1 = c (combine_fwd), c2 = c (the next layer's combine_bwd),
                  k1 = A_b - A_b,w, k1w = A_b,w, k2 = A_f (the next layer's, the same)
    each K times o. A_f, M_f, M_b, A_b = the pre-dispatch (attention, router) and expert
    (MLP) chunks' whole compute stream (GEMMs, attention core and its memory-bound kernels,
    `workload.flops.ep_chunk_elementwise_bytes`), M_b,w and A_b,w (`mlp_bw_s`, `attn_bw_s`) the
    weight-gradient GEMMs in M_b and A_b that run deferred (0: Megatron-Core's default
    `delay_wgrad_compute = False`, where each is part of its node's backward), c = one
    dispatch or combine all-to-all (`a2a_s`), c_x = `extra_bwd_s` (the all-to-alls a full
    recompute adds, which the schedule does not pair: exposed whole, on the backward;
    Megatron-Core rejects full recompute under this overlap), o = ep_overlap. The forward
    exposes each step's e2 (its own all-to-all outlasting the compute before k2), the
    backward the rest.
    Source: Megatron-Core `megatron/core/models/common/model_chunk_schedule_plan.py`,
    `TransformerLayerSchedulePlan.run` (the stream diagram above and its issue order: at
    d98e8a64 and core_v0.14.0-core_v0.16.0), `pipeline_parallel/utils.py` `ScheduleNode`
    (one CUDA event per micro-batch's model chunk, waited for and recorded around every
    node), `models/gpt/fine_grained_callables.py` `TransformerLayerNode.backward_dw`;
    `megatron/core/transformer/moe/README.md`, "EP A2A Overlap: overlaps All-to-All with
    computation by merging FWD-BWD passes of adjacent microbatches" [S]. The warm-up and
    cool-down passes have no partner: `ep_merged_unpaired_frac`, applied by `predict._ep_parts`.
    Example: c = 1 ms, A_f = 0.6, M_f = 1, M_b = 2, A_b = 1.2 ms, no deferred wgrad, o = 1:
    step 1 max(1, 2) + max(1, 1) = 3 ms against 3 ms of compute, none exposed; step 2
    max(1, 1.2) + max(1, 0.6) = 2.2 against 1.8 ms: 0.4 ms exposed, the combine_bwd's (the
    backward's): 0.4 ms of 4 ms. With M_f = 0.5 and M_b,w = 0 step 1 exposes
    max(1, 2) + max(1, 0.5) - 2.5 = 0.5 ms (a single window max(2 c, M_b + M_f) would hide all
    of it); with M_b,w = 1 of the 2 ms, the dispatch_bwd waits only for the 1 ms dgrad:
    max(max(1, 1) + 1, max(1, 2) + 0.5) - 2.5 = 0.
    """
    c, c_x, o = a2a_s, extra_bwd_s, overlap
    f1, b1 = ep_two_step_exposed_s(c, c, o * (mlp_b_s - mlp_bw_s), o * mlp_bw_s,
                                   o * mlp_f_s, temperature)
    f2, b2 = ep_two_step_exposed_s(c, c, o * (attn_b_s - attn_bw_s), o * attn_bw_s,
                                   o * attn_f_s, temperature)
    f, b = f1 + f2, b1 + b2 + c_x
    return f, 2.0 * c - f, b, 2.0 * c + c_x - b


def ep_merged_unpaired_frac(parallel):
    """u: the share of a device's layer passes that Megatron-Core's merged EP schedule runs
    without a partner pass of another micro-batch, so their all-to-alls are not overlapped:

        W = 2 (p - 1) + (v - 1) p + 1     forward passes of the first stage's warm-up
                                          (and as many backward passes in its cool-down)
        u = min(W / (m v), 1)             of its m v forward (and m v backward) chunk passes
    p = pp, v = vp, m = micro-batches per step. Source: Megatron-Core core_v0.16.0
    `pipeline_parallel/schedules.py`, `get_pp_rank_microbatches`: with interleaving the
    warm-up is (p - r - 1) 2 + (v - 1) g forward chunk passes, g =
    `microbatch_group_size_per_vp_stage` (default p), "+ 1" under
    `overlap_moe_expert_parallel_comm` ("one extra micro-batch forward step before the 1f1b
    stages"); rank r = 0, the longest, is taken. `combined_1f1b.py`: the 1F1B steps merge one
    forward with one backward; warm-up forwards and cool-down backwards run alone; without
    pipelining (`combined_1f1b_schedule_for_no_pipelining`) the first micro-batch's forward
    and the last one's backward run alone: W = 1, which the formula gives at p = v = 1.
    EP overlap with p > 1 requires v (transformer_config.py: "virtual_pipeline_model_parallel_
    size must be specified when pipeline_model_parallel_size > 1") [S].
    Example: p 8, v 4, m 512 (Qwen3 235B-A22B on DGX-H100, GBS 8192): W = 14 + 24 + 1 = 39,
    u = 39 / 2048 = 0.019; m 128 (GBS 2048): u = 39 / 512 = 0.076; p = v = 1, m 64: 1/64.
    """
    p, v = parallel.pp, parallel.vp
    warm = 2.0 * (p - 1.0) + (v - 1.0) * p + 1.0
    return jnp.minimum(warm / (parallel.n_microbatches * v), 1.0)


def host_sync_regions_s(gpu_s, host_s, gpu_r_s, host_r_s, p):
    """Seconds of one layer pass whose host blocks once on the GPU (a device-to-host sync):
    the pass is two regions the host cannot run ahead across, each its own smooth max of GPU
    time and host launch time, instead of one max over the whole pass:

        t = M(G_r, H_r) + M(G - G_r, H - H_r)          M(a, b) = (a^p + b^p)^(1/p)
    G, H = the pass's GPU and host seconds (`predict._layer_parts`' gpu_f, host_f), G_r, H_r =
    the region after the sync (0 <= G_r <= G, 0 <= H_r <= H; each rest is clipped at 0),
    p = `Efficiency.floor_pnorm`. After `cudaStreamSynchronize` (or a blocking D2H copy) the
    GPU queue is empty and the host issues the region's kernels from there: the region takes
    at least its GPU time and at least the host's time to issue it, and the host's lead before
    the sync is lost (CUDA Runtime API, cudaStreamSynchronize: "Blocks until stream has
    completed all operations"). t >= M(G, H) (Minkowski's inequality for the p-norm): equal
    when both regions have the same host / GPU ratio, larger when the host binds in one
    region only. The sync's own bubble (the GPU idle from the read to the first launch after
    it: 22-28 us on one H100 with an x86 host, data/kernels/h100_sync_bubble.csv) is not added;
    the form itself was measured there (h100_sync_region.csv: after a blocking read the GPU
    span is the regions' max + 20-62 us; with work queued ahead, the one max). Source of the
    sync in the MoE layer: docs/accuracy-bridge.md "Session 15: host syncs inside the MoE
    layer" (Megatron-Core core_v0.14.0-v0.17.0 token dispatchers).
    Example (p -> inf, the hard max): G = 10, H = 6, G_r = 2, H_r = 5: one max 10; regions
    max(2, 5) + max(8, 1) = 13. At p = 6: 5.0034 + 8.0000 = 13.0034.
    """
    rest_g = jnp.maximum(gpu_s - gpu_r_s, 0.0)
    rest_h = jnp.maximum(host_s - host_r_s, 0.0)
    return pnorm_max(gpu_r_s, host_r_s, p) + pnorm_max(rest_g, rest_h, p)
