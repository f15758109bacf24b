"""NVIDIA's published long-sequence FP8 runs with context parallelism (data/published_longseq.csv,
provenance in data/published_longseq.md): a held-out check set that no fit reads.

Every row loads and predicts (one compiled program for both systems), finite; the provenance
columns are filled; the printed
throughput is consistent with NeMo's own FLOP count (the conversion the B200 rows rely on).
The errors themselves are reported by calibration/check_longseq.py (docs/accuracy-longseq.md),
not asserted: they are a measurement of diffperf, not a bar it was tuned to.
"""

from __future__ import annotations

import csv
import re
from pathlib import Path

import numpy as np
import yaml

from diffperf import load_runs, resources

ROOT = Path(__file__).resolve().parent.parent
CSV = ROOT / "data" / "published_longseq.csv"
PROVENANCE = ("source", "source_page", "page_commit", "container", "system_page",
              "precision_page", "tokens_per_s_per_gpu", "model_tflops_per_gpu",
              "throughput_printed", "notes")
# NeMo's Llama shapes as its FLOP formula reads them: (L, h, f, a, g, V)
SHAPES = {"llama2-7b": (32, 4096, 11008, 32, 32, 32000),
          "llama3-8b": (32, 4096, 14336, 32, 8, 128256),
          "llama3-70b": (80, 8192, 28672, 64, 8, 128256)}


def _rows():
    return list(csv.DictReader(open(CSV)))


def test_provenance_columns_are_present_and_filled():
    rows = _rows()
    assert len(rows) == 19
    for r in rows:
        for col in PROVENANCE:
            assert (r.get(col) or "").strip(), (r["id"], col)
        assert re.fullmatch(r"[0-9a-f]{40}", r["page_commit"]), r["id"]
        assert r["page_commit"] in r["source_page"] and r["source_page"].startswith(
            "https://github.com/NVIDIA/NeMo/blob/"), r["id"]
        assert r["throughput_printed"] in ("tokens", "tflops"), r["id"]
    # the set reaches long sequences with context parallelism on both GPUs
    for system in ("h100-sxm-80gb", "dgx-b200"):
        longest = max(int(r["seq_len"]) for r in rows if r["system"] == system)
        assert longest == 1024 * 1024
        assert max(int(r["cp"]) for r in rows if r["system"] == system) >= 16


def test_printed_throughput_matches_nemo_flop_count_and_step_time():
    """TFLOP/s/GPU = tokens/s/GPU x NeMo's FLOPs per token, L h^2 (12 + 12 g/a + 18 f/h +
    12 s/h + 6 V/(L h)) (non-causal attention; nemo/utils/flops_formulas.py): within the
    printed rounding for the rows that print both (H100), by construction for the B200 rows
    (tokens/s derived from TFLOP/s). step_time_s = GBS s / (tokens/s/GPU x GPUs)."""
    for r in _rows():
        L, h, f, a, g, V = SHAPES[r["model"]]
        s = int(r["seq_len"])
        per_token = L * h * h * (12 + 12 * g / a + 18 * f / h + 12 * s / h + 6 * V / (L * h))
        tok = float(r["tokens_per_s_per_gpu"])
        tol = 3e-3 if r["throughput_printed"] == "tokens" else 1e-5
        np.testing.assert_allclose(tok * per_token / 1e12, float(r["model_tflops_per_gpu"]),
                                   rtol=tol, err_msg=r["id"])
        step = int(r["global_batch"]) * s / (tok * int(r["num_gpus"]))
        np.testing.assert_allclose(float(r["step_time_s"]), step, rtol=1e-5, err_msg=r["id"])
        n = int(r["tp"]) * int(r["pp"]) * int(r["cp"]) * int(r["dp"])
        assert n == int(r["num_gpus"]), r["id"]


def test_every_row_loads_and_predicts_finite():
    """load_runs and one vmap over every row (both systems in one program): no refusal,
    finite positive step times and memory. (Whether each run fits is reported by
    calibration/check_longseq.py, not asserted: one row sits at the capacity.)"""
    from diffperf.cli.validate_cmd import load_systems
    from diffperf.validation import predict_runs

    runs = load_runs("published_longseq")  # by its shipped name
    assert len(runs) == 19
    # the row's `set` facts reach its Training: FlashAttention-2 on the DGX-H100 rows (NeMo
    # Framework Launcher 24.01-24.07 exports NVTE_FUSED_ATTN=0; data/published_longseq.md),
    # cuDNN (the set's kernel) on the DGX-B200 rows (NeMo 25.04 exports NVTE_FUSED_ATTN=1)
    fa2 = {s: {float(runs.trainings[i].attention_fa2) for i in range(len(runs))
               if runs.systems[i] == s} for s in set(runs.systems)}
    assert fa2 == {"h100-sxm-80gb": {1.0}, "dgx-b200": {0.0}}
    # TE 1.8 userbuffers with pipelined reduce-scatters on the 24.07 70B row only (NeMo
    # Framework Launcher 24.07 ub_cfg_h100_fp8_h8192_tp4_mbs1_seqlen8192; the others: TP 1 or
    # no published overlap configuration)
    ub = {runs.rows[i]["id"]: float(runs.parallels[i].tp_userbuffers) for i in range(len(runs))}
    assert {k for k, v in ub.items() if v} == {"nemo-24_07-dgx-h100-llama3-70b-fp8-8k"}
    assert ub["nemo-24_07-dgx-h100-llama3-70b-fp8-8k"] == 2.0
    systems = load_systems(runs, None, "none")
    step, mem, _ = predict_runs(runs, systems)
    assert np.all(np.isfinite(step)) and np.all(step > 0)
    assert np.all(np.isfinite(mem)) and np.all(mem > 0)


def test_no_fit_reads_the_check_set():
    """Held out: no shipped overlay or efficiency set was fitted on these rows."""
    for name, f in resources.calibration_files().items():
        assert yaml.safe_load(f.read_text())["fitted_on"]["runs"] != "published_longseq", name
    for f in (ROOT / "configs" / "efficiency").glob("*.yaml"):
        assert "published_longseq" not in f.read_text(), f.name


def test_cp_attention_work_and_ring_block_of_the_1m_row_by_hand():
    """The two CP quantities docs/accuracy-longseq.md's analysis rests on, for the H100 1M row
    (Llama 2 7B: h 4096, 32 heads and 32 KV heads of d 128; s = 2^20, c 32, t 8, b 1, bf16):

    - attention core per rank and layer, forward: QK^T and AV each 2 (s/c) s d kappa per head,
      kappa 1/2 (causal), a/t = 4 heads: 2 x 2 x 32768 x 1048576 x 128 x 0.5 x 4 = 3.518e13
      FLOP = the whole sequence's causal attention 2 s^2 h / (c t), i.e. TE's load-balanced
      ring (2c chunks, rank r holds chunks r and 2c-1-r) gives every rank 1/c of the work;
    - K/V block of one ring step: 2 b (s/c) a_kv d q_a / t = 2 x 32768 x 32 x 128 x 2 / 8
      = 67,108,864 B (TE's AttnFuncWithCP sends the rank's K and V each step; the backward's
      buffers hold K/V and dK/dV, twice that)."""
    from diffperf.workload.cp import cp_ring_block_bytes
    from diffperf.workload.flops import layer_ops

    runs = load_runs(CSV)
    i = runs.ids.index("nemo-24_03_01-dgx-h100-llama2-7b-fp8-1024k")
    m, p, t = runs.models[i], runs.parallels[i], runs.trainings[i]
    s, c, tp, h = 2.0**20, 32.0, 8.0, 4096.0
    flops = float(np.sum(np.asarray(layer_ops(m, p, t).attention.flops)))
    np.testing.assert_allclose(flops, 2 * 2 * (s / c) * s * 128 * 0.5 * 4, rtol=1e-6)
    np.testing.assert_allclose(flops, 2 * s * s * h / (c * tp), rtol=1e-6)
    assert float(cp_ring_block_bytes(m, p, t)) == 2 * (s / c) * 32 * 128 * 2 / tp == 67108864
