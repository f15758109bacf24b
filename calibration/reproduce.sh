#!/usr/bin/env bash
# Re-fit the shipped overlays and print the held-out figures quoted in README.md.
# Run from the repository root: bash calibration/reproduce.sh (about 11 minutes on 2 cores).
# The runs are the datasets shipped in data/ (by name: `diffperf list datasets`); DATA=FOLDER
# reads FOLDER/vtrain_a100.csv, FOLDER/kernels/h100_gemm.csv, ... instead. Framework facts
# passed with --set / --precision are properties of the software stack that measured the
# runs, documented in data/README.md, not per-row terms:
#   vTrain (Megatron-DeepSpeed, 2023): unfused attention (flash_attention=0) whose softmax is
#     Megatron's fused kernel for key lengths up to 2048 where the shape allows it, else
#     PyTorch ops (fused_softmax_max_seq=2048; megatron/model/fused_softmax.py), and the data-
#     parallel all-reduce after the backward, not overlapped with it (dp_overlap=0). The
#     vocabulary keeps Megatron's padding to a multiple of 128 t (the default vocab_pad_to=128;
#     data/README.md caveat 1).
#   H100 runs (PyTorch autocast / JAX): fp32 weights and Adam with bf16 matmuls (amp-bf16);
#     the JAX runs are one XLA-compiled step (xla-amp-bf16: the same precisions, plus
#     Training.xla_compiled = 1: XLA's live sets for memory, memory/xla.py; kernels issued
#     back to back and fused as XLA runs them, costs/xla.py and workload/xla.py).
# Since 2026-11-27 (branch rowfacts) the shipped CSVs carry these facts themselves (the H100
# files' precision column, vtrain_a100.csv's `set` column; data/README.md "Changed in the
# shipped copies"); the flags below repeat them, so a DATA folder of the shared copies (bf16
# columns, no set column) fits the same, and the overlays' fitted_on still records them. The
# vTrain rows' dropout=1 (branch review15a; vTrain's model code, p 0.1) is repeated since
# session 16 (branch dropout): it prices the attention-probs dropout and the bias-dropout-add
# masks (workload.flops.dropout_bytes), so it moves the step time, not only the memory.
set -euo pipefail
if [ -n "${DATA:-}" ]; then  # a folder of CSVs: paths
    ds() { echo "$DATA/$1.csv"; }
    kn() { echo "$DATA/kernels/$1.csv"; }
else  # the shipped datasets, by name (recorded so in the overlays' fitted_on)
    ds() { echo "$1"; }
    kn() { echo "$1"; }
fi
KERNELS="$(kn h100_gemm) $(kn h100_attention) $(kn h100_memory_bw)"
VTRAIN="--set dp_overlap=0 --set flash_attention=0 --set fused_softmax_max_seq=2048 --set dropout=1"

echo "== vTrain: random 80/20 split over all rows -> calibration/fitted/vtrain-a100.yaml"
diffperf calibrate "$(ds vtrain_a100)" $VTRAIN --holdout-frac 0.2 --seed 0 --steps 300 \
    --out calibration/fitted/vtrain-a100.yaml --force

echo "== vTrain: fit on a random 80% of the single-node rows; the other 20% and every"
echo "   multi-node row held out"
diffperf calibrate "$(ds vtrain_a100)" $VTRAIN --fit-only source=vtrain-single \
    --holdout-frac 0.2 --seed 0 --steps 300

echo "== vTrain: fit on all single-node rows, predict the multi-node rows"
diffperf calibrate "$(ds vtrain_a100)" $VTRAIN --fit-only source=vtrain-single \
    --holdout-frac 0 --steps 300

echo "== H100 PyTorch: 5-fold CV with the kernel microbenchmarks -> torch-h100.yaml"
diffperf calibrate "$(ds h100_single_gpu)" --precision amp-bf16 --folds 5 --steps 200 \
    --microbench $KERNELS \
    --out calibration/fitted/torch-h100.yaml --force

echo "== H100 JAX/XLA: 5-fold CV with the kernel microbenchmarks -> jax-h100.yaml"
diffperf calibrate "$(ds h100_jax_single_gpu)" --precision xla-amp-bf16 --folds 5 --steps 200 \
    --microbench $KERNELS \
    --out calibration/fitted/jax-h100.yaml --force

echo "== transfer: the H100 overlay on the H200 datasheet (no H200 runs here: runs only)"
diffperf validate "$(ds h100_single_gpu)" --precision amp-bf16 --system h200-sxm-141gb \
    --calibration torch-h100
