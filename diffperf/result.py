"""Result pytrees: step time, breakdown and memory with named fields (STYLE.md section 3)."""

from __future__ import annotations

import dataclasses
from typing import Any

from flax import struct


class Breakdown(struct.PyTreeNode):
    """Seconds of one step. The exposed parts (EXPOSED_PARTS) sum to the step time; the
    hidden parts ran concurrently with compute and are reported beside them."""

    compute_s: Any            # forward + backward work of the critical pipeline stage
    recompute_s: Any          # activation recomputation (selective or full)
    tp_exposed_s: Any         # tensor-parallel collectives on the critical path
    cp_exposed_s: Any         # context-parallel K/V exchange not hidden behind attention
    ep_exposed_s: Any         # expert-parallel token all-to-alls (dispatch and combine)
    axonn_exposed_s: Any      # AxoNN 3D tensor-grid collectives on the critical path
    pp_exposed_s: Any         # stage-boundary sends and receives
    dp_exposed_s: Any         # gradient reduction / ZeRO gathers not hidden behind backward
    bubble_s: Any             # pipeline fill and drain
    optimizer_s: Any          # optimizer step (memory bound)
    overhead_s: Any           # host/launch floor above GPU time, per-micro-batch and per-step
    overlap_slowdown_s: Any   # compute slowed down by the communication it hides
    tp_hidden_s: Any
    cp_hidden_s: Any
    ep_hidden_s: Any
    axonn_hidden_s: Any
    dp_hidden_s: Any


EXPOSED_PARTS = ("compute_s", "recompute_s", "tp_exposed_s", "cp_exposed_s", "ep_exposed_s",
                 "axonn_exposed_s", "pp_exposed_s", "dp_exposed_s", "bubble_s", "optimizer_s",
                 "overhead_s", "overlap_slowdown_s")
HIDDEN_PARTS = ("tp_hidden_s", "cp_hidden_s", "ep_hidden_s", "axonn_hidden_s", "dp_hidden_s")


class Memory(struct.PyTreeNode):
    """Bytes on the device with the largest footprint (first or last pipeline stage)."""

    weights_bytes: Any
    gradients_bytes: Any
    optimizer_bytes: Any      # master weights + optimizer states
    activations_bytes: Any    # in-flight micro-batches of the schedule, logits on the last stage
    buffers_bytes: Any        # ZeRO-3 gathered layers + output / embedding (FSDP root) units,
                              # runtime workspace
    total_bytes: Any
    capacity_bytes: Any       # usable HBM: capacity x eff.mem_usable_frac


MEMORY_PARTS = ("weights_bytes", "gradients_bytes", "optimizer_bytes", "activations_bytes",
                "buffers_bytes")


class Goodput(struct.PyTreeNode):
    """Training kept per second of wall time, given failures, checkpoints and restarts
    (schedule.goodput, after Daly 2006). The four fractions sum to 1."""

    mtbf_s: Any               # M = 1 / (devices x failure rate): mean time between failures
    checkpoint_bytes: Any     # V: one copy of the weights, master weights and optimizer state
    checkpoint_s: Any         # delta = V / storage write bandwidth: the job stalls this long
    checkpoint_interval_s: Any  # tau: training between checkpoints (Daly's optimum or given)
    restart_s: Any            # R: from a failure to training again (System.reliability)
    goodput_frac: Any         # tau / E(tau): the wall time whose training is kept
    checkpoint_frac: Any      # wall time spent writing checkpoints
    rework_frac: Any          # wall time redoing the work lost since the last checkpoint
    restart_frac: Any         # wall time restarting after failures
    effective_tokens_per_s: Any  # tokens_per_s x goodput_frac


GOODPUT_FRACS = ("goodput_frac", "checkpoint_frac", "rework_frac", "restart_frac")


class Result(struct.PyTreeNode):
    """What `predict` returns; works under jit, vmap and grad."""

    step_time_s: Any
    breakdown: Breakdown
    memory: Memory
    fits: Any                 # total memory <= usable capacity
    fit_margin_frac: Any      # (capacity - total) / capacity: smooth feasibility for search
    mfu: Any                  # model FLOPs / (step time x devices x matmul peak)
    tokens_per_s: Any
    model_flops: Any          # per step, without recompute (3 x forward)
    hardware_flops: Any       # per step, executed (recompute and flash backward included)
    n_devices: Any
    goodput: Goodput          # effective throughput under failures and checkpoints
    valid: Any = True         # the inputs pass every rule of specs.validate (layout divides
                              # the model, positive whole degrees, physical system, 0/1
                              # switches, job within the last tier). Under jit / vmap an
                              # invalid entry cannot raise: it gets valid = False,
                              # step_time_s = +inf, tokens_per_s = mfu = 0 and fits = False
                              # (its other fields mean nothing); predict() on concrete values
                              # raises a SpecError instead


def as_dict(result, flat: bool = False) -> dict:
    """A Result as plain Python: each leaf a float (a list of floats for a batched Result,
    e.g. from `predict_batch` or `search`), `fits` as bool(s); breakdown, memory and goodput
    as nested dicts, or with `flat` as dotted keys ('breakdown.compute_s'), which
    `pandas.DataFrame(as_dict(batched, flat=True))` turns into one row per configuration.
    Fields left out of a search (None) are left out here too."""
    import numpy as np

    def value(x, boolean=False):
        a = np.asarray(x)
        a = a.astype(bool) if boolean else a.astype(float)
        return a.item() if a.ndim == 0 else a.tolist()

    out = {}
    for f in dataclasses.fields(result):
        v = getattr(result, f.name)
        if v is None:
            continue
        if dataclasses.is_dataclass(v):
            inner = {g.name: value(getattr(v, g.name)) for g in dataclasses.fields(v)
                     if getattr(v, g.name) is not None}
            out |= ({f"{f.name}.{k}": x for k, x in inner.items()} if flat
                    else {f.name: inner})
        else:
            out[f.name] = value(v, boolean=f.name in ("fits", "valid"))
    return out
