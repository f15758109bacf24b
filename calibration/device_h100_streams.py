"""Per-expert GEMMs on one stream vs Transformer Engine's four compute streams (run on the device machine).

Transformer Engine's GroupedLinear (BF16, and FP8 without the op fuser) runs one cuBLAS GEMM per local
expert, round-robin over ``num_compute_streams = 4`` streams, and joins them before the next op
(transformer_engine/common/util/multi_stream.cpp, ``multi_stream_cublas_gemm``; docs/accuracy-gptoss.md,
"Candidates", item 1). Small per-expert GEMMs leave the GPU's last wave partly idle; on four streams the
next expert's GEMM can fill it. This script measures how much of the per-expert loss
(``data/kernels/h100_expert_loop.csv``: per-expert GEMMs +10..+45 % over one GEMM of the same FLOPs)
the streams win back, for the same cases, in the same run:

- ``serial_s``: the six products of every expert (fc1 / fc2, forward, data and weight gradient), grouped by
  product as TE issues them (all experts' fc1 forward, then fc2 forward, ...), on one stream;
- ``streams_s``: the same, each product's expert GEMMs round-robin over 4 streams, joined after each product;
- ``one_gemm_s``: one GEMM per product with all experts' rows (the ideal).

All three from CUDA-graph replays (the GPU's time; host dispatch out), medians of 10. Writes
``h100_expert_streams.csv`` to argv[1]. Run: ``python calibration/device_h100_streams.py OUTDIR``.
Prints one line per case: serial (and its repeat), 4-stream and one-GEMM ms, and the serial / one
and streams / one ratios.
"""
from __future__ import annotations

import csv
import sys
import traceback

import torch

DEV = "cuda"
E4M3 = torch.float8_e4m3fn
N_STREAMS = 4


def bench_graph(fn, reps: int = 10) -> float:
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    for _ in range(2):
        g.replay()
    torch.cuda.synchronize()
    st = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    en = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        st[i].record()
        g.replay()
        en[i].record()
    torch.cuda.synchronize()
    t = sorted(a.elapsed_time(b) * 1e-3 for a, b in zip(st, en))
    del g
    return t[len(t) // 2]


def case(dtype: str, e: int, t: int, h: int, ffn: int):
    """Operands of one MoE layer's expert products: for product p, a list of (a [m,k], b [k,n]) per expert."""
    bf = torch.bfloat16
    one = torch.tensor(1.0, device=DEV)

    def pair(m, n, k):
        if dtype == "bf16":
            return (torch.randn(m, k, device=DEV, dtype=bf), torch.randn(k, n, device=DEV, dtype=bf))
        return (torch.randn(m, k, device=DEV).to(E4M3), torch.randn(n, k, device=DEV).to(E4M3).t())

    shapes = [(t, 2 * ffn, h), (t, h, ffn), (t, ffn, h), (h, ffn, t), (t, h, 2 * ffn), (2 * ffn, h, t)]
    prods = [[pair(m, n, k) for _ in range(e)] for m, n, k in shapes]
    # one GEMM per product: the experts' token rows stacked (m = E t), or for the weight gradients
    # (products 3 and 5, k = tokens) the tokens stacked along k
    whole = [pair(m, n, k * e) if p in (3, 5) else pair(m * e, n, k) for p, (m, n, k) in enumerate(shapes)]

    def mm(a, b):
        if dtype == "bf16":
            return a @ b
        return torch._scaled_mm(a, b, one, one, out_dtype=bf, use_fast_accum=True)

    streams = [torch.cuda.Stream() for _ in range(N_STREAMS)]

    def serial():
        for ops in prods:
            for a, b in ops:
                mm(a, b)

    def multi():
        cur = torch.cuda.current_stream()
        for ops in prods:
            for s in streams:
                s.wait_stream(cur)
            for j, (a, b) in enumerate(ops):
                with torch.cuda.stream(streams[j % N_STREAMS]):
                    mm(a, b)
            for s in streams:
                cur.wait_stream(s)

    def one_gemm():
        for a, b in whole:
            mm(a, b)
    return serial, multi, one_gemm


def main() -> None:
    outdir = sys.argv[1] if len(sys.argv) > 1 else "."
    cases = [("qwen3-30b ep16", "fp8", 8, 4096, 2048, 768), ("qwen3-30b ep16", "bf16", 8, 4096, 2048, 768),
             ("qwen3-30b ep8", "fp8", 16, 4096, 2048, 768), ("gpt-oss ep8", "bf16", 16, 1024, 2880, 2880),
             ("qwen3-235b ep32", "fp8", 4, 2048, 4096, 1536), ("dsv3 ep8", "bf16", 32, 1024, 7168, 2048),
             ("dsv3 ep8", "fp8", 32, 1024, 7168, 2048), ("qwen3-30b gb ep8 t8192", "bf16", 16, 8192, 2048, 768),
             ("gpt-oss ep8 t512", "bf16", 16, 512, 2880, 2880), ("qwen3-30b ep32 t1024", "fp8", 4, 1024, 2048, 768)]
    with open(f"{outdir}/h100_expert_streams.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["case", "dtype", "local_experts", "tokens_per_expert", "hidden", "expert_ffn", "flop",
                    "serial_s", "streams_s", "one_gemm_s", "serial_repeat_s"])
        for name, dtype, e, t, h, ffn in cases:
            try:
                serial, multi, one = case(dtype, e, t, h, ffn)
                flop = e * 3 * (2 * t * 2 * ffn * h + 2 * t * ffn * h)
                ts, tm, to = bench_graph(serial), bench_graph(multi), bench_graph(one)
                ts2 = bench_graph(serial)
                w.writerow([name, dtype, e, t, h, ffn, flop, f"{ts:.6e}", f"{tm:.6e}", f"{to:.6e}", f"{ts2:.6e}"])
                f.flush()
                print(f"{name:24s} {dtype} E{e:2d} T{t:5d}: serial {ts*1e3:.3f} ms (again {ts2*1e3:.3f}) "
                      f"4 streams {tm*1e3:.3f} ms one GEMM {to*1e3:.3f} ms | serial/one {ts/to:.3f} "
                      f"streams/one {tm/to:.3f}", flush=True)
            except Exception:  # noqa: BLE001 -- one case failing must not lose the others
                traceback.print_exc()
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
