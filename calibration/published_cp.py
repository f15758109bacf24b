"""Held-out check: diffperf on NVIDIA's published long-sequence, context-parallel FP8 runs
(data/published_cp.csv, provenance in data/published_cp.md). Never fitted to: these rows are
in no calibration set; the efficiencies are the physics defaults, as in calibration/bridge.py's
figure (i), or a fitted overlay given with --calibration.

    python calibration/published_cp.py [--calibration OVERLAY.yaml]

Prints, per row, the measured and predicted model TFLOP/s/GPU (NeMo's FLOPs of the row over
the measured / predicted step), the signed error of throughput (= measured step / predicted
step - 1, positive: diffperf too fast) and the breakdown's largest parts; then the MAPE.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CSV = ROOT / "data" / "published_cp.csv"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calibration", default=None, help="an overlay YAML (default: physics)")
    args = p.parse_args(argv)

    from diffperf import load_runs
    from diffperf.cli.validate_cmd import load_systems
    from diffperf.validation import predict_runs

    runs = load_runs(CSV)
    systems = load_systems(runs, None, args.calibration)
    step, _, _ = predict_runs(runs, systems)
    err = 100.0 * (runs.step_time_s / step - 1.0)
    print(f"{'id':40s} {'meas TF':>8s} {'pred TF':>8s} {'err %':>7s}")
    for i, r in enumerate(runs.rows):
        tf = float(r["model_tflops_per_gpu"])
        print(f"{r['id']:40s} {tf:8.0f} {tf * runs.step_time_s[i] / step[i]:8.0f} "
              f"{err[i]:+7.1f}")
    print(f"n {len(err)}  MAPE {np.mean(np.abs(err)):.1f} %  bias {np.mean(err):+.1f} %  "
          f"max {np.max(np.abs(err)):.1f} %")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
