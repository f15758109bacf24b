"""GPT-OSS 120B's attention core on one H100, as the Megatron-Bridge rows run it (device run).

Transformer Engine 2.9-2.16 under Megatron-Core 0.15-0.17 cannot run GPT-OSS's attention with
FlashAttention (learnable sinks, `softmax_type = "learnable"`): `get_attention_backend` leaves
cuDNN's FusedAttention (F16_arbitrary_seqlen, sinks from cuDNN 9.13.1) and, behind it,
UnfusedDotProductAttention (docs/accuracy-gptoss.md, "Session 15"). This script times, at the
rows' shapes (64 query / 8 KV heads of 64, bf16, s 4096 and 8192; b 1 = the H100 rows'
micro-batch, b 4 = the Blackwell rows', b 2 at s 8192 = the 25.11 GB300 row), forward and backward
separately:

- ``cudnn_fe``: cuDNN's SDPA through the cudnn-frontend Python graph API (the path TE calls:
  `fused_attn_f16_arbitrary_seqlen.cu` builds the same graph), causal, with and without the
  128-key window (TE: `set_diagonal_band_left_bound(window_size_left + 1)` with (127, 0)), with
  and without the sink token (`set_sink_token` / `set_dsink_token`, fp32 [1, h, 1, 1]);
- ``torch_flash`` / ``torch_cudnn`` / ``torch_efficient``: PyTorch's SDPA backends, full causal
  (no window argument there), the flash one being the reference diffperf's attention curve was
  fitted to;
- ``unfused_te``: UnfusedDotProductAttention's arithmetic in PyTorch ops (K / V expanded to the
  64 heads, bf16 baddbmm of the scaled scores, causal / window mask, the sink column
  concatenated, softmax, the column dropped, bmm with V; forward and autograd backward), b 1 s 4096;
- ``jax_cudnn`` (subprocess): `jax.nn.dot_product_attention(implementation="cudnn")` with
  `local_window_size=(127, 0)` and without, forward and forward + backward (a cross-check of the
  window timing that needs no cudnn-frontend wheel).

Timing: CUDA events around `inner` back-to-back calls, median over `reps` such loops, divided by
`inner`; the host enqueue time of the same loop is recorded (`host_ms`) so that a host-bound case
shows (gpu_ms ~ host_ms). Inputs random normal; sinks random normal (std 0.5).

Run: ``python calibration/device_h100_attention.py OUTDIR`` (cudnn-frontend installed, e.g.
``pip install --no-deps nvidia_cudnn_frontend-1.23.0-*.whl``; without it the cudnn_fe rows are
skipped). About 2 minutes on an H100; a global budget (170 s) skips what is left. Writes
OUTDIR/h100_gptoss_attention.csv (one row per case) and prints one line per case.
"""
from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import time
import traceback

HQ, HKV, D = 64, 8, 64
WINDOW_LEFT = 127  # Megatron-Bridge gpt_oss_bridge: window_size = (sliding_window - 1, 0)
SHAPES = [(1, 4096), (4, 4096), (2, 8192)]
BUDGET_S = 170.0
T0 = time.time()
FIELDS = ["impl", "b", "s", "hq", "hkv", "d", "window_left", "sink", "pass", "gpu_ms", "min_ms",
          "host_ms", "band_flops", "tflops_band", "note"]


def band_scores(s: int, window_left: int | None) -> int:
    """Scores a causal (windowed) attention keeps per head: the triangle, or the band of
    window_left + 1 keys per query (as cudnn-frontend's benchmark counts them)."""
    if window_left is None or window_left + 1 >= s:
        return s * (s + 1) // 2
    w = window_left + 1
    return w * (w + 1) // 2 + (s - w) * w


def flops(b, s, window_left, which):
    """Forward 4 N b h d, backward 10 N b h d (2.5 x: dQ, dK, dV, dP GEMMs + recomputed S)."""
    n = band_scores(s, window_left) * b * HQ
    return {"fwd": 4 * n * D, "bwd": 10 * n * D, "fwd+bwd": 14 * n * D}[which]


def left():
    return BUDGET_S - (time.time() - T0)


class Out:
    def __init__(self, outdir):
        os.makedirs(outdir, exist_ok=True)
        self.path = os.path.join(outdir, "h100_gptoss_attention.csv")
        self.f = open(self.path, "w", newline="")
        self.w = csv.DictWriter(self.f, fieldnames=FIELDS)
        self.w.writeheader()

    def row(self, **kw):
        fl = flops(kw["b"], kw["s"], kw.get("window_left"), kw["pass"])
        kw.setdefault("hq", HQ), kw.setdefault("hkv", HKV), kw.setdefault("d", D)
        kw["band_flops"] = fl
        kw["tflops_band"] = round(fl / (kw["gpu_ms"] * 1e-3) / 1e12, 1) if kw["gpu_ms"] else ""
        for k in ("gpu_ms", "min_ms", "host_ms"):
            if isinstance(kw.get(k), float):
                kw[k] = round(kw[k], 4)
        self.w.writerow(kw)
        self.f.flush()
        print(f"{kw['impl']:16s} b{kw['b']} s{kw['s']:5d} win {str(kw.get('window_left')):4s} "
              f"sink {kw.get('sink', 0)} {kw['pass']:7s} {kw['gpu_ms']:9.4f} ms "
              f"({kw['tflops_band']} TFLOP/s band) host {kw.get('host_ms')} ms "
              f"{kw.get('note', '')}",
              flush=True)


def timeit(fn, inner=10, reps=5, warm=2):
    """(median ms per call, min ms per call, host ms per call of the enqueue loop)."""
    import torch
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    gpu, host = [], []
    for _ in range(reps):
        a, z = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        h0 = time.perf_counter()
        for _ in range(inner):
            fn()
        h1 = time.perf_counter()
        z.record()
        torch.cuda.synchronize()
        gpu.append(a.elapsed_time(z) / inner)
        host.append((h1 - h0) * 1e3 / inner)
    gpu.sort()
    return gpu[len(gpu) // 2], gpu[0], sorted(host)[len(host) // 2]


# ----------------------------------------------------------------------------- cudnn-frontend
def run_cudnn_fe(out):
    import torch
    try:
        import cudnn
    except Exception as e:  # noqa: BLE001
        print(f"cudnn-frontend not importable ({e!r}): cudnn_fe rows skipped", flush=True)
        return
    print(f"cudnn-frontend {cudnn.__version__}, cuDNN backend {cudnn.backend_version()}",
          flush=True)
    handle = cudnn.create_handle()
    cudnn.set_stream(handle=handle, stream=torch.cuda.current_stream().cuda_stream)
    bf16, f32 = cudnn.data_type.BFLOAT16, cudnn.data_type.FLOAT
    for b, s in SHAPES:
        q = torch.randn(b, s, HQ, D, dtype=torch.bfloat16, device="cuda").transpose(1, 2)
        k = torch.randn(b, s, HKV, D, dtype=torch.bfloat16, device="cuda").transpose(1, 2)
        v = torch.randn(b, s, HKV, D, dtype=torch.bfloat16, device="cuda").transpose(1, 2)
        o = torch.empty(b, s, HQ, D, dtype=torch.bfloat16, device="cuda").transpose(1, 2)
        do = torch.randn(b, s, HQ, D, dtype=torch.bfloat16, device="cuda").transpose(1, 2)
        stats = torch.empty(b, HQ, s, 1, dtype=torch.float32, device="cuda")
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        sink_t = (0.5 * torch.randn(1, HQ, 1, 1, dtype=torch.float32, device="cuda"))
        dsink_t = torch.zeros(1, HQ, 1, 1, dtype=torch.float32, device="cuda")
        for window in (WINDOW_LEFT, None):
            for sink in (0, 1):
                if left() < 20:
                    print("budget: cudnn_fe cases left out", flush=True)
                    return
                tag = dict(impl="cudnn_fe", b=b, s=s, window_left=window, sink=sink)
                try:
                    band = {} if window is None else dict(diagonal_band_left_bound=window + 1)
                    gf = cudnn.pygraph(io_data_type=bf16, intermediate_data_type=f32,
                                       compute_data_type=f32, handle=handle)
                    qf, kf, vf = gf.tensor_like(q), gf.tensor_like(k), gf.tensor_like(v)
                    sf = (gf.tensor(dim=(1, HQ, 1, 1), stride=(HQ, 1, 1, 1), data_type=f32)
                          if sink else None)
                    of, stf = gf.sdpa(name="fwd", q=qf, k=kf, v=vf, generate_stats=True,
                                      attn_scale=D ** -0.5, use_causal_mask=True,
                                      sink_token=sf, **band)
                    of.set_output(True).set_dim(o.size()).set_stride(o.stride())
                    stf.set_output(True).set_dim(stats.size()).set_stride(
                        stats.stride()).set_data_type(f32)
                    gf.validate()
                    gf.build_operation_graph()
                    gf.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
                    gf.check_support()
                    gf.build_plans()
                    gb = cudnn.pygraph(io_data_type=bf16, intermediate_data_type=f32,
                                       compute_data_type=f32, handle=handle)
                    qb, kb, vb = gb.tensor_like(q), gb.tensor_like(k), gb.tensor_like(v)
                    ob, dob, stb = gb.tensor_like(o), gb.tensor_like(do), gb.tensor_like(stats)
                    sb = dsb = None
                    if sink:
                        sb = gb.tensor(dim=(1, HQ, 1, 1), stride=(HQ, 1, 1, 1), data_type=f32)
                        dsb = gb.tensor(dim=(1, HQ, 1, 1), stride=(HQ, 1, 1, 1), data_type=f32)
                    dqb, dkb, dvb = gb.sdpa_backward(name="bwd", q=qb, k=kb, v=vb, o=ob, dO=dob,
                                                     stats=stb, attn_scale=D ** -0.5,
                                                     use_causal_mask=True, sink_token=sb,
                                                     dSink_token=dsb, **band)
                    for t, ref in ((dqb, dq), (dkb, dk), (dvb, dv)):
                        t.set_output(True).set_dim(ref.size()).set_stride(ref.stride())
                    if sink:
                        dsb.set_output(True)
                    gb.validate()
                    gb.build_operation_graph()
                    gb.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
                    gb.check_support()
                    gb.build_plans()
                    ws = torch.empty(max(gf.get_workspace_size(), gb.get_workspace_size(), 1),
                                     device="cuda", dtype=torch.uint8)
                    pf = {qf: q, kf: k, vf: v, of: o, stf: stats}
                    pb = {qb: q, kb: k, vb: v, ob: o, dob: do, stb: stats, dqb: dq, dkb: dk,
                          dvb: dv}
                    if sink:
                        pf[sf] = sink_t
                        pb[sb], pb[dsb] = sink_t, dsink_t
                    fwd = lambda: gf.execute(pf, ws, handle=handle)  # noqa: E731
                    bwd = lambda: gb.execute(pb, ws, handle=handle)  # noqa: E731
                    for name, fn in (("fwd", fwd), ("bwd", bwd)):
                        med, mn, host = timeit(fn)
                        out.row(**tag, **{"pass": name}, gpu_ms=med, min_ms=mn, host_ms=host)
                except Exception as e:  # noqa: BLE001
                    print(f"cudnn_fe {tag} failed: {e!r}", flush=True)
                    traceback.print_exc(limit=2)
        del q, k, v, o, do, stats, dq, dk, dv
        torch.cuda.empty_cache()


# ----------------------------------------------------------------------------- torch SDPA
def run_torch_sdpa(out):
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    backends = [("torch_flash", SDPBackend.FLASH_ATTENTION),
                ("torch_cudnn", SDPBackend.CUDNN_ATTENTION),
                ("torch_efficient", SDPBackend.EFFICIENT_ATTENTION)]
    for b, s in SHAPES:
        q = torch.randn(b, HQ, s, D, dtype=torch.bfloat16, device="cuda", requires_grad=True)
        k = torch.randn(b, HKV, s, D, dtype=torch.bfloat16, device="cuda", requires_grad=True)
        v = torch.randn(b, HKV, s, D, dtype=torch.bfloat16, device="cuda", requires_grad=True)
        rep = HQ // HKV
        ke = k.detach().repeat_interleave(rep, 1).requires_grad_()
        ve = v.detach().repeat_interleave(rep, 1).requires_grad_()
        do = torch.randn(b, HQ, s, D, dtype=torch.bfloat16, device="cuda")
        for name, be in backends:
            if left() < 15:
                print("budget: torch SDPA cases left out", flush=True)
                return
            if name == "torch_efficient" and (b, s) != (1, 4096):
                continue
            for gqa in (True, False):
                kk, vv = (k, v) if gqa else (ke, ve)
                note = "enable_gqa" if gqa else "K/V expanded to 64 heads"
                try:
                    with sdpa_kernel([be]):
                        def fwd():
                            with torch.no_grad():
                                return F.scaled_dot_product_attention(
                                    q, kk, vv, is_causal=True, enable_gqa=gqa)
                        o = F.scaled_dot_product_attention(q, kk, vv, is_causal=True,
                                                           enable_gqa=gqa)

                        def fb():
                            oo = F.scaled_dot_product_attention(q, kk, vv, is_causal=True,
                                                                enable_gqa=gqa)
                            torch.autograd.grad(oo, (q, kk, vv), do)
                        med_f, mn_f, h_f = timeit(fwd)
                        med, mn, h = timeit(fb)
                    tag = dict(impl=name, b=b, s=s, window_left=None, sink=0, note=note)
                    out.row(**tag, **{"pass": "fwd"}, gpu_ms=med_f, min_ms=mn_f, host_ms=h_f)
                    out.row(**tag, **{"pass": "fwd+bwd"}, gpu_ms=med, min_ms=mn, host_ms=h)
                    del o
                    break  # GQA worked: the expanded variant is not needed
                except Exception as e:  # noqa: BLE001
                    print(f"{name} b{b} s{s} {note} failed: {str(e)[:200]}", flush=True)
        del q, k, v, ke, ve, do
        torch.cuda.empty_cache()


# ----------------------------------------------------------------------------- TE unfused
def run_unfused(out):
    import torch
    b, s = 1, 4096
    scale = D ** -0.5
    q0 = torch.randn(b * HQ, s, D, dtype=torch.bfloat16, device="cuda")
    k0 = torch.randn(b * HKV, s, D, dtype=torch.bfloat16, device="cuda")
    v0 = torch.randn(b * HKV, s, D, dtype=torch.bfloat16, device="cuda")
    sink = (0.5 * torch.randn(1, HQ, 1, 1, device="cuda")).requires_grad_()
    i = torch.arange(s, device="cuda")
    for window in (WINDOW_LEFT, None):
        if left() < 15:
            print("budget: unfused cases left out", flush=True)
            return
        masked = i[None, :] > i[:, None]
        if window is not None:
            masked = masked | (i[None, :] < i[:, None] - window)
        q = q0.clone().requires_grad_()
        k = k0.clone().requires_grad_()
        v = v0.clone().requires_grad_()
        do = torch.randn(b * HQ, s, D, dtype=torch.bfloat16, device="cuda")

        def fwd():
            ke = k.repeat_interleave(HQ // HKV, 0)
            ve = v.repeat_interleave(HQ // HKV, 0)
            sc = torch.baddbmm(torch.empty(b * HQ, s, s, dtype=torch.bfloat16, device="cuda"),
                               q, ke.transpose(1, 2), beta=0.0, alpha=scale)
            sc = sc.view(b, HQ, s, s).masked_fill(masked, float("-inf"))
            sc = torch.cat([sc, sink.to(sc.dtype).expand(b, HQ, s, 1)], dim=-1)
            p = torch.softmax(sc, dim=-1)[..., :s]
            return torch.bmm(p.reshape(b * HQ, s, s), ve)

        def fb():
            o = fwd()
            torch.autograd.grad(o, (q, k, v, sink), do)
        tag = dict(impl="unfused_te", b=b, s=s, window_left=window, sink=1,
                   note="bf16 scores, mask, sink column, softmax, bmm (TE backends.py)")
        try:
            with torch.no_grad():
                med_f, mn_f, h_f = timeit(fwd, inner=3, reps=3)
            med, mn, h = timeit(fb, inner=3, reps=3)
            out.row(**tag, **{"pass": "fwd"}, gpu_ms=med_f, min_ms=mn_f, host_ms=h_f)
            out.row(**tag, **{"pass": "fwd+bwd"}, gpu_ms=med, min_ms=mn, host_ms=h)
        except Exception as e:  # noqa: BLE001
            print(f"unfused {tag} failed: {str(e)[:200]}", flush=True)
        torch.cuda.empty_cache()


# ----------------------------------------------------------------------------- JAX cuDNN
def jax_child(json_path):
    """Runs in a subprocess (JAX and PyTorch each hold their own GPU memory)."""
    import jax
    import jax.numpy as jnp
    print(f"jax {jax.__version__} {jax.devices()[0].device_kind}", flush=True)
    rows = []
    key = jax.random.PRNGKey(0)
    for b, s in SHAPES:
        q = jax.random.normal(key, (b, s, HQ, D), jnp.bfloat16)
        k = jax.random.normal(key, (b, s, HKV, D), jnp.bfloat16)
        v = jax.random.normal(key, (b, s, HKV, D), jnp.bfloat16)
        do = jax.random.normal(key, (b, s, HQ, D), jnp.bfloat16)
        for window in (WINDOW_LEFT, None):
            lw = None if window is None else (window, 0)

            def att(q, k, v):
                return jax.nn.dot_product_attention(q, k, v, is_causal=True,
                                                    local_window_size=lw,
                                                    implementation="cudnn")
            fwd = jax.jit(att)

            @jax.jit
            def fb(q, k, v, do):
                o, vjp = jax.vjp(att, q, k, v)
                return vjp(do)
            for name, fn, args in (("fwd", fwd, (q, k, v)), ("fwd+bwd", fb, (q, k, v, do))):
                try:
                    jax.block_until_ready(fn(*args))
                    ts = []
                    for _ in range(5):
                        t0 = time.perf_counter()
                        for _ in range(10):
                            r = fn(*args)
                        jax.block_until_ready(r)
                        ts.append((time.perf_counter() - t0) * 1e3 / 10)
                    ts.sort()
                    rows.append(dict(impl="jax_cudnn", b=b, s=s, window_left=window, sink=0,
                                     **{"pass": name}, gpu_ms=ts[2], min_ms=ts[0], host_ms="",
                                     note="wall time of 10 async calls / 10"))
                    print(rows[-1], flush=True)
                except Exception as e:  # noqa: BLE001
                    print(f"jax {b} {s} {window} {name} failed: {str(e)[:300]}", flush=True)
    with open(json_path, "w") as f:
        json.dump(rows, f)


def run_jax(out, outdir):
    if left() < 25:
        print("budget: JAX cases left out", flush=True)
        return
    path = os.path.join(outdir, "_jax_rows.json")
    env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false")
    try:
        subprocess.run([sys.executable, __file__, "--jax-child", path], env=env,
                       timeout=max(left(), 10))
        with open(path) as f:
            for r in json.load(f):
                out.row(**r)
        os.remove(path)
    except Exception as e:  # noqa: BLE001
        print(f"jax part failed: {e!r}", flush=True)


def main():
    if len(sys.argv) >= 3 and sys.argv[1] == "--jax-child":
        jax_child(sys.argv[2])
        return
    outdir = sys.argv[1] if len(sys.argv) > 1 else "."
    import torch
    p = torch.cuda.get_device_properties(0)
    print(f"torch {torch.__version__} CUDA {torch.version.cuda} cuDNN "
          f"{torch.backends.cudnn.version()} GPU {p.name} SMs {p.multi_processor_count}",
          flush=True)
    out = Out(outdir)
    for part in (run_cudnn_fe, run_torch_sdpa, run_unfused):
        try:
            part(out)
        except Exception:  # noqa: BLE001
            traceback.print_exc()
        print(f"-- {part.__name__} done at {time.time() - T0:.0f} s", flush=True)
    torch.cuda.empty_cache()
    run_jax(out, outdir)
    print(f"-- all done at {time.time() - T0:.0f} s; {out.path}", flush=True)


if __name__ == "__main__":
    main()
