"""cuDNN attention by GQA group size and head dim on one GPU (device run; branch attnwin,
docs/accuracy-gptoss.md "Session 15: attention by keys per query row").

calibration/attn_keys.py finds that splitting the work W = R kv into a wave term in query rows
and a per-tile term in keys fits the H100 window kernels, but that the MHA full-causal kernels
(data/kernels/h100_attention.csv, d_h 64 / 128, KV heads = query heads) and the GQA ones
(h100_gptoss_attention.csv, h100_sink_heads.csv, d_h 64, 8 query heads per KV head) differ by
~25-40 % at equal rows, keys and d_h. This script times the same cuDNN SDPA graphs
(calibration/device_h100_attention.py's run_cudnn_fe: causal, 128-key window or full, forward
and backward apart; its sink 0 / 1 pairs come along) at 64 query heads with 64 / 16 / 8 / 1 KV
heads (group 1 / 4 / 8 / 64), head dim 64 and 128, (b, s) = (1, 4096), (4, 4096): the group
size and the head dim apart, at the rows and keys of the Bridge rows.

Run: ``python calibration/device_h100_attn_group.py OUTDIR`` (the cudnn-frontend wheel of the
gptoss3 request installed). About 1-2 minutes on an H100 (a 160 s budget skips what is left).
Writes OUTDIR/h100_attn_group.csv (the columns of h100_gptoss_attention.csv) and prints one
line per case, then a table of TFLOP/s (band FLOPs) by group, head dim, window and pass.
"""
from __future__ import annotations

import csv
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import device_h100_attention as dha  # noqa: E402

KV_HEADS = [64, 8, 1, 16]   # group 1 (MHA), 8 (GPT-OSS), 64 (MQA), 4
HEAD_DIMS = [64, 128]
SHAPES = [(1, 4096), (4, 4096)]


class Out(dha.Out):
    def __init__(self, outdir):
        os.makedirs(outdir, exist_ok=True)
        self.path = os.path.join(outdir, "h100_attn_group.csv")
        self.f = open(self.path, "w", newline="")
        self.w = csv.DictWriter(self.f, fieldnames=dha.FIELDS)
        self.w.writeheader()
        self.rows = []

    def row(self, **kw):
        kw.setdefault("hq", dha.HQ)
        kw.setdefault("hkv", dha.HKV)
        kw.setdefault("d", dha.D)
        super().row(**kw)
        self.rows.append(dict(kw))


def main():
    outdir = sys.argv[1] if len(sys.argv) > 1 else "."
    import torch
    p = torch.cuda.get_device_properties(0)
    print(f"torch {torch.__version__} CUDA {torch.version.cuda} cuDNN "
          f"{torch.backends.cudnn.version()} GPU {p.name} SMs {p.multi_processor_count}",
          flush=True)
    dha.BUDGET_S = 160.0
    dha.T0 = time.time()
    out = Out(outdir)
    for d in HEAD_DIMS:
        for hkv in KV_HEADS:
            dha.HQ, dha.HKV, dha.D = 64, hkv, d
            dha.SHAPES = SHAPES
            dha.run_cudnn_fe(out)
            torch.cuda.empty_cache()
            print(f"-- d {d} kv heads {hkv} done at {time.time() - dha.T0:.0f} s", flush=True)
    print("\n  d  hkv  b     s  window  pass  gpu_ms  TFLOP/s(band)   [sink 0]")
    for r in out.rows:
        ms = r.get("gpu_ms")
        if r.get("sink") != 0 or r.get("impl") != "cudnn_fe" or not isinstance(ms, float):
            continue
        n = dha.band_scores(r["s"], r.get("window_left")) * r["b"] * r["hq"] * r["d"]
        band = {"fwd": 4, "bwd": 10}.get(r["pass"], 14) * n
        print(f"{r['d']:3d} {r['hkv']:4d} {r['b']:2d} {r['s']:5d} {str(r.get('window_left')):6s} "
              f"{r['pass']:4s} {ms:7.4f} {band / (ms * 1e-3) / 1e12:8.1f}")
    print(f"-- all done at {time.time() - dha.T0:.0f} s; {out.path}", flush=True)


if __name__ == "__main__":
    main()
