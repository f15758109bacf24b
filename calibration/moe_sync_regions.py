"""The host syncs inside one MoE layer, priced as regions: how much of the Bridge MoE rows'
excess could the host's per-expert launches explain when the host cannot run ahead across a
sync? (docs/accuracy-bridge.md, section "Session 15: host syncs inside the MoE layer (branch
`hostsync`)"; a diagnostic, no diffperf term.)

    python calibration/moe_sync_regions.py [--model qwen3-30b-a3b,...] [--tau-gemm-us 5,10,28.3]
                                           [--tau-kernel-us 5]

The sources (Megatron-Core core_v0.14.0-v0.17.0, DeepEP hybrid-ep, PyTorch's copy) give, per
MoE layer, ONE blocking host sync in the forward before the token dispatch for every dropless
dispatcher the rows ran (alltoall: `d2h_event.synchronize()` at "before_ep_alltoall"; DeepEP:
the CPU waits for the notify counts; HybridEP: `cudaStreamSynchronize` before the dispatch
kernel), none for the alltoall dispatcher's drop-and-pad path, none in the backward; GPT-OSS's
quick-GEGLU adds one between fc1 and fc2 (`torch.tensor(linear_offset, device=...)`, a pageable
copy = `memcpy_and_sync`) and one more in the backward where `moe_act` is recomputed.

After a sync the GPU queue is empty: the kernels run as the host issues them. The host reaches
the expert loop after the dispatch's launches, and the GPU has only the work queued since the
sync to hide the loop's host time behind. With kernels k_i issued at host times H_i and GPU
times g_i, the region ends at max_i (H_i + sum_{j >= i} g_j); when the host is fast again after
the loop (the combine, the next attention), the layer's forward takes, beyond its GPU time,

    extra_f = max(0, H_x - G_d - G_x)            per MoE layer forward, one micro-batch
        H_x = 2 E_l tau_g + n_q tau_k + n_o tau_k    host: fc1 and fc2 per-expert GEMM calls, the
                                                  per-slice quantize launches of their inputs
                                                  (lowp_quantize_kernels' expert rows) and the
                                                  others (dispatch, permute, activation, pads)
        G_d = one dispatch all-to-all (predict._ep_parts' price, the full message)
        G_x = the routed experts' forward GEMMs + quantize (diffperf's own terms)
GPT-OSS, two regions in the forward (the activation's sync between them) and, with moe_act
recomputed, one in the backward (the experts' dgrad + wgrad, 4 E_l GEMM calls, against their
GPU time):
    extra_f = max(0, E_l tau_g + .. - G_d - G_fc1) + max(0, E_l tau_g + .. - G_act - G_fc2)
    extra_b = max(0, 4 E_l tau_g + .. - G_xb)
diffperf's layer already takes one max(GPU, host) per layer pass; the host there is the whole
layer's launches (far below its GPU time on every row), so the regions add extra_f (+ extra_b).
The excess to compare with is moe_layer_excess.py's: (measured - predicted step) / (m_eff L_moe).
Not modelled here: the merged EP schedule's interleaving (ep_overlap rows: another
micro-batch's chunk may be queued before the sync, which hides more), the sync's own round
trip (~10-20 us), and the activation's elementwise GPU time (small; left out: extra is an
upper bound on that account).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MOE = ("deepseek-v3", "gpt-oss-120b", "qwen3-235b-a22b", "qwen3-30b-a3b")
GRACE = ("gb200-nvl72", "gb300-nvl72")
# launches besides the expert GEMMs and quantizes between the sync and fc2's end: the dispatch
# (HybridEP dispatch + permute; alltoall: the tokens' and probs' all-to-alls, the chunk sort),
# the fused activation, Fp8Padding / Unpadding (counted once each, a lower bound)
OTHER_LAUNCHES = 3.0


def _expert_parts(model, parallel, system, training):
    """(fc1 fwd, fc2 fwd, bwd GEMMs, fwd quant s, bwd quant s, fwd quant kernels, bwd quant
    kernels): diffperf's charge for one MoE layer's routed experts, one micro-batch, per MoE
    layer (the mean layer's rows divided by phi)."""
    import jax.numpy as jnp

    from diffperf.costs.compute import layer_pass_gemm_times_s, memory_time_s
    from diffperf.costs.xla import kernel_fixed_s
    from diffperf.workload.flops import (EXPERT_ROWS, layer_ops, lowp_quantize_bytes,
                                         lowp_quantize_kernels, moe_layer_fraction,
                                         te_quantize_rows)

    ops = layer_ops(model, parallel, training)
    phi = float(moe_layer_fraction(model))
    ex = jnp.asarray(EXPERT_ROWS)
    only = ops.dense.replace(count=ops.dense.count * ex)
    f, d, w = layer_pass_gemm_times_s(ops.replace(dense=only), system, training, None, True)
    f = np.asarray(f) / phi
    te = te_quantize_rows(model, parallel, training, system)
    b_f, b_b, _ = lowp_quantize_bytes(only, training, te)
    kf, kb, _ = lowp_quantize_kernels(only, training, te)
    ks = float(kernel_fixed_s(system, training))
    q_f = (float(memory_time_s(b_f, system)) + float(kf) * ks) / phi
    q_b = (float(memory_time_s(b_b, system)) + float(kb) * ks) / phi
    return (float(f[5]), float(f[6]), float(jnp.sum(d + w)) / phi, q_f, q_b,
            float(kf) / phi, float(kb) / phi)


def _dispatch_s(model, parallel, system, training):
    """One token all-to-all of the layer as predict._ep_parts prices it (the full message)."""
    from diffperf.costs.collectives import all_to_all_s, hierarchical_all_to_all_s
    from diffperf.predict import _placed
    from diffperf.workload.ep import ep_a2a_bytes, ep_stride
    from diffperf.workload.groups import stride

    S = ep_a2a_bytes(model, parallel, training)
    s_ep = ep_stride(parallel, stride(_placed(parallel), "ep"))
    if float(parallel.ep_dispatch) > 0:
        return float(hierarchical_all_to_all_s(S, parallel.ep, s_ep, model.moe_topk,
                                               model.n_experts, system))
    return float(all_to_all_s(S, parallel.ep, s_ep, system))


def region_extra_s(E_l, tau_g, tau_k, parts, g_d, gptoss, recompute_act, sync):
    """(extra forward, extra backward) seconds per MoE layer and micro-batch (docstring)."""
    fc1, fc2, g_b, q_f, q_b, k_f, k_b = parts
    if not sync:
        return 0.0, 0.0
    if not gptoss:
        h = 2.0 * E_l * tau_g + (k_f + OTHER_LAUNCHES) * tau_k
        return max(0.0, h - g_d - fc1 - fc2 - q_f), 0.0
    h1 = E_l * tau_g + (0.5 * k_f + 1.0) * tau_k
    h2 = E_l * tau_g + (0.5 * k_f + 2.0) * tau_k
    ef = max(0.0, h1 - g_d - fc1 - 0.5 * q_f) + max(0.0, h2 - fc2 - 0.5 * q_f)
    eb = 0.0
    if recompute_act:
        eb = max(0.0, 4.0 * E_l * tau_g + (k_b + 2.0) * tau_k - g_b - q_b)
    return ef, eb


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=",".join(MOE))
    p.add_argument("--tau-gemm-us", default="5,10,28.3",
                   help="host seconds per per-expert GEMM call (us), comma-separated")
    p.add_argument("--tau-kernel-us", type=float, default=5.0,
                   help="host seconds per other launch (us; 5: Efficiency.host_kernel_s's "
                        "default when this study was run, session 15; the default is 12.90 "
                        "since session 16, specs.system.eager_launch_host_s)")
    args = p.parse_args(argv)
    from calibration.moe_layer_excess import layer_passes, predicted_rows

    taus = [float(x) * 1e-6 for x in args.tau_gemm_us.split(",")]
    tau_k = args.tau_kernel_us * 1e-6
    want = set(args.model.split(","))
    runs, systems, step = predicted_rows(want)
    out = []
    for i, r in enumerate(runs.rows):
        model, par, tr = runs.models[i], runs.parallels[i], runs.trainings[i]
        system = systems[runs.systems[i]]
        m_eff, L_moe, E_l = layer_passes(model, par, r)
        loop = "moe_expert_loop=1" in r["set"]
        # dropless: every dispatcher syncs once per MoE layer forward; drop-and-pad alltoall
        # does not (MoEAlltoAllTokenDispatcher._maybe_dtoh_and_synchronize: `if not
        # self.drop_and_pad`); 26.06+ full-iteration graphs: no sync (not a loop row either)
        sync = (loop and r["moe_token_drop"] != "1"
                and r["container"] in ("25.09", "25.11", "26.02", "26.02.01", "26.04", "26.04.01"))
        parts = _expert_parts(model, par, system, tr)
        g_d = _dispatch_s(model, par, system, tr) if float(par.ep) > 1 else 0.0
        gptoss = r["model"] == "gpt-oss-120b"
        rec = "recompute_moe_act=1" in r["set"]
        excess = float(runs.step_time_s[i] - step[i]) / (m_eff * L_moe)
        extras = [region_extra_s(E_l, t, tau_k, parts, g_d, gptoss, rec, sync) for t in taus]
        add = [(ef + eb) * m_eff * L_moe for ef, eb in extras]
        # the per-call host time that would make the forward region carry the whole excess
        # (non-GPT-OSS form: 2 E_l tau = G_d + G_x + excess - the other launches)
        need = ((g_d + parts[0] + parts[1] + parts[3] + excess
                 - (parts[5] + OTHER_LAUNCHES) * tau_k) / (2.0 * E_l)
                if sync and not gptoss and excess > 0 else float("nan"))
        out.append(dict(id=r["id"][3:], model=r["model"], system=r["system"], E_l=E_l,
                        need=need,
                        loop=loop, sync=sync, excess=excess, g_d=g_d,
                        g_x=parts[0] + parts[1] + parts[3], extras=extras,
                        err=100.0 * (runs.step_time_s[i] / step[i] - 1.0),
                        err_if=[100.0 * (runs.step_time_s[i] / (step[i] + x) - 1.0)
                                for x in add]))
    head = "  ".join(f"x@{t * 1e6:g}us" for t in taus)
    print(f"{'row':52s} {'E_l':>3s} {'sync':>4s} {'G_d':>6s} {'G_x':>6s} {'excess':>7s} "
          f"{'tau_need':>8s}  {head}"
          "   (ms per MoE layer pass and micro-batch; x = region extra, fwd + bwd;"
          " tau_need: us per GEMM call for the excess)")
    for x in sorted(out, key=lambda x: (x["model"], x["id"])):
        ex = "  ".join(f"{1e3 * (ef + eb):8.3f}" for ef, eb in x["extras"])
        print(f"{x['id']:52s} {x['E_l']:3.0f} {'y' if x['sync'] else '-':>4s} "
              f"{1e3 * x['g_d']:6.3f} {1e3 * x['g_x']:6.3f} {1e3 * x['excess']:7.3f} "
              f"{1e6 * x['need']:8.1f}  {ex}")
    print("\n# tokens/s MAPE (bias) per model: as predicted -> + region extra at each tau_g")
    for mdl in sorted(want):
        sel = [x for x in out if x["model"] == mdl]
        if not sel:
            continue
        e0 = np.array([x["err"] for x in sel])
        line = f"  {mdl:18s} {len(sel):3d} rows: {np.mean(np.abs(e0)):5.1f} ({e0.mean():+5.1f})"
        for k, t in enumerate(taus):
            e1 = np.array([x["err_if"][k] for x in sel])
            line += f" | {t * 1e6:g} us: {np.mean(np.abs(e1)):5.1f} ({e1.mean():+5.1f})"
        print(line)
    for k, t in enumerate(taus):
        moved = [x for x in out if x["extras"][k][0] + x["extras"][k][1] > 0]
        print(f"# tau_g {t * 1e6:g} us: {len(moved)} of {len(out)} rows get a region extra")
    return 0


if __name__ == "__main__":
    sys.exit(main())
