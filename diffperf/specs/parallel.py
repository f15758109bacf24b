"""The parallel layout of one training job, as a frozen pytree of numbers.

Every degree and switch is an array leaf, so that a search evaluates a batch of layouts in one
`vmap` and one compilation (STYLE.md section 3), the placement included: `placement` indexes
`ORDERS`, the rank orders of the parallel dimensions, innermost first. The order decides which
groups share a fast domain (a TP group of 8 inside an NVLink node, a DP group spanning nodes).
"""

from __future__ import annotations

import enum
import itertools
from typing import Any

from flax import struct

from diffperf.errors import SpecError

# TE 1.8's pipelined reduce-scatter (Parallel.tp_userbuffers = 2): the SMs its comm kernels take,
# (proj_fprop, fc2_fprop), as NeMo Framework Launcher 24.07 configures H100 FP8
# (launcher_scripts/conf/training/tp_overlap/ub_cfg_h100_fp8_h8192_tp4_mbs1_seqlen8192.yaml, tag
# 24.07: num_sm 24 / 16) [S]. Read by schedule.overlap.ub_pipe_sm_margin and by
# specs.validate.check_tp_userbuffers_system.
UB_PIPE_COMM_SMS = (24.0, 16.0)


class Recompute(enum.IntEnum):
    """Activation recomputation (Korthikanti et al. 2022, Section 5)."""

    NONE = 0
    SELECTIVE = 1  # recompute the attention core only
    FULL = 2  # keep each layer's input, re-run its forward before its backward


class ZeroStage(enum.IntEnum):
    """ZeRO sharding of model states over the data-parallel group (Rajbhandari et al. 2020)."""

    NONE = 0
    OPTIMIZER = 1
    GRADIENTS = 2
    PARAMETERS = 3  # = FSDP


DIMENSIONS = ("tp", "cp", "ep", "dp", "pp")
PLACED = ("tp", "cp", "dp", "pp")  # the dimensions a rank order places (ep sits inside dp)
# Every rank order of PLACED, innermost first; ORDERS[0] is Megatron-LM's (tp, cp, dp, pp).
ORDERS = tuple(itertools.permutations(PLACED))
GRID = ("gx", "gy", "gz")  # AxoNN 3D tensor grid (Singh et al.; PAPERS.md section 4)
# Megatron-Core's recompute_modules that diffperf models, each a Parallel field
# recompute_<module> (workload.recompute); "moe" (the whole MoE layer) is not modelled.
RECOMPUTE_MODULES = ("core_attn", "mlp", "moe_act", "layernorm", "mla_up_proj",
                     "shared_experts")


class Parallel(struct.PyTreeNode):
    """Degrees tp x cp x dp x pp x gx x gy x gz = number of devices; ep divides dp (experts are
    sharded over a sub-group of the data-parallel ranks, as in Megatron-Core); vp virtual stages
    per device. The AxoNN grid gx x gy x gz (Singh et al., PAPERS.md section 4) takes the place
    of Megatron TP (tp = 1 when it is > 1) and splits the batch over dp x gz."""

    tp: Any = 1                 # tensor (Megatron 1D) parallel degree t
    pp: Any = 1                 # pipeline stages p
    dp: Any = 1                 # data-parallel degree d
    cp: Any = 1                 # context-parallel degree c (sequence split, ring attention)
    ep: Any = 1                 # expert-parallel degree e (divides dp; with etp > 0, e x etp
                                # divides t x c x d: Megatron-Core's expert layout)
    etp: Any = 0                # expert tensor-parallel degree t_e of the routed experts:
                                # 0 = tp with the experts inside dp (the layout before etp);
                                # 1 = experts not split by TP, the ep group taking the t x c x d
                                # ranks (Megatron-Core --expert-tensor-parallel-size 1); workload.ep
    vp: Any = 1                 # interleaved virtual stages per device v
    micro_batch: Any = 1        # sequences per micro-batch b
    global_batch: Any = 1       # sequences per optimizer step B
    sequence_parallel: Any = 0  # 1: Megatron sequence parallelism on the TP group
    zero_stage: Any = 0         # ZeroStage (0-3)
    recompute: Any = 0          # Recompute (0 none, 1 selective, 2 full)
    dp_overlap: Any = 1         # 1: gradient reduction overlaps the backward (bucketed DDP)
    tp_overlap: Any = 0         # fraction of TP communication that can hide behind GEMMs
    tp_userbuffers: Any = 0     # 1: the TP collectives run as Transformer Engine's userbuffers
                                # overlap with Megatron-Bridge's FP8 configurations (ring
                                # exchange forward and output-gradient all-gathers, ring-exchange
                                # reduce-scatters, bulk input re-gather / dgrad reduce-scatter
                                # beside the backward GEMMs; schedule.overlap.
                                # tp_userbuffers_block_s); tp_overlap is then not read. 2: the
                                # same, but the forward reduce-scatters pipelined as TE 1.8 runs
                                # NeMo Framework Launcher 24.07's H100 FP8 configuration
                                # (tp_pipeline_rs_s; validate: 16-bit or delayed FP8, H100). 0: the
                                # tp_overlap form (the default)
    ep_overlap: Any = 0         # fraction of the compute the EP all-to-alls can hide behind,
                                # as Megatron-Core's merged forward-backward EP schedule pairs
                                # them (schedule.overlap.ep_merged_1f1b_exposed_s); 0: none
    ep_dispatch: Any = 0        # EP token exchange: 0 pairwise all-to-all (NCCL; Megatron-Core's
                                # alltoall dispatcher), 1 DeepEP-style hierarchical dispatch with
                                # one scale-out copy per remote NVLink domain, permuted to the
                                # local experts after the dispatch (flex dispatcher, deepep /
                                # hybridep); costs.collectives.hierarchical_all_to_all_s,
                                # workload.flops.moe_permute_bytes
    cp_ring: Any = 1            # CP form: 1 ring (p2p K/V blocks, Megatron-Core's default "p2p"),
                                # 0 all-gather of K/V (NERSC 2D-seqp, PAPERS.md 3.5)
    gx: Any = 1                 # AxoNN 3D tensor grid G_x (innermost; replaces tp when > 1)
    gy: Any = 1                 # AxoNN G_y
    gz: Any = 1                 # AxoNN G_z ("depth": weights sharded FSDP-like, batch split)
    axonn_overlap: Any = 1      # 1: AxoNN's overlapped collectives (PAPERS.md 4.3); 0: none
    placement: Any = 0          # index into ORDERS (0: Megatron tp-cp-dp-pp; 1: tp-cp-pp-dp)
    zero_shard: Any = 0         # ZeRO shard group: states sharded over this many of the d x c
                                # ranks that hold the same weights, replicated across the rest
                                # (HSDP / MiCS); 0: all of them (plain ZeRO, FSDP FULL_SHARD)
    zero3_prefetch_params: Any = 0  # ZeRO-3 parameters gathered ahead of use (DeepSpeed's
                                # stage3_prefetch_bucket_size, default 5e7); 0: the next layer
                                # whole (PyTorch FSDP BACKWARD_PRE); workload.dp
    zero3_regather: Any = 1     # 1: full recompute gathers a layer's parameters again for the
                                # recomputed forward (DeepSpeed ZeRO-3 activation checkpointing:
                                # 3 gathers per layer); 0: the backward's gather serves it
                                # (PyTorch FSDP, checkpoint inside the unit: 2)
    zero3_calls_per_layer: Any = 1  # gather / reduce-scatter calls per layer pass (FSDP: one
                                # flat parameter per layer; DeepSpeed: one per sub-module)
    zero3_copy_out: Any = 0     # 1: FSDP2 (per-parameter sharding): each gathered layer is
                                # copied out of the all-gather buffer into its parameters on
                                # the compute stream (workload.dp.zero3_copy_out_bytes), and
                                # each layer's gradients are cast into the reduce-scatter
                                # buffer before the compute stream goes on
                                # (workload.dp.zero3_rs_copy_in_bytes);
                                # 0: FSDP1 / DeepSpeed flat buffers, the parameters are views
    zero3_root_unit: Any = 0    # 1: FSDP's root unit (fully_shard(model): embedding, final
                                # norm, output) is gathered and reduce-scattered exposed once
                                # per micro-batch (schedule.overlap.zero3_root_unit_s);
                                # 0: its collectives are not priced (the layers' only)
    recompute_layer_frac: Any = 1.0  # recompute = full: the fraction of the layers that are
                                # checkpointed, the rest keeping every activation (fms-fsdp
                                # selective AC's p, TorchTitan's selective layer AC 1/k);
                                # workload.recompute
    recompute_policy: Any = 0   # recompute = selective: 0 Megatron (the attention core),
                                # 1 TorchTitan per-op SAC (saves every 2nd mm and SDPA,
                                # recomputes the rest; torchao Float8 linears too), 2 every
                                # linear recomputed (a linear the policy does not see as
                                # aten.mm); workload.recompute.sac_recompute_fracs
    # recompute = selective, recompute_policy = 0: Megatron-Core's `recompute_modules`, one 0/1
    # field per module (workload.recompute.megatron_module_fracs); the default is Megatron's
    # default list ["core_attn"]
    recompute_core_attn: Any = 1       # the attention core (softmax(QK^T) V) re-runs
    recompute_mlp: Any = 0             # the dense layers' MLP re-runs (not the MoE layers')
    recompute_moe_act: Any = 0         # the routed experts' activation (SwiGLU) re-runs
    recompute_layernorm: Any = 0       # the norms that are modules of their own re-run
    recompute_mla_up_proj: Any = 0     # MLA's q / kv up-projections (+ RoPE) re-run
    recompute_shared_experts: Any = 0  # the MoE layers' shared experts re-run
    pp_first_layers: Any = 0    # layers on the first pipeline stage, and
    pp_last_layers: Any = 0     # on the last (both > 0, or both 0: balanced automatically,
                                # the first and last stage giving up layers first; see
                                # workload.pp.stage_layers); pp need not divide the layers


    @property
    def n_devices(self):
        """tp x cp x dp x pp x gx x gy x gz."""
        return self.tp * self.cp * self.dp * self.pp * self.gx * self.gy * self.gz

    @property
    def n_microbatches(self):
        """m = B / (d G_z b): micro-batches per pipeline per step (gradient accumulation
        steps); the AxoNN depth G_z splits the batch like data parallelism (PAPERS.md 4.1)."""
        return self.global_batch / (self.dp * self.gz * self.micro_batch)


# Megatron-Core's default recompute_modules (["core_attn"]) as Parallel's field defaults
RECOMPUTE_MODULE_DEFAULTS = {m: getattr(Parallel, f"recompute_{m}") for m in RECOMPUTE_MODULES}


def placement_index(order) -> int:
    """ORDERS.index of a rank order given as a tuple or a 'tp-cp-dp-pp' string."""
    names = tuple(order.split("-")) if isinstance(order, str) else tuple(order)
    if names not in ORDERS:
        text = "-".join(map(str, names))
        raise SpecError(f"placement={text!r} must order each of {', '.join(PLACED)} once, "
                        f"innermost first (e.g. tp-cp-dp-pp, Megatron-LM's)")
    return ORDERS.index(names)
