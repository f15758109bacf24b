"""Study 3: LLMs vs long-sequence transformers and what hardware they need (Subramanian et al.).

Subramanian, Rrapaj, Harrington, Chheda, Farrell, Austin, Williams, Wright & Bhimji,
"Comprehensive Performance Modeling and System Design Insights for Foundation Models"
(PMBS @ SC24, arXiv 2410.00273; PAPERS.md section 3). Findings [A]: LLMs run well with 3D
parallelism and stress the network only at pre-training scale, depending little on HBM
capacity and bandwidth; long-sequence transformers (ViT-ERA5, s = 64800) need 4D parallelism
(context/sequence parallelism added) and depend more uniformly on network and capacity.

diffperf's version: GPT-3 175B and ViT-ERA5 with the NERSC code's global batch of 4096 on
4096 GPUs of an H200-class system. For each model the whole layout space is searched (CP
included) and the fastest layout that fits is kept. Sensitivities are elasticities
d ln T / d ln theta: (a) at the best layout, by jax.grad of the prediction; (b) with the
layout searched again after doubling theta (HBM capacity acts only through (b): it decides
which layouts fit). The NVLink domain is compared as 8 vs 72 GPUs, both on the H200 datasheet
with a 72-GPU domain (a counterfactual) and as the real systems H100 / H200 vs GB200 NVL72.
"""

from __future__ import annotations

import numpy as np

from diffperf.search import PLACEMENTS
from diffperf.studies.common import (FACTORS, QUICK_PLACEMENTS, StudyResult, best_index,
                                     best_parallel, columns_of, elasticities,
                                     researched_elasticity, row_summary, scaled_system,
                                     search_layouts)

NAME = "llm-vs-longseq"
TITLE = "GPT-3 175B vs ViT-ERA5: layouts and hardware sensitivities (Subramanian et al.)"
MODELS = ("gpt3-175b", "vit-era5")
BASE = "h200-sxm-141gb"
NVL72_NAME = "h200-nvl72 (counterfactual)"
SYSTEMS = ("h100-sxm-80gb", BASE, "gb200-nvl72")
QUICK_SYSTEMS = (BASE,)
GPUS = 4096
GLOBAL_BATCH = 4096  # sequences (NERSC run_configs.py default)
DOUBLED = ("hbm_capacity", "fast_bw", "net_bw")  # FLOP/s, HBM bandwidth: grad only
QUICK_DOUBLED = ("hbm_capacity", "net_bw")
LABELS = dict(flops="FLOP/s", hbm_bw="HBM bandwidth", hbm_capacity="HBM capacity",
              fast_bw="NVLink bandwidth", fast_domain="NVLink domain", net_bw="network bandwidth")


def inputs(quick=False) -> dict:
    return dict(models=MODELS, systems=QUICK_SYSTEMS if quick else SYSTEMS)


def run(models: dict, systems: dict, *, quick=False, training=None, gpus=GPUS,
        global_batch=GLOBAL_BATCH) -> StudyResult:
    """Best layouts per (model, system) and elasticities per (model, parameter).

    Returns:
        StudyResult with a long table: rows of kind 'best_layout' (model, system, layout,
        step time, shares) and of kind 'elasticity' (model, parameter, method 'grad' or
        'research', factor, value).
    """
    placements = QUICK_PLACEMENTS if quick else PLACEMENTS
    hw = dict(systems)
    if not quick:  # the 72-GPU NVLink domain on the H200 datasheet, all else equal
        hw[NVL72_NAME] = scaled_system(systems[BASE], fast_domain=72.0 / 8.0, name=NVL72_NAME)
    rows = []
    for name in MODELS:
        model = models[name]
        best, grads = {}, dict.fromkeys(FACTORS, np.nan)
        for sys_name, system in hw.items():
            layouts, result = search_layouts(model, system, gpus, global_batch, training,
                                             placements=placements)
            i = best_index(result)
            if i is None:
                continue
            r = row_summary(layouts, result, i, placements)
            best[sys_name] = r["step_time_s"]
            rows.append(dict(kind="best_layout", model=name, system=sys_name, gpus=gpus,
                             global_batch=global_batch,
                             tokens_per_s_per_gpu=r["tokens_per_s"] / gpus) | r)
            if sys_name == BASE:
                grads = elasticities(model, best_parallel(layouts, i, placements),
                                     systems[BASE], training)
        rows += [dict(kind="elasticity", model=name, system=BASE, parameter=p,
                      method="grad", factor=1.0, elasticity=grads[p]) for p in FACTORS]
        for p in QUICK_DOUBLED if quick else DOUBLED:
            _, result = search_layouts(model, scaled_system(systems[BASE], **{p: 2.0}), gpus,
                                       global_batch, training, placements=placements)
            i = best_index(result)
            value = np.nan if i is None else researched_elasticity(
                best[BASE], float(result.step_time_s[i]), 2.0)
            rows.append(dict(kind="elasticity", model=name, system=BASE, parameter=p,
                             method="research", factor=2.0, elasticity=value))
        if NVL72_NAME in best:
            rows.append(dict(kind="elasticity", model=name, system=BASE,
                             parameter="fast_domain", method="research", factor=9.0,
                             elasticity=researched_elasticity(best[BASE], best[NVL72_NAME],
                                                              9.0)))
    table = columns_of(rows)
    return StudyResult(NAME, TITLE, table, _summary(table), _notes(gpus, global_batch))


def elasticity(table, model, parameter, method) -> float:
    """One elasticity of a study table (nan when absent)."""
    sel = ((table["kind"] == "elasticity") & (table["model"] == model)
           & (table["parameter"] == parameter) & (table["method"] == method))
    return float(table["elasticity"][sel][0]) if sel.any() else float("nan")


def ranking(table, model, parameters=("hbm_bw", "hbm_capacity", "fast_bw", "fast_domain",
                                       "net_bw")) -> list:
    """[(parameter, elasticity, method)] of `model`, largest |elasticity| first: the
    re-searched value where the study has one (the layout may change, so capacity counts),
    else the gradient at the best layout (FLOP/s, about -1 for both models, is left out).
    The ranking Subramanian et al. state [A]: an LLM depends most on the network and little on
    HBM capacity and bandwidth; a long-sequence model more uniformly on network and capacity."""
    out = []
    for p in parameters:
        e = elasticity(table, model, p, "research")
        how = "research"
        if not np.isfinite(e):
            e, how = elasticity(table, model, p, "grad"), "grad"
        out.append((p, e, how))
    return sorted(out, key=lambda r: -abs(r[1]))


def _summary(t) -> dict:
    out = {}
    lay = t["kind"] == "best_layout"
    for m in MODELS:
        sel = lay & (t["model"] == m) & (t["system"] == BASE)
        if sel.any():
            i = np.flatnonzero(sel)[0]
            out[f"{m} best on {BASE}"] = (
                f"tp {int(t['tp'][i])} pp {int(t['pp'][i])} dp {int(t['dp'][i])} "
                f"cp {int(t['cp'][i])}, zero {int(t['zero_stage'][i])}; "
                f"{t['step_time_s'][i]:.3g} s, MFU {100 * t['mfu'][i]:.1f}%")
        for p in ("net_bw", "hbm_capacity", "fast_bw", "fast_domain"):
            out[f"{m}: elasticity to {LABELS[p]} (grad / re-searched)"] = (
                f"{elasticity(t, m, p, 'grad'):+.3f} / {elasticity(t, m, p, 'research'):+.3f}")
        out[f"{m}: ranking (re-searched where done, else grad)"] = ", ".join(
            f"{LABELS[p]} {e:+.3f}" for p, e, _ in ranking(t, m))
    return out


def _notes(gpus, global_batch) -> tuple:
    return (f"{gpus} GPUs, global batch {global_batch} sequences for both models.",
            f"'{NVL72_NAME}' is the {BASE} datasheet with a 72-GPU NVLink domain: a "
            "counterfactual that isolates the domain size.",
            "Re-searched elasticities: ln(T_best(2 theta) / T_best(theta)) / ln 2 (NVLink "
            "domain: 8 -> 72, ln 9).",
            "Uncalibrated default efficiencies unless an overlay is given.")
