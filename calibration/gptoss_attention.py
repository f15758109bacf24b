"""GPT-OSS's attention kernel: diffperf's price against cuDNN's own timings
(docs/accuracy-gptoss.md, "Session 15").

The Megatron-Bridge GPT-OSS rows run cuDNN's fused attention (Transformer Engine disables
FlashAttention for learnable sinks). cudnn-frontend publishes cuDNN SDPA timings at GPT-OSS
shapes (data/kernels/cudnn_fe_gptoss_sdpa.csv, provenance in data/README.md): GB200 / GB300 with
a 128-key window (b 2, 128 heads of 64, cuDNN 9.22 and 9.27), H200 with it (cuDNN 9.27), the
same shapes in FlashAttention-4 (`backend` flash_attention_4), and GB200 / GB300 / H200 with a
1024-key window (b 2, 64 query / 8 KV heads of 64, cuDNN 9.19.1), forward and backward apart.
For each bf16, non-deterministic row this prints the measured time, diffperf's price of the
same kernel (the row system's physics defaults, bf16, flash attention, attn_tile = 128 as the
Bridge rows set it: `costs.compute.attention_time_s` at the window layer's tile kappa; backward
= 2.5 x the forward work at the backward's rate, as predict prices it) and measured / priced.

    python calibration/gptoss_attention.py [--csv PATH] [--device-csv PATH] [--what-if]

--what-if: the GPT-OSS BF16 Bridge rows on GB200 / GB300 (the systems with published
window-128 timings; with --device-csv also DGX-H100, at this project's cuDNN ratios without the
sink, whose own backward cost is now priced: System.attn_sink_bwd_row_s) if each window layer's
attention cost cuDNN's measured time (priced time x measured / priced at the row's sequence and
pass) and each full layer's cost the priced time x k_full, with k_full = 1 (priced as now) and
k_full = the 1024-key window's measured / priced ratio (a proxy on GB200 / GB300: no full-causal
head-dim-64 bf16 timing is published there; measured on H100). step' = step + (m + p - 1) L
(delta_win + delta_full) / 2 per layer pair (1F1B: the stage's micro-batch time m + p - 1
times); a what-if, not a shipped term.

--device-csv: this project's H100 measurement (calibration/device_h100_attention.py), priced the
same way on h100-sxm-80gb (cudnn_fe, torch_* and jax_cudnn rows; the cudnn_fe rows with the sink
priced with the shipped sink term added to their backward).
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CSV = ROOT / "data" / "kernels" / "cudnn_fe_gptoss_sdpa.csv"
SYSTEMS = {"GB200": "gb200-nvl72", "GB300": "gb300-nvl72", "H200": "h200-sxm-141gb",
           "H100": "h100-sxm-80gb"}


def priced_ms(system_name, b, s, hq, hkv, d, window, which, tile=128.0):
    """diffperf's forward / backward / forward+backward milliseconds of one attention kernel:
    causal, `window` keys (0 or >= s: full causal), at the system's physics defaults."""
    import diffperf
    from diffperf import Parallel, load_model, load_system
    from diffperf.costs.compute import FLASH_BACKWARD_WORK, attention_time_s
    from diffperf.workload.flops import attention_by_kind, attention_io_bytes

    model = load_model("gpt-oss-120b").replace(
        n_heads=float(hq), n_kv_heads=float(hkv), head_dim=float(d), seq_len=float(s),
        sliding_window=float(window if window and window < s else 0.0))
    training = diffperf.training("bf16").replace(attn_tile=float(tile))
    par = Parallel(micro_batch=float(b))
    system = load_system(system_name)
    full, win, f_win = attention_by_kind(model, par, training)
    kind = win if (window and window < s) else full
    io = attention_io_bytes(model, par, training)
    f = float(attention_time_s(kind, system, training, io))
    bw = FLASH_BACKWARD_WORK * float(attention_time_s(kind, system, training, io, backward=True))
    return 1e3 * {"fwd": f, "bwd": bw, "fwd+bwd": f + bw}[which]


def ratios(path):
    """{(gpu, seq, window, pass): measured / priced} of the bf16 non-deterministic rows."""
    out = {}
    rows = [r for r in csv.DictReader(open(path)) if r["dtype"] == "bfloat16"
            and r["deterministic"] == "False" and r["backend"] == "cudnn"]
    # the oldest cuDNN of each shape: nearest the rows' 9.13-9.21
    for r in sorted(rows, key=lambda r: -int(r["cudnn_backend"])):
        b, s, hq, hkv, d, w = (int(r[k]) for k in ("batch", "seq", "q_heads", "kv_heads",
                                                     "head_dim", "window"))
        out[(r["gpu"], s, w, r["pass"])] = float(r["time_ms"]) / priced_ms(
            SYSTEMS[r["gpu"]], b, s, hq, hkv, d, w, r["pass"])
    return out


def sink_ms(b, s, hq, which, system_name="h100-sxm-80gb"):
    """The sinks' backward term diffperf now adds (costs.compute.attention_sink_backward_s),
    milliseconds, for a `which` pass that includes the backward."""
    from diffperf import load_system
    return 0.0 if which == "fwd" else 1e3 * b * hq * s * float(
        load_system(system_name).attn_sink_bwd_row_s)


def device_ratios(path, impl="cudnn_fe", sink="0"):
    """{("H100", b, s, window, pass): measured / priced} of this project's H100 run
    (calibration/device_h100_attention.py), cuDNN without the sink: the sink's own backward
    cost is now priced (attention_sink_backward_s), so the what-if adds only the kernels'
    excess beyond it."""
    out = {}
    for r in csv.DictReader(open(path)):
        if r["impl"] != impl or r["sink"] != sink or r["pass"] not in ("fwd", "bwd"):
            continue
        b, s, hq, hkv, d = (int(r[k]) for k in ("b", "s", "hq", "hkv", "d"))
        w = int(r["window_left"]) + 1 if r["window_left"] else 0
        out[("H100", b, s, w, r["pass"])] = float(r["gpu_ms"]) / priced_ms(
            "h100-sxm-80gb", b, s, hq, hkv, d, w, r["pass"])
    return out


def what_if(path, device="") -> int:
    import numpy as np
    from diffperf import load_runs
    from diffperf.api import _as_float, _normalize
    from diffperf.cli.validate_cmd import load_systems
    from diffperf.predict import FEATURES
    from diffperf.specs.batch import stack
    from diffperf.validation import _predict_rows
    from diffperf.workload.stages import pipeline_stages
    from calibration.bridge import CSV as BRIDGE, _subset

    k = ratios(path)
    kd = device_ratios(device) if device else {}
    gpu_of = {v: g for g, v in SYSTEMS.items()}
    gpus = ("GB200", "GB300") + (("H100",) if kd else ())
    runs = load_runs(BRIDGE)
    idx = [i for i, r in enumerate(runs.rows) if r["model"] == "gpt-oss-120b"
           and r["precision"] == "bf16" and gpu_of.get(runs.systems[i]) in gpus]
    runs = _subset(runs, idx)
    systems = load_systems(runs, None, None)
    a = _as_float((stack(runs.models), _normalize(stack(runs.parallels)),
                   stack([systems[s] for s in runs.systems]), stack(runs.trainings)))
    step = np.asarray(_predict_rows(*a, temperature=None, features=FEATURES).step_time_s)
    print(f"{'row':44s} {'err%':>6s} {'win_only':>8s} {'+full':>8s}   (err % if the window "
          "layers / also the full layers cost cuDNN's measured ratio; GB full: the 1024-window "
          "proxy, H100: measured)")
    for i, r in enumerate(runs.rows):
        m, par = runs.models[i], _normalize(runs.parallels[i])
        g, s, b = gpu_of[runs.systems[i]], int(m.seq_len), int(par.micro_batch)
        L = float(np.max(np.asarray(pipeline_stages(m, par).layers)))
        # 1F1B: step ~ (m + p - 1) x the stage's micro-batch time
        mb = float(par.n_microbatches) + float(par.pp) - 1.0
        if g == "H100":
            kw = {p: kd[(g, b, s, 128, p)] for p in ("fwd", "bwd")}
            kf = {p: kd[(g, b, s, 0, p)] for p in ("fwd", "bwd")}
        else:
            kw = {p: k[(g, s, 128, p)] for p in ("fwd", "bwd")}
            kf = {p: k[(g, s, 1024, p)] for p in ("fwd", "bwd")}
        d_win = sum((kw[p] - 1) * priced_ms(runs.systems[i], b, s, 64, 8, 64, 128, p)
                    for p in ("fwd", "bwd"))
        d_full = sum((kf[p] - 1) * priced_ms(runs.systems[i], b, s, 64, 8, 64, 0, p)
                     for p in ("fwd", "bwd"))
        meas = float(runs.step_time_s[i])
        s1 = step[i] + mb * L / 2 * d_win * 1e-3
        s2 = s1 + mb * L / 2 * d_full * 1e-3
        print(f"{r['id'][3:47]:44s} {100 * (meas / step[i] - 1):+6.1f} "
              f"{100 * (meas / s1 - 1):+8.1f} {100 * (meas / s2 - 1):+8.1f}")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--csv", default=str(CSV))
    p.add_argument("--device-csv", default="")
    p.add_argument("--what-if", action="store_true")
    args = p.parse_args(argv)
    if args.what_if:
        return what_if(args.csv, args.device_csv)
    print(f"{'gpu':6s} {'backend':17s} {'cuDNN':>6s} {'b':>2s} {'s':>6s} {'hq/hkv':>7s} "
          f"{'win':>5s} {'pass':7s} {'meas_ms':>8s} {'price_ms':>8s} {'meas/price':>10s}")
    for r in csv.DictReader(open(args.csv)):
        if r["dtype"] != "bfloat16" or r["deterministic"] != "False":
            continue
        b, s, hq, hkv, d, w = (int(r[k]) for k in ("batch", "seq", "q_heads", "kv_heads",
                                                     "head_dim", "window"))
        pr = priced_ms(SYSTEMS[r["gpu"]], b, s, hq, hkv, d, w, r["pass"])
        meas = float(r["time_ms"])
        print(f"{r['gpu']:6s} {r['backend']:17s} {r['cudnn_backend']:>6s} {b:2d} {s:6d} "
              f"{hq:3d}/{hkv:<3d} {w:5d} {r['pass']:7s} {meas:8.3f} {pr:8.3f} {meas / pr:10.2f}")
    if args.device_csv:
        print("\nH100 (this project's measurement)")
        for r in csv.DictReader(open(args.device_csv)):
            b, s, hq, hkv, d = (int(r[k]) for k in ("b", "s", "hq", "hkv", "d"))
            w = int(r["window_left"]) + 1 if r["window_left"] else 0
            pr = priced_ms("h100-sxm-80gb", b, s, hq, hkv, d, w, r["pass"])
            if r["sink"] == "1" and r["impl"] == "cudnn_fe":
                pr += sink_ms(b, s, hq, r["pass"])  # priced with the shipped sink term
            meas = float(r["gpu_ms"])
            print(f"{r['impl']:16s} b{b} s{s:5d} win {w:4d} sink {r['sink']} {r['pass']:7s} "
                  f"{meas:8.3f} {pr:8.3f} {meas / pr:6.2f}  {r['note']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
