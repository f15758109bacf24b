"""Study 4: AxoNN's 4D hybrid vs Megatron-LM's 3D parallelism (Singh et al.).

Singh, Singhania, Ranjan, Sating & Bhatele, "A 4D Hybrid Algorithm to Scale Parallel Training
to Thousands of GPUs" (AxoNN; arXiv 2305.13525, SC24; PAPERS.md section 4). Findings [A]:
80B GPT on 1024 A100s of Perlmutter, 26% faster than Megatron-LM, 57% of peak (178 TFLOP/s
per GPU, 182 PFLOP/s in all); overlap gives ~53% on a 20B model.

diffperf's version: the best Megatron-style 3D layout (tp x pp x dp, no CP, ZeRO-0/1 as the
distributed optimizer) and the best layout of diffperf's whole space (CP and ZeRO-2/3 added)
for 20B- and 80B-class GPT models (Narayanan et al.'s 18.4B and 76.1B) on a Perlmutter-like
A100 system (configs/systems/perlmutter-a100.yaml: 4 GPUs per node), and, where `Parallel`
carries the AxoNN grid (gx, gy, gz), the best AxoNN 4D layout (the grid rows of
`search.enumerate_layouts(..., axonn=True)`: every valid grid x micro-batch x recompute x ZeRO
0-1 over data, searched with overlap on). Without the grid the AxoNN series is reported as
pending. Both are set beside the published AxoNN figure and the Megatron-LM
figure it implies (178 / 1.26 = 141 TFLOP/s per GPU).
"""

from __future__ import annotations

import numpy as np

from diffperf.search import PLACEMENTS, axonn_mask, enumerate_layouts, search
from diffperf.specs.parallel import Parallel
from diffperf.studies.common import (QUICK_PLACEMENTS, STUDY_CHUNK, StudyResult, column,
                                     columns_of, row_summary, search_layouts)

NAME = "axonn"
TITLE = "AxoNN 4D vs Megatron-LM 3D on a Perlmutter-like A100 system (Singh et al.)"
SYSTEM = "perlmutter-a100"
# (model, GPUs, global batch): the 80B case of AxoNN on 1024 GPUs (batch of Narayanan et al.
# Table 1's 76.1B row); the 20B case on the 256 GPUs and batch of Table 1's 18.4B row.
CASES = (("megatron-18.4b", 256, 1024), ("megatron-76.1b", 1024, 1792))
QUICK_CASES = (("megatron-76.1b", 1024, 1792),)
# Singh et al. (SC24 abstract, PAPERS.md sections 4 and 6): 80B GPT, 1024 A100s, 178 TFLOP/s
# per GPU (57% of 312), 26% faster than Megatron-LM on the same run.
AXONN_80B_TFLOPS = 178.0
AXONN_SPEEDUP = 1.26
SERIES = ("megatron_3d", "any", "axonn_4d")
AXONN_ZERO = (0, 1)  # ZeRO over the data-parallel ranks: none, or the distributed optimizer


def axonn_available() -> bool:
    """True once `Parallel` has the AxoNN 3D tensor grid (gx, gy, gz), whose layouts the search
    enumerates (search.enumerate_layouts(..., axonn=True))."""
    return all(f in Parallel.__dataclass_fields__ for f in ("gx", "gy", "gz"))


def axonn_layouts(model, n_gpus, global_batch) -> np.ndarray:
    """Every AxoNN 4D layout: valid grids (gx, gy, gz, dp) x micro-batches dividing the batch
    of one (z, data) slice x recompute (none, selective, full) x ZeRO (0, 1 over data), as a
    search table (columns search.COLUMNS; tp = pp = 1)."""
    table = enumerate_layouts(model, n_gpus, global_batch, zero_stages=AXONN_ZERO, axonn=True)
    return table[axonn_mask(table)]


def inputs(quick=False) -> dict:
    cases = QUICK_CASES if quick else CASES
    return dict(models=tuple(m for m, _, _ in cases), systems=(SYSTEM,))


def series_masks(layouts) -> dict:
    """Megatron-LM 3D (cp = 1, ZeRO <= 1) and every layout diffperf knows."""
    megatron = (column(layouts, "cp") == 1) & (column(layouts, "zero_stage") <= 1)
    return dict(megatron_3d=megatron, any=np.ones(len(layouts), bool))


def run(models: dict, systems: dict, *, quick=False, training=None) -> StudyResult:
    """Best 3D layout per model, with TFLOP/s per GPU, beside the published AxoNN figure.

    Returns:
        StudyResult; rows (model, series) with the layout, model_tflops_per_gpu (model FLOPs
        without recompute / step time / GPUs), hardware_tflops_per_gpu (recompute included),
        and for the 80B case the published AxoNN and implied Megatron-LM figures.
    """
    system = systems[SYSTEM]
    placements = QUICK_PLACEMENTS if quick else PLACEMENTS
    available = axonn_available()
    status = ("modeled (Parallel gx, gy, gz; search.enumerate_layouts(axonn=True))" if available
              else "pending: Parallel has no gx/gy/gz grid yet")
    peak = float(system.matmul_flops_per_s) / 1e12
    rows = []
    for name, n, B in QUICK_CASES if quick else CASES:
        layouts, result = search_layouts(models[name], system, n, B, training,
                                         placements=placements)
        step = np.where(result.fits, result.step_time_s, np.inf)
        eighty = name == "megatron-76.1b"
        for series, mask in series_masks(layouts).items():
            s = np.where(mask, step, np.inf)
            i = int(np.argmin(s))
            if not np.isfinite(s[i]):
                continue
            r = row_summary(layouts, result, i, placements)
            tflops = r["model_flops"] / r["step_time_s"] / n / 1e12
            rows.append(dict(model=name, series=series, gpus=n, global_batch=B,
                             model_tflops_per_gpu=tflops,
                             hardware_tflops_per_gpu=r["hardware_flops"] / r["step_time_s"]
                             / n / 1e12,
                             peak_tflops=peak, frac_of_peak=tflops / peak,
                             axonn_published_tflops=AXONN_80B_TFLOPS if eighty else np.nan,
                             megatron_implied_tflops=(AXONN_80B_TFLOPS / AXONN_SPEEDUP
                                                      if eighty else np.nan),
                             axonn_status=status) | r)
        if available:
            rows += _axonn_rows(name, models[name], system, n, B, training, peak, status)
    table = columns_of(rows)
    return StudyResult(NAME, TITLE, table, _summary(table, status), _notes())


def _axonn_rows(name, model, system, n, B, training, peak, status) -> list:
    """The best AxoNN 4D layout that fits, as one row (none when nothing fits)."""
    table = axonn_layouts(model, n, B)
    result = search(model, system, training, table, chunk=STUDY_CHUNK, validate=False)
    step = np.where(result.fits, result.step_time_s, np.inf)
    i = int(np.argmin(step))
    if not np.isfinite(step[i]):
        return []
    r = row_summary(table, result, i)
    tflops = r["model_flops"] / r["step_time_s"] / n / 1e12
    return [dict(model=name, series="axonn_4d", gpus=n, global_batch=B,
                 model_tflops_per_gpu=tflops,
                 hardware_tflops_per_gpu=r["hardware_flops"] / r["step_time_s"] / n / 1e12,
                 peak_tflops=peak, frac_of_peak=tflops / peak, axonn_status=status,
                 n_axonn_layouts=len(table)) | r]


def _summary(t, status) -> dict:
    out = {"AxoNN 4D grid": status}
    for i in np.flatnonzero(t["series"] == "axonn_4d"):
        out[f"{t['model'][i]} on {t['gpus'][i]} GPUs, best AxoNN 4D"] = (
            f"gx {t['gx'][i]:.0f} gy {t['gy'][i]:.0f} gz {t['gz'][i]:.0f} dp {t['dp'][i]:.0f} "
            f"mb {t['micro_batch'][i]:.0f}: {t['model_tflops_per_gpu'][i]:.0f} TFLOP/s/GPU "
            f"({100 * t['frac_of_peak'][i]:.0f}% of peak)")
    for i in np.flatnonzero(t["series"] == "megatron_3d"):
        out[f"{t['model'][i]} on {t['gpus'][i]} GPUs, best 3D"] = (
            f"tp {t['tp'][i]:.0f} pp {t['pp'][i]:.0f} dp {t['dp'][i]:.0f} vp {t['vp'][i]:.0f} "
            f"mb {t['micro_batch'][i]:.0f}: {t['model_tflops_per_gpu'][i]:.0f} TFLOP/s/GPU "
            f"({100 * t['frac_of_peak'][i]:.0f}% of peak)")
        if np.isfinite(t["axonn_published_tflops"][i]):
            out[f"{t['model'][i]}: published AxoNN / implied Megatron-LM"] = (
                f"{t['axonn_published_tflops'][i]:.0f} / "
                f"{t['megatron_implied_tflops'][i]:.0f} TFLOP/s/GPU")
    return out


def _notes() -> tuple:
    return ("TFLOP/s per GPU count model FLOPs (no recompute) over the predicted step time.",
            "AxoNN's 178 TFLOP/s/GPU and 26% speed-up are the paper's measurements (abstract); "
            "the Megatron-LM figure is derived from them (178 / 1.26).",
            "Uncalibrated default efficiencies unless an overlay is given.")
