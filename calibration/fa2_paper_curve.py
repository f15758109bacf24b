"""diffperf's FlashAttention-2 forward TFLOP/s at the FA3 paper's Fig. 5 shapes, beside the
paper's bars (docs/accuracy-longseq.md, "Session 13: FA2's own fall-off").

Shapes: H100 80GB SXM5, BF16, batch x seqlen = 16k tokens, hidden 2048 (2048 / d_h heads),
s = 512 ... 16k. Bars: FlashAttention-3 paper (Shah, Bikshandi, Zhang, Thakkar, Ramani, Dao
2024, arXiv:2407.08608), Fig. 5 (a)-(f), FlashAttention-2's bar labels, read from the figure
as shipped in Dao-AILab/flash-attention `assets/flash3_fp16_fwd.png`. Each cell prints
before / after / paper: `before` = FA2 at the set's (cuDNN) fall-off (attn_fa2_half_GFLOP 0),
`after` = FA2's own fall-off (shipped), both under the shipped H100 efficiency set.

    python calibration/fa2_paper_curve.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SEQS = (512, 1024, 2048, 4096, 8192, 16384)
# (head dim, causal): FA2 TFLOP/s at SEQS (Fig. 5 (a) d64, (b) d64 causal, (c) d128,
# (d) d128 causal, (e) d256, (f) d256 causal)
PAPER_FA2 = {(64, False): (282, 306, 318, 321, 322, 324),
             (64, True): (180, 229, 262, 284, 295, 299),
             (128, False): (309, 350, 362, 366, 370, 370),
             (128, True): (191, 260, 298, 319, 333, 335),
             (256, False): (275, 313, 321, 323, 324, 326),
             (256, True): (208, 251, 278, 293, 297, 298)}


def main():
    import diffperf
    from diffperf import Training
    from diffperf.costs.compute import attention_time_s
    from diffperf.workload.ops import Gemms

    shipped = diffperf.load_system("h100-sxm-80gb",
                                   calibration=str(ROOT / "configs/efficiency/h100.yaml"))
    before = shipped.replace(attn_fa2_half_flop=0.0)
    fa2 = Training(attention_fa2=1.0)
    print("FA2 forward TFLOP/s, before / after / paper, s =", " ".join(map(str, SEQS)))
    for (d, causal), bars in PAPER_FA2.items():
        heads = 2048 // d
        cells, err = [], []
        for s, bar in zip(SEQS, bars):
            count = 16384 // s * heads * (0.5 if causal else 1.0)
            g = Gemms(m=np.array([s, s], float), n=np.array([s, d], float),
                      k=np.array([d, s], float), count=np.array([count, count]))
            flops = 4.0 * s * s * d * count
            tf = [flops / float(attention_time_s(g, sy, fa2, 0.0)) / 1e12
                  for sy in (before, shipped)]
            cells.append(f"{tf[0]:.0f}/{tf[1]:.0f}/{bar}")
            err.append((abs(tf[0] / bar - 1), abs(tf[1] / bar - 1)))
        e = np.mean(err, axis=0) * 100
        print(f"d_h {d:3d} {'causal' if causal else 'non-causal':10s} " + "  ".join(cells)
              + f"   mean |err| {e[0]:.1f} -> {e[1]:.1f} %")


if __name__ == "__main__":
    main()
