"""FP8 current-scaling quantize as Transformer Engine launches it, per expert slice, and the four-stream
expert GEMMs at the DGX-H100 Bridge rows' own tokens per expert (run on the device machine).

Transformer Engine 2.7-2.16 quantizes a tensor under FP8 current scaling with four GPU operations
(``Float8CurrentScalingQuantizer::quantize_impl``, pytorch/csrc/quantizer.cpp; kernels in
common/recipe/current_scaling.cu): zero the amax (v2.9+: ``zero_amax_kernel<<<1, 1>>>``; v2.7 a memset),
one amax pass (``amax_kernel``: one tile of 512 threads x 16 BF16 elements per block, a block reduction,
one ``atomicMax`` per block), ``compute_scale_from_amax_kernel<<<1, 1>>>``, then the cast (with the
transposed copy the weight gradient reads on Hopper: cast-transpose). ``split_quantize`` runs that per
expert slice (pytorch/csrc/extensions/cast.cpp, "Quantize kernels individually"). The loop measurement
of data/kernels/h100_expert_loop.csv used PyTorch's reduction and scale ops instead; this script writes
the four kernels in the same shape as TE's (Triton, one pass, atomics) so that their GPU floors and
their time per slice at the rows' sizes are measured, and adds the four-stream GEMM loop
(``calibration/device_h100_streams.py``) at the tokens per expert diffperf gives the DGX-H100 rows
(Qwen3 235B-A22B TP 2 EP 32 and DeepSeek-V3 TP 2 EP 64: 4096; Qwen3 30B-A3B EP 8 MBS 1: 2048; GPT-OSS
MBS 4: 4096).

Writes to argv[1]:
- ``h100_te_quantize_kernels.csv``: kernel (zero_amax, amax_atomic, compute_scale, cast_transpose,
  te_quantize = the four in order), rows, cols, gpu_time_s (20 calls in one CUDA graph, median of 10
  replays / 20), gpu_min_time_s;
- ``h100_te_quantize_slices.csv``: per case, the quantize of every expert slice of one MoE layer
  (forward: fc1's input [T, h] and fc2's input [T, f]; backward: the two output gradients [T, h] and
  [T, 2f]), TE-shaped (``te_s``) and as data/kernels/h100_expert_loop.csv did it (``torch_s``), both
  from CUDA graphs, and per slice;
- ``h100_expert_streams_rows.csv``: the columns of h100_expert_streams.csv for the rows' shapes.

Prints a short table. Run: ``python calibration/device_h100_te_quantize.py OUTDIR`` (well under a minute
of GPU time on an H100).
"""
from __future__ import annotations

import csv
import sys
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

DEV = "cuda"
E4M3 = torch.float8_e4m3fn
E4M3_MAX = 448.0
TE_AMAX_TILE = 512 * 16  # TE amax_kernel: 512 threads x one 32-byte vector of BF16 each per block


def bench_graph(fn, inner: int = 20, reps: int = 10) -> tuple[float, float]:
    """GPU seconds per call of fn: ``inner`` calls captured in one CUDA graph, median / min of reps replays."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(inner):
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
    t = sorted(a.elapsed_time(b) * 1e-3 / inner for a, b in zip(st, en))
    del g
    return t[len(t) // 2], t[0]


import triton  # noqa: E402
import triton.language as tl  # noqa: E402


@triton.jit
def _zero(a_ptr):
    tl.store(a_ptr, 0.0)


@triton.jit
def _amax(x_ptr, a_ptr, N, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < N, other=0.0).to(tl.float32)
    tl.atomic_max(a_ptr, tl.max(tl.abs(x), axis=0))


@triton.jit
def _scale(a_ptr, s_ptr, si_ptr, FMAX: tl.constexpr):
    a = tl.maximum(tl.load(a_ptr), 1e-12)
    s = FMAX / a
    tl.store(s_ptr, s)
    tl.store(si_ptr, 1.0 / s)


@triton.jit
def _cast_transpose(x_ptr, s_ptr, y_ptr, yt_ptr, M, N, BM: tl.constexpr, BN: tl.constexpr):
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    x = tl.load(x_ptr + rm[:, None] * N + rn[None, :], mask=mask, other=0.0).to(tl.float32)
    y = (x * tl.load(s_ptr)).to(tl.float8e4nv)
    tl.store(y_ptr + rm[:, None] * N + rn[None, :], y, mask=mask)
    tl.store(yt_ptr + rn[:, None] * M + rm[None, :], tl.trans(y), mask=tl.trans(mask))


class TeQuant:
    """Buffers and the four TE-shaped kernels for one [m, n] BF16 tensor (a view with unit row stride)."""

    def __init__(self, m: int, n: int):
        self.m, self.n = m, n
        self.amax = torch.zeros(1, device=DEV, dtype=torch.float32)
        self.scale = torch.ones(1, device=DEV, dtype=torch.float32)
        self.scale_inv = torch.ones(1, device=DEV, dtype=torch.float32)
        self.y = torch.empty(m, n, device=DEV, dtype=E4M3)
        self.yt = torch.empty(n, m, device=DEV, dtype=E4M3)

    def zero(self, x=None):
        _zero[(1,)](self.amax)

    def amax_pass(self, x):
        n = self.m * self.n
        _amax[(triton.cdiv(n, TE_AMAX_TILE),)](x, self.amax, n, BLOCK=TE_AMAX_TILE, num_warps=16)

    def compute_scale(self, x=None):
        _scale[(1,)](self.amax, self.scale, self.scale_inv, FMAX=E4M3_MAX)

    def cast_transpose(self, x):
        _cast_transpose[(triton.cdiv(self.m, 64), triton.cdiv(self.n, 64))](
            x, self.scale, self.y, self.yt, self.m, self.n, BM=64, BN=64)

    def quantize(self, x):
        self.zero()
        self.amax_pass(x)
        self.compute_scale()
        self.cast_transpose(x)


def torch_quantize(x):
    """data/kernels/h100_expert_loop.csv's quantize (calibration/device_h100_lowp.py `quantize`): PyTorch's
    inf-norm reduction, the scale as PyTorch ops, the same Triton cast-transpose."""
    amax = torch.linalg.vector_norm(x, float("inf"))
    scale = E4M3_MAX / torch.clamp(amax.float(), min=1e-12)
    m, n = x.shape
    y = torch.empty(m, n, device=DEV, dtype=E4M3)
    yt = torch.empty(n, m, device=DEV, dtype=E4M3)
    _cast_transpose[(triton.cdiv(m, 64), triton.cdiv(n, 64))](x, scale, y, yt, m, n, BM=64, BN=64)
    return y, yt


def run_kernels(out: str) -> None:
    sizes = [(256, 1024), (1024, 1024), (1024, 2048), (2048, 2048), (1024, 7168), (2048, 4096),
             (4096, 2048), (4096, 4096), (8192, 4096), (8192, 8192)]
    with open(f"{out}/h100_te_quantize_kernels.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["kernel", "rows", "cols", "gpu_time_s", "gpu_min_time_s"])
        for m, n in sizes:
            x = torch.randn(m, n, device=DEV, dtype=torch.bfloat16)
            q = TeQuant(m, n)
            q.quantize(x)
            torch.cuda.synchronize()
            ref = float(x.float().abs().max())
            got = float(q.amax)
            if abs(got - ref) > 1e-3 * ref:
                print(f"amax check failed at {m}x{n}: {got} vs {ref}", flush=True)
            for name, fn in (("zero_amax", q.zero), ("amax_atomic", q.amax_pass),
                             ("compute_scale", q.compute_scale), ("cast_transpose", q.cast_transpose),
                             ("te_quantize", q.quantize), ("torch_quantize", torch_quantize)):
                med, mn = bench_graph(lambda fn=fn: fn(x))
                w.writerow([name, m, n, f"{med:.6e}", f"{mn:.6e}"])
            f.flush()
            print(f"kernels {m}x{n} done", flush=True)
            del x, q
            torch.cuda.empty_cache()


# (case, local experts, tokens per expert, hidden, expert ffn): the DGX-H100 rows' expert slices
SLICE_CASES = [("qwen3-30b ep16", 8, 4096, 2048, 768), ("qwen3-30b ep8 mbs1", 16, 2048, 2048, 768),
               ("qwen3-30b ep8 mbs2", 16, 4096, 2048, 768), ("qwen3-235b ep32 tp2", 4, 4096, 4096, 1536),
               ("dsv3 ep64 tp2", 4, 4096, 7168, 2048), ("dsv3 ep8", 32, 1024, 7168, 2048)]


def run_slices(out: str) -> None:
    with open(f"{out}/h100_te_quantize_slices.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["case", "local_experts", "tokens_per_expert", "hidden", "expert_ffn", "slices",
                    "te_s", "torch_s", "te_per_slice_s", "torch_per_slice_s"])
        for name, e, t, h, ffn in SLICE_CASES:
            try:
                bufs = [torch.randn(e * t, c, device=DEV, dtype=torch.bfloat16) for c in (h, ffn, h, 2 * ffn)]
                slices = [(b.split(t), c) for b, c in zip(bufs, (h, ffn, h, 2 * ffn))]
                qs = [[TeQuant(t, c) for _ in range(e)] for _, c in slices]

                def te():
                    for (parts, _), quants in zip(slices, qs):
                        for x, q in zip(parts, quants):
                            q.quantize(x)

                def tq():
                    for parts, _ in slices:
                        for x in parts:
                            torch_quantize(x)
                n = 4 * e
                te_s, _ = bench_graph(te, inner=1)
                tq_s, _ = bench_graph(tq, inner=1)
                w.writerow([name, e, t, h, ffn, n, f"{te_s:.6e}", f"{tq_s:.6e}", f"{te_s / n:.6e}",
                            f"{tq_s / n:.6e}"])
                f.flush()
                print(f"slices {name:22s} E{e:2d} T{t:5d}: TE-shaped {te_s*1e3:.3f} ms ({te_s/n*1e6:.1f} us/slice) "
                      f"torch {tq_s*1e3:.3f} ms ({tq_s/n*1e6:.1f} us/slice)", flush=True)
                del bufs, slices, qs
            except Exception:  # noqa: BLE001 -- one case failing must not lose the others
                traceback.print_exc()
            torch.cuda.empty_cache()


STREAM_CASES = [("qwen3-235b ep32 tp2", "fp8", 4, 4096, 4096, 1536), ("dsv3 ep64 tp2", "fp8", 4, 4096, 7168, 2048),
                ("qwen3-30b ep8 mbs1", "fp8", 16, 2048, 2048, 768), ("gpt-oss ep8 mbs4", "bf16", 16, 4096, 2880, 2880),
                ("qwen3-30b ep16", "fp8", 8, 4096, 2048, 768)]


def run_streams(out: str) -> None:
    from calibration.device_h100_streams import bench_graph as bg, case

    with open(f"{out}/h100_expert_streams_rows.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["case", "dtype", "local_experts", "tokens_per_expert", "hidden", "expert_ffn", "flop",
                    "serial_s", "streams_s", "one_gemm_s", "serial_repeat_s"])
        for name, dtype, e, t, h, ffn in STREAM_CASES:
            try:
                serial, multi, one = case(dtype, e, t, h, ffn)
                flop = e * 3 * (2 * t * 2 * ffn * h + 2 * t * ffn * h)
                ts, tm, to = bg(serial), bg(multi), bg(one)
                ts2 = bg(serial)
                w.writerow([name, dtype, e, t, h, ffn, flop, f"{ts:.6e}", f"{tm:.6e}", f"{to:.6e}", f"{ts2:.6e}"])
                f.flush()
                print(f"streams {name:22s} {dtype} E{e:2d} T{t:5d}: serial {ts*1e3:.3f} (again {ts2*1e3:.3f}) "
                      f"4 streams {tm*1e3:.3f} one GEMM {to*1e3:.3f} ms", flush=True)
            except Exception:  # noqa: BLE001
                traceback.print_exc()
            torch.cuda.empty_cache()


def main() -> None:
    out = sys.argv[1] if len(sys.argv) > 1 else "."
    p = torch.cuda.get_device_properties(0)
    print(torch.__version__, torch.version.cuda, triton.__version__, p.name, p.multi_processor_count, "SMs",
          flush=True)
    for fn in (run_kernels, run_slices, run_streams):
        try:
            fn(out)
        except Exception:  # noqa: BLE001
            traceback.print_exc()


if __name__ == "__main__":
    main()
