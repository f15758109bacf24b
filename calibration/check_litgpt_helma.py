"""A published run diffperf never saw: Mayr et al., arXiv:2603.16164 (2026), Table 4, LLaMA 3 8B
continued pre-training under LitGPT on one NHR@FAU Helma node (4 H100 94 GB HBM2e), at the
700 W default and at a 500 W power cap. Predicts the absolute tokens/s with the shipped H100
set and the run's framework facts; nothing here is fitted, and the run is in no fitted set.

    python calibration/check_litgpt_helma.py [--json]

The run (RRZE-HPC/hpc-ai-perf-bench @52d1f50, llm/training/configs/llama3_8b_4gpu.yaml and the
LitGPT copy it ships, litgpt/pretrain.py, litgpt/model.py):
  precision bf16-true (weights, gradients and AdamW states in bf16: `bf16-pure`), micro-batch
  4, global batch 64 on 4 GPUs (4 micro-batches), max_seq_length 512, FSDP1 FULL_SHARD with
  one flat parameter per Block (FSDPStrategy(auto_wrap_policy={Block}), no MixedPrecision:
  bf16 reduce-scatter), torch.compile(model), no activation checkpointing, fused AdamW,
  F.scaled_dot_product_attention(is_causal=True) after the rotary and `repeat_interleave` of
  K / V to the 32 query heads (`rope_kv_pass=1`), container `pip install torch` (unpinned,
  PyTorch >= 2.5 at the time: SDPA's flash backend = FlashAttention-2 on H100, cuDNN attention
  opt-in since pytorch PR 138522: `attention_fa2=1`), vocabulary 128256 unpadded.
Measured (Table 4, as the transcription in docs/accuracy-hopper.md "Session 11" gives it):
30271.0 tokens/s at 700 W, 27705.3 at 500 W, the 4-GPU total (30271 per GPU would be 1.46
PFLOP/s of 6 N T work on one H100).

The system: configs/systems/grand-teton-h100.yaml is the same GPU (H100 SXM5 with 94 GiB
HBM2e, 2.4 TB/s, arXiv:2604.11391v2 measures 2.41 TB/s on Helma) with 8 per host; Helma has
4 per node on NVLink (HGX H100 4-GPU board: each GPU's 18 NVLink4 links go to its 3 peers,
900 GB/s bidirectional per GPU, 450 per direction as in the Grand Teton file). 500 W: the
Grand Teton file as shipped (SM clock 1731 / 1969 MHz at the cap, arXiv:2604.11391v2 Fig. 6b,
measured on these Helma GPUs); 700 W: the same file without the cap's clock ratio
(matmul_sustained_frac = matmul_fp8_sustained_frac = 0: the reference H100 rate; vector 66.9
TFLOP/s, the SXM datasheet's).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from diffperf import Parallel, load_model, predict  # noqa: E402
from diffperf.load import (apply_overlay, read_yaml, system_from_dict,  # noqa: E402
                           training_from_name)

MEASURED_TOKENS_PER_S = {700: 30271.0, 500: 27705.3}  # arXiv:2603.16164 Table 4, 4 GPUs
FACTS = dict(attention_fa2=1.0, rope_kv_pass=1.0, vocab_pad_to=0.0, loss_bytes_per_logit=40.0,
             gemm_wave_split=1.0)
H100_SET = ROOT / "configs" / "efficiency" / "h100.yaml"


def helma_system(watts: int):
    """The 4-GPU Helma node at the 700 W default or the 500 W cap (module docstring)."""
    d = read_yaml(ROOT / "configs" / "systems" / "grand-teton-h100.yaml")
    d["name"] = f"helma-h100-94gb-{watts}w"
    d["tiers"][0]["domain_size"] = 4
    d["power_W"] = watts
    if watts == 700:
        d["matmul_sustained_frac"] = d["matmul_fp8_sustained_frac"] = 0.0
        d["vector_TFLOPs"] = 66.9
    return apply_overlay(system_from_dict(d, d["name"]), H100_SET)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    model = load_model("llama3-8b").replace(seq_len=512)
    par = Parallel(dp=4, micro_batch=4, global_batch=64, zero_stage=3, recompute=0,
                   zero3_regather=0)
    tr = training_from_name("bf16-pure", **FACTS)
    out = {}
    for watts, meas in MEASURED_TOKENS_PER_S.items():
        r = predict(model, par, helma_system(watts), tr)
        tps = float(r.tokens_per_s)
        b = r.breakdown
        out[watts] = dict(measured_tokens_per_s=meas, predicted_tokens_per_s=round(tps, 1),
                          step_error_pct=round(100 * (meas / tps - 1), 2),
                          step_s=round(float(r.step_time_s), 4),
                          compute_s=round(float(b.compute_s), 4),
                          dp_exposed_s=round(float(b.dp_exposed_s), 4),
                          dp_hidden_s=round(float(b.dp_hidden_s), 4),
                          overlap_slowdown_s=round(float(b.overlap_slowdown_s), 4),
                          overhead_s=round(float(b.overhead_s), 4),
                          optimizer_s=round(float(b.optimizer_s), 4))
    ratio_m = MEASURED_TOKENS_PER_S[500] / MEASURED_TOKENS_PER_S[700]
    ratio_p = out[500]["predicted_tokens_per_s"] / out[700]["predicted_tokens_per_s"]
    out["ratio_500_700"] = dict(measured=round(ratio_m, 4), predicted=round(ratio_p, 4))
    if args.json:
        print(json.dumps(out, indent=1))
        return
    for watts in (700, 500):
        o = out[watts]
        print(f"{watts} W: measured {o['measured_tokens_per_s']:.0f} tokens/s, predicted "
              f"{o['predicted_tokens_per_s']:.0f} (step error {o['step_error_pct']:+.1f} %); "
              f"step {o['step_s']:.4f} s = compute {o['compute_s']:.4f} + DP exposed "
              f"{o['dp_exposed_s']:.4f} + slowdown {o['overlap_slowdown_s']:.4f} + host "
              f"{o['overhead_s']:.4f} + optimizer {o['optimizer_s']:.4f} (hidden DP "
              f"{o['dp_hidden_s']:.4f})")
    print(f"500 / 700 W throughput: measured {ratio_m:.3f}, predicted {ratio_p:.3f}")


if __name__ == "__main__":
    main()
