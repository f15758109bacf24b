"""Predicted device memory of the published FSDP rows against the memory their sources print
(docs/accuracy-hopper.md, "Session 14: the root unit's memory"). Run from the repository root:

    python calibration/check_fsdp_memory.py

Measured (never fitted; not in the runs CSVs, whose `peak_memory_GB` is the allocator's
allocated peak while TorchTitan prints its *reserved* peak):
  TorchTitan `benchmarks/llama3_h100_202412_torchtitan.md` (torch 1963fc8, torchtitan 9dec370),
  Tables 1-4, column "Memory(GiB)": `train.py` logs `device_memory_monitor.get_peak_stats()
  .max_reserved_gib` = `torch.cuda.memory_stats()["reserved_bytes.all.peak"]` / 2^30
  (`torchtitan/metrics.py` at 9dec370). Reserved >= allocated (the caching allocator's
  segments), so a model of the tensors live at the peak should come out *below* these.
  TorchTitan `docs/performance.md` at 395a52627 (2024-04-18), Llama 2 70B on 64 A100 80GB,
  local batch 2: "selective layer" and "selective op" AC ran out of memory (OOM), local batch
  1 "selective op" and local batch 2 "full" AC ran: a fits check.
Prints, per row: measured GB (reserved), predicted GB, error, the predicted parts (GB) and
whether the layout fits; each row predicted with the shipped set of its GPU (as
`calibration/trust_sets.py` does).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from diffperf import load_runs, load_system, predict  # noqa: E402

GIB = 2.0 ** 30
SETS = {"a100": ROOT / "calibration/fitted/vtrain-a100.yaml",
        "h100": ROOT / "calibration/fitted/torch-h100.yaml"}
# row id -> TorchTitan's "Memory(GiB)" (max reserved), benchmarks/llama3_h100_202412_torchtitan.md
RESERVED_GIB = {
    "tt-h100-l3-8b-n8-eager": 82.4, "tt-h100-l3-8b-n8-compile": 77.0,   # Table 1
    "tt-h100-l3-8b-n8-fp8": 76.8,
    "tt-h100-l3-8b-n128-eager": 67.0, "tt-h100-l3-8b-n128-compile": 62.0,  # Table 3
    "tt-h100-l3-8b-n128-fp8": 61.8,
    "tt-h100-l3-8b-n8-cp1-fp8": 83.9, "tt-h100-l3-8b-n8-cp2-fp8": 84.2,  # Table 2
    "tt-h100-l3-8b-n8-cp4-fp8": 84.0, "tt-h100-l3-8b-n8-cp8-fp8": 84.5,
    "tt-h100-l3-70b-n256-tp8-fp8": 71.9,                                  # Table 4, "2D"
}
PARTS = ("weights_bytes", "gradients_bytes", "optimizer_bytes", "activations_bytes",
         "buffers_bytes")


def predict_row(runs, i, parallel=None, training=None):
    base = load_system(runs.systems[i])
    system = load_system(runs.systems[i], SETS.get(base.gpu))
    return predict(runs.models[i], parallel or runs.parallels[i], system,
                   training or runs.trainings[i])


def measured_rows():
    """(id, measured GB, predicted GB, parts GB, fits) of every row with a printed memory."""
    out = []
    for name in ("published_fsdp.csv", "published_fsdp_fp8.csv"):
        runs = load_runs(ROOT / "data" / name)
        for i, rid in enumerate(runs.ids):
            if rid not in RESERVED_GIB:
                continue
            m = predict_row(runs, i).memory
            parts = [float(getattr(m, k)) / 1e9 for k in PARTS]
            fits = float(m.total_bytes) <= float(m.capacity_bytes)
            out.append((rid, RESERVED_GIB[rid] * GIB / 1e9, float(m.total_bytes) / 1e9,
                        parts, fits, float(m.capacity_bytes) / 1e9))
    return out


def a100_70b_fits():
    """TorchTitan Llama 2 70B, 64 A100 80GB (docs/performance.md at 395a52627): the two
    local-batch-2 layouts that ran out of memory and the two that ran, built from the
    published rows tt-a100-l2-70b-sac-op (local batch 1, op SAC) and tt-a100-l2-70b-full."""
    runs = load_runs(ROOT / "data" / "published_fsdp.csv")
    i_op = runs.ids.index("tt-a100-l2-70b-sac-op")
    i_full = runs.ids.index("tt-a100-l2-70b-full")
    op = runs.parallels[i_op]
    cases = [
        ("bs1 selective op (ran)", i_op, op, "ran"),
        ("bs2 full (ran)", i_full, runs.parallels[i_full], "ran"),
        ("bs2 selective op (OOM)", i_op, op.replace(micro_batch=2.0, global_batch=128.0),
         "OOM"),
        # "selective layer": every second block checkpointed (config_manager default '2')
        ("bs2 selective layer (OOM)", i_full,
         runs.parallels[i_full].replace(recompute_layer_frac=0.5), "OOM"),
    ]
    out = []
    for label, i, par, meas in cases:
        m = predict_row(runs, i, parallel=par).memory
        out.append((label, meas, float(m.total_bytes) / 1e9, float(m.capacity_bytes) / 1e9,
                    float(m.total_bytes) <= float(m.capacity_bytes)))
    return out


def main():
    rows = measured_rows()
    print("row, measured GB (TorchTitan max reserved), predicted GB, error %, "
          "weights / grads / optim / activations / buffers GB, fits")
    errs = []
    for rid, meas, pred, parts, fits, cap in rows:
        err = 100 * (pred / meas - 1)
        errs.append(err)
        print(f"  {rid:30s} {meas:6.1f} {pred:6.1f} {err:+6.1f} %  "
              + " / ".join(f"{p:5.1f}" for p in parts) + f"  {'fits' if fits else 'OOM'}"
              f" (usable {cap:.1f})")
    e = np.asarray(errs)
    print(f"  {len(e)} rows: mean |err| {np.abs(e).mean():.1f} %, mean signed {e.mean():+.1f} %, "
          f"median {np.median(e):+.1f} %")
    print("TorchTitan Llama 2 70B, 64 A100 80GB (395a52627): predicted GB, usable GB, verdict")
    for label, meas, pred, cap, fits in a100_70b_fits():
        got = "fits" if fits else "OOM"
        ok = (got == "fits") == (meas == "ran")
        print(f"  {label:28s} {pred:6.1f} {cap:6.1f}  predicted {got:4s} "
              f"({'agrees' if ok else 'DISAGREES'})")


if __name__ == "__main__":
    main()
