"""Write tests/regression_pins.json: a small set of predictions that test_regression.py pins.

    python tests/make_regression_pins.py

Run it when a change to the model is *meant* to move predictions, and say in the commit
message which pins moved, by how much and why (the test prints the old and new values). The
cases use only shipped configs (configs/models, configs/systems) and run in the default
float32, through the public `predict`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

PINS = Path(__file__).resolve().parent / "regression_pins.json"
FIELDS = ("step_time_s", "memory.total_bytes", "mfu")

# name -> model, system, layout (Parallel fields), precision. Each comment says what the case
# exercises; all layouts are valid for their model.
CASES = {
    # The CLI default (diffperf predict): GPT-3 175B on 1024 A100 80 GB, tp 8 pp 8 dp 16,
    # sequence parallel, selective recompute, ZeRO-1, DP overlap (Narayanan et al. setup).
    "gpt3-175b/a100-sxm-80gb/cli-default": ("gpt3-175b", "a100-sxm-80gb", dict(
        tp=8, pp=8, dp=16, cp=1, ep=1, vp=1, micro_batch=1, global_batch=1536,
        zero_stage=1, sequence_parallel=1, recompute=1, dp_overlap=1), "bf16"),
    # One DGX H100 node: TP pairs, DP 4, GQA model, no recompute.
    "llama3-8b/h100-sxm-80gb/tp2-pp1-dp4": ("llama3-8b", "h100-sxm-80gb", dict(
        tp=2, pp=1, dp=4, micro_batch=1, global_batch=32, zero_stage=1,
        sequence_parallel=1), "bf16"),
    # vTrain's cluster (800 Gb/s per node): 16 GPUs on two nodes, fp16, full recompute.
    "megatron-1.7b/a100-4nic/tp2-pp2-dp4": ("megatron-1.7b", "a100-4nic", dict(
        tp=2, pp=2, dp=4, micro_batch=2, global_batch=64, recompute=2), "fp16"),
    # MoE with expert parallelism: 64 GPUs, ep 8 inside dp 8, 4 stages.
    "mixtral-8x7b/h100-sxm-80gb/tp2-pp4-dp8-ep8": ("mixtral-8x7b", "h100-sxm-80gb", dict(
        tp=2, pp=4, dp=8, ep=8, micro_batch=1, global_batch=64, zero_stage=1, recompute=1,
        sequence_parallel=1), "bf16"),
    # Interleaved pipeline and context parallelism: 256 GPUs, vp 2, cp 2, full recompute.
    "llama3-70b/h200-sxm-141gb/tp8-pp4-vp2-cp2-dp4": ("llama3-70b", "h200-sxm-141gb", dict(
        tp=8, pp=4, vp=2, cp=2, dp=4, micro_batch=1, global_batch=64, zero_stage=1,
        recompute=2, sequence_parallel=1), "bf16"),
    # Fine-grained MoE under ZeRO-3 (FSDP) on an 8-GPU-node AMD system: dp 16, ep 16.
    "deepseek-moe-16b/mi300x/dp16-ep16-zero3": ("deepseek-moe-16b", "mi300x", dict(
        dp=16, ep=16, micro_batch=2, global_batch=64, zero_stage=3), "bf16"),
    # One GPU, fp32 training (TF32 matmuls), no sharding at all.
    "gpt-small/a100-sxm-40gb/single-gpu-fp32": ("gpt-small", "a100-sxm-40gb", dict(
        micro_batch=8, global_batch=32), "fp32"),
    # 896 TPU v5p chips in one ICI pod: tp 8 pp 14 (126 layers) dp 8, selective recompute.
    "llama3-405b/tpu-v5p/tp8-pp14-dp8": ("llama3-405b", "tpu-v5p", dict(
        tp=8, pp=14, dp=8, micro_batch=1, global_batch=512, zero_stage=1, recompute=1,
        sequence_parallel=1), "bf16"),
    # Encoder (full attention) with a long sequence on an NVL72 rack: cp 4, ZeRO-3.
    "vit-era5/gb200-nvl72/tp4-pp4-cp4-dp4-zero3": ("vit-era5", "gb200-nvl72", dict(
        tp=4, pp=4, cp=4, dp=4, micro_batch=1, global_batch=64, zero_stage=3, recompute=2,
        sequence_parallel=1), "bf16"),
}


def predict_case(case) -> dict:
    """{field: float} of one case, in FIELDS order."""
    from diffperf import Parallel, load_model, load_system, predict, training

    model, system, layout, precision = case
    r = predict(load_model(model), Parallel(**layout), load_system(system), training(precision))
    return {"step_time_s": float(r.step_time_s), "memory.total_bytes": float(
        r.memory.total_bytes), "mfu": float(r.mfu)}


def main() -> int:
    import jax

    import diffperf

    pins = {"generated_by": "python tests/make_regression_pins.py",
            "jax": jax.__version__, "diffperf": diffperf.__version__,
            "dtype": str(jax.numpy.result_type(float)), "cases": {}}
    for name, case in CASES.items():
        model, system, layout, precision = case
        pins["cases"][name] = dict(model=model, system=system, layout=layout,
                                   precision=precision, expected=predict_case(case))
        print(name, pins["cases"][name]["expected"])
    PINS.write_text(json.dumps(pins, indent=2) + "\n")
    print(f"wrote {PINS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
