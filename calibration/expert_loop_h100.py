"""What diffperf charges for one MoE layer's routed experts on the DGX-H100 Megatron-Bridge
rows, against the GPU time the same work took on one H100 (data/kernels/h100_expert_loop.csv,
h100_gemm_lowp.csv, h100_quantize.csv; data/README.md, "Measured on one NVIDIA H100: low
precision and expert loops"). The diagnostic behind docs/accuracy-bridge.md, section
"Session 14: the per-expert loop against H100 kernel measurements".

    python calibration/expert_loop_h100.py [--json out.json]

Three tables, default efficiencies of h100-sxm-80gb (split (i), no fitting):

1. The measured loop cases (E_l local experts x T tokens per expert, fc1 [2 f, h] gated and
   fc2 [h, f], forward + dgrad + wgrad: six products per expert; h100_expert_loop.csv and
   h100_expert_streams.csv). Model = what predict charges for the same work on the GPU: the
   two expert rows of `layer_ops` (count E_l, m = T) in each pass at the row's precision
   (`layer_pass_gemm_times_s`, `=gemm`) plus the fixed time of the grouped GEMMs' kernels
   (`+fixed`, 6 g kernel_s, g = max(E_l / 4, 1): `moe_expert_loop_kernels`' serial chain).
   Measured: `loop` = the six products per expert back to back on one stream (gemms_graph_s),
   `shapes` = the same products timed one shape at a time (h100_gemm_lowp.csv; FP8 forward
   with fast accumulation, dgrad / wgrad without, as TE runs them), `x4str` = round-robin over
   Transformer Engine's 4 streams / one stream (streams_s / serial, 1 without a streams case),
   `meas` = shapes x x4str, `one` = one GEMM of the same FLOPs on the same scale; `m/mdl` =
   meas / model, `m/one` = meas / one, `us/E_l` = (meas - model) per local expert; all GPU
   time from CUDA graphs. FP8 current-scaling quantize per expert slice (4 per expert and
   layer pass: fc1's and fc2's inputs, the two output gradients), us: `model` =
   `lowp_quantize_kernels` x kernel_s + bytes / (BW eta_mem) (weights left out); `TE-sl` =
   TE's kernels timed on the slice itself (h100_te_quantize_slices.csv, when shipped);
   `TE-k` = TE's four kernels at their measured times (`te_quantize_measured_s`,
   h100_quantize.csv); `loop` = (graph_s - gemms_graph_s) of the FP8 loop less that of the
   BF16 loop (their activation kernels are the same), per slice.
2. The DGX-H100 Bridge MoE rows: per MoE layer pass (forward + backward, one micro-batch) the
   model's routed-expert GPU charge (GEMMs + fixed + quantize) and the measured GPU time of
   the same shapes at the row's own tokens per expert (the per-shape sum x E_l, x the
   4-stream / serial ratio where a streams case has the same E_l, T and precision; the
   quantize as `TE-k`); d_gemm, d_q = measured - model; the row's excess (measured - predicted
   step) / (m_eff L_moe) as in `calibration/moe_layer_excess.py`; left = excess - d_gemm -
   d_q, also per extra per-expert GEMM call (6 (E_l - 1)); err_if = the tokens/s error with
   d_gemm + d_q added to every MoE layer pass (m_eff L_moe of them).
3. Per model, the tokens/s MAPE (mean signed error) of these rows as predicted, and with the
   routed experts' GPU work priced as measured (err_if of table 2).
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

KERNELS = ROOT / "data" / "kernels"
MOE = ("deepseek-v3", "gpt-oss-120b", "qwen3-235b-a22b", "qwen3-30b-a3b")
# loop case name prefix -> Bridge model
CASE_MODEL = {"qwen3-30b": "qwen3-30b-a3b", "gpt-oss": "gpt-oss-120b",
              "qwen3-235b": "qwen3-235b-a22b", "dsv3": "deepseek-v3"}


def _read(name):
    with open(KERNELS / name, newline="") as f:
        return list(csv.DictReader(f))


def _read_opt(name):
    """`_read`, or [] when the file is not shipped."""
    return _read(name) if (KERNELS / name).exists() else []


def streams_rows():
    """h100_expert_streams.csv, then the rows of h100_expert_streams_rows.csv (the same
    columns at the Bridge rows' own tokens per expert), when shipped."""
    return _read("h100_expert_streams.csv") + _read_opt("h100_expert_streams_rows.csv")


def te_slices():
    """{(E_l, T, h, f): GPU seconds per expert slice of the FP8 current-scaling quantize written
    as Transformer Engine's four kernels} (h100_te_quantize_slices.csv, when shipped)."""
    return {(int(r["local_experts"]), int(r["tokens_per_expert"]), int(r["hidden"]),
             int(r["expert_ffn"])): float(r["te_per_slice_s"])
            for r in _read_opt("h100_te_quantize_slices.csv")}


def shape_table():
    """{(label, dtype, fast_accum, m, n, k): gpu_time_s} of h100_gemm_lowp.csv."""
    out = {}
    for r in _read("h100_gemm_lowp.csv"):
        out[(r["shape"], r["dtype"], int(r["fast_accum"]), int(r["m"]), int(r["n"]),
             int(r["k"]))] = float(r["gpu_time_s"])
    return out


def measured_products_s(table, label, dtype, T, h, f):
    """GPU seconds of one expert's six products at T tokens, from the per-shape table
    (fc1 = [2f, h], fc2 = [h, f]; forward m = T; dgrad [T, out] x [out, in]; wgrad
    [out, T] x [T, in]); FP8: forward with fast accumulation, dgrad / wgrad without."""
    fa = (1, 0, 0) if dtype == "fp8" else (0, 0, 0)
    s = 0.0
    for lin, o, i in ((f"{label}.fc1", 2 * f, h), (f"{label}.fc2", h, f)):
        s += table[(lin + ".fwd", dtype, fa[0], T, o, i)]
        s += table[(lin + ".dgrad", dtype, fa[1], T, i, o)]
        s += table[(lin + ".wgrad", dtype, fa[2], o, i, T)]
    return s


def kernel_curves():
    """{kernel: (elements, GPU seconds)} of h100_quantize.csv (graph replays), sorted by size."""
    out = {}
    for r in _read("h100_quantize.csv"):
        out.setdefault(r["kernel"], []).append((int(r["rows"]) * int(r["cols"]),
                                                float(r["gpu_time_s"])))
    return {k: (np.array([p[0] for p in sorted(v)], float), np.array([p[1] for p in sorted(v)], float))
            for k, v in out.items()}


def at(curve, elements):
    """Log-log interpolation of a (elements, seconds) curve (clamped at its ends)."""
    x, y = curve
    return float(np.exp(np.interp(np.log(elements), np.log(x), np.log(y))))


def te_quantize_measured_s(elements, curves):
    """GPU seconds of one FP8 current-scaling quantize as TE launches it (zero amax, amax, scale,
    cast-transpose: `TE_CURRENT_SCALING_KERNELS`), each kernel at its measured time: the amax
    reduction and the fused cast-transpose at `elements`, the two one-thread kernels at the
    smallest measured kernel's time (a cast of 256 x 1024: the GPU's floor per kernel). The
    amax is PyTorch's reduction, not TE's one-pass kernel: an upper bound on TE's."""
    tiny = float(curves["cast"][1][0])
    return at(curves["amax"], elements) + at(curves["fused_cast_transpose"], elements) + 2 * tiny


def model_charge(model, parallel, system, training, T=None, E_l=None):
    """diffperf's GPU seconds for one MoE layer's routed experts, forward + backward, one
    micro-batch: (gemm_s, fixed_s, quant_s, quant_kernels), from the row's own specs (T, E_l
    given: the expert rows' m and count replaced by them, the case in isolation)."""
    import jax.numpy as jnp

    from diffperf.costs.compute import layer_pass_gemm_times_s, memory_time_s
    from diffperf.costs.xla import kernel_fixed_s
    from diffperf.workload.flops import (EXPERT_ROWS, TE_GEMM_STREAMS, layer_ops,
                                         lowp_quantize_bytes, lowp_quantize_kernels,
                                         moe_layer_fraction, te_quantize_rows)

    ops = layer_ops(model, parallel, training)
    phi = float(moe_layer_fraction(model))
    ex = jnp.asarray(EXPERT_ROWS)
    dense = ops.dense
    if T is not None:
        dense = dense.replace(m=jnp.where(ex > 0, float(T), dense.m),
                              count=jnp.where(ex > 0, phi * float(E_l), dense.count))
    else:
        E_l = float(jnp.maximum(model.n_experts, 1.0) / parallel.ep)
    only = dense.replace(count=dense.count * ex)
    f, d, w = layer_pass_gemm_times_s(ops.replace(dense=only), system, training, None, True)
    gemm = float(jnp.sum(f + d + w)) / phi
    g = max(E_l / TE_GEMM_STREAMS, 1.0) if float(training.moe_expert_loop) > 0 else 1.0
    fixed = 6.0 * g * float(kernel_fixed_s(system, training))
    # the quantize of the expert inputs and output gradients (`lowp_quantize_times_s` less its
    # weights' share: the loop measurement quantized its weights beforehand)
    te = te_quantize_rows(model, parallel, training, system)
    b_f, b_b, _ = lowp_quantize_bytes(only, training, te)
    kf, kb, _ = lowp_quantize_kernels(only, training, te)
    quant = (float(memory_time_s(b_f + b_b, system))
             + (float(kf) + float(kb)) * float(kernel_fixed_s(system, training)))
    return gemm, fixed, quant / phi, (float(kf) + float(kb)) / phi


def _spec_row(runs, mdl, dtype):
    """Index of a row of model `mdl` to take specs from (its precision when there is one) and
    the Training for `dtype` ('bf16' turns a quantized row's low precision off)."""
    prec = "fp8-current" if dtype == "fp8" else "bf16"
    cand = [i for i, rr in enumerate(runs.rows) if rr["model"] == mdl]
    same = [i for i in cand if runs.rows[i]["precision"] == prec]
    i = (same or cand)[0]
    training = runs.trainings[i]
    if dtype == "bf16" and runs.rows[i]["precision"] != "bf16":
        training = training.replace(lowp_fprop=0.0, lowp_dgrad=0.0, lowp_wgrad=0.0,
                                    lowp_te_quantizer=0.0)
    return i, training


def slice_sizes(T, h, f):
    """Elements of the four tensors TE quantizes per expert slice and MoE layer pass: fc1's
    input [T, h], fc2's input [T, f] (forward), fc2's and fc1's output gradients [T, h],
    [T, 2 f] (backward)."""
    return (T * h, T * f, T * h, 2 * T * f)


def _serial_mean(r):
    """One-stream time of a streams case: the mean of its two timings (they differ by up to
    14 %, data/README.md)."""
    return 0.5 * (float(r["serial_s"]) + float(r["serial_repeat_s"]))


def cases_table(runs, systems, table, curves, out):
    """Table 1: the measured cases against the model's charge for the same work. GEMM times
    are compared on one scale, the per-shape table's run (h100_gemm_lowp.csv): `meas` = the
    per-shape sum x the 4-stream / one-stream ratio of the streams run (1 without one), `one`
    = the per-shape sum x one GEMM / one stream of the run that timed it (the runs' GPUs
    differed by up to 25 % in GEMM speed: only ratios travel between runs)."""
    print("# 1. measured cases on one H100: one MoE layer's routed experts, fwd + bwd, one "
          "micro-batch (ms; GEMM times on the per-shape run's scale)")
    print(f"{'case':22s} {'dt':4s} {'E_l':>3s} {'T':>5s} | {'model':>6s} {'=gemm':>6s} "
          f"{'+fixed':>6s} | {'loop':>6s} {'shapes':>6s} {'x4str':>5s} {'meas':>6s} "
          f"{'one':>6s} | {'m/mdl':>5s} {'m/one':>5s} {'us/E_l':>6s} | q us/slice: "
          f"{'model':>5s} {'TE-sl':>5s} {'TE-k':>5s} {'loop':>5s}")
    loops = {(r["case"], r["dtype"]): r for r in _read("h100_expert_loop.csv")}
    streams = {}
    for r in streams_rows():
        streams.setdefault((r["case"], r["dtype"]), r)
    sliced = te_slices()
    keys = list(loops) + [k for k in streams if k not in loops]
    for key in keys:
        r = loops.get(key) or streams[key]
        name, dtype = key
        i, training = _spec_row(runs, CASE_MODEL[name.split()[0]], dtype)
        E_l, T = int(r["local_experts"]), int(r["tokens_per_expert"])
        h, f = int(r["hidden"]), int(r["expert_ffn"])
        gemm, fixed, quant, _ = model_charge(runs.models[i], runs.parallels[i],
                                             systems[runs.systems[i]], training, T, E_l)
        label = name.split()[0]
        shapes = E_l * measured_products_s(table, label, dtype, T, h, f)
        loop = float(loops[key]["gemms_graph_s"]) if key in loops else float("nan")
        if key in streams:
            st = streams[key]
            ratio = float(st["streams_s"]) / _serial_mean(st)
            one = shapes * float(st["one_gemm_s"]) / _serial_mean(st)
        else:  # the loop file's one GEMM (same run as the per-shape table), one stream
            ratio = 1.0
            one = shapes * float(r["one_gemm_s"]) / loop
        meas = shapes * ratio
        q_loop = q_te = q_mod = q_ts = float("nan")
        if dtype == "fp8":
            q_mod = quant / (4 * E_l)
            q_te = float(np.mean([te_quantize_measured_s(n, curves) for n in slice_sizes(T, h, f)]))
            q_ts = sliced.get((E_l, T, h, f), float("nan"))
            if key in loops and (name, "bf16") in loops:
                b = loops[(name, "bf16")]
                extra = ((float(r["graph_s"]) - loop)
                         - (float(b["graph_s"]) - float(b["gemms_graph_s"])))
                q_loop = extra / (4 * E_l)
        model = gemm + fixed
        print(f"{name:22s} {dtype:4s} {E_l:3d} {T:5d} | {1e3*model:6.3f} {1e3*gemm:6.3f} "
              f"{1e3*fixed:6.3f} | {1e3*loop:6.3f} {1e3*shapes:6.3f} {ratio:5.3f} "
              f"{1e3*meas:6.3f} {1e3*one:6.3f} | {meas/model:5.3f} {meas/one:5.3f} "
              f"{1e6*(meas-model)/E_l:6.1f} | {'':11s} {1e6*q_mod:5.1f} {1e6*q_ts:5.1f} "
              f"{1e6*q_te:5.1f} {1e6*q_loop:5.1f}")
        out["cases"].append(dict(case=name, dtype=dtype, E_l=E_l, T=T, model_s=model,
                                 model_gemm_s=gemm, model_fixed_s=fixed, loop_s=loop,
                                 shapes_s=shapes, streams_ratio=ratio, measured_s=meas,
                                 one_gemm_s=one, quant_model_s=q_mod, quant_te_slices_s=q_ts,
                                 quant_te_kernels_s=q_te, quant_loop_s=q_loop))


def rows_table(runs, systems, table, curves, out):
    """Table 2: per DGX-H100 MoE row, the routed experts' GPU time per MoE layer pass priced by
    the model and as measured, against the row's excess."""
    from diffperf.api import _as_float, _normalize
    from diffperf.predict import FEATURES
    from diffperf.specs.batch import stack
    from diffperf.validation import _predict_rows

    a = _as_float((stack(runs.models), _normalize(stack(runs.parallels)),
                   stack([systems[s] for s in runs.systems]), stack(runs.trainings)))
    step = np.asarray(_predict_rows(*a, temperature=None, features=FEATURES).step_time_s)
    streams = streams_rows()
    sliced = te_slices()
    print("\n# 2. DGX-H100 MoE rows: routed experts per MoE layer pass (fwd + bwd, one "
          "micro-batch), ms; excess = (measured - predicted step) / (m_eff L_moe)")
    print(f"{'row':46s} {'err%':>6s} {'E_l':>3s} {'T':>5s} | {'model':>6s} {'meas':>6s} "
          f"{'d_gemm':>6s} {'d_q':>6s} | {'excess':>6s} {'left':>6s} {'us/call':>7s} | "
          f"{'err_if':>6s}")
    for i, r in enumerate(runs.rows):
        model, par, training = runs.models[i], runs.parallels[i], runs.trainings[i]
        E_l = float(model.n_experts) / float(par.ep)
        from diffperf.workload.flops import layer_ops
        ops = layer_ops(model, par, training)
        T = float(np.asarray(ops.dense.m)[5])
        h, f = int(model.hidden), int(model.moe_ffn_hidden)
        fp8 = r["precision"] != "bf16"
        dtype = "fp8" if fp8 else "bf16"
        gemm, fixed, quant, _ = model_charge(model, par, systems[runs.systems[i]], training)
        label = next(k for k, v in CASE_MODEL.items() if v == r["model"])
        meas_g = E_l * measured_products_s(table, label, dtype, int(round(T)), h, f)
        # four streams: the measured streams / serial ratio of the same (E_l, T, dtype) if any
        same = [s for s in streams if s["dtype"] == dtype and int(s["local_experts"]) == E_l
                and int(s["tokens_per_expert"]) == int(round(T)) and s["case"].startswith(label)]
        ratio = float(same[0]["streams_s"]) / _serial_mean(same[0]) if same else 1.0
        meas_g *= ratio
        key = (int(round(E_l)), int(round(T)), h, f)
        if not fp8:
            meas_q = 0.0
        elif key in sliced:  # TE's four kernels timed per slice at the row's sizes
            meas_q = 4 * E_l * sliced[key]
        else:  # TE's four kernels, each at its measured time (`te_quantize_measured_s`)
            meas_q = E_l * sum(te_quantize_measured_s(n, curves) for n in slice_sizes(T, h, f))
        d_g = meas_g - (gemm + fixed)
        d_q = meas_q - quant
        pp, vp = float(par.pp), max(float(par.vp), 1.0)
        m = float(r["global_batch"]) / (float(r["micro_batch"]) * float(r["dp"]))
        m_eff = m + (pp - 1.0) / vp
        L_moe = (float(model.n_layers) - float(model.moe_dense_layers)) / pp
        excess = float(runs.step_time_s[i] - step[i]) / (m_eff * L_moe)
        left = excess - d_g - d_q
        calls = 6.0 * max(E_l - 1.0, 0.0)
        meas_step = float(runs.step_time_s[i])
        err = 100.0 * (meas_step / float(step[i]) - 1.0)  # tokens/s error: + = predicted fast
        # the what-if: the routed experts' GPU work priced as measured, every MoE layer pass
        err_if = 100.0 * (meas_step / (float(step[i]) + (d_g + d_q) * m_eff * L_moe) - 1.0)
        print(f"{r['id'][3:49]:46s} {err:+6.1f} {E_l:3.0f} {T:5.0f} | "
              f"{1e3*(gemm+fixed+quant):6.3f} {1e3*(meas_g+meas_q):6.3f} {1e3*d_g:+6.3f} "
              f"{1e3*d_q:+6.3f} | {1e3*excess:+6.3f} {1e3*left:+6.3f} "
              f"{1e6*left/calls if calls else float('nan'):7.1f} | {err_if:+6.1f}")
        out["rows"].append(dict(id=r["id"], model=r["model"], tokens_err_pct=err,
                                tokens_err_if_pct=err_if, E_l=E_l, T=T,
                                model_s=gemm + fixed + quant, model_gemm_s=gemm,
                                model_fixed_s=fixed, model_quant_s=quant,
                                measured_gemm_s=meas_g, measured_quant_s=meas_q,
                                streams_ratio=ratio, excess_s=excess, left_s=left,
                                left_per_call_s=left / calls if calls else None))
    print("\n# tokens/s MAPE (bias) of these rows per model: as predicted -> the routed experts' "
          "GPU work priced as measured")
    for mdl in sorted({x["model"] for x in out["rows"]}):
        e0 = np.array([x["tokens_err_pct"] for x in out["rows"] if x["model"] == mdl])
        e1 = np.array([x["tokens_err_if_pct"] for x in out["rows"] if x["model"] == mdl])
        print(f"  {mdl:18s} {len(e0):2d} rows: {np.mean(np.abs(e0)):5.1f} ({e0.mean():+5.1f}) -> "
              f"{np.mean(np.abs(e1)):5.1f} ({e1.mean():+5.1f})")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json")
    args = p.parse_args(argv)
    from diffperf import load_runs
    from calibration.bridge import CSV, _subset
    from diffperf.cli.validate_cmd import load_systems

    runs = load_runs(CSV)
    idx = [i for i, r in enumerate(runs.rows)
           if r["model"] in MOE and r["system"].startswith("h100")]
    runs = _subset(runs, idx)
    systems = load_systems(runs, None, None)
    table, curves = shape_table(), kernel_curves()
    out = {"cases": [], "rows": []}
    cases_table(runs, systems, table, curves, out)
    rows_table(runs, systems, table, curves, out)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
