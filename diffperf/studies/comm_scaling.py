"""Study 1: computation vs communication as models and hardware scale (Pati et al.).

Pati, Aga, Islam, Jayasena & Sinclair, "Computation vs. Communication Scaling for Future
Transformers on Future Hardware" (arXiv 2302.02825; PAPERS.md section 1). Their finding [A]:
compute keeps an edge algorithmically, but as memory capacity and network scale slower than
FLOP/s, communication becomes 40-75% of runtime and overlap no longer hides it.

diffperf's version: the GPT family of Narayanan et al. Table 1 (hidden and layers growing,
18.4B to 1T parameters), each on the GPU count and global batch it was trained with there,
on A100 -> H100 -> B200 -> a *projected* next generation (B200 scaled: FLOP/s x2.5, HBM
bandwidth, HBM capacity, NVLink and network bandwidth x1.5). For each (model, system) the
whole layout space is searched and the fastest layout that fits is kept; the study reports
the share of its step time spent in exposed communication, the exposed communication plus
the pipeline bubble (the parallel overhead the search trades: where communication grows
dearer the fastest layout may move it into a deeper pipeline, so exposed communication alone
need not grow while the sum does), and the hidden communication (overlapped with compute).
"""

from __future__ import annotations

import numpy as np

from diffperf.studies.common import (QUICK_PLACEMENTS, StudyResult, columns_of, row_summary,
                                     scaled_system, search_layouts)
from diffperf.search import PLACEMENTS
from diffperf.workload.params import total_params

NAME = "comm-scaling"
TITLE = "Compute vs communication as models and hardware scale (Pati et al.)"
# (model, GPUs, global batch in sequences): Narayanan et al. SC21 Table 1 (PAPERS.md section 6).
MODELS = (("megatron-18.4b", 256, 1024), ("megatron-39.1b", 512, 1536),
          ("megatron-76.1b", 1024, 1792), ("megatron-145.6b", 1536, 2304),
          ("megatron-310.1b", 1920, 2160), ("megatron-529.6b", 2520, 2520),
          ("megatron-1t", 3072, 3072))
QUICK_MODELS = ("megatron-18.4b", "megatron-76.1b")
SYSTEMS = ("a100-sxm-80gb", "h100-sxm-80gb", "b200-sxm-180gb")
QUICK_SYSTEMS = ("a100-sxm-80gb", "b200-sxm-180gb")
PROJECTED_FROM = "b200-sxm-180gb"
PROJECTED_NAME = "next-projected"
# The projection: FLOP/s grows faster than memory and network (A100 -> H100 -> B200 per
# generation, geometric mean: FLOP/s x2.7, HBM bandwidth x1.9, capacity x1.5, NVLink x1.7,
# scale-out NIC x1.4; configs/systems). An assumption, not a datasheet: labelled as such.
PROJECTION = dict(flops=2.5, hbm_bw=1.5, hbm_capacity=1.5, fast_bw=1.5, net_bw=1.5, power=1.2)


def inputs(quick=False) -> dict:
    """Names of the models and systems the study needs (the CLI loads them)."""
    return dict(models=QUICK_MODELS if quick else tuple(m for m, _, _ in MODELS),
                systems=QUICK_SYSTEMS if quick else SYSTEMS)


def projected_system(base):
    """The next generation projected from `base` by PROJECTION (named PROJECTED_NAME)."""
    return scaled_system(base, **PROJECTION, name=PROJECTED_NAME)


def run(models: dict, systems: dict, *, quick=False, training=None) -> StudyResult:
    """Best layout and its communication shares for every (system, model).

    Args:
        models: name -> Model, for the names of `inputs(quick)['models']`.
        systems: name -> System, for `inputs(quick)['systems']` (must include PROJECTED_FROM).
    Returns:
        StudyResult; its table has one row per (system, model) with the layout and
        comm_exposed_frac / comm_hidden_frac (fractions of the step time).
    """
    placements = QUICK_PLACEMENTS if quick else PLACEMENTS
    hw = dict(systems)
    hw[PROJECTED_NAME] = projected_system(systems[PROJECTED_FROM])
    rows = []
    for sys_name, system in hw.items():
        for name, n, B in MODELS:
            if name not in models:
                continue
            model = models[name]
            layouts, result = search_layouts(model, system, n, B, training,
                                             placements=placements)
            fit = np.flatnonzero(result.fits)
            row = dict(system=sys_name, projected=int(sys_name == PROJECTED_NAME), model=name,
                       params_B=float(total_params(model)) / 1e9,
                       hidden=int(model.hidden), layers=int(model.n_layers), gpus=n,
                       global_batch=B, n_layouts=len(layouts), n_fit=len(fit))
            if not len(fit):
                continue
            i = fit[np.argmin(result.step_time_s[fit])]
            rows.append(row | row_summary(layouts, result, i, placements))
    table = columns_of(rows)
    return StudyResult(NAME, TITLE, table, _summary(table), _notes())


def _summary(t) -> dict:
    out = {}
    for s in dict.fromkeys(t["system"]):
        sel = t["system"] == s
        share = t["comm_exposed_frac"][sel]
        out[f"{s}: exposed comm % (smallest -> largest model)"] = (
            f"{100 * share[0]:.1f} -> {100 * share[-1]:.1f} (max {100 * share.max():.1f})")
    for m in dict.fromkeys(t["model"]):
        sel = t["model"] == m
        shares = ", ".join(f"{100 * x:.1f}" for x in t["comm_exposed_frac"][sel])
        out[f"{m}: exposed comm % by system"] = shares
        overhead = t["comm_exposed_frac"][sel] + t["bubble_frac"][sel]
        out[f"{m}: exposed comm + bubble % by system"] = ", ".join(
            f"{100 * x:.1f}" for x in overhead)
    return out


def _notes() -> tuple:
    proj = ", ".join(f"{k} x{v:g}" for k, v in PROJECTION.items())
    return (f"'{PROJECTED_NAME}' is a PROJECTION, not a product: {PROJECTED_FROM} with {proj}.",
            "GPU counts and global batches are those of Narayanan et al. SC21 Table 1.",
            "Uncalibrated default efficiencies (configs/systems datasheets, Efficiency "
            "defaults) unless an overlay is given.")
