"""How the learned-sink gradient's cost in cuDNN's attention backward scales with the heads on
one GPU (device run; review15b of the gptoss3 term System.attn_sink_bwd_row_s).

The shipped term prices the sink gradient per query row x head, R = b (a / t) (s / c)
(costs.compute.attention_sink_backward_s), from calibration/device_h100_attention.py's six
points, which all have 64 query heads: they cannot tell R = b h s from b s (the cost of a
per-head reduction whose heads run side by side). Tensor parallelism (and Ulysses / a2a
context parallelism, the only CP form Transformer Engine runs sinks with) divides the heads,
so this script times the same cuDNN SDPA graphs (calibration/device_h100_attention.py's
run_cudnn_fe: causal, 128-key window or full, sink 0 / 1, forward and backward apart) at
64 / 32 / 16 / 8 query heads (8 / 4 / 2 / 1 KV heads: t = 1, 2, 4, 8 of GPT-OSS) and
(b, s) = (1, 4096), (2, 4096), (1, 8192).

Run: ``python calibration/device_h100_sink_heads.py OUTDIR`` (the cudnn-frontend wheel of the
gptoss3 request installed). About 1-2 minutes on an H100 (a 150 s budget skips what is left).
Writes OUTDIR/h100_sink_heads.csv (the columns of h100_gptoss_attention.csv) and prints one
line per case, then the table of (bwd with sink - without) per b h s row and per b s row.
"""
from __future__ import annotations

import csv
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import device_h100_attention as dha  # noqa: E402

HEADS = [(64, 8), (32, 4), (16, 2), (8, 1)]
SHAPES = [(1, 4096), (2, 4096), (1, 8192)]


class Out(dha.Out):
    def __init__(self, outdir):
        os.makedirs(outdir, exist_ok=True)
        self.path = os.path.join(outdir, "h100_sink_heads.csv")
        self.f = open(self.path, "w", newline="")
        self.w = csv.DictWriter(self.f, fieldnames=dha.FIELDS)
        self.w.writeheader()
        self.rows = []

    def row(self, **kw):
        kw.setdefault("hq", dha.HQ)
        kw.setdefault("hkv", dha.HKV)
        super().row(**kw)
        self.rows.append(dict(kw))


def main():
    outdir = sys.argv[1] if len(sys.argv) > 1 else "."
    import torch
    p = torch.cuda.get_device_properties(0)
    print(f"torch {torch.__version__} CUDA {torch.version.cuda} cuDNN "
          f"{torch.backends.cudnn.version()} GPU {p.name} SMs {p.multi_processor_count}",
          flush=True)
    dha.BUDGET_S = 150.0
    dha.T0 = time.time()
    out = Out(outdir)
    for hq, hkv in HEADS:
        dha.HQ, dha.HKV = hq, hkv
        dha.SHAPES = SHAPES
        dha.run_cudnn_fe(out)
        torch.cuda.empty_cache()
        print(f"-- heads {hq}/{hkv} done at {time.time() - dha.T0:.0f} s", flush=True)
    t = {(r["hq"], r["b"], r["s"], r["window_left"], r["sink"], r["pass"]): r["gpu_ms"]
         for r in out.rows}
    print("\nhq  b     s  window  bwd0_ms  bwd1_ms  delta_ms  ns/(b h s)  ns/(b s)")
    for hq, _ in HEADS:
        for b, s in SHAPES:
            for w in (dha.WINDOW_LEFT, None):
                k0, k1 = (hq, b, s, w, 0, "bwd"), (hq, b, s, w, 1, "bwd")
                if k0 in t and k1 in t:
                    d = t[k1] - t[k0]
                    print(f"{hq:3d} {b} {s:5d} {str(w):6s} {t[k0]:8.4f} {t[k1]:8.4f} "
                          f"{d:9.4f} {d * 1e6 / (b * hq * s):11.3f} {d * 1e6 / (b * s):9.2f}")
    print(f"-- all done at {time.time() - dha.T0:.0f} s; {out.path}", flush=True)


if __name__ == "__main__":
    main()
