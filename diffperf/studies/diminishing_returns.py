"""Study 2: diminishing returns of scale (Fernandez et al.).

Fernandez, Wehrstedt, Shamis, Elhoushi, Saladi, Bisk, Strubell & Kahn, "Hardware Scaling
Trends and Diminishing Returns in Large-Scale Distributed Training" (arXiv 2411.13055;
PAPERS.md section 2). Findings [A]: (1) naive FSDP scale-out pays so much communication that
adding tensor or pipeline parallelism becomes preferable beyond some scale; (2) adding GPUs
quickly gives diminishing returns in throughput per GPU, per GPU-hour and per unit of power.

diffperf's version: Llama 3 70B, a fixed global batch (2048 sequences of 2048 tokens = 4.2M
tokens: pure FSDP of B sequences can use at most B GPUs, so the sequence is shortened from
8192 to reach 2048 GPUs at a 4M-token batch), on 64 ... 2048 H100s. At every GPU count the
whole layout space is searched again; three series are kept: the best layout of all, the
best pure FSDP (ZeRO-3 with tp = pp = cp = 1) and the best with tensor or pipeline
parallelism (tp > 1 or pp > 1, any ZeRO stage). Metrics (PAPERS.md section 2.1): tokens/s,
tokens/s per GPU, tokens per GPU-hour, tokens per joule (System.power_W per GPU), MFU,
exposed communication, and the marginal return X(2N) / X(N).
"""

from __future__ import annotations

import numpy as np

from diffperf.search import PLACEMENTS
from diffperf.studies.common import (QUICK_PLACEMENTS, StudyResult, column, columns_of,
                                     row_summary, search_layouts)

NAME = "diminishing-returns"
TITLE = "Diminishing returns of scale: Llama 3 70B, fixed global batch (Fernandez et al.)"
MODEL = "llama3-70b"
SYSTEM = "h100-sxm-80gb"
SEQ_LEN = 2048
GLOBAL_BATCH = 2048  # sequences: 2048 x 2048 = 4.19M tokens per step
GPUS = (64, 128, 256, 512, 1024, 2048)
QUICK_GPUS = (128, 512, 2048)
SERIES = ("best", "fsdp", "tp_pp")


def inputs(quick=False) -> dict:
    return dict(models=(MODEL,), systems=(SYSTEM,))


def series_masks(layouts) -> dict:
    """Layout masks of the series: all, pure FSDP, and with tensor or pipeline parallelism."""
    tp, pp, cp = (column(layouts, c) for c in ("tp", "pp", "cp"))
    fsdp = (tp == 1) & (pp == 1) & (cp == 1) & (column(layouts, "zero_stage") == 3)
    return dict(best=np.ones(len(layouts), bool), fsdp=fsdp, tp_pp=(tp > 1) | (pp > 1))


def run(models: dict, systems: dict, *, quick=False, training=None, gpus=None,
        seq_len=SEQ_LEN, global_batch=GLOBAL_BATCH) -> StudyResult:
    """Per GPU count and series: the best layout and its efficiency metrics.

    Returns:
        StudyResult; table rows (gpus, series) with tokens_per_s_per_gpu, tokens_per_gpu_hour,
        tokens_per_joule, marginal_return (X(N) / X(N_prev) x N_prev / N x 2 for doubling).
    """
    model = models[MODEL].replace(seq_len=float(seq_len))
    system = systems[SYSTEM]
    placements = QUICK_PLACEMENTS if quick else PLACEMENTS
    tokens = float(global_batch) * seq_len
    rows = []
    for n in gpus or (QUICK_GPUS if quick else GPUS):
        layouts, result = search_layouts(model, system, n, global_batch, training,
                                         placements=placements)
        step = np.where(result.fits, result.step_time_s, np.inf)
        for series, mask in series_masks(layouts).items():
            s = np.where(mask, step, np.inf)
            i = int(np.argmin(s))
            if not np.isfinite(s[i]):
                continue
            r = row_summary(layouts, result, i, placements)
            per_gpu = tokens / r["step_time_s"] / n
            rows.append(dict(gpus=n, series=series, tokens_per_step=tokens,
                             tokens_per_s_per_gpu=per_gpu,
                             tokens_per_gpu_hour=per_gpu * 3600.0,
                             tokens_per_joule=per_gpu / float(system.power_W)) | r)
    table = columns_of(rows)
    table["marginal_return"] = _marginal(table)
    return StudyResult(NAME, TITLE, table, _summary(table), _notes(seq_len, global_batch))


def _marginal(t) -> np.ndarray:
    """X(N) / X(N_prev) per series (X = tokens/s), nan for the first count of a series;
    2.0 is perfect scaling when N = 2 N_prev."""
    out = np.full(len(t["gpus"]), np.nan)
    for s in SERIES:
        idx = np.flatnonzero(t["series"] == s)
        x = t["tokens_per_s"][idx]
        out[idx[1:]] = x[1:] / x[:-1]
    return out


def _summary(t) -> dict:
    out = {}
    best = t["series"] == "best"
    g, x = t["gpus"][best], t["tokens_per_s_per_gpu"][best]
    out["best: tokens/s per GPU, first -> last count"] = (
        f"{x[0]:.0f} @ {g[0]} -> {x[-1]:.0f} @ {g[-1]} ({100 * (x[-1] / x[0] - 1):+.1f}%)")
    out["best: tokens per joule, first -> last"] = (
        f"{t['tokens_per_joule'][best][0]:.3f} -> {t['tokens_per_joule'][best][-1]:.3f}")
    fsdp = t["series"] == "fsdp"
    for n in t["gpus"][fsdp]:
        i = np.flatnonzero(fsdp & (t["gpus"] == n))[0]
        j = np.flatnonzero(best & (t["gpus"] == n))[0]
        out[f"{n} GPUs: FSDP / best throughput"] = (
            f"{t['tokens_per_s'][i] / t['tokens_per_s'][j]:.3f} (FSDP exposed comm "
            f"{100 * t['comm_exposed_frac'][i]:.1f}%)")
    return out


def _notes(seq_len, global_batch) -> tuple:
    return (f"Sequence length {seq_len} (Llama 3 70B's own is 8192) and global batch "
            f"{global_batch} sequences, fixed at every GPU count.",
            "Tokens per joule use the board TDP (System.power_W) for every GPU all step.",
            "Uncalibrated default efficiencies unless an overlay is given.")
