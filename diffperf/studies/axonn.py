"""Study 4: AxoNN's 4D hybrid vs Megatron-LM's 3D parallelism (Singh et al.).

Singh, Singhania, Ranjan, Sating & Bhatele, "A 4D Hybrid Algorithm to Scale Parallel Training
to Thousands of GPUs" (AxoNN; arXiv 2305.13525, SC24; PAPERS.md section 4). Findings [A]:
80B GPT on 1024 A100s of Perlmutter, 26% faster than Megatron-LM, 57% of peak (178 TFLOP/s
per GPU, 182 PFLOP/s in all); overlap gives ~53% on a 20B model.

diffperf's version: the best Megatron-style 3D layout (tp x pp x dp, no CP, ZeRO-0/1 as the
distributed optimizer) and the best layout of diffperf's whole space (CP and ZeRO-2/3 added)
for 20B- and 80B-class GPT models (Narayanan et al.'s 18.4B and 76.1B) on a Perlmutter-like
A100 system (configs/systems/perlmutter-a100.yaml: 4 GPUs per node), and, where `Parallel`
carries the AxoNN grid (gx, gy, gz), the best AxoNN 4D layout (every valid grid x micro-batch
x recompute x ZeRO over data, predicted with overlap on). Without the grid the AxoNN series is
reported as pending. Both are set beside the published AxoNN figure and the Megatron-LM
figure it implies (178 / 1.26 = 141 TFLOP/s per GPU).
"""

from __future__ import annotations

import numpy as np

import jax
import jax.numpy as jnp

from diffperf.api import _as_float
from diffperf.predict import predict_step
from diffperf.search import PLACEMENTS
from diffperf.specs.batch import anonymous
from diffperf.specs.parallel import Parallel
from diffperf.specs.training import Training
from diffperf.studies.common import (QUICK_PLACEMENTS, StudyResult, column, columns_of,
                                     quick_jit, result_summary, row_summary,
                                     search_layouts)

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
AXONN_COLUMNS = ("gx", "gy", "gz", "dp", "micro_batch", "recompute", "zero_stage")
_AXONN_PAD = 2048  # AxoNN layouts per padded batch: one compilation for every case


def axonn_available() -> bool:
    """True once `Parallel` has the AxoNN 3D tensor grid (gx, gy, gz) and diffperf can
    enumerate its grids (diffperf.axonn_search)."""
    if not all(f in Parallel.__dataclass_fields__ for f in ("gx", "gy", "gz")):
        return False
    try:
        from diffperf.axonn_search import axonn_grids  # noqa: F401
    except ImportError:
        return False
    return True


def axonn_layouts(model, n_gpus, global_batch) -> np.ndarray:
    """Every AxoNN 4D layout: valid grids (gx, gy, gz, dp) x micro-batches dividing the batch
    of one (z, data) slice x recompute (none, selective, full) x ZeRO (0, 1 over data), as an
    int table with columns AXONN_COLUMNS."""
    from diffperf.axonn_search import axonn_grids

    rows = []
    for gx, gy, gz, dp in axonn_grids(model, n_gpus, global_batch):
        per_slice = global_batch // (dp * gz)
        for b in (d for d in range(1, per_slice + 1) if per_slice % d == 0):
            rows += [(gx, gy, gz, dp, b, r, z) for r in range(3) for z in range(2)]
    return np.asarray(rows, dtype=np.int64)


def _predict_many_impl(model, parallel, system, training):
    axes = Parallel(**{f: (0 if f in AXONN_COLUMNS else None)
                       for f in Parallel.__dataclass_fields__})
    return jax.vmap(predict_step, in_axes=(None, axes, None, None, None))(
        model, parallel, system, training, None)


_predict_many = quick_jit(_predict_many_impl)


def axonn_predictions(model, system, table, global_batch, training=None):
    """`predict` of every row of an AxoNN layout table (a Result of numpy arrays)."""
    training = Training() if training is None else training
    n = len(table)
    padded = np.concatenate([table, np.repeat(table[-1:], -n % _AXONN_PAD, axis=0)])
    dtype = jnp.result_type(float)
    args = _as_float((anonymous(model), anonymous(system), anonymous(training)))
    outs = []
    for i in range(0, len(padded), _AXONN_PAD):
        chunk = padded[i:i + _AXONN_PAD]
        cols = {c: np.asarray(chunk[:, j], dtype) for j, c in enumerate(AXONN_COLUMNS)}
        parallel = _as_float(Parallel(**cols, global_batch=global_batch, axonn_overlap=1))
        outs.append(_predict_many(args[0], parallel, args[1], args[2]))
    return jax.tree.map(lambda *xs: np.concatenate([np.asarray(x) for x in xs])[:n], *outs)


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
    status = ("modeled (Parallel gx, gy, gz; diffperf.axonn_search grids)" if available
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
    result = axonn_predictions(model, system, table, B, training)
    step = np.where(result.fits, result.step_time_s, np.inf)
    i = int(np.argmin(step))
    if not np.isfinite(step[i]):
        return []
    r = dict(zip(AXONN_COLUMNS, (int(v) for v in table[i]))) | dict(tp=1, pp=1, cp=1)
    r |= result_summary(result, i)
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
