"""Transcribe the pre-training tables of Megatron-Bridge's performance pages into runs CSVs.

Provenance tool, not package code: it reads the two Markdown pages of the NVIDIA-NeMo/
Megatron-Bridge repository (docs/performance-summary.md and docs/performance-summary-archive.md,
given as paths) and writes

    data/megatron_bridge.csv            rows of the models diffperf has a config for (validated)
    data/transcribed/megatron_bridge_unmodelled.csv the other pre-training rows (transcribed,
    not predicted: not a runs CSV, so not a shipped dataset)

Every printed number is copied unchanged; the derived columns (dp, step_time_s, zero_stage,
the notes) are computed here as described in
data/megatron_bridge.md. Only "Pre-Training Performance" sections are read (SFT and LoRA are
skipped). A cell printed as "A (B)" is two runs: A and the variant B (the pages' note: B is
another quantization granularity, and in the 25.09 tables another layout).

Usage (from the repository root):
    git --git-dir=$MIRROR show HEAD:docs/performance-summary.md > /tmp/summary.md
    git --git-dir=$MIRROR show HEAD:docs/performance-summary-archive.md > /tmp/archive.md
    python calibration/bridge_transcribe.py /tmp/summary.md /tmp/archive.md
"""

from __future__ import annotations

import csv
import re
import sys
from pathlib import Path

# Page names -> SHARED_NAMES.md names.
SYSTEMS = {"DGX-H100": "h100-sxm-80gb", "DGX-B200": "dgx-b200", "DGX-B300": "dgx-b300",
           "DGX-GB200": "gb200-nvl72", "DGX-GB300": "gb300-nvl72"}
GPUS_PER_NODE = {"h100-sxm-80gb": 8, "dgx-b200": 8, "dgx-b300": 8, "gb200-nvl72": 4,
                 "gb300-nvl72": 4}
# Page precision -> --precision name (SHARED_NAMES.md). "FP8" on the 26.x pages is read as
# current scaling, the 25.11 page's "FP8-CS" (see data/megatron_bridge.md, ambiguities).
PRECISIONS = {"BF16": "bf16", "FP8": "fp8-current", "FP8-CS": "fp8-current",
              "FP8-MX": "mxfp8", "MXFP8": "mxfp8", "NVFP4": "nvfp4"}
# Page model label (before any parenthesised remark) -> configs/models name.
MODELS = {"LLAMA3_8B": "llama3-8b", "LLAMA3_70B": "llama3-70b",
          "LLAMA3.1_405B": "llama3.1-405b", "DeepSeekV3": "deepseek-v3",
          "GPT OSS 120B": "gpt-oss-120b", "Qwen3_30B_a3B": "qwen3-30b-a3b",
          "Qwen3_235B_a22B": "qwen3-235b-a22b"}
UNMODELLED = {"Kimi_K2": "kimi-k2", "Nemotron_3_Nano": "nemotron-3-nano",
              "Nemotron_3_Super": "nemotron-3-super", "Nemotron_3_Ultra": "nemotron-3-ultra",
              "Nemotron_3_5_Lightning": "nemotron-3.5-lightning",
              "DeepSeekV4 Flash": "deepseek-v4-flash"}
# Architecture columns of the runs schema, from each model's config.json (the model_config
# column names the shipped config; load_runs checks these against it).
ARCH = {
    "llama3-8b": dict(num_layers=32, hidden=4096, ffn_hidden=14336, num_heads=32,
                      num_kv_heads=8, vocab=128256, gated_mlp=1, moe_experts=0, moe_topk=0),
    "llama3-70b": dict(num_layers=80, hidden=8192, ffn_hidden=28672, num_heads=64,
                       num_kv_heads=8, vocab=128256, gated_mlp=1, moe_experts=0, moe_topk=0),
    "llama3.1-405b": dict(num_layers=126, hidden=16384, ffn_hidden=53248, num_heads=128,
                          num_kv_heads=8, vocab=128256, gated_mlp=1, moe_experts=0,
                          moe_topk=0),
    "deepseek-v3": dict(num_layers=61, hidden=7168, ffn_hidden=18432, num_heads=128,
                        num_kv_heads=128, vocab=129280, gated_mlp=1, moe_experts=256,
                        moe_topk=8),
    "gpt-oss-120b": dict(num_layers=36, hidden=2880, ffn_hidden=2880, num_heads=64,
                         num_kv_heads=8, vocab=201088, gated_mlp=1, moe_experts=128,
                         moe_topk=4),
    "qwen3-30b-a3b": dict(num_layers=48, hidden=2048, ffn_hidden=768, num_heads=32,
                          num_kv_heads=4, vocab=151936, gated_mlp=1, moe_experts=128,
                          moe_topk=8),
    "qwen3-235b-a22b": dict(num_layers=94, hidden=4096, ffn_hidden=1536, num_heads=64,
                            num_kv_heads=4, vocab=151936, gated_mlp=1, moe_experts=128,
                            moe_topk=8),
}
# EP token exchange of each row's Bridge performance recipe at the snapshot commit
# (src/megatron/bridge/perf_recipes/<model>/<system>/): 1 = the flex dispatcher with a DeepEP /
# HybridEP backend, 0 = the alltoall dispatcher. Megatron-Core uses the flex backend only with
# moe_token_dispatcher_type == "flex" (megatron/core/transformer/moe/moe_utils.py), so GPT-OSS's
# BF16 recipes (the GPT-OSS bridge sets "alltoall"; the base recipe's backend "deepep" is then
# inactive) are 0. An assumption for older containers (data/megatron_bridge.md).


def ep_dispatch(name, system, prec, n_gpus):
    """1 where the row's performance recipe runs the flex dispatcher (DeepEP / HybridEP)."""
    if name == "deepseek-v3":
        return 1  # hybridep / deepep in every DeepSeek-V3 recipe
    if name == "gpt-oss-120b":  # flex + hybridep: DGX-B300, and the GB200 / GB300 MXFP8 recipes
        return int(system == "dgx-b300" or (system in ("gb200-nvl72", "gb300-nvl72")
                                            and prec == "mxfp8"))
    if name == "qwen3-30b-a3b":
        return 1  # flex + hybridep in every recipe
    if name == "qwen3-235b-a22b":  # alltoall on DGX-H100 and DGX-B200 at 64 GPUs / BF16 / FP8-CS
        return int(not (system == "h100-sxm-80gb"
                        or (system == "dgx-b200" and (n_gpus == 64 or prec != "mxfp8"))))
    return 0


COLUMNS = ["id", "source", "source_page", "container", "system", "system_page", "model",
           "model_page", "model_config", "num_gpus", "gpus_per_node", "precision",
           "precision_page", "num_layers", "hidden", "ffn_hidden", "num_heads", "num_kv_heads",
           "vocab", "gated_mlp", "moe_experts", "moe_topk", "seq_len", "global_batch",
           "micro_batch", "tp", "pp", "cp", "vp", "ep", "etp", "dp", "fsdp", "zero_stage",
           "grad_accum", "sequence_parallel", "recompute", "ep_dispatch", "moe_token_drop",
           "mtp",
           "tokens_per_s_per_gpu", "model_tflops_per_gpu", "step_time_s", "notes"]


def _split(cell: str) -> tuple[str, str | None]:
    """'A (B)' -> ('A', 'B'); 'A' -> ('A', None). Footnote marks [^x] are dropped."""
    cell = re.sub(r"\[\^[^\]]*\]", "", cell).strip()
    m = re.fullmatch(r"(.*?)\s*\((.*?)\)\s*", cell)
    return (m.group(1).strip(), m.group(2).strip()) if m else (cell, None)


def _int(x: str, default: int = 1) -> int:
    return default if x in ("n/a", "") else int(x)


def tables(text: str, page: str):
    """Yield (container, header dict, row cells, heading) for every pre-training table row."""
    container, section, heading = None, None, {}
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i].strip()
        if m := re.match(r"## (\S+) NeMo Container", line):
            container, section = m.group(1), None
        elif line.startswith("### "):
            section = line[4:].strip()
        elif m := re.match(r"#### (Model|System): (.*)", line):
            heading = {m.group(1).lower(): m.group(2).strip()}
        elif line.startswith("|") and container and section == "Pre-Training Performance":
            header = [c.strip() for c in line.strip("|").split("|")]
            i += 2  # the |---| line
            while i < len(lines) and lines[i].strip().startswith("|"):
                cells = [c.strip() for c in lines[i].strip().strip("|").split("|")]
                yield container, dict(zip(header, cells)), dict(heading), page
                i += 1
            continue
        i += 1


def runs(container, row, heading, page):
    """One or two runs (the 'A (B)' variant) of a table row as dicts of COLUMNS."""
    model_page = heading.get("model") or row["Model"]
    system_page = heading.get("system") or row["System"]
    variants = []
    keys = [k for k in row if k not in ("Model", "System")]
    # A variant is a run only where its throughput is printed (25.09 H100 DeepSeek-V3 gives
    # a second TFLOP/s figure without tokens/s: kept as a note).
    has_variant = _split(row["Tokens / sec / GPU"])[1] is not None
    lone = [k for k in keys if _split(row[k])[1] is not None] if not has_variant else []
    for v in ((0, 1) if has_variant else (0,)):
        cells = {k: (_split(row[k])[v] if _split(row[k])[1] is not None else _split(row[k])[0])
                 for k in keys}
        variants.append((v, cells))
    out = []
    base_label = _split(model_page)[0].strip()
    remark = _split(model_page)[1]
    for v, c in variants:
        notes = [f"{k} printed as '{row[k]}': the variant has no tokens/s, not a run"
                 for k in lone]
        n = int(c["#-GPUs"])
        tp, pp, cp = _int(c["TP"]), _int(c["PP"]), _int(c["CP"])
        vp, ep = _int(c["VP"]), _int(c["EP"])
        fsdp = _int(c.get("FSDP", "0"), 0)
        dp = n // (tp * pp * cp)
        if dp * tp * pp * cp != n:
            raise ValueError(f"{container} {model_page} {system_page}: tp pp cp do not divide {n}")
        gbs, mbs, seq = int(c["GBS"]), int(c["MBS"]), int(c["Sequence Length"])
        ga = c.get("GA")
        if ga is not None and int(ga) * mbs * dp != gbs:
            notes.append(f"GA {ga} x MBS {mbs} x dp {dp} != GBS {gbs}: the printed MBS is "
                         f"kept (GA would imply MBS {gbs / (int(ga) * dp):g})")
        if "Precision" in c:
            prec_page = c["Precision"]
        else:  # 25.09: no precision column; the footnote's convention (see README)
            prec_page = "(not printed)"
            notes.append("precision not printed on the 25.09 page: main value read as FP8-CS, "
                         "the parenthesised variant as FP8-MX (Blackwell) / 128x128 blockwise "
                         "(H100) per the page's note")
        if prec_page == "(not printed)":
            prec = "fp8-current" if v == 0 else (
                "fp8-blockwise" if system_page == "DGX-H100" else "mxfp8")
        else:
            prec = PRECISIONS[prec_page]
        tok = float(c["Tokens / sec / GPU"])
        tfl = c["Model TFLOP / sec / GPU"]
        system = SYSTEMS[system_page]
        name = MODELS.get(base_label) or UNMODELLED[base_label]
        mtp = ""
        drop = 0
        if remark:
            notes.append(f"page label '{model_page}'")
            if remark == "w/ MTP":
                mtp = 1
            elif remark == "w/o MTP":
                mtp = 0
            elif remark == "tokendrop":
                drop = 1
        invalid = (tp * cp * dp) % ep != 0
        if invalid:
            notes.append(f"layout as printed is not a Megatron-Core layout: ep {ep} does not "
                         f"divide the tp x cp x dp = {tp * cp * dp} ranks of a pipeline stage")
        step = gbs * seq / (tok * n)
        rid = (f"mb-{container}-{system_page.lower()}-{name}-{prec}-{n}g"
               .replace(".", "_"))
        out.append(dict(
            id=rid, source=f"megatron-bridge-{container}", source_page=page,
            container=container, system=system, system_page=system_page, model=name,
            model_page=model_page, model_config=name if name in MODELS.values() and not invalid else "",
            num_gpus=n, gpus_per_node=GPUS_PER_NODE[system], precision=prec,
            precision_page=prec_page, **ARCH.get(name, {}), seq_len=seq, global_batch=gbs,
            micro_batch=mbs, tp=tp, pp=pp, cp=cp, vp=vp, ep=ep,
            etp=1 if ep > 1 else "", dp=dp, fsdp=fsdp, zero_stage=3 if fsdp > 0 else 0,
            grad_accum=ga or "", sequence_parallel=1 if tp > 1 else 0, recompute="none",
            ep_dispatch=ep_dispatch(name, system, prec, n) if ep > 1 else 0,
            moe_token_drop=drop, mtp=mtp, tokens_per_s_per_gpu=c["Tokens / sec / GPU"],
            model_tflops_per_gpu=tfl, step_time_s=f"{step:.6g}", notes="; ".join(notes)))
    return out


def main(summary: str, archive: str, outdir: str = "data") -> None:
    rows = []
    for path, page in ((summary, "docs/performance-summary.md"),
                       (archive, "docs/performance-summary-archive.md")):
        for container, row, heading, pg in tables(Path(path).read_text(), page):
            rows += runs(container, row, heading, pg)
    seen = {}
    for r in rows:  # same container/system/model/precision/GPUs twice: number them
        k = r["id"]
        seen[k] = seen.get(k, 0) + 1
    count = {}
    for r in rows:
        if seen[r["id"]] > 1:
            count[r["id"]] = count.get(r["id"], 0) + 1
            r["id"] = f"{r['id']}-{count[r['id']]}"
    for name, keep in (("megatron_bridge.csv", lambda r: r["model_config"]),
                       ("transcribed/megatron_bridge_unmodelled.csv",
                        lambda r: not r["model_config"])):
        sel = [r for r in rows if keep(r)]
        if not keep(dict(model_config="x")):  # the unmodelled file: no architecture columns
            for r in sel:
                for k in ARCH["llama3-8b"]:
                    r[k] = ""
        with open(Path(outdir) / name, "w", newline="") as f:
            w = csv.DictWriter(f, COLUMNS, extrasaction="raise")
            w.writeheader()
            for r in sel:
                w.writerow({k: r.get(k, "") for k in COLUMNS})
        print(f"{name}: {len(sel)} rows")


if __name__ == "__main__":
    main(*sys.argv[1:])
