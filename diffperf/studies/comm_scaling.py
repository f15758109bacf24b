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

Two views, as rows of column `view`:
- "re-searched": the fastest layout of the whole space on each system (what a planner who
  re-tunes for new hardware gets);
- "fixed Megatron": the layout Megatron-LM ran each model with in Table 1 (t = 8 and its p,
  Megatron's rank order, full recompute, no distributed optimizer, cp = 1; micro-batch,
  interleaving and sequence parallelism still chosen), kept as hardware changes: the
  scenario of Pati et al. (today's parallelization of a model carried to future hardware,
  where communication that overlap hid becomes exposed).
"""

from __future__ import annotations

import numpy as np

from diffperf.studies.common import (QUICK_PLACEMENTS, StudyResult, columns_of, row_summary,
                                     scaled_system, search_layouts)
from diffperf.search import COLUMNS, PLACEMENTS
from diffperf.workload.params import total_params

NAME = "comm-scaling"
TITLE = "Compute vs communication as models and hardware scale (Pati et al.)"
# (model, GPUs, global batch in sequences): Narayanan et al. SC21 Table 1 (PAPERS.md section 6).
MODELS = (("megatron-18.4b", 256, 1024), ("megatron-39.1b", 512, 1536),
          ("megatron-76.1b", 1024, 1792), ("megatron-145.6b", 1536, 2304),
          ("megatron-310.1b", 1920, 2160), ("megatron-529.6b", 2520, 2520),
          ("megatron-1t", 3072, 3072))
# (t, p) each model was trained with in Narayanan et al. SC21 Table 1 (PAPERS.md section 6).
TABLE1_TP_PP = {"megatron-18.4b": (8, 1), "megatron-39.1b": (8, 2), "megatron-76.1b": (8, 4),
                "megatron-145.6b": (8, 8), "megatron-310.1b": (8, 16),
                "megatron-529.6b": (8, 35), "megatron-1t": (8, 64)}
VIEWS = ("re-searched", "fixed Megatron")
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


def view_masks(layouts, name) -> dict:
    """Layouts of each view: all ('re-searched'), and Table 1's t and p with full recompute,
    ZeRO 0, cp 1 in Megatron's rank order ('fixed Megatron')."""
    col = lambda c: layouts[:, COLUMNS.index(c)]  # noqa: E731
    t, p = TABLE1_TP_PP[name]
    fixed = ((col("tp") == t) & (col("pp") == p) & (col("recompute") == 2)
             & (col("zero_stage") == 0) & (col("cp") == 1) & (layouts[:, -1] == 0))
    return {VIEWS[0]: np.ones(len(layouts), bool), VIEWS[1]: fixed}


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
            row = dict(system=sys_name, projected=int(sys_name == PROJECTED_NAME), model=name,
                       params_B=float(total_params(model)) / 1e9,
                       hidden=int(model.hidden), layers=int(model.n_layers), gpus=n,
                       global_batch=B, n_layouts=len(layouts))
            for view, mask in view_masks(layouts, name).items():
                fit = np.flatnonzero(np.asarray(result.fits) & mask)
                if not len(fit):
                    continue
                i = fit[np.argmin(result.step_time_s[fit])]
                rows.append(row | dict(view=view, n_fit=len(fit))
                            | row_summary(layouts, result, i, placements))
    table = columns_of(rows)
    return StudyResult(NAME, TITLE, table, _summary(table), _notes())


def _summary(t) -> dict:
    out = {}
    for view in VIEWS:
        v = t["view"] == view
        for s in dict.fromkeys(t["system"]):
            sel = v & (t["system"] == s)
            if not sel.any():
                continue
            share = t["comm_exposed_frac"][sel]
            out[f"{view}, {s}: exposed comm % (smallest -> largest model)"] = (
                f"{100 * share[0]:.1f} -> {100 * share[-1]:.1f} (min {100 * share.min():.1f}, "
                f"max {100 * share.max():.1f})")
        for m in dict.fromkeys(t["model"]):
            sel = v & (t["model"] == m)
            shares = ", ".join(f"{100 * x:.1f}" for x in t["comm_exposed_frac"][sel])
            out[f"{view}, {m}: exposed comm % by system"] = shares
            overhead = t["comm_exposed_frac"][sel] + t["bubble_frac"][sel]
            out[f"{view}, {m}: exposed comm + bubble % by system"] = ", ".join(
                f"{100 * x:.1f}" for x in overhead)
    return out


def _notes() -> tuple:
    proj = ", ".join(f"{k} x{v:g}" for k, v in PROJECTION.items())
    return (f"'{PROJECTED_NAME}' is a PROJECTION, not a product: {PROJECTED_FROM} with {proj}.",
            "GPU counts and global batches are those of Narayanan et al. SC21 Table 1.",
            "fixed Megatron: Table 1's t and p, full recompute, ZeRO 0, Megatron's rank order, "
            "kept on every system (micro-batch, interleaving, SP still chosen); re-searched: "
            "the fastest layout of the whole space on each system.",
            "Uncalibrated default efficiencies (configs/systems datasheets, Efficiency "
            "defaults) unless an overlay is given.")
