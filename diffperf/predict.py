"""predict(): step time, breakdown, memory and MFU of one configuration (DESIGN.md).

Assembly after PAPERS.md section 5.11:
    t_f, t_b  = per layer: op times + exposed TP / CP / EP / AxoNN collectives (+ recompute
                in t_b), each combined with the host launch floor by a smooth max
    T_pipe    = m t_max + (sum_i t_i - t_max)/v  + exposed p2p     (stages of uneven layer
                counts: workload.stages; the slowest sets the pace)
    T_step    = T_pipe + exposed DP / ZeRO + optimizer step + per-step overhead
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from diffperf.costs.axonn import axonn_times_s
from diffperf.costs.collectives import (all_gather_s, all_reduce_s, all_to_all_s,
                                        hierarchical_all_to_all_s, ring_group,
                                        ring_phase_calls_s, ring_phase_s, ring_step_s,
                                        send_recv_s)
from diffperf.costs.compute import (FLASH_BACKWARD_WORK, attention_by_kind_time_s,
                                    attention_sink_backward_s, attention_time_s, gemms_time_s,
                                    layer_dense_times_s, layer_pass_gemm_times_s, layer_times_s,
                                    lowp_quantize_times_s, matmul_peak, memory_time_s)
from diffperf.costs.smooth import pnorm_max
from diffperf.costs.xla import kernel_fixed_s
from diffperf.memory.device import device_memory
from diffperf.memory.weights import gradient_bytes
from diffperf.memory.xla import select_memory, xla_device_memory
from diffperf.result import EXPOSED_PARTS, Breakdown, Goodput, Result
from diffperf.schedule.goodput import (checkpoint_bytes, checkpoint_write_s, daly_interval_s,
                                      job_mtbf_s, lost_fracs)
from diffperf.schedule.overlap import (UB_PIPE_SPLITS, axonn_exposed_s, dp_hidden_slowdown_s,
                                       dp_step_exposed_s, ep_merged_1f1b_exposed_s,
                                       ep_merged_unpaired_frac, host_sync_regions_s,
                                       overlap_sigma,
                                       ring_exposed_s, split_exposed, tp_pipeline_rs_s,
                                       tp_userbuffers_block_s, tp_userbuffers_sigmas,
                                       ub_pipe_sm_margin, zero3_layer_exposed_s,
                                       zero3_microbatch_edge_s, zero3_root_unit_s)
from diffperf.schedule.pipeline import (critical_stage, p2p_exposed_s, pipeline_times_s,
                                        stage_times_s)
from diffperf.specs import Parallel
from diffperf.specs.validate import computed_once, valid_mask
from diffperf.workload.axonn import axonn_layer_volumes
from diffperf.workload.cp import (cp_kv_bytes, cp_ring_block_bytes, cp_ring_steps,
                                  cp_torch_dkv_block_bytes, cp_torch_merge_bytes)
from diffperf.workload.dp import (dp_volumes_bytes, product_group, root_unit_params,
                                  zero3_copy_out_bytes,
                                  zero3_prefetch_frac, zero3_rs_copy_in_bytes, zero_groups)
from diffperf.workload.ep import (ep_a2a_bytes, ep_a2a_per_layer, ep_stride, expert_dp_degree,
                                  expert_tp, moe_mlp_on_tp)
from diffperf.workload.flops import (DENSE_ROW_BLOCKS, EXPERT_ROWS, attention_by_kind,
                                     attention_io_bytes,
                                     ep_chunk_elementwise_bytes,
                                     elementwise_backward_once_bytes,
                                     head_ops, layer_ops, lowp_quantize_kernels,
                                     moe_expert_loop_kernels, moe_layer_fraction,
                                     qk_norm_backward_excess_kernels, query_rows,
                                     te_quantize_rows)
from diffperf.workload.groups import stride
from diffperf.workload.params import (grid_shards, layer_params_per_device,
                                      stage_expert_params_per_device, stage_params_per_device,
                                      total_params)
from diffperf.workload.pp import pp_message_bytes
from diffperf.workload.recompute import (full_frac, megatron_module_fracs,
                                         megatron_recompute_bytes, megatron_recompute_rows,
                                         op_sac_frac, sac_recompute_fracs)
from diffperf.workload.stages import at_largest, pipeline_stages
from diffperf.workload.tp import (tp_calls_per_all_reduce, tp_collectives_per_layer,
                                  tp_message_bytes, tp_ub_message_bytes, tp_ub_reduce_bytes,
                                  tp_ub_scale_bytes)
from diffperf.workload.xla import (grad_accumulation_traffic_bytes, optimizer_bytes_per_param,
                                   remat_skipped_gemms, stacked_pass_traffic_bytes)

# Terms that are exactly 0 for most layouts, and that a caller who knows so can leave out of
# the traced program (`features` of predict_step; `features_of` finds them from concrete specs).
FEATURES = frozenset({"ep", "cp", "axonn", "experts", "hsdp", "xla", "tiles", "lowp", "mla",
                      "tpub", "ubpipe", "ep_overlap", "cp_torch", "wave_split", "te_quant",
                      "host_sync"})
_PARTS = ("compute_s", "recompute_s", "tp_exposed_s", "cp_exposed_s", "ep_exposed_s",
          "axonn_exposed_s", "overhead_s", "overlap_slowdown_s", "tp_hidden_s", "cp_hidden_s",
          "ep_hidden_s", "axonn_hidden_s")


def _placed(parallel):
    """The layout as `groups.stride` sees it: the AxoNN grid (tp = 1 when it is on) sits in
    TP's slot of the rank order (PAPERS.md section 4.1: X innermost, data parallel outside)."""
    return parallel.replace(tp=parallel.tp * grid_shards(parallel))


def _tp_collective_s(model, parallel, system, training):
    """One TP all-reduce of S = b (s/c) h q_a (with SP: RS + AG, same ring cost; the
    second call's fixed cost is added by `_layer_parts`)."""
    S = tp_message_bytes(model, parallel, training)
    return all_reduce_s(S, parallel.tp, stride(_placed(parallel), "tp"), system)


# Rows of `workload.flops.layer_ops`' dense GEMMs that Megatron-Core's merged EP schedule
# runs in the MLP chunk (dense MLP up / down, routed experts up / down, shared experts up /
# down) and in the pre-dispatch chunk (QKV, output projection, router, MLA projections).
_MLP_ROWS = (0.0, 0.0, 1.0, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0)


def _ep_parts(model, parallel, system, training, windows, temperature):
    """(fwd exposed, fwd hidden, bwd exposed, bwd hidden) of the MoE token all-to-alls of one
    layer, one micro-batch: 2 forward + 2 backward (+2 under full recompute) of
    S = k C_f T_r h q_a over the ep ranks (PAPERS.md section 5.8). With ep_overlap > 0 they
    run as Megatron-Core's merged forward-backward schedule pairs them with the other
    micro-batch's compute (`schedule.overlap.ep_merged_1f1b_exposed_s`), a fraction
    ep_overlap of each phase's compute usable:

        windows = (A_f, M_f, M_b, A_b, M_b,w, A_b,w): pre-dispatch (attention, router,
                  permute) and MLP compute of the forward and the backward (GEMMs, attention
                  core, memory-bound kernels and quantization casts of each chunk:
                  workload.flops.ep_chunk_elementwise_bytes), and the weight-gradient GEMMs
                  of M_b and A_b, which run deferred: every Megatron-Bridge recipe that sets
                  `overlap_moe_expert_parallel_comm` sets `delay_wgrad_compute` with it
                  (v0.1.0rc3 scripts/performance/run_script.py, v0.2.0 utils/helpers.py
                  `set_moe_a2a_overlap_overrides`, v0.3.0-v0.6.0 utils/overrides.py
                  `_set_moe_a2a_overlap_overrides`); each less the TP communication already
                  hidden behind it (one GEMM cannot hide two collectives at once).
    Under full recompute (recompute = 2) the overlap is 0: Megatron-Core refuses the merged
    schedule there (TransformerConfig.__post_init__: "disable full recomputation when enabling
    overlap_moe_expert_parallel_comm"), so a framework that sets it runs such a layout
    without it (a search's row; `specs.validate.check_facts_act` refuses a given one)."""
    n_f, n_b = ep_a2a_per_layer(parallel)
    S = ep_a2a_bytes(model, parallel, training)
    s_ep = ep_stride(parallel, stride(_placed(parallel), "ep"))
    c = jnp.where(parallel.ep_dispatch > 0,
                  hierarchical_all_to_all_s(S, parallel.ep, s_ep, model.moe_topk,
                                            model.n_experts, system),
                  all_to_all_s(S, parallel.ep, s_ep, system))
    attn_f, mlp_f, mlp_b, attn_b, mlp_bw, attn_bw = windows
    c_x = (n_b - 2.0) * c
    _, fh, _, bh = ep_merged_1f1b_exposed_s(c, c_x, attn_f, mlp_f, mlp_b, attn_b,
                                            jnp.where(parallel.recompute == 2, 0.0,
                                                      parallel.ep_overlap), temperature,
                                            mlp_bw_s=mlp_bw, attn_bw_s=attn_bw)
    # The warm-up forwards and cool-down backwards of the schedule have no partner pass:
    # their all-to-alls are all exposed (schedule.overlap.ep_merged_unpaired_frac), so a
    # share 1 - u of the merged schedule's hidden time stays hidden (exactly 0 hidden, all
    # exposed, at ep_overlap = 0 as before).
    keep = 1.0 - ep_merged_unpaired_frac(parallel)
    fh, bh = keep * fh, keep * bh
    return 2.0 * c - fh, fh, 2.0 * c + c_x - bh, bh


def _cp_parts(model, parallel, system, training, attn, attn_bwd, temperature,
              features=FEATURES):
    """(fwd exposed, fwd hidden, bwd exposed, bwd hidden, fwd merge, bwd merge) seconds of
    the context parallelism of one layer, one micro-batch (PAPERS.md section 5.7): the K/V
    exchange by `cp_ring`,

        ring (1):       c - 1 steps of S_blk each behind one block's attention (attention / c);
                        backward: 2 S_blk per step (K, V and dK, dV) behind attention_bwd / c
        all-gather (0): AG(S) behind the forward attention; AG(S) + RS(S) behind the backward
    or, under `Training.cp_torch`, PyTorch's experimental context parallel (`cp_torch_s`),
    whose fp32 merging is the two merge terms (memory-bound, on the compute stream; 0 without
    the fact). Full recompute re-runs the forward exchange inside the backward. Without the
    "cp_torch" feature (`features_of`: every training.cp_torch is 0) `cp_torch_s` is not
    traced: its blend weight is exactly 0 and its merges are 0 bytes."""
    c, s_cp = parallel.cp, stride(_placed(parallel), "cp")
    blk = cp_ring_block_bytes(model, parallel, training)
    steps = cp_ring_steps(parallel)
    rf, rfh = ring_exposed_s(ring_step_s(blk, c, s_cp, system), steps, attn / c, temperature)
    rb, rbh = ring_exposed_s(ring_step_s(2.0 * blk, c, s_cp, system), steps, attn_bwd / c,
                             temperature)
    c_ag = all_gather_s(cp_kv_bytes(model, parallel, training), c, s_cp, system)
    af, afh = split_exposed(c_ag, attn, temperature)
    ab, abh = split_exposed(2.0 * c_ag, attn_bwd, temperature)
    ring = parallel.cp_ring
    f, fh = ring * rf + (1.0 - ring) * af, ring * rfh + (1.0 - ring) * afh
    b, bh = ring * rb + (1.0 - ring) * ab, ring * rbh + (1.0 - ring) * abh
    if "cp_torch" in features:
        tf, tfh, tb, tbh, m_f, m_b = cp_torch_s(model, parallel, system, training, attn,
                                                attn_bwd, temperature)
        pt = jnp.where(training.cp_torch > 0, 1.0, 0.0)
        f, fh = pt * tf + (1.0 - pt) * f, pt * tfh + (1.0 - pt) * fh
        b, bh = pt * tb + (1.0 - pt) * b, pt * tbh + (1.0 - pt) * bh
    else:
        m_f, m_b = _zeros(f, 2)
    full = full_frac(parallel)
    return f, fh, b + full * f, bh + full * fh, m_f, m_b


def cp_torch_s(model, parallel, system, training, attn, attn_bwd, temperature=None):
    """(fwd exposed, fwd hidden, bwd exposed, bwd hidden, fwd merge, bwd merge) seconds of one
    layer, one micro-batch, in PyTorch's experimental context parallel (`Training.cp_torch`;
    what the caller uses only where the fact is set):

        K_f = attention / c,  K_b = attention_bwd / c      (one step's SDPA: with the
              round-robin load balance every step of every rank does s^2 / (2 c^2) scores)
        forward   all-gather (cp_ring 0):  max(0, AG(S) - K_f)
                  ring (cp_ring 1):        (c - 1) max(0, P(S/c) - K_f)
        backward  all-gather:  max(0, AG(S) - K_b) + (c - 1) max(0, P(D) - K_b) + P(D)
                  ring:        (c - 1) max(0, P(S/c) + P(D) - K_b) + P(D)
        merges    M_f = B_f / (BW_hbm eta_mem),  M_b = B_b / (BW_hbm eta_mem)
    S = `workload.cp.cp_kv_bytes` with the a query heads (`cp_kv_heads`), D = the fp32 dK, dV
    block (`cp_torch_dkv_block_bytes`), P = one ring step (`costs.collectives.ring_step_s`),
    AG = `all_gather_s`, B_f, B_b = `cp_torch_merge_bytes`.
    Source: pytorch torch/distributed/tensor/experimental/_attention.py (a version after PR
    142093, 2024-12-05, as the rows' torch 1963fc8 is; the same loops at 0123248a, 2025):
    `_templated_ring_attention` issues the K/V exchange (`_AllGatherRotater`: one
    `all_gather_tensor` of the cat'ed K, V, issued at step 0 before its SDPA and waited at
    step 1; `_AllToAllRotater`: a `permute_tensor` per step, waited at the next) and runs c
    SDPA calls (step 0 causal over both local chunks, then non-causal on half of q or half of
    k); `_templated_ring_attention_backward` gathers K, V again with the same rotater and sends
    the fp32 dK, dV accumulator to the next rank after every step (always all-to-all: the one
    of step i hides behind step i + 1's SDPA backward, the last one is waited after the loop).
    The two-sided ring step is counted once per window (the first and last backward windows
    hold only one of the two in the ring form: a slight over-count).
    Example (Llama 3 8B, s 262144, c 8 in one Grand Teton H100 node, all-gather, the shipped
    H100 set): the forward all-gather of 4.3 GB (10.5 ms) and each backward's 1.07 GB fp32
    send (3.0 ms) hide behind one step's SDPA (30 / 78 ms); the last send is exposed, 3.0 ms
    per layer.
    """
    c, s_cp = parallel.cp, stride(_placed(parallel), "cp")
    steps = cp_ring_steps(parallel)
    k_f, k_b = attn / c, attn_bwd / c
    S = cp_kv_bytes(model, parallel, training)
    p_kv = ring_step_s(S / c, c, s_cp, system)
    p_d = ring_step_s(cp_torch_dkv_block_bytes(model, parallel, training), c, s_cp, system)
    ag = all_gather_s(S, c, s_cp, system)
    agf, agfh = split_exposed(ag, k_f, temperature)
    rf, rfh = ring_exposed_s(p_kv, steps, k_f, temperature)
    agb, agbh = split_exposed(ag, k_b, temperature)
    db, dbh = ring_exposed_s(p_d, steps, k_b, temperature)
    rb, rbh = ring_exposed_s(p_kv + p_d, steps, k_b, temperature)
    ring = parallel.cp_ring
    f, fh = ring * rf + (1.0 - ring) * agf, ring * rfh + (1.0 - ring) * agfh
    b = ring * rb + (1.0 - ring) * (agb + db) + p_d
    bh = ring * rbh + (1.0 - ring) * (agbh + dbh)
    b_f, b_b = cp_torch_merge_bytes(model, parallel, training)
    return f, fh, b, bh, memory_time_s(b_f, system), memory_time_s(b_b, system)


def _axonn_parts(model, parallel, system, training, dense_rows, fwd_window, bwd_window,
                 temperature):
    """(fwd exposed, fwd hidden, bwd exposed, bwd hidden, forward calls) of AxoNN's grid
    collectives of one layer, one micro-batch (PAPERS.md sections 4.2-4.3; all 0 without the
    grid). The dW GEMM of each linear (same FLOPs as its forward GEMM) hides its dX
    all-reduce; full recompute re-runs the forward's collectives. `dense_rows`: the layer's
    weight-gradient GEMM times, one per row (`costs.compute.layer_pass_gemm_times_s`)."""
    vol = axonn_layer_volumes(model, parallel, training)
    t = axonn_times_s(vol, parallel, stride(_placed(parallel), "tp"), system)
    dw = dense_rows[:4]
    fwd_ar = t["x_forward"] + t["y_forward"]
    full = full_frac(parallel)
    f, fh, b, bh = axonn_exposed_s(
        fwd_ar, jnp.sum(t["z_gather"]), t["x_backward"] + t["y_backward"],
        jnp.sum(t["z_scatter"]) + full * jnp.sum(t["z_gather"]), dw, fwd_window, bwd_window,
        parallel.axonn_overlap, temperature)
    calls = jnp.sum(jnp.where(vol.x_forward + vol.y_forward > 0, 1.0, 0.0)
                    + jnp.where(vol.z_gather > 0, 1.0, 0.0))
    return f, fh, b + full * jnp.sum(fwd_ar), bh, calls


def features_of(model, parallel, training=None) -> frozenset:
    """The FEATURES whose terms can be non-zero for these specs (batched leaves allowed):

        ep: an MoE model and some ep > 1 (token all-to-alls)   cp: some cp > 1 (K/V exchange)
        axonn: some gx gy gz > 1 (grid collectives)  experts: some moe_experts > 0
        hsdp: some zero_shard > 0 (ZeRO shard groups smaller than the DP group, replicas)
        xla: training.xla_compiled = 1 (one XLA program: memory/xla.py, workload/xla.py)
        tiles: training.attn_tile > 0 (full and window attention kernels tile by tile)
        lowp: some dense GEMM pass in low precision (training.lowp_fprop, lowp_dgrad or
              lowp_wgrad, with lowp_layer_frac, not 0: workload.flops.lowp_pass_fracs);
              without it the low-precision GEMM times are not computed
              (costs.compute.layer_pass_gemm_times_s)
        mla: some kv_lora_rank > 0 (multi-head latent attention: the MLA GEMM rows; without
             it, and without experts, those rows of workload.flops.DENSE_ROW_BLOCKS are not
             timed)
        tpub: some parallel.tp_userbuffers > 0 (TE userbuffers TP overlap:
              `_tp_userbuffers_parts`)
        ubpipe: some parallel.tp_userbuffers = 2 (the forward reduce-scatters as TE 1.8's
              pipelined overlap: `schedule.overlap.tp_pipeline_rs_s`)
        ep_overlap: some parallel.ep_overlap != 0 (Megatron-Core's merged EP schedule: the
             chunk windows of `_ep_parts`; without it every window is multiplied by
             ep_overlap = 0 and they are not computed)
        cp_torch: some training.cp_torch != 0 (PyTorch's experimental CP, `cp_torch_s`)
        wave_split: some training.gemm_wave_split != 0 (`schedule.overlap.overlap_sigma`,
             `tp_userbuffers_sigmas`; without it every sigma is exactly sigma_0)
        te_quant: lowp and some training.lowp_te_quantizer != 0 (Transformer Engine's
             per-row quantize counts, `workload.flops.te_quantize_rows`; without it the
             generic count, which the rows equal at lowp_te_quantizer = 0)
        host_sync: experts and some training.moe_host_sync != 0 (the MoE layer's forward
             as two host regions, `schedule.overlap.host_sync_regions_s`; without it the one
             smooth max, which is what the program computes at moe_host_sync = 0 too)
    training None: the default Training() (xla_compiled = 0, attn_tile = 0, every lowp pass
    0, cp_torch = 0, gemm_wave_split = 0, lowp_te_quantizer = 0, moe_host_sync = 0).
    Every feature when a leaf is traced (values unknown). Leaving a feature out when its
    terms are 0 changes no result: each of them is multiplied by a size-1-group factor of
    exactly 0 (collectives.*: `active`), or is a group with no parameters.
    """
    xla = 0.0 if training is None else training.xla_compiled
    tile = 0.0 if training is None else training.attn_tile
    cp_torch = 0.0 if training is None else training.cp_torch
    wave = 0.0 if training is None else training.gemm_wave_split
    te_q = 0.0 if training is None else training.lowp_te_quantizer
    h_sync = 0.0 if training is None else training.moe_host_sync
    passes = (0.0, 0.0, 0.0, 0.0) if training is None else (
        training.lowp_fprop, training.lowp_dgrad, training.lowp_wgrad, training.lowp_layer_frac)
    leaves = (parallel.ep, parallel.cp, parallel.gx, parallel.gy, parallel.gz, model.n_experts,
              parallel.zero_shard, model.kv_lora_rank, parallel.tp_userbuffers, parallel.ep_overlap,
              xla, tile, cp_torch, wave, te_q, h_sync, *passes)
    if any(isinstance(x, jax.core.Tracer) for x in leaves):
        return FEATURES
    f, d, w, frac = (np.abs(np.asarray(x, float)) for x in passes)
    lowp = bool(np.any((np.maximum(np.maximum(f, d), w) * frac) != 0))
    big = lambda x: bool(np.any(np.asarray(x) > 1))  # noqa: E731
    experts = bool(np.any(np.asarray(model.n_experts) > 0))
    nonzero = lambda x: bool(np.any(np.asarray(x) != 0))  # noqa: E731
    on = {"ep": experts and big(parallel.ep), "cp": big(parallel.cp),
          "ep_overlap": nonzero(parallel.ep_overlap), "cp_torch": nonzero(cp_torch),
          "wave_split": nonzero(wave), "te_quant": lowp and nonzero(te_q),
          "host_sync": experts and nonzero(h_sync),
          "axonn": big(parallel.gx) or big(parallel.gy) or big(parallel.gz), "experts": experts,
          "hsdp": bool(np.any(np.asarray(parallel.zero_shard) > 0)),
          "xla": bool(np.any(np.asarray(xla) > 0)), "tiles": bool(np.any(np.asarray(tile) > 0)),
          "lowp": lowp, "mla": bool(np.any(np.asarray(model.kv_lora_rank) > 0)),
          "tpub": bool(np.any(np.asarray(parallel.tp_userbuffers) > 0)),
          "ubpipe": bool(np.any(np.asarray(parallel.tp_userbuffers) == 2))}
    return frozenset(k for k, v in on.items() if v)


def _zeros(like, n):
    return tuple(jnp.zeros_like(like) for _ in range(n))


def _tp_host_sync_s(parallel, n_f, n_b, e):
    """(forward, backward) host-side time of one layer's TP collectives beyond their launch:

        t_sync = n_calls (t - 1) tau_peer        (0 for t = 1)

    n_calls = the layer's TP NCCL calls: its all-reduce equivalents (`tp_collectives_per_layer`:
    2 forward, 2 backward, + 2 recomputed under full recompute), each one call, or two with
    sequence parallelism (`tp_calls_per_all_reduce`: reduce-scatter + all-gather), t the TP
    group size, tau_peer = `host_coll_peer_s`.
    Each Megatron TP all-reduce is a barrier of the t ranks of the group, issued from t host
    processes (NCCL enqueue and the proxy/progress work that scales with the ring's t - 1
    peers): when the layer is host-bound (small layers, as in the vTrain single-node runs) the
    GPUs stall at every all-reduce until the slowest of the t hosts has issued it, so the
    per-call host cost grows with the number of peers. It sits on the host side of the
    layer's floor (combined with the GPU time by the smooth max), so it costs nothing when
    the GPU work per layer is long (large models). Source: PAPERS.md 5.11 (host floor per
    layer pass); DESIGN.md (vTrain per-layer floor of ~3.5 ms at t <= 4 and ~5 ms at t = 8
    in one node) [D, fitted].
    """
    peers = jnp.maximum(parallel.tp - 1.0, 0.0) * tp_calls_per_all_reduce(parallel)
    return n_f * peers * e.host_coll_peer_s, n_b * peers * e.host_coll_peer_s


def _tp_userbuffers_parts(model, parallel, system, training, ops, fprop_rows, dgrad_rows,
                          wgrad_rows, n_b, mlp_again, lowp, temperature, pipe=False):
    """(fwd exposed, fwd hidden, bwd exposed, bwd hidden, bwd hidden in bulk overlaps) TP
    seconds of one layer, one micro-batch, under Parallel.tp_userbuffers: the attention block
    (QKV = GEMM row 0, output projection = row 1) and the MLP block (up = row 2, down = row
    3) each as `schedule.overlap.tp_userbuffers_block_s` prices it, at the sizes of
    `workload.tp.tp_ub_message_bytes`; the MXFP8 column-wise re-gather of the output gradient
    (AG_w) where the backward's quantization is block-scaled (lowp_block > 0 with lowp_dgrad:
    a row-scaled gradient cannot serve the wgrad GEMM); the blocking NCCL all-gather of the
    block scales before each userbuffers all-gather of a block-scaled tensor
    (`workload.tp.tp_ub_scale_bytes`; a ring collective on the TP group, in the lowp_layer_frac
    of the layers whose pass is quantized): exposed before the forward ring (1 per block) and
    before the backward's ring and bulk re-gather (2 per block); AG_w's waits on the dgrad
    send stream and runs before AG_w, beside the last dgrad chunk (TE linear.py
    `bulk_overlap_ag_with_external_gemm` path); the forward's collectives again for every
    recomputed forward: both blocks for each all-reduce-equivalent pair that full recompute
    (or per-op SAC) adds to the backward ((n_b - 2) / 2; n_b without Megatron's "mlp"
    recompute, which `_layer_parts` adds after this call), the MLP block for
    Megatron's recompute "mlp" (mlp_again: the dense layers' share), at the blocks' forward
    exposed and hidden seconds.
    The ring-exchange GEMMs (the four fprops, the row dgrads) run as t GEMMs of m / t token
    rows each: each chunk is timed at its own shape (`costs.compute.layer_pass_gemm_times_s`,
    the efficiency curve at m / t), and what the t chunks take beyond the whole GEMM is
    counted with the exposed seconds (forward: the fprops, backward: the row dgrads).
    pipe (static; FEATURES "ubpipe"): where tp_userbuffers = 2 the row-parallel fprops' reduce-
    scatters run as TE 1.8's pipelined overlap of NeMo Framework Launcher 24.07's H100 FP8
    configuration (`schedule.overlap.tp_pipeline_rs_s`): the GEMM as UB_PIPE_SPLITS chunks of
    1/n of its output columns (each timed at its own shape), on the SMs the comm kernel leaves
    (x sm / (sm - num_sm), set_sm_margin: TE `_math_sms`); the reduce-scatter moves the
    quantized output (fp8_buf: the uint8 userbuffer, so the all-gather's bytes S_ag,f) and sums
    in its kernel (no reduction R); the chunked GEMM's time beyond the whole GEMM is exposed."""
    t = parallel.tp
    s_f, s_b, s_rs = tp_ub_message_bytes(model, parallel, training)
    # ring all-gathers and the reduce-scatter on the one TP group (costs.collectives.
    # all_gather_s / reduce_scatter_s: one ring phase each)
    group = ring_group(t, stride(_placed(parallel), "tp"), system)
    ag_f, ag_b, rs = (ring_phase_s(group, x, 1.0, 1.0) for x in (s_f, s_b, s_rs))
    block = jnp.where((training.lowp_block > 0) & (training.lowp_dgrad > 0), 1.0, 0.0)
    red = memory_time_s(tp_ub_reduce_bytes(model, parallel, training, s_rs), system)
    # block scales: one NCCL all-gather per userbuffers all-gather of a block-scaled tensor
    s_sc = tp_ub_scale_bytes(model, parallel, training)
    sc = jnp.where(s_sc > 0, ring_phase_s(group, s_sc, 1.0, 1.0), 0.0) * \
        training.lowp_layer_frac
    sc_f = jnp.where(training.lowp_fprop > 0, sc, 0.0)
    sc_b = jnp.where(training.lowp_dgrad > 0, sc, 0.0)
    # the first four rows (QKV, proj, MLP up, MLP down) at m / t tokens: one chunk each
    n_rows = ops.dense.m.shape[0]
    split = jnp.asarray([1.0] * 4 + [0.0] * (n_rows - 4)).reshape(
        (n_rows,) + (1,) * (ops.dense.m.ndim - 1))
    chunked = ops.dense.replace(m=ops.dense.m / (1.0 + split * (t - 1.0)))
    f_c, d_c, _ = layer_pass_gemm_times_s(ops.replace(dense=chunked), system, training,
                                          temperature, lowp, ((0, 4),))
    f_c, d_c = t * f_c, t * d_c
    # the two blocks at once: column rows 0, 2 and row-parallel rows 1, 3 on axis 0
    col, row = slice(0, 4, 2), slice(1, 4, 2)
    row_extra = f_c[row] - fprop_rows[row]
    pipe_args = None
    if pipe:
        on = jnp.where(parallel.tp_userbuffers == 2, 1.0, 0.0)
        cut = jnp.asarray([0.0, 1.0, 0.0, 1.0] + [0.0] * (n_rows - 4)).reshape(split.shape)
        sliced = ops.dense.replace(n=ops.dense.n / (1.0 + cut * (UB_PIPE_SPLITS - 1.0)))
        f_p, _, _ = layer_pass_gemm_times_s(ops.replace(dense=sliced), system, training,
                                            temperature, lowp, ((0, 4),))
        # the GEMM chunks on the SMs the comm kernels leave (System.gpu_sms)
        margin = ub_pipe_sm_margin(system.gpu_sms).reshape((2,) + (1,) * (f_p.ndim - 1))
        f_p = UB_PIPE_SPLITS * margin * f_p[row]
        e_p, h_p = tp_pipeline_rs_s(ag_f, f_p, UB_PIPE_SPLITS, temperature)
        pipe_args = (on, e_p, h_p)
        row_extra = jnp.where(on > 0, f_p - fprop_rows[row], row_extra)
    f, fh, b, bh, bulk = tp_userbuffers_block_s(
        ag_f, ag_b, rs, block * (sc_b + ag_b), red, f_c[col], f_c[row], dgrad_rows[col],
        wgrad_rows[col], d_c[row], t, temperature, pipe_args)
    # per block: the chunked GEMMs' time beyond the whole GEMMs', the exposed scale gathers
    f = f + (f_c[col] - fprop_rows[col]) + row_extra + sc_f
    b = b + (d_c[row] - dgrad_rows[row]) + sc_b + sc_f
    # recomputed forwards: both blocks per full-recompute pair, the MLP block (index 1) for
    # Megatron's recompute "mlp"
    both = jnp.maximum(n_b - 2.0, 0.0) / 2.0
    f_s, fh_s, b_s, bh_s, bulk_s = (jnp.sum(x, axis=0) for x in (f, fh, b, bh, bulk))
    return (f_s, fh_s, b_s + both * f_s + mlp_again * f[1],
            bh_s + both * fh_s + mlp_again * fh[1], bulk_s)


def _layer_parts(model, parallel, system, training, temperature, features=FEATURES):
    """Named seconds of one layer, one micro-batch, forward + backward (+ recompute), and
    the (forward, backward) windows left for the DP / ZeRO collectives:

        free_f = max(t_f - hidden_f, 0),   free_b = max(t_b - hidden_b, 0)
    the layer's time less the TP, CP, EP and AxoNN communication already hidden in it: a GPU
    runs one NCCL kernel at a time (Megatron-LM sets CUDA_DEVICE_MAX_CONNECTIONS=1 so that
    its communication kernels are issued in order), so two collectives cannot hide behind the
    same compute [D]."""
    e = system.eff
    ops = layer_ops(model, parallel, training)
    attn_io = attention_io_bytes(model, parallel, training)
    # query rows R: the two-factor attention efficiency's and the sink gradient's
    q_rows = query_rows(model, parallel)
    _, attn, other = layer_times_s(ops, system, training, attn_io, temperature, q_rows)
    # attn_tile > 0: full and sliding-window layers as their own kernels, tile by tile
    # (costs.compute.attention_by_kind_time_s); 0 keeps the mean layer's one kernel exactly.
    # The backward kernel's time per unit of forward work (the forward's, unless the run ran
    # FlashAttention-2 on a GPU with a published FA2 rate: costs.compute.
    # attention_kernel_factor), the same way.
    attn_b1 = attention_time_s(ops.attention, system, training, attn_io, temperature,
                               backward=True, rows=q_rows)
    if "tiles" in features:
        kinds = attention_by_kind(model, parallel, training)
        attn = jnp.where(training.attn_tile > 0, attention_by_kind_time_s(
            kinds, system, training, attn_io, temperature, rows=q_rows), attn)
        attn_b1 = jnp.where(training.attn_tile > 0, attention_by_kind_time_s(
            kinds, system, training, attn_io, temperature, backward=True, rows=q_rows), attn_b1)
    # Dense GEMM rows of the forward (fprop) and of the backward's two GEMMs (dgrad, wgrad):
    # each at its own precision (16-bit presets: dgrad = wgrad = fprop, dense_b = 2 dense).
    lowp = "lowp" in features
    rows = tuple((a, b) for a, b, f in DENSE_ROW_BLOCKS if f is None or f in features)
    rows = None if len(rows) == len(DENSE_ROW_BLOCKS) else rows
    dense_rows, dgrad_rows, wgrad_rows = layer_pass_gemm_times_s(ops, system, training,
                                                                 temperature, lowp, rows)
    dense, dense_b = layer_dense_times_s(ops, system, training, temperature, lowp, rows)
    # Low precision: the quantization kernels of the layer's inputs, output gradients and
    # weights (0 for 16-bit presets; costs.compute.lowp_quantize_times_s).
    # Under Training.lowp_te_quantizer each row at Transformer Engine's own count.
    te_rows = (te_quantize_rows(model, parallel, training, system)
               if "te_quant" in features else None)
    quant_f, quant_b = lowp_quantize_times_s(ops.dense, system, training,
                                             parallel.n_microbatches, te_rows)
    n_f, n_b = tp_collectives_per_layer(parallel)
    # An MoE layer whose experts are not TP-split has no TP collectives around its MLP: half
    # of them (workload.ep.moe_mlp_on_tp; the attention's pair stays).
    mlp_share = 0.5 * (1.0 + moe_mlp_on_tp(model, parallel))
    n_f, n_b = n_f * mlp_share, n_b * mlp_share
    # Megatron's recompute_mlp re-runs the dense layers' checkpointed MLP with its TP pair
    # (the SP all-gather in front of fc1 and fc2's reduce-scatter, or fc2's all-reduce): one
    # all-reduce equivalent more in the backward of the 1 - phi dense layers
    # (transformer_layer.py _forward_mlp: tensor_parallel.checkpoint / te_checkpoint of
    # self.mlp, whose forward holds the collectives; workload.recompute).
    modules = megatron_module_fracs(parallel)  # Megatron's selective recompute_modules
    mlp_again = modules["mlp"] * (1.0 - moe_layer_fraction(model))
    n_b_pairs = n_b  # the recomputed forwards' pairs, without "mlp" (_tp_userbuffers_parts)
    n_b = n_b + mlp_again
    # With SP each all-reduce equivalent is two calls of the same ring cost: one more t0.
    calls = tp_calls_per_all_reduce(parallel)
    tp_on = jnp.where(parallel.tp > 1, 1.0, 0.0)
    c_tp = _tp_collective_s(model, parallel, system, training) + (
        (calls - 1.0) * tp_on * e.coll_base_s)
    tp_f, tp_fh = split_exposed(n_f * c_tp, parallel.tp_overlap * dense, temperature)
    tp_b, tp_bh = split_exposed(n_b * c_tp, parallel.tp_overlap * dense_b, temperature)
    ub_on, ub_bulk = 0.0, 0.0
    if "tpub" in features:
        # Transformer Engine's userbuffers overlap (Parallel.tp_userbuffers): each TP block's
        # ring exchanges and bulk overlaps beside its own GEMMs (_tp_userbuffers_parts), with
        # sequence parallelism only: Megatron-Bridge's CommOverlapConfig turns the overlap off
        # without it (a search's row; specs.validate.check_facts_act refuses a given one)
        ub_on = jnp.where((parallel.tp_userbuffers > 0) & (parallel.sequence_parallel > 0),
                          1.0, 0.0)
        ub = _tp_userbuffers_parts(model, parallel, system, training, ops, dense_rows,
                                   dgrad_rows, wgrad_rows, n_b_pairs, mlp_again, lowp,
                                   temperature, "ubpipe" in features)
        tp_f, tp_fh, tp_b, tp_bh = (jnp.where(ub_on > 0, u, o) for u, o in
                                    zip(ub[:4], (tp_f, tp_fh, tp_b, tp_bh)))
        ub_bulk = ub_on * ub[4]
    # Attention backward: 2 x forward, + the recomputed scores of flash attention (0.5 x),
    # at the backward kernel's rate (attn_b1 above).
    attn_bwd = (2.0 + (FLASH_BACKWARD_WORK - 2.0) * training.flash_attention) * attn_b1
    # + the learned sinks' gradient in the fused backward (a few scalar ops; 0 without sinks or
    # where the GPU's cost is not measured: costs.compute.attention_sink_backward_s)
    attn_bwd = attn_bwd + attention_sink_backward_s(q_rows, model.attention_sinks, system,
                                                    training)
    cp_f, cp_fh, cp_b, cp_bh, cpm_f, cpm_b = (
        _cp_parts(model, parallel, system, training, attn, attn_bwd, temperature, features)
        if "cp" in features else _zeros(attn, 6))
    if "ep" in features and "ep_overlap" in features:
        # the merged EP schedule's compute chunks (A_f, M_f, M_b, A_b), less hidden TP
        mlp = jnp.asarray(_MLP_ROWS)
        mlp_f = jnp.sum(mlp * dense_rows)
        mlp_b = jnp.sum(mlp * (dgrad_rows + wgrad_rows))
        attn_f, attn_b = dense - mlp_f + attn, dense_b - mlp_b + attn_bwd
        # ... and the chunks' memory-bound kernels and quantization casts, which run on the
        # same compute stream (workload.flops.ep_chunk_elementwise_bytes; the combine node's
        # unpermute and residual add run on the communication stream: in no window). The
        # element-wise backward is 2 x forward less the bytes moved once, as below.
        e_a, e_m, once_a, once_m = ep_chunk_elementwise_bytes(model, parallel, training)
        q_mf, q_mb = lowp_quantize_times_s(ops.dense.replace(count=ops.dense.count * mlp),
                                           system, training, parallel.n_microbatches, te_rows)
        mlp_f = mlp_f + memory_time_s(e_m, system) + q_mf
        mlp_b = mlp_b + memory_time_s(2.0 * e_m - once_m, system) + q_mb
        attn_f = attn_f + memory_time_s(e_a, system) + (quant_f - q_mf)
        attn_b = attn_b + memory_time_s(2.0 * e_a - once_a, system) + (quant_b - q_mb)
        free_f = 1.0 - tp_fh / jnp.maximum(attn_f + mlp_f, 1e-30)
        free_b = 1.0 - tp_bh / jnp.maximum(attn_b + mlp_b, 1e-30)
        # Megatron-Bridge turns the overlap on with delay_wgrad_compute: the weight-gradient
        # GEMMs of each chunk run after its dgrad, waited for by no all-to-all.
        mlp_bw = jnp.sum(mlp * wgrad_rows)
        attn_bw = jnp.sum((1.0 - mlp) * wgrad_rows)
        windows = (free_f * attn_f, free_f * mlp_f, free_b * mlp_b, free_b * attn_b,
                   free_b * mlp_bw, free_b * attn_bw)
        ep_f, ep_fh, ep_b, ep_bh = _ep_parts(model, parallel, system, training, windows,
                                             temperature)
    elif "ep" in features:
        # Without the "ep_overlap" feature every ep_overlap is 0 and `_ep_parts` multiplies
        # each window by it: zero windows give the same result without computing them.
        ep_f, ep_fh, ep_b, ep_bh = _ep_parts(model, parallel, system, training,
                                             _zeros(dense, 6), temperature)
    else:
        ep_f, ep_fh, ep_b, ep_bh = _zeros(dense, 4)
    ax_f, ax_fh, ax_b, ax_bh, ax_calls = (_axonn_parts(
        model, parallel, system, training, wgrad_rows, dense + attn, dense_b + attn_bwd,
        temperature) if "axonn" in features else _zeros(dense, 5))
    full = full_frac(parallel)
    sac = op_sac_frac(parallel)
    skipped = stacked = 0.0
    if "xla" in features:
        # XLA's remat does not re-run the GEMMs that end the layer (workload.xla).
        skipped = jnp.sum(dense_rows * remat_skipped_gemms(training))
        # XLA writes the layer scan's residuals in the forward and reads them in the backward.
        stacked = memory_time_s(stacked_pass_traffic_bytes(model, parallel, training), system)
    # Per-op SAC (workload.recompute): the recomputed share of each GEMM row, every
    # element-wise op, the quantization of the recomputed linears; the attention is saved.
    sac_gemm = jnp.sum(sac_recompute_fracs(model, parallel) * dense_rows)
    sac_share = sac_gemm / jnp.maximum(jnp.sum(dense_rows), 1e-30)
    # Megatron's selective recompute (workload.recompute): the modules' GEMM rows, the
    # quantization of their linears' inputs, their element-wise ops and (core_attn) the
    # attention core, each re-run once in the backward.
    sel_gemm = jnp.sum(megatron_recompute_rows(model, parallel) * dense_rows)
    sel_share = sel_gemm / jnp.maximum(jnp.sum(dense_rows), 1e-30)
    selective = (modules["core_attn"] * attn + sel_gemm + sel_share * quant_f
                 + memory_time_s(megatron_recompute_bytes(model, parallel, training), system))
    recompute = (full * (dense - skipped + attn + other + quant_f + cpm_f) + selective
                 + sac * (sac_gemm + other + sac_share * quant_f))
    # Element-wise backward = 2 x forward, less one pass of the ops whose backward moves
    # their bytes once (workload.flops.elementwise_backward_once_bytes; 0 by default).
    # The same for kernels: the QK-norm's copies run no backward kernel (2 x forward less
    # workload.flops.qk_norm_backward_excess_kernels, here and in the host's launches).
    k_once = qk_norm_backward_excess_kernels(model, parallel)
    once = (memory_time_s(elementwise_backward_once_bytes(model, parallel, training), system)
            + k_once * kernel_fixed_s(system, training))
    other_f, other_b = other + stacked, 2.0 * other - once + stacked
    hidden_f = tp_fh + cp_fh + ep_fh + ax_fh
    hidden_b = tp_bh + cp_bh + ep_bh + ax_bh
    # Compute lost per hidden communication second (schedule.overlap.overlap_sigma): sigma_0,
    # or with gemm_wave_split the GEMMs beside NCCL at half speed, g = the GEMMs' share of the
    # compute each collective hides behind: the layer's compute seconds (forward, backward
    # and their recomputed GEMMs) for the DP / ZeRO (predict_step), EP and AxoNN collectives;
    # the attention alone (g = 0: FlashAttention-class kernels, not persistent) for CP's
    # exchange (its window is the block attention, `_cp_parts`). TP's hidden seconds (its
    # window is tp_overlap x the GEMMs) as TE's userbuffers overlap runs them
    # (tp_userbuffers_sigmas): its GEMMs are sized to the SMs the comm kernels leave, or the
    # chunks move by copy engine, so no wave splits (sigma_0), except the backward's bulk
    # reduce-scatter beside the wgrad GEMM that Megatron-Bridge's H100 configurations run
    # without an SM margin (half the backward TP seconds at g = 1).
    gemm_s = dense + dense_b + full * (dense - skipped) + sel_gemm + sac * sac_gemm
    work_s = (dense + dense_b + attn + attn_bwd + other_f + other_b + recompute
              + quant_f + quant_b + cpm_f + cpm_b)
    s0 = e.overlap_slowdown
    if "wave_split" in features:
        split = training.gemm_wave_split
        sigma = overlap_sigma(s0, gemm_s / jnp.maximum(work_s, 1e-30), split)
        sigma_tp_f, sigma_tp_b = tp_userbuffers_sigmas(s0, split)
        sigma_cp = overlap_sigma(s0, 0.0, split)  # = sigma_0
        # (without the fact every sigma is sigma_0 and the differences are exactly 0)
        slow_f = sigma * hidden_f + (sigma_tp_f - sigma) * tp_fh + (sigma_cp - sigma) * cp_fh
        slow_b = sigma * hidden_b + (sigma_tp_b - sigma) * tp_bh + (sigma_cp - sigma) * cp_bh
        if "tpub" in features:
            # userbuffers: the ring exchanges move by copy engine (sigma_0), the bulk overlaps'
            # GEMMs take every SM beside the comm kernels (g = 1 under the wave split)
            slow_b = slow_b + ub_on * (s0 * (tp_bh - ub_bulk) + overlap_sigma(s0, 1.0, split)
                                       * ub_bulk - sigma_tp_b * tp_bh)
    else:  # every gemm_wave_split is 0: the block above reduces to sigma_0 exactly (the
        # userbuffers' bulk term is then s0 (tp_bh - bulk) + s0 bulk - s0 tp_bh = 0)
        sigma = s0 * jnp.ones_like(hidden_f)
        slow_f, slow_b = sigma * hidden_f, sigma * hidden_b
    gpu_f = (dense + attn + other_f + tp_f + cp_f + ep_f + ax_f
             + slow_f + quant_f + cpm_f)
    gpu_b = (dense_b + attn_bwd + other_b + recompute + tp_b + cp_b + ep_b + ax_b
             + slow_b + quant_b + cpm_b)
    is_moe = moe_layer_fraction(model)  # the mean layer's share of MoE layers
    kernels = (ops.n_kernels + tp_on * calls * n_f
               + jnp.where(parallel.ep > 1, 2.0 * is_moe, 0.0)  # dispatch, combine
               + 2.0 * parallel.cp_ring * cp_ring_steps(parallel)  # block attention + p2p
               # PyTorch's experimental CP: c SDPA calls and c - 1 merges in either form
               # (the ring form's c - 1 block attentions are the line above: + the merges)
               + ((2.0 - parallel.cp_ring) * cp_ring_steps(parallel) * jnp.where(
                   training.cp_torch > 0, 1.0, 0.0) if "cp_torch" in features else 0.0)
               + ax_calls)
    sync_f, sync_b = _tp_host_sync_s(parallel, n_f, n_b, e)
    # Quantization kernels (0 for 16-bit presets): the weights' casts once per step if cached.
    qk_f, qk_b, qk_w = lowp_quantize_kernels(ops.dense, training, te_rows)
    qk_f = qk_f + qk_w * jnp.where(training.lowp_weight_cache > 0,
                                   1.0 / parallel.n_microbatches, 1.0)
    sync_f = sync_f + qk_f * e.host_kernel_s
    sync_b = sync_b + (qk_b + (full + sac * sac_share + sel_share) * qk_f) * e.host_kernel_s
    # Transformer Engine's per-expert GEMM loop (Training.moe_expert_loop): the host launches
    # every local expert's GEMM, the GPU's serial chain (in ops.n_kernels) is shorter
    # (workload.flops.moe_expert_loop_kernels, counted once in layer_ops; 0 without the fact).
    launches = kernels + ops.extra_launches
    # One XLA program has no host work per layer or kernel (the step is enqueued as a whole).
    eager = 1.0 - training.xla_compiled
    host_f = eager * (launches * e.host_kernel_s + e.host_layer_s + sync_f)
    # Full recompute re-runs the layer's forward inside the backward: one more layer pass on
    # the host, plus the checkpoint's own bookkeeping (RNG state, rebuilding the graph). Per-op
    # SAC re-runs the forward through its policy too (saved ops return their cached output).
    again = full + sac
    host_b = eager * (((2.0 + again) * launches - k_once) * e.host_kernel_s
                      + (1.0 + again) * e.host_layer_s
                      + again * e.host_recompute_s + sync_b)
    t_f = pnorm_max(gpu_f, host_f, e.floor_pnorm)
    t_b = pnorm_max(gpu_b, host_b, e.floor_pnorm)
    if "host_sync" in features:
        # Training.moe_host_sync: the MoE layer's forward blocks the host once before the
        # token dispatch (Megatron-Core 0.14-0.17's dropless dispatchers; docs/accuracy-
        # bridge.md "Session 15: host syncs inside the MoE layer"), so the forward is two
        # regions (schedule.overlap.host_sync_regions_s): after the sync the GPU has only the
        # dispatch and the routed experts' forward (their GEMMs and quantization, priced as
        # above; the dispatch as half of the forward's exposed all-to-all time) to hide the
        # host's launches of that stretch behind: the dispatch, every expert GEMM launch
        # (2 phi grouped GEMMs, + 2 phi (E_l - 1) under moe_expert_loop: workload.flops.
        # moe_expert_loop_kernels) and the experts' forward quantize kernels, x
        # host_kernel_s. The backward pass has no sync of its own (the dispatchers reuse the
        # forward's host split sizes / handle), but full recompute re-runs the layer's forward,
        # dispatcher and sync included, inside the backward (Megatron-Core's
        # tensor_parallel.checkpoint of the whole TransformerLayer): the backward is then two
        # regions too, the recomputed one full x (G_r, H_r) (its all-to-all and GEMMs are in
        # gpu_b: _ep_parts' b + full f, recompute's full x dense; its launches in host_b's
        # again x launches). At full = 0 M(0, 0) = 0 and t_b is the one max exactly.
        # Not priced: under ep_overlap the merged schedule issues the paired micro-batch's
        # expert backward after the sync too (its GEMMs and launches join the region); per-op
        # SAC's re-run forward (TorchTitan, not a Megatron dispatcher) keeps the one max.
        ex = jnp.asarray(EXPERT_ROWS)
        x_rows = ops.dense.replace(count=ops.dense.count * ex)
        q_xf, _ = lowp_quantize_times_s(x_rows, system, training, parallel.n_microbatches,
                                        te_rows)
        qk_xf = lowp_quantize_kernels(x_rows, training, te_rows)[0]
        gpu_r = 0.5 * ep_f + jnp.sum(ex * dense_rows) + q_xf
        host_r = eager * e.host_kernel_s * (
            jnp.where(parallel.ep > 1, is_moe, 0.0) + 2.0 * is_moe
            + moe_expert_loop_kernels(model, parallel, training)[1] + qk_xf)
        t_f = jnp.where(training.moe_host_sync > 0,
                        host_sync_regions_s(gpu_f, host_f, gpu_r, host_r, e.floor_pnorm), t_f)
        t_b = jnp.where(training.moe_host_sync > 0, host_sync_regions_s(
            gpu_b, host_b, full * gpu_r, full * host_r, e.floor_pnorm), t_b)
    parts = dict(compute_s=(dense + dense_b + attn + attn_bwd + 3.0 * other - once
                            + 2.0 * stacked
                            + quant_f + quant_b + cpm_f + cpm_b),
                 recompute_s=recompute,
                 tp_exposed_s=tp_f + tp_b, cp_exposed_s=cp_f + cp_b, ep_exposed_s=ep_f + ep_b,
                 axonn_exposed_s=ax_f + ax_b,
                 overhead_s=(t_f - gpu_f) + (t_b - gpu_b),
                 overlap_slowdown_s=slow_f + slow_b, overlap_sigma=sigma,
                 tp_hidden_s=tp_fh + tp_bh, cp_hidden_s=cp_fh + cp_bh, ep_hidden_s=ep_fh + ep_bh,
                 axonn_hidden_s=ax_fh + ax_bh)
    return parts, jnp.maximum(t_f - hidden_f, 0.0), jnp.maximum(t_b - hidden_b, 0.0)


def _head_parts(model, parallel, system, training, temperature):
    """(first-stage extra, last-stage extra) named seconds per micro-batch: the embedding
    (lookup and its gradient, one TP all-reduce) and the output layer with the loss
    (logits GEMM forward + 2 x backward, fp32 loss traffic, one TP all-reduce)."""
    head = head_ops(model, parallel, training)
    logits = gemms_time_s(head.logits, system, training, system.eff.mm_max,
                          system.eff.mm_half_dim, temperature)
    k_s = kernel_fixed_s(system, training)
    loss = memory_time_s(head.loss_bytes, system) + 3.0 * k_s
    emb = memory_time_s(head.embedding_bytes, system) + k_s
    c_tp = _tp_collective_s(model, parallel, system, training)
    zero = jnp.zeros_like(logits)
    first = {k: zero for k in _PARTS} | dict(compute_s=2.0 * emb, tp_exposed_s=c_tp)
    # each MTP module computes its own logits and loss with the shared output layer
    mtp = 1.0 + model.mtp_layers
    last = {k: zero for k in _PARTS} | dict(compute_s=mtp * (3.0 * logits + 2.0 * loss),
                                            tp_exposed_s=mtp * c_tp)
    return first, last


def _exposed_sum(parts):
    return sum(parts[k] for k in _PARTS if not k.endswith("hidden_s"))


def _dp_groups(model, parallel, stages, features=FEATURES):
    """(P, groups, n_stage): P = the stage's parameters, n_stage = its layers, groups =
    [(stage params, layer params, group size, stride)] of the weights reduced together:
    dense weights over the d x c ranks that hold them (PAPERS.md section 3.5: CP ranks hold
    the same weights), routed experts over the d c / e expert-data-parallel ranks (section 5.8;
    ep is the innermost part of dp, so their dp members are e dp-strides apart). The stage
    is the candidate stage with the most parameters (`workload.stages.pipeline_stages`), its
    expert parameters those of the same stage (`workload.stages.at_largest`: a gradient that
    stays finite where candidates tie, as at p = 1)."""
    params = stage_params_per_device(model, parallel, stages)
    pick = at_largest(params)
    P = pick(params)
    P_e = stage_expert_params_per_device(model, parallel, pick(stages.layers))
    layer_P = layer_params_per_device(model, parallel)
    layer_P_e = stage_expert_params_per_device(model, parallel, 1.0)
    placed = _placed(parallel)
    s_dp, s_cp = stride(placed, "dp"), stride(placed, "cp")
    n_d, s_d = product_group(parallel.dp, s_dp, parallel.cp, s_cp)
    n_e, s_e = product_group(parallel.dp / parallel.ep, s_dp * parallel.ep, parallel.cp, s_cp)
    # etp > 0: Megatron-Core's expert ranks t_e x e x N_e over the t c d ranks (tp-ep-dp):
    # the expert-data-parallel copies are t_e e ranks apart (workload.ep.expert_dp_degree).
    n_e = jnp.where(parallel.etp > 0, expert_dp_degree(parallel), n_e)
    s_e = jnp.where(parallel.etp > 0, expert_tp(parallel) * parallel.ep, s_e)
    groups = [(P - P_e, layer_P - layer_P_e, n_d, s_d), (P_e, layer_P_e, n_e, s_e)]
    return P, groups if "experts" in features else groups[:1], pick(stages.layers)


def _sharded_reduce_s(shard, repl, n_shard, grad_bytes):
    """Seconds of a sharded gradient reduction (ZeRO >= 1, HSDP): a ring reduce-scatter of
    `grad_bytes` over the shard group, then a ring all-reduce of the 1/n_shard shard across
    its replicas (`workload.dp.zero_groups`; PAPERS.md section 5.5)."""
    return (ring_phase_s(shard, grad_bytes, 1.0, 1.0)
            + ring_phase_s(repl, grad_bytes / n_shard, 2.0, 2.0))


def _dp_times(model, parallel, system, training, stages=None, features=FEATURES) -> dict:
    """Seconds of the data-parallel collectives of one device, summed over `_dp_groups`:

        reduce_s   gradients of the stage: AR over the d c ranks (ZeRO 0), or RS over the
                   ZeRO shard group + AR of the 1/g shard across its replicas (ZeRO >= 1)
        gather_s   parameters of the stage: AG over the shard group (after a ZeRO-1/2 step)
        layer_gather_s, layer_reduce_s   one layer's ZeRO-3 AG of its weights and RS of its
                   gradients (+ the replicas' AR under HSDP), in zero3_calls_per_layer calls
        prefetch   `workload.dp.zero3_prefetch_frac` of the dense layer
        P, own     parameters of the largest stage; those whose optimizer state this rank
                   holds (sharded over the shard group under ZeRO >= 1)
        copy_out_s, rs_copy_in_s   FSDP2's copy-out / copy-in of one layer's parameters
        root       the dense group's parameters outside the layers (`workload.dp.
                   root_unit_params`); root_gather_s, root_reduce_s their AG and RS (+ AR);
                   root_s = `schedule.overlap.zero3_root_unit_s` (with their copies)
    Groups and volumes: PAPERS.md section 5.5; shard and replica groups `workload.dp.zero_groups`.
    """
    stages = pipeline_stages(model, parallel) if stages is None else stages
    P, groups, n_stage = _dp_groups(model, parallel, stages, features)
    t = dict(reduce_s=0.0, gather_s=0.0, layer_gather_s=0.0, layer_reduce_s=0.0, own=0.0)
    k = parallel.zero3_calls_per_layer
    for i, (params, lparams, n, s) in enumerate(groups):
        g, w, lw, lg = dp_volumes_bytes(params, lparams, training)
        on = jnp.where(params > 0, 1.0, 0.0)  # no expert group in a dense model
        whole = ring_group(n, s, system)
        if "hsdp" in features:
            (n_s, s_s), (n_r, s_r) = zero_groups(n, s, parallel)
            shard, repl = ring_group(n_s, s_s, system), ring_group(n_r, s_r, system)
        else:  # the shard group is the whole group, no replicas (a call on one rank: 0)
            n_s, shard, repl = n, whole, whole._replace(active=0.0 * whole.active)
        sharded = _sharded_reduce_s(shard, repl, n_s, g)
        t["reduce_s"] += on * jnp.where(parallel.zero_stage == 0,
                                        ring_phase_s(whole, g, 2.0, 2.0), sharded)
        t["gather_s"] += on * ring_phase_s(shard, w, 1.0, 1.0)
        t["layer_gather_s"] += on * ring_phase_calls_s(shard, lw, 1.0, 1.0, k)
        t["layer_reduce_s"] += on * (ring_phase_calls_s(shard, lg, 1.0, 1.0, k)
                                     + ring_phase_calls_s(repl, lg / n_s, 2.0, 2.0, k))
        t["own"] += params / jnp.where(parallel.zero_stage >= 1, n_s, 1.0)
        if i == 0:  # the dense group: its non-layer parameters (zero3_root_unit)
            root = root_unit_params(params, lparams, n_stage)
            rw, rg = w / jnp.maximum(params, 1.0) * root, g / jnp.maximum(params, 1.0) * root
            t["root"] = root
            t["root_gather_s"] = ring_phase_s(shard, rw, 1.0, 1.0)
            t["root_reduce_s"] = _sharded_reduce_s(shard, repl, n_s, rg)
    t["prefetch"] = zero3_prefetch_frac(parallel, groups[0][1])
    t["P"] = P
    layer_params = sum(g[1] for g in groups)
    t["copy_out_s"] = memory_time_s(zero3_copy_out_bytes(
        layer_params, training, parallel.zero3_copy_out), system)
    t["rs_copy_in_s"] = memory_time_s(zero3_rs_copy_in_bytes(
        layer_params, training, parallel.zero3_copy_out), system)
    t["root_s"] = zero3_root_unit_s(t["root_gather_s"], t["root_reduce_s"], memory_time_s(
        zero3_copy_out_bytes(t["root"], training, parallel.zero3_copy_out)
        + zero3_rs_copy_in_bytes(t["root"], training, parallel.zero3_copy_out), system),
        parallel)
    return t


def _zero3_layer_parts(dp, parallel, free_f, free_b, temperature):
    """(forward exposed, forward hidden, backward exposed, backward hidden) ZeRO-3 seconds
    of one layer, one micro-batch (`schedule.overlap.zero3_layer_exposed_s`; 0 unless
    zero_stage = 3): 1 gather forward, 1 backward (+1 when full recompute re-gathers,
    `zero3_regather`), 1 reduce-scatter; windows free_f, free_b from `_layer_parts`."""
    g_b = 1.0 + full_frac(parallel) * parallel.zero3_regather
    e_f, h_f, e_b, h_b = zero3_layer_exposed_s(dp["layer_gather_s"], dp["layer_reduce_s"],
                                               free_f, free_b, dp["prefetch"], g_b,
                                               parallel.dp_overlap, temperature)
    # FSDP2's copy-out of each gathered layer runs on the compute stream: exposed, once per
    # gather (workload.dp.zero3_copy_out_bytes); its reduce-scatter copy-in, which the compute
    # stream waits for, once per backward (workload.dp.zero3_rs_copy_in_bytes).
    e_f = e_f + dp["copy_out_s"]
    e_b = e_b + g_b * dp["copy_out_s"] + dp["rs_copy_in_s"]
    z3 = jnp.where(parallel.zero_stage == 3, 1.0, 0.0)
    return tuple(z3 * x for x in (e_f, h_f, e_b, h_b))


def _optimizer_s(own, system, training):
    """Memory-bound optimizer step over the parameters this rank owns (PAPERS.md 5.11):

        bytes = Psi_own (q_g + 2 q_opt + q_w + q_master + (q_master or q_w)) + q_g Psi_own
    (read gradient, master or weights, moments; write them and the 16-bit weights; one more
    gradient read for the norm / clipping). Mixed-precision Adam: (26 + q_g) + q_g per param.
    Psi_own = Psi / N under ZeRO >= 1, N the ranks that hold the same weights (`_dp_groups`).
    One XLA program fuses the update (`workload.xla.optimizer_bytes_per_param`).
    """
    per_param = optimizer_bytes_per_param(training)
    return memory_time_s(own * per_param, system) + 4.0 * kernel_fixed_s(system, training)


def _flops_per_step(model, parallel, training):
    """(model FLOPs, hardware FLOPs) of one step over all devices.

        model    = 3 B [(L + D) (dense + attention) + (1 + D) logits]   forward x 3, no recompute
    D = model.mtp_layers (multi-token prediction modules, each a layer and a logits GEMM).
    The layer's `dense` rows count what a token's forward runs: MLA's projections and the
    k routed (+ shared) experts, not all E (the active-parameter convention of Megatron-LM's
    `num_floating_point_operations`, which Megatron-Bridge's "model TFLOP/s" prints).
        hardware = model + B L (flash backward's recomputed scores 0.5 x attention + recompute:
                   phi_full (dense + attention), Megatron selective: core_attn x attention
                   + sum_r rho_r dense_r of its recompute_modules, per-op SAC sum_r rho_r
                   dense_r; workload.recompute)
    per sequence forward FLOPs from `layer_ops` at b = 1 and no sharding (PAPERS.md 5.1).
    """
    unit = Parallel(micro_batch=1.0)
    ops = layer_ops(model, unit, training)
    dense = jnp.sum(ops.dense.flops)
    skipped = jnp.sum(ops.dense.flops * remat_skipped_gemms(training))
    attn = jnp.sum(ops.attention.flops)
    # The model's own vocabulary V: padding rows (Training.vocab_pad_to) are not model work.
    logits = jnp.sum(head_ops(model, unit, training.replace(vocab_pad_to=0.0)).logits.flops)
    B, L = parallel.global_batch, model.n_layers + model.mtp_layers
    model_flops = 3.0 * B * (L * (dense + attn) + (1.0 + model.mtp_layers) * logits)
    full = full_frac(parallel)
    selective = (megatron_module_fracs(parallel)["core_attn"] * attn
                 + jnp.sum(megatron_recompute_rows(model, parallel) * ops.dense.flops))
    sac = op_sac_frac(parallel) * jnp.sum(sac_recompute_fracs(model, parallel) * ops.dense.flops)
    flash_bwd = 0.5 * training.flash_attention * attn  # flash backward recomputes the scores
    extra = B * L * (flash_bwd + full * (dense - skipped + attn) + selective + sac)
    return model_flops, model_flops + extra


def _goodput(model, system, training, n_devices, tokens_per_s) -> Goodput:
    """Goodput of the job (schedule.goodput): checkpoint V = N (q_w + q_master + q_opt),
    delta = V / B, M = 1 / (n lambda), tau = training.checkpoint_interval_s or, when 0,
    Daly's optimum; the step time enters only through tokens_per_s."""
    rel = system.reliability
    V = checkpoint_bytes(total_params(model), training)
    delta = checkpoint_write_s(V, rel.storage_write_Bps)
    M = job_mtbf_s(rel.failure_rate_per_s, n_devices)
    given = training.checkpoint_interval_s
    tau = jnp.where(given > 0, given, daly_interval_s(delta, M))
    kept, ckpt, rework, restart = lost_fracs(tau, delta, M, rel.restart_s)
    return Goodput(mtbf_s=M, checkpoint_bytes=V, checkpoint_s=delta, checkpoint_interval_s=tau,
                   restart_s=jnp.asarray(rel.restart_s), goodput_frac=kept, checkpoint_frac=ckpt,
                   rework_frac=rework, restart_frac=restart,
                   effective_tokens_per_s=tokens_per_s * kept)


def predict_step(model, parallel, system, training, temperature=None,
                 features=FEATURES, checked=False) -> Result:
    """The whole prediction for one configuration (pure; jit/vmap/grad-safe).

    `features` (static, a subset of FEATURES) leaves out the terms of the others, which must
    be 0 for these specs (`features_of`): a smaller program, same result.
    `checked` (static): True when the caller has passed these inputs through
    `specs.validate.check_inputs` (concrete values; it raises on a broken rule), whose rules
    include every rule of `valid_mask`: the mask is then True by construction and is not
    traced (valid = True), same result; it saved ~3 s of a ~22 s hard value-and-gradient
    compile (XLA:CPU, every feature, llama3-8b on h100-sxm-80gb; measured before the parts
    were computed once, which brought that compile to ~7 s). Hard model only
    (temperature None or 0), where the compiled value and gradient are bit-identical with
    and without the mask; the smooth model keeps it (its gradient once depended on the
    program's structure through a cancellation in `costs.smooth.exposed`, now removed;
    dropping the mask there has not been measured since). The mask and the parts below are
    each computed once per program (`specs.validate.computed_once`; benchmarks/README.md
    "Session 13" sections).
    """
    # computed_once: each part's forward chain is compiled once, not copied into every
    # backward fusion that reads it (exact; XLA:CPU compile ~3x cheaper, validate.computed_once)
    layer, free_f, free_b = computed_once(_layer_parts(model, parallel, system, training,
                                                       temperature, features))
    first, last = computed_once(_head_parts(model, parallel, system, training, temperature))
    stages = pipeline_stages(model, parallel)
    mb = system.eff.microbatch_s  # fixed time per micro-batch on every stage
    dp = computed_once(_dp_times(model, parallel, system, training, stages, features))
    z3_f, z3_fh, z3_b, z3_bh = _zero3_layer_parts(dp, parallel, free_f, free_b, temperature)
    t_fe, t_le = _exposed_sum(first), _exposed_sum(last)
    times, t_sum = stage_times_s(_exposed_sum(layer) + z3_f + z3_b, stages, model.n_layers,
                                 t_fe, t_le)
    _, bubble = pipeline_times_s(times + mb, t_sum + parallel.pp * mb, parallel)
    n_crit, w_first, w_last = critical_stage(times, stages)
    m = parallel.n_microbatches
    crit = {k: m * (n_crit * layer[k] + w_first * first[k] + w_last * last[k]) for k in _PARTS}
    crit["overhead_s"] = crit["overhead_s"] + m * mb
    send = send_recv_s(pp_message_bytes(model, parallel, training), parallel.pp,
                       stride(_placed(parallel), "pp"), system)
    step_exposed, step_hidden = dp_step_exposed_s(dp["reduce_s"], dp["gather_s"],
                                                  n_crit * free_b, parallel, temperature)
    # ZeRO-3: the first gather and the last reduce-scatter of each micro-batch are exposed.
    edge = zero3_microbatch_edge_s(z3_fh, z3_bh, dp["layer_reduce_s"])
    dp_exposed = m * (n_crit * (z3_f + z3_b) + edge + dp["root_s"]) + step_exposed
    dp_hidden = m * (n_crit * (z3_fh + z3_bh) - edge) + step_hidden
    breakdown = Breakdown(
        **{k: crit[k] for k in _PARTS}, pp_exposed_s=p2p_exposed_s(send, parallel),
        dp_exposed_s=dp_exposed, dp_hidden_s=dp_hidden, bubble_s=bubble,
        optimizer_s=_optimizer_s(dp["own"], system, training))
    breakdown = breakdown.replace(
        overhead_s=breakdown.overhead_s + system.eff.step_s,
        overlap_slowdown_s=breakdown.overlap_slowdown_s
        + dp_hidden_slowdown_s(dp_hidden, layer["overlap_sigma"]))
    memory = device_memory(model, parallel, system, training, stages)
    if "xla" in features:
        # XLA's micro-batch scan adds each micro-batch's gradients to its carry; XLA's live
        # sets replace the eager memory model (workload.xla, memory.xla).
        # The carry holds this rank's gradient shard under ZeRO-2/3, as the memory model does
        # (dp["P"]: the parameters of the largest stage, `_dp_groups`).
        G_acc = gradient_bytes(dp["P"], parallel, training)
        accumulate = memory_time_s(grad_accumulation_traffic_bytes(G_acc, parallel, training),
                                   system)
        breakdown = breakdown.replace(compute_s=breakdown.compute_s + accumulate)
        memory = select_memory(training, xla_device_memory(model, parallel, system, training,
                                                           stages), memory)
    # Inputs that break a rule of specs.validate (traced: they cannot raise) get an infinite
    # step, no throughput and valid = False: never mistaken for a prediction (Result.valid).
    valid = (jnp.asarray(True) if checked and not temperature
             else valid_mask(model, parallel, system, training))
    step = jnp.where(valid, sum(getattr(breakdown, k) for k in EXPOSED_PARTS), jnp.inf)
    model_flops, hw_flops = _flops_per_step(model, parallel, training)
    n = parallel.n_devices
    tokens_per_s = jnp.where(valid, parallel.global_batch * model.seq_len / step, 0.0)
    return Result(
        step_time_s=step, breakdown=breakdown, memory=memory,
        fits=valid & (memory.total_bytes <= memory.capacity_bytes),
        fit_margin_frac=(memory.capacity_bytes - memory.total_bytes) / memory.capacity_bytes,
        mfu=jnp.where(valid, model_flops / (step * n * matmul_peak(system, training)), 0.0),
        tokens_per_s=tokens_per_s, model_flops=model_flops, hardware_flops=hw_flops,
        n_devices=n, goodput=_goodput(model, system, training, n, tokens_per_s), valid=valid)
