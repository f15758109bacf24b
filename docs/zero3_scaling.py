"""ZeRO-3 / FSDP at a fixed global batch: step time against the data-parallel degree.

    python docs/zero3_scaling.py [--out docs/figures/zero3-scaling]

GPT-3 175B on H100 80 GB (8 per node, 8 x 400 Gb/s NDR), pure data parallelism with ZeRO-3,
full recompute, global batch 1024 sequences of 2048 tokens. At each degree d the largest
micro-batch that fits is used (fewest micro-batches, so fewest gathers per step). Two
implementations: PyTorch FSDP (the next layer prefetched whole, the backward's gather serving
the recomputation) and DeepSpeed ZeRO-3 of 2021 (a 5e7-element prefetch bucket, the
recomputed forward gathering the layer again). Writes NAME.csv and NAME.png.

Where the floor comes from: per micro-batch every rank gathers each layer's weights in the
forward and the backward (and once more for the recomputation under DeepSpeed) and
reduce-scatters its gradients, over all d ranks: 96 x (2 or 3 AG + RS) of a 3.6 GB layer,
whatever d. Once every rank runs one micro-batch (m = 1) the compute keeps halving with d
and that volume does not, so the step stops at the fabric's time for it.
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import numpy as np

from diffperf import Parallel, load_model, load_system, predict
from diffperf.predict import _dp_times
from diffperf.specs.training import Training

IMPLEMENTATIONS = {"PyTorch FSDP": dict(zero3_regather=0),
                   "DeepSpeed ZeRO-3 (2021)": dict(zero3_regather=1, zero3_prefetch_params=5e7)}
DEGREES = (64, 128, 256, 512, 1024)
BATCH = 1024


def rows():
    model, system = load_model("gpt3-175b"), load_system("h100-sxm-80gb")
    out = []
    for name, facts in IMPLEMENTATIONS.items():
        for d in DEGREES:
            for b in sorted((b for b in range(1, BATCH // d + 1) if (BATCH // d) % b == 0),
                            reverse=True):
                par = Parallel(dp=d, micro_batch=b, global_batch=BATCH, zero_stage=3,
                               recompute=2, **facts)
                r = predict(model, par, system)
                if bool(r.fits):
                    break
            dp = _dp_times(model, par, system, Training())
            gathers = 2 + facts["zero3_regather"]
            floor = float(par.n_microbatches) * 96 * (
                gathers * float(dp["layer_gather_s"]) + float(dp["layer_reduce_s"]))
            bd = r.breakdown
            out.append(dict(implementation=name, dp=d, micro_batch=b,
                            micro_batches=int(par.n_microbatches), fits=bool(r.fits),
                            step_time_s=float(r.step_time_s),
                            compute_s=float(bd.compute_s + bd.recompute_s),
                            dp_exposed_s=float(bd.dp_exposed_s),
                            dp_hidden_s=float(bd.dp_hidden_s), comm_per_step_s=floor))
    return out


def figure(table, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for color, name in zip(("#1f77b4", "#d62728"), IMPLEMENTATIONS):
        t = [r for r in table if r["implementation"] == name]
        d = [r["dp"] for r in t]
        ax.plot(d, [r["step_time_s"] for r in t], "o-", color=color, label=f"{name}: step")
        ax.plot(d, [r["comm_per_step_s"] for r in t], ":", color=color,
                label=f"{name}: gathers + reduce-scatters per step")
    t = [r for r in table if r["implementation"] == "PyTorch FSDP"]
    ax.plot([r["dp"] for r in t], [r["compute_s"] for r in t], "s--", color="#555555",
            label="compute + recompute")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("data-parallel degree d (GPUs)")
    ax.set_ylabel("seconds per step")
    ax.set_title(f"GPT-3 175B, ZeRO-3, global batch {BATCH}, H100 80 GB (8 x 400 Gb/s NDR per node)",
                 fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(True, which="both", alpha=0.3)
    fig.savefig(path, dpi=150, bbox_inches="tight")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="docs/figures/zero3-scaling")
    args = p.parse_args()
    table = rows()
    out = Path(args.out)
    with out.with_suffix(".csv").open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(table[0]))
        w.writeheader()
        w.writerows(table)
    figure(table, out.with_suffix(".png"))
    for r in table:
        print(f"{r['implementation']:>24}  d {r['dp']:5d}  b {r['micro_batch']:3d}  "
              f"m {r['micro_batches']:3d}  step {r['step_time_s']:8.2f} s  compute "
              f"{r['compute_s']:8.2f} s  DP exposed {r['dp_exposed_s']:7.2f} s  "
              f"comm/step {r['comm_per_step_s']:7.2f} s")
    assert np.isfinite([r["step_time_s"] for r in table]).all()


if __name__ == "__main__":
    main()
