"""Kernel measurements on one H100 for the low-precision and MoE terms (run on the device machine).

Writes three CSVs (data/kernels/, provenance in data/README.md, "Low precision and expert loops"):

- ``h100_gemm_lowp.csv``: bf16 and FP8 (e4m3, per-tensor scales, ``torch._scaled_mm``, TN layout as
  cuBLASLt needs it) matrix products ``[m,k] @ [k,n]`` on a power-of-two grid and on the GEMM shapes
  of the Megatron-Bridge DGX-H100 rows (dense linears and the routed experts' fc1 / fc2, each as
  forward, data-gradient and weight-gradient product). FP8 is timed with and without cuBLAS's fast
  accumulation (Transformer Engine's fprop uses it, dgrad / wgrad use split accumulation).
- ``h100_expert_loop.csv``: one MoE layer's routed-expert GEMMs, forward and backward (fc1, fc2: six
  products per expert), for the local-expert counts and tokens per expert of the DGX-H100 rows: as an
  eager per-expert loop (host issue included), the same loop replayed from a CUDA graph (GPU time
  alone), and one product of the same FLOPs (the ideal a single large GEMM reaches); bf16 and FP8
  (FP8 adds the per-tensor current-scaling quantize of each expert's inputs: amax, scale, cast).
- ``h100_quantize.csv``: the memory-bound kernels of FP8 current scaling by tensor size: amax of |x|,
  scaled cast to e4m3, scaled cast with a transposed copy.

Timing: CUDA events around each region, median (and minimum) of the timed repetitions after
warm-up, inputs rotated among several buffers when they would fit in L2, random normal data.
Run: ``python calibration/device_h100_lowp.py OUTDIR`` (about 3 minutes on an H100; the CSVs go
into OUTDIR, argv[1], and were copied into data/kernels/). Prints the torch / CUDA versions, the
GPU and its SM count, one line per expert-loop case (eager and graph ms), the elapsed time after
each CSV and a line when the GEMMs and the quantize kernels are done; a failure prints its error.
"""
from __future__ import annotations

import csv
import math
import sys
import time
import traceback

import torch

DEV = "cuda"
E4M3 = torch.float8_e4m3fn
E4M3_MAX = 448.0
L2_BYTES = 50e6


def sets_for(nbytes: float) -> int:
    """How many input sets to rotate so that repeated runs do not read from L2."""
    return max(1, min(8, math.ceil(4 * L2_BYTES / max(nbytes, 1.0))))


def bench(fns, warm: int = 3, reps: int = 15) -> tuple[float, float]:
    """Median and minimum seconds of fns[i % len(fns)]() timed with CUDA events."""
    for i in range(warm):
        fns[i % len(fns)]()
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        starts[i].record()
        fns[i % len(fns)]()
        ends[i].record()
    torch.cuda.synchronize()
    t = sorted(s.elapsed_time(e) * 1e-3 for s, e in zip(starts, ends))
    return t[len(t) // 2], t[0]


def bench_graph(fns, inner: int = 20, reps: int = 10) -> tuple[float, float]:
    """GPU seconds per call: ``inner`` calls (cycling fns) captured in one CUDA graph, its replays timed
    with events, median and minimum over ``reps`` replays divided by ``inner``. Host dispatch is out of
    the figure (per-call event timing on this machine floors at ~30-40 us of Python dispatch)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for i in range(3):
            fns[i % len(fns)]()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(inner):
            fns[i % len(fns)]()
    med, mn = bench([g.replay], warm=2, reps=reps)
    del g
    return med / inner, mn / inner


try:
    import triton
    import triton.language as tl

    @triton.jit
    def _cast_transpose(x_ptr, s_ptr, y_ptr, yt_ptr, M, N, BM: tl.constexpr, BN: tl.constexpr):
        rm = tl.program_id(0) * BM + tl.arange(0, BM)
        rn = tl.program_id(1) * BN + tl.arange(0, BN)
        mask = (rm[:, None] < M) & (rn[None, :] < N)
        x = tl.load(x_ptr + rm[:, None] * N + rn[None, :], mask=mask, other=0.0).to(tl.float32)
        y = (x * tl.load(s_ptr)).to(tl.float8e4nv)
        tl.store(y_ptr + rm[:, None] * N + rn[None, :], y, mask=mask)
        tl.store(yt_ptr + rn[:, None] * M + rm[None, :], tl.trans(y), mask=tl.trans(mask))

    def cast_transpose(x, scale):
        """One fused kernel (as TE's cast_transpose): reads x once, writes e4m3 x * scale and its transpose."""
        m, n = x.shape
        y = torch.empty(m, n, device=DEV, dtype=E4M3)
        yt = torch.empty(n, m, device=DEV, dtype=E4M3)
        _cast_transpose[(triton.cdiv(m, 64), triton.cdiv(n, 64))](x, scale, y, yt, m, n, BM=64, BN=64)
        return y, yt
    FUSED = True
except Exception:  # noqa: BLE001 -- fall back to two PyTorch kernels, recorded in the CSVs
    traceback.print_exc()
    FUSED = False


def quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-tensor current scaling (TE's Float8CurrentScaling) as three kernels: amax of |x| (one
    reduction), the scale (a scalar kernel), and one fused cast-transpose writing the e4m3 tensor and
    the transposed copy the weight gradient reads (TE's cast_transpose; a Triton kernel here). Without
    Triton: a cast and a strided copy (PyTorch's strided copy runs at ~390 GB/s, far under TE's)."""
    amax = torch.linalg.vector_norm(x, float("inf"))
    scale = E4M3_MAX / torch.clamp(amax.float(), min=1e-12)
    if FUSED:
        y, yt = cast_transpose(x, scale)
        return y, yt, scale
    xt = torch.empty(x.shape[1], x.shape[0], device=DEV, dtype=E4M3)
    xt.copy_(x.t())
    return x.to(E4M3), xt, scale


def fp8_operands(m, n, k):
    a = torch.randn(m, k, device=DEV).to(E4M3)
    b = torch.randn(n, k, device=DEV).to(E4M3).t()  # [k, n] column-major: TN as cuBLASLt needs
    return a, b


ONE = None


def gemm_fn(dtype: str, m: int, n: int, k: int, fast: bool):
    nbytes = (m * k + k * n) * (1 if dtype == "fp8" else 2)
    fns = []
    for _ in range(sets_for(nbytes)):
        if dtype == "bf16":
            a = torch.randn(m, k, device=DEV, dtype=torch.bfloat16)
            b = torch.randn(k, n, device=DEV, dtype=torch.bfloat16)
            fns.append(lambda a=a, b=b: torch.matmul(a, b))
        else:
            a, b = fp8_operands(m, n, k)
            fns.append(lambda a=a, b=b: torch._scaled_mm(a, b, ONE, ONE, out_dtype=torch.bfloat16,
                                                         use_fast_accum=fast))
    return fns


def run_gemms(out: str) -> None:
    grid = [256, 512, 1024, 2048, 4096, 8192, 16384]
    shapes = [("grid", m, n, k) for m in grid for n in grid for k in grid]
    # (label, out_features, in_features) of the DGX-H100 rows' linears, tensor-parallel shards applied
    linears = [("llama3-8b.qkv", 6144, 4096), ("llama3-8b.proj", 4096, 4096),
               ("llama3-8b.fc1", 28672, 4096), ("llama3-8b.fc2", 4096, 14336),
               ("llama3-70b-tp4.qkv", 2560, 8192), ("llama3-70b-tp4.proj", 8192, 2048),
               ("llama3-70b-tp4.fc1", 14336, 8192), ("llama3-70b-tp4.fc2", 8192, 7168)]
    experts = [("qwen3-30b.fc1", 1536, 2048), ("qwen3-30b.fc2", 2048, 768),
               ("gpt-oss.fc1", 5760, 2880), ("gpt-oss.fc2", 2880, 2880),
               ("qwen3-235b.fc1", 3072, 4096), ("qwen3-235b.fc2", 4096, 1536),
               ("dsv3.fc1", 4096, 7168), ("dsv3.fc2", 7168, 2048)]
    for label, o, i in linears:
        for t in (4096, 8192, 16384):
            shapes += [(label + ".fwd", t, o, i), (label + ".dgrad", t, i, o), (label + ".wgrad", o, i, t)]
    for label, o, i in experts:
        for t in (256, 512, 1024, 2048, 4096, 8192):
            shapes += [(label + ".fwd", t, o, i), (label + ".dgrad", t, i, o), (label + ".wgrad", o, i, t)]
    with open(out, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["shape", "dtype", "fast_accum", "m", "n", "k", "time_s", "min_time_s", "tflops",
                    "gpu_time_s", "gpu_min_time_s", "gpu_tflops"])
        for label, m, n, k in shapes:
            for dtype, fast in (("bf16", 0), ("fp8", 1), ("fp8", 0)):
                fns = gemm_fn(dtype, m, n, k, bool(fast))
                med, mn = bench(fns)
                gmed, gmn = bench_graph(fns, inner=20 if 2 * m * n * k < 1e12 else 4)
                w.writerow([label, dtype, fast, m, n, k, f"{med:.6e}", f"{mn:.6e}", f"{2*m*n*k/med/1e12:.1f}",
                            f"{gmed:.6e}", f"{gmn:.6e}", f"{2*m*n*k/gmed/1e12:.1f}"])
                del fns
            f.flush()
    print("gemms done", len(shapes), flush=True)


def expert_loop(dtype: str, e: int, t: int, h: int, ffn: int):
    """One MoE layer's routed-expert products (fc1 [2ffn, h] gated, fc2 [h, ffn]) forward and backward
    per expert, as TE's GroupedLinear loops over the local experts (fp8: current-scaling quantize of
    every GEMM input that changes each call; weights quantized once, outside the loop)."""
    bf = torch.bfloat16
    x = torch.randn(e * t, h, device=DEV, dtype=bf)
    dy = torch.randn(e * t, h, device=DEV, dtype=bf)
    w1 = [torch.randn(2 * ffn, h, device=DEV, dtype=bf) / h**0.5 for _ in range(e)]
    w2 = [torch.randn(h, ffn, device=DEV, dtype=bf) / ffn**0.5 for _ in range(e)]
    if dtype == "fp8":
        w1q = [(a.to(E4M3), a.t().contiguous().to(E4M3)) for a in w1]
        w2q = [(a.to(E4M3), a.t().contiguous().to(E4M3)) for a in w2]

    def mm(a, b_nk):  # a [m, k] @ b_nk[n, k]^T
        if dtype == "bf16":
            return a @ b_nk.t()
        return torch._scaled_mm(a, b_nk.t(), ONE, ONE, out_dtype=bf, use_fast_accum=True)

    def loop():
        xs = x.split(t)
        dys = dy.split(t)
        for j in range(e):
            xj = xs[j]
            if dtype == "fp8":
                xq, xtq, _ = quantize(xj)
                h1 = mm(xq, w1q[j][0])
            else:
                h1 = mm(xj, w1[j])
            g, u = h1.chunk(2, dim=1)
            a = torch.nn.functional.silu(g) * u
            if dtype == "fp8":
                aq, atq, _ = quantize(a)
                mm(aq, w2q[j][0])
                dq, dtq, _ = quantize(dys[j])
                da = mm(dq, w2q[j][1])                 # dgrad fc2: [t, ffn]
                mm(dtq, atq)                           # wgrad fc2: [h, ffn]
                dh = torch.cat([da, da], dim=1)        # stands for the gated activation's backward
                dhq, dhtq, _ = quantize(dh)
                mm(dhq, w1q[j][1])                     # dgrad fc1: [t, h]
                mm(dhtq, xtq)                          # wgrad fc1: [2ffn, h]
            else:
                mm(a, w2[j])
                da = dys[j] @ w2[j]
                dys[j].t() @ a
                dh = torch.cat([da, da], dim=1)
                dh @ w1[j]
                dh.t() @ xj
    # the six products alone, on operands made beforehand (no activation, no quantize): the GEMMs' GPU time
    xa = torch.randn(e * t, ffn, device=DEV, dtype=bf)
    xdh = torch.randn(e * t, 2 * ffn, device=DEV, dtype=bf)
    ops = list(zip(x.split(t), xa.split(t), dy.split(t), xdh.split(t)))
    if dtype == "fp8":
        ops = [tuple(quantize(z)[:2] for z in op) for op in ops]

    def gemms():
        for j, (xj, aj, dyj, dhj) in enumerate(ops):
            if dtype == "fp8":
                mm(xj[0], w1q[j][0])
                mm(aj[0], w2q[j][0])
                mm(dyj[0], w2q[j][1])
                mm(dyj[1], aj[1])
                mm(dhj[0], w1q[j][1])
                mm(dhj[1], xj[1])
            else:
                mm(xj, w1[j])
                mm(aj, w2[j])
                dyj @ w2[j]
                dyj.t() @ aj
                dhj @ w1[j]
                dhj.t() @ xj
    flop = e * 3 * (2 * t * 2 * ffn * h + 2 * t * ffn * h)
    return loop, gemms, flop


def run_loops(out: str) -> None:
    # (row, dtype, local experts, tokens per local expert per micro-batch, hidden, expert ffn)
    cases = [("qwen3-30b ep16", "fp8", 8, 4096, 2048, 768), ("qwen3-30b ep16", "bf16", 8, 4096, 2048, 768),
             ("qwen3-30b ep8", "fp8", 16, 4096, 2048, 768), ("qwen3-30b ep8", "bf16", 16, 4096, 2048, 768),
             ("gpt-oss ep8", "bf16", 16, 1024, 2880, 2880), ("gpt-oss ep8 mbs4", "bf16", 16, 4096, 2880, 2880),
             ("qwen3-235b ep32", "fp8", 4, 2048, 4096, 1536), ("qwen3-235b ep32", "bf16", 4, 2048, 4096, 1536),
             ("dsv3 ep64", "fp8", 4, 2048, 7168, 2048), ("dsv3 ep8", "bf16", 32, 1024, 7168, 2048),
             ("dsv3 ep8", "fp8", 32, 1024, 7168, 2048)]
    with open(out, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["case", "dtype", "local_experts", "tokens_per_expert", "hidden", "expert_ffn", "flop",
                    "eager_s", "graph_s", "host_issue_s", "one_gemm_s", "grouped_mm_s", "gemms_graph_s",
                    "fused_cast_transpose"])
        for name, dtype, e, t, h, ffn in cases:
            try:
                loop, gemms, flop = expert_loop(dtype, e, t, h, ffn)
                gemm_graph, _ = bench_graph([gemms], inner=1)
                eager, _ = bench([loop], warm=3, reps=10)
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                loop()
                host = time.perf_counter() - t0
                torch.cuda.synchronize()
                s = torch.cuda.Stream()
                s.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(s):
                    for _ in range(2):
                        loop()
                torch.cuda.current_stream().wait_stream(s)
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    loop()
                graph, _ = bench([g.replay], warm=2, reps=10)
                del g
                # one product with the loop's FLOPs: [e*t, h] x [h, 3*ffn] taken 3 times (fwd, dgrad, wgrad)
                m, n, k = e * t, 3 * ffn, h
                fns = gemm_fn(dtype, m, n, k, True)
                one, _ = bench(fns)
                one *= 3
                grouped = float("nan")
                if dtype == "bf16" and hasattr(torch, "_grouped_mm"):
                    try:
                        a = torch.randn(e * t, h, device=DEV, dtype=torch.bfloat16)
                        b = torch.randn(e, 2 * ffn, h, device=DEV, dtype=torch.bfloat16).transpose(1, 2)
                        offs = torch.arange(t, e * t + 1, t, device=DEV, dtype=torch.int32)
                        gfl = 2 * e * t * 2 * ffn * h
                        gm, _ = bench([lambda: torch._grouped_mm(a, b, offs=offs)])
                        grouped = gm * flop / gfl  # scaled to the loop's FLOPs
                    except Exception as exc:  # noqa: BLE001 -- recorded, not fatal
                        print("grouped_mm failed:", repr(exc)[:200], flush=True)
                w.writerow([name, dtype, e, t, h, ffn, flop, f"{eager:.6e}", f"{graph:.6e}", f"{host:.6e}",
                            f"{one:.6e}", f"{grouped:.6e}", f"{gemm_graph:.6e}", int(FUSED)])
                f.flush()
                print(f"{name:18s} {dtype} E{e} T{t}: eager {eager*1e3:.3f} ms graph {graph*1e3:.3f} ms "
                      f"host {host*1e3:.3f} ms gemms {gemm_graph*1e3:.3f} ms one-gemm {one*1e3:.3f} ms grouped {grouped*1e3:.3f} ms "
                      f"({flop/graph/1e12:.0f} TFLOP/s in graph)", flush=True)
            except Exception:  # noqa: BLE001 -- one case failing must not lose the others
                traceback.print_exc()
            torch.cuda.empty_cache()


def run_quantize(out: str) -> None:
    with open(out, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["kernel", "rows", "cols", "bytes_moved", "time_s", "min_time_s", "GBps",
                    "gpu_time_s", "gpu_min_time_s", "gpu_GBps"])
        for rows, cols in [(256, 1024), (1024, 1024), (1024, 2048), (4096, 2048), (4096, 4096), (8192, 4096),
                           (8192, 8192), (16384, 8192), (32768, 8192), (65536, 8192)]:
            n = rows * cols
            xs = [torch.randn(rows, cols, device=DEV, dtype=torch.bfloat16) for _ in range(sets_for(2 * n))]
            yt = torch.empty(cols, rows, device=DEV, dtype=E4M3)
            kernels = {  # name: (one call, bytes read + written by it)
                "amax": (lambda x: torch.linalg.vector_norm(x, float("inf")), 2 * n),
                "cast": (lambda x: x.to(E4M3), 3 * n),
                "transpose_cast": (lambda x: yt.copy_(x.t()), 3 * n),
                "current_scaling_quantize": (quantize, 8 * n if not FUSED else 6 * n),
            }
            if FUSED:
                one = torch.tensor(1.0, device=DEV)
                kernels["fused_cast_transpose"] = (lambda x: cast_transpose(x, one), 4 * n)
            for name, (fn, nbytes) in kernels.items():
                calls = [lambda x=x, fn=fn: fn(x) for x in xs]
                med, mn = bench(calls, warm=3, reps=20)
                gmed, gmn = bench_graph(calls)
                w.writerow([name, rows, cols, nbytes, f"{med:.6e}", f"{mn:.6e}", f"{nbytes/med/1e9:.0f}",
                            f"{gmed:.6e}", f"{gmn:.6e}", f"{nbytes/gmed/1e9:.0f}"])
            f.flush()
    print("quantize done", flush=True)


def main() -> None:
    global ONE
    outdir = sys.argv[1] if len(sys.argv) > 1 else "."
    ONE = torch.tensor(1.0, device=DEV)
    p = torch.cuda.get_device_properties(0)
    print(torch.__version__, torch.version.cuda, p.name, p.multi_processor_count, "SMs", flush=True)
    t0 = time.time()
    for name, fn in (("h100_expert_loop.csv", run_loops), ("h100_quantize.csv", run_quantize),
                     ("h100_gemm_lowp.csv", run_gemms)):
        try:
            fn(f"{outdir}/{name}")
        except Exception:  # noqa: BLE001
            traceback.print_exc()
        print(f"{name} at {time.time() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
