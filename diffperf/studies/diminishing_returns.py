"""Study 2: diminishing returns of scale (Fernandez et al.).

Fernandez, Wehrstedt, Shamis, Elhoushi, Saladi, Bisk, Strubell & Kahn, "Hardware Scaling
Trends and Diminishing Returns in Large-Scale Distributed Training" (arXiv 2411.13055;
PAPERS.md section 2). Findings [A]: (1) naive FSDP scale-out pays so much communication that
adding tensor or pipeline parallelism becomes preferable beyond some scale; (2) adding GPUs
quickly gives diminishing returns in throughput per GPU, per GPU-hour and per unit of power.

diffperf's version: Llama 3 8B and 70B, a fixed global batch (2048 sequences of 2048 tokens
= 4.2M tokens: pure FSDP of B sequences can use at most B GPUs, so the sequence is shortened
from 8192 to reach 2048 GPUs at a 4M-token batch), on 64 ... 2048 H100s. At every GPU count
the whole layout space is searched again and split into three disjoint families, each
plotted once: pure FSDP (ZeRO-3 with tp = pp = cp = 1), with tensor or pipeline
parallelism (tp > 1 or pp > 1, any ZeRO stage), and the rest (tp = pp = 1 with context
parallelism or ZeRO 0-2). `best` marks the family that holds the fastest layout at that
count (no "best" series repeats a family). Along each panel only the GPU count changes
(model, batch, sequence fixed). Metrics (PAPERS.md section 2.1): tokens/s, tokens/s per GPU,
tokens per GPU-hour, tokens per joule (System.power_W per GPU), MFU, exposed communication,
and the marginal return X(N) / X(N_prev). The cross-over of finding (1) is where the best
family changes from pure FSDP to TP/PP (`crossover`).
"""

from __future__ import annotations

import numpy as np

from diffperf.search import PLACEMENTS
from diffperf.studies.common import (QUICK_PLACEMENTS, StudyResult, column, columns_of,
                                     row_summary, search_layouts)

NAME = "diminishing-returns"
TITLE = "Diminishing returns of scale: Llama 3 8B and 70B, fixed global batch (Fernandez et al.)"
MODELS = ("llama3-8b", "llama3-70b")
MODEL = "llama3-70b"
SYSTEM = "h100-sxm-80gb"
SEQ_LEN = 2048
GLOBAL_BATCH = 2048  # sequences: 2048 x 2048 = 4.19M tokens per step
GPUS = (64, 128, 256, 512, 1024, 2048)
QUICK_GPUS = {"llama3-8b": (512, 1024, 2048), "llama3-70b": (128, 512, 2048)}
SERIES = ("fsdp", "tp_pp", "other")
LABELS = dict(fsdp="pure FSDP (ZeRO-3, tp = pp = cp = 1)",
              tp_pp="with TP and/or PP (any ZeRO)",
              other="rest: tp = pp = 1 with CP or ZeRO 0-2")


def inputs(quick=False) -> dict:
    return dict(models=MODELS, systems=(SYSTEM,))


def series_masks(layouts) -> dict:
    """Three disjoint layout families: pure FSDP, with TP or PP, and the rest."""
    tp, pp, cp = (column(layouts, c) for c in ("tp", "pp", "cp"))
    fsdp = (tp == 1) & (pp == 1) & (cp == 1) & (column(layouts, "zero_stage") == 3)
    tp_pp = (tp > 1) | (pp > 1)
    return dict(fsdp=fsdp, tp_pp=tp_pp, other=~(fsdp | tp_pp))


def run(models: dict, systems: dict, *, quick=False, training=None, gpus=None,
        seq_len=SEQ_LEN, global_batch=GLOBAL_BATCH) -> StudyResult:
    """Per model, GPU count and family: the best layout and its efficiency metrics.

    Returns:
        StudyResult; table rows (model, gpus, series) with best (1 for the fastest family at
        that count), tokens_per_s_per_gpu, tokens_per_gpu_hour, tokens_per_joule,
        marginal_return (X(N) / X(N_prev), 2.0 = linear when N = 2 N_prev).
    """
    system = systems[SYSTEM]
    placements = QUICK_PLACEMENTS if quick else PLACEMENTS
    tokens = float(global_batch) * seq_len
    rows = []
    for name in MODELS:
        model = models[name].replace(seq_len=float(seq_len))
        counts = gpus or (QUICK_GPUS[name] if quick else GPUS)
        for n in counts:
            layouts, result = search_layouts(model, system, n, global_batch, training,
                                             placements=placements)
            step = np.where(result.fits, result.step_time_s, np.inf)
            found = []
            for series, mask in series_masks(layouts).items():
                s = np.where(mask, step, np.inf)
                i = int(np.argmin(s))
                if not np.isfinite(s[i]):
                    continue
                r = row_summary(layouts, result, i, placements)
                per_gpu = tokens / r["step_time_s"] / n
                found.append(dict(model=name, gpus=n, series=series, best=0,
                                  tokens_per_step=tokens, tokens_per_s_per_gpu=per_gpu,
                                  tokens_per_gpu_hour=per_gpu * 3600.0,
                                  tokens_per_joule=per_gpu / float(system.power_W)) | r)
            if found:
                min(found, key=lambda r: r["step_time_s"])["best"] = 1
            rows += found
    table = columns_of(rows)
    table["marginal_return"] = _marginal(table)
    return StudyResult(NAME, TITLE, table, _summary(table), _notes(seq_len, global_batch))


def _marginal(t) -> np.ndarray:
    """X(N) / X(N_prev) per (model, series) (X = tokens/s), nan for the first count of a
    series; 2.0 is perfect scaling when N = 2 N_prev. For the best family at each count
    (`best_marginal`) the same over the best rows."""
    out = np.full(len(t["gpus"]), np.nan)
    for m in dict.fromkeys(t["model"]):
        for s in SERIES:
            idx = np.flatnonzero((t["model"] == m) & (t["series"] == s))
            x = t["tokens_per_s"][idx]
            out[idx[1:]] = x[1:] / x[:-1]
    return out


def best_rows(t, model) -> np.ndarray:
    """Row indices of the fastest family at each GPU count of `model`, by count."""
    return np.flatnonzero((t["model"] == model) & (t["best"] == 1))


def crossover(t, model):
    """(last count where pure FSDP is the fastest family, first later count where a TP/PP
    layout is), or None when the best family never changes from FSDP to TP/PP."""
    rows = best_rows(t, model)
    fams, counts = t["series"][rows], t["gpus"][rows]
    for k in range(1, len(rows)):
        if fams[k - 1] == "fsdp" and fams[k] == "tp_pp":
            return int(counts[k - 1]), int(counts[k])
    return None


def _summary(t) -> dict:
    out = {}
    for m in dict.fromkeys(t["model"]):
        b = best_rows(t, m)
        g, x = t["gpus"][b], t["tokens_per_s_per_gpu"][b]
        out[f"{m}: best tokens/s per GPU, first -> last count"] = (
            f"{x[0]:.0f} @ {g[0]} -> {x[-1]:.0f} @ {g[-1]} ({100 * (x[-1] / x[0] - 1):+.1f}%)")
        out[f"{m}: fastest family by count"] = ", ".join(
            f"{gi}: {s}" for gi, s in zip(g, t["series"][b]))
        c = crossover(t, m)
        out[f"{m}: FSDP -> TP/PP cross-over"] = (
            "none (the fastest family never changes from pure FSDP to TP/PP)" if c is None
            else f"between {c[0]} and {c[1]} GPUs")
        fsdp = (t["model"] == m) & (t["series"] == "fsdp")
        for n in t["gpus"][fsdp]:
            i = np.flatnonzero(fsdp & (t["gpus"] == n))[0]
            j = np.flatnonzero((t["model"] == m) & (t["gpus"] == n) & (t["series"] == "tp_pp"))
            if len(j):
                out[f"{m}, {n} GPUs: FSDP / best TP-PP throughput"] = (
                    f"{t['tokens_per_s'][i] / t['tokens_per_s'][j[0]]:.3f} (FSDP exposed comm "
                    f"{100 * t['comm_exposed_frac'][i]:.1f}%)")
    return out


def _notes(seq_len, global_batch) -> tuple:
    return (f"Sequence length {seq_len} (Llama 3's own is 8192) and global batch "
            f"{global_batch} sequences, fixed at every GPU count.",
            "Three disjoint layout families, each its best layout; a star marks the fastest "
            "family at each count.",
            "Tokens per joule use the board TDP (System.power_W) for every GPU all step.",
            "Uncalibrated default efficiencies unless an overlay is given.")
