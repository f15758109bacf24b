"""Published runs the model never saw: Megatron-LM's weak-scaling table (Narayanan et al.,
SC21, Table 1: GPT 1.7B to 1T on 32 to 3072 A100 80 GB of NVIDIA's Selene).

    python docs/published_megatron.py [--calibration vtrain-a100]

Selene is `a100-sxm-80gb` (DGX A100: 8 GPUs on NVSwitch, 8 x 200 Gb/s HDR per node). The
table gives t, p, the GPU count (so d = n / (t p)) and the global batch B; the framework facts
are Megatron-LM's of 2021, the same as the vTrain runs' (`calibration/reproduce.sh`): fp16
with fp32 master weights and Adam, full activation recomputation, no sequence parallelism,
unfused attention with Megatron's fused softmax kernel up to 2048 keys, dropout 0.1 on the
attention probabilities and after attention and MLP (MEGATRON_2021's comment), the data-parallel
all-reduce after the backward (dp_overlap = 0), ZeRO 0. Section 5.1 runs the interleaved
schedule with the scatter/gather optimization (Megatron-LM of 2021 did not interleave a
2-stage pipeline: its README); the table gives neither the micro-batch size nor the number
of chunks vp. The paper's reading takes, per row, the fastest (micro-batch, vp) that fits,
vp > 1 dividing the stage's layers (m a multiple of p, Megatron's rule) when p > 2, vp = 1
otherwise; the 1F1B reading (vp = 1 everywhere) is printed beside it. Taking the fastest
*predicted* candidate leans fast, so the range of the predictions over every candidate that
fits is printed too.

Measured figures are TFLOP/s per GPU by the paper's own count with recomputation (Section
5.1, PAPERS.md 5.1):  F = 96 B s L h^2 (1 + s / (6 h) + V / (16 L h)),  X = F / (T n).
PAPERS.md section 6 transcribes the table: the 1T row (3072 GPUs, 163 TFLOP/s, 502 PFLOP/s,
52 %) is confirmed by the abstract, the other rows are tagged there as not checked against
the paper's text.
"""

from __future__ import annotations

import argparse

import numpy as np

from diffperf import Parallel, load_model, load_system, predict
from diffperf.load import training

# (model config, t, p, GPUs, global batch, published TFLOP/s per GPU): SC21 Table 1.
TABLE1 = (("megatron-1.7b", 1, 1, 32, 512, 137), ("megatron-3.6b", 2, 1, 64, 512, 138),
          ("megatron-7.5b", 4, 1, 128, 512, 142), ("megatron-18.4b", 8, 1, 256, 1024, 135),
          ("megatron-39.1b", 8, 2, 512, 1536, 138), ("megatron-76.1b", 8, 4, 1024, 1792, 140),
          ("megatron-145.6b", 8, 8, 1536, 2304, 148),
          ("megatron-310.1b", 8, 16, 1920, 2160, 155),
          ("megatron-529.6b", 8, 35, 2520, 2520, 163), ("megatron-1t", 8, 64, 3072, 3072, 163))
SYSTEM = "a100-sxm-80gb"
# dropout=1: the SC21 scripts (NVIDIA/Megatron-LM examples/sc21/CONFIG.sh, run_table_1.sh at
# de7dc40f883ceed06344051c3c7ebd57da59cc53, 2021-08-10, "scripts for sc21") pass no dropout
# flag, so megatron/arguments.py's defaults hold at that commit: --attention-dropout 0.1 and
# --hidden-dropout 0.1; megatron/model/transformer.py there applies attention_dropout to the
# attention probabilities and bias_dropout_add_fused_train after attention and MLP
# (workload.flops.dropout_bytes), as in the vTrain runs.
MEGATRON_2021 = dict(flash_attention=0.0, fused_softmax_max_seq=2048.0, dropout=1.0)
MICRO_BATCHES = (1, 2, 4, 8, 16)


def table1_flops(model, B) -> float:
    """F = 96 B s L h^2 (1 + s / (6 h) + V / (16 L h)): Narayanan et al. SC21 Section 5.1,
    the model FLOPs of one step with full recomputation, as Table 1 counts them."""
    L, h, s, V = (float(np.asarray(x)) for x in (model.n_layers, model.hidden, model.seq_len,
                                                  model.vocab))
    return 96.0 * B * s * L * h * h * (1.0 + s / (6.0 * h) + V / (16.0 * L * h))


def candidates(model, system, train, t, p, d, B, interleave):
    """[(step seconds, micro-batch, vp)] of every layout that fits, among the micro-batch
    sizes and (with `interleave`, when p > 2) the interleaving degrees the table leaves
    open."""
    L = int(np.asarray(model.n_layers))
    out = []
    for b in MICRO_BATCHES:
        if (B // d) % b:
            continue
        m = B // (d * b)
        vps = [v for v in range(2, L // p + 1) if (L // p) % v == 0 and L % p == 0
               and m % p == 0] if interleave and p > 2 else [1]
        for v in vps:
            par = Parallel(tp=t, pp=p, dp=d, vp=v, micro_batch=b, global_batch=B,
                           recompute=2, sequence_parallel=0, zero_stage=0, dp_overlap=0)
            r = predict(model, par, system, train)
            if bool(r.fits):
                out.append((float(r.step_time_s), b, v))
    return out


def rows(calibration=None, interleave=False):
    """One dict per Table 1 row: the layout chosen (the fastest predicted that fits),
    predicted and published TFLOP/s per GPU, the signed error in %, and the range of the
    predictions over every candidate that fits."""
    system = load_system(SYSTEM, calibration)
    train = training("fp16", **MEGATRON_2021)
    out = []
    for name, t, p, n, B, published in TABLE1:
        model = load_model(name)
        d = n // (t * p)
        fits = candidates(model, system, train, t, p, d, B, interleave)
        step, b, v = min(fits)
        per_gpu = lambda sec: table1_flops(model, B) / (sec * n) / 1e12  # noqa: E731
        tflops = per_gpu(step)
        out.append(dict(model=name, tp=t, pp=p, dp=d, gpus=n, global_batch=B, micro_batch=b,
                        vp=v, step_time_s=step, predicted_tflops=tflops,
                        published_tflops=published,
                        error_pct=100.0 * (tflops - published) / published,
                        lowest_tflops=per_gpu(max(fits)[0]), candidates=len(fits)))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calibration", default=None,
                    help="efficiency overlay: a shipped name (vtrain-a100) or a YAML path")
    args = ap.parse_args(argv)
    for interleave in (False, True):
        table = rows(args.calibration, interleave)
        print(f"\n{'interleaved at p > 2 (paper)' if interleave else '1F1B (vp 1)'}, "
              f"{args.calibration or 'uncalibrated'}")
        print("| model | t | p | d | B | mb | vp | predicted | all that fit | published | error |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        for r in table:
            print(f"| {r['model']} | {r['tp']} | {r['pp']} | {r['dp']} | {r['global_batch']} "
                  f"| {r['micro_batch']} | {r['vp']} | {r['predicted_tflops']:.0f} "
                  f"| {r['lowest_tflops']:.0f}-{r['predicted_tflops']:.0f} "
                  f"| {r['published_tflops']} | {r['error_pct']:+.1f} % |")
        e = np.abs([r["error_pct"] for r in table])
        print(f"MAPE {e.mean():.2f} %, median {np.median(e):.2f} %, max {e.max():.1f} %")


if __name__ == "__main__":
    main()
