"""Measure the held-out error of the shipped efficiency sets and write configs/efficiency/GPU.yaml
(docs/trust.md). Run from the repository root with shared/ beside it:

    python calibration/trust_sets.py [--write] [--skip-inside]

Regimes (each an envelope and the error of the set's predictions on runs it never saw):
  a100 / inside   vTrain rows held out of the fit of calibration/fitted/vtrain-a100.yaml
                  (the same seed-0 80/20 split as calibration/reproduce.sh), with its facts
  h100 / inside   5-fold cross-validation on shared/data/h100_single_gpu.csv (refitted per
                  fold as reproduce.sh does; the shipped overlay is the all-rows fit)
  */ fsdp-published  data/published_fsdp.csv rows of that GPU (never fitted)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DATA = ROOT / "data"  # the shipped copies (data/README.md)

from diffperf import load_runs, load_system  # noqa: E402
from diffperf.intervals import conformal_quantile  # noqa: E402
from diffperf.validation import predict_runs  # noqa: E402

VTRAIN_FACTS = ["dp_overlap=0", "dropout=1", "flash_attention=0", "fused_softmax_max_seq=2048"]
PUBLISHED = ROOT / "data" / "published_fsdp.csv"
PUBLISHED_FP8 = ROOT / "data" / "published_fsdp_fp8.csv"  # reported, not a regime


def stats(log_r, ids, note) -> dict:
    """Regime statistics of log(measured / predicted) residuals."""
    r = np.asarray(log_r, float)
    ape = np.abs(np.expm1(-r))  # |predicted / measured - 1|
    return dict(n=int(len(r)), runs=note, mape_pct=round(float(100 * ape.mean()), 3),
                median_signed_pct=round(float(100 * np.median(np.expm1(-r))), 3),
                q95_log=round(conformal_quantile(np.abs(r), 0.95), 4), ids=list(ids))


def residuals(runs, systems):
    step, _, _ = predict_runs(runs, systems)
    return np.log(runs.step_time_s) - np.log(step), step


def systems_for(runs, overlay):
    return {n: load_system(n, overlay) for n in sorted(set(runs.systems))}


def a100_inside():
    runs = load_runs(DATA / "vtrain_a100.csv", None, VTRAIN_FACTS)
    cand = np.isfinite(runs.step_time_s) | ~runs.ran
    rng = np.random.default_rng(0)
    idx = np.flatnonzero(cand)
    fit = np.zeros_like(cand)
    fit[idx[rng.random(len(idx)) >= 0.2]] = True
    held = np.flatnonzero(~fit & np.isfinite(runs.step_time_s))
    sub = subset(runs, held)
    r, _ = residuals(sub, systems_for(sub, ROOT / "calibration/fitted/vtrain-a100.yaml"))
    return stats(r, [], "vTrain rows held out of the vtrain-a100 fit (seed 0, 20 %)")


def h100_inside(steps=200):
    from diffperf import calibrate as cal
    from diffperf.cli.calibrate_cmd import benches

    runs = load_runs(DATA / "h100_single_gpu.csv", "amp-bf16", None)
    systems = systems_for(runs, None)
    K = DATA / "kernels"
    terms = benches([K / "h100_gemm.csv", K / "h100_attention.csv", K / "h100_memory_bw.csv"],
                    next(iter(systems.values())))
    cand = np.isfinite(runs.step_time_s) | ~runs.ran
    rng = np.random.default_rng(0)
    idx = np.flatnonzero(cand)
    fold = rng.permutation(len(idx)) % 5
    pred = np.full(len(runs), np.nan)
    for k in range(5):
        fit = np.zeros_like(cand)
        fit[idx[fold != k]] = True
        c = cal.calibrate_runs(runs, systems, fit, benches=terms, steps=steps)
        pred[~fit] = c.step_time_s[~fit]
    ok = np.isfinite(pred) & np.isfinite(runs.step_time_s)
    r = np.log(runs.step_time_s[ok]) - np.log(pred[ok])
    return stats(r, [], "h100_single_gpu.csv, 5-fold cross-validation (PyTorch eager, 1 GPU)")


def subset(runs, idx):
    from diffperf.load import Runs

    pick = lambda xs: [xs[i] for i in idx]  # noqa: E731
    return Runs(pick(runs.ids), pick(runs.rows), pick(runs.models), pick(runs.parallels),
                pick(runs.trainings), pick(runs.systems), runs.step_time_s[idx],
                runs.peak_memory_GB[idx], runs.ran[idx])


def published(overlay_by_gpu):
    """{gpu: (log residuals, ids, predicted)} of the published FSDP runs, each GPU's rows
    predicted with that GPU's set (None: physics defaults)."""
    runs = load_runs(PUBLISHED)
    out = {}
    for gpu, overlay in overlay_by_gpu.items():
        idx = [i for i, s in enumerate(runs.systems) if load_system(s).gpu == gpu]
        sub = subset(runs, idx)
        r, step = residuals(sub, systems_for(sub, overlay))
        out[gpu] = (r, sub.ids, step, sub)
    return out


PARTS = (("compute_s", "compute"), ("recompute_s", "recomp"), ("tp_exposed_s", "tp"),
         ("dp_exposed_s", "dp_exp"), ("dp_hidden_s", "dp_hid"), ("overlap_slowdown_s", "slow"),
         ("overhead_s", "host"), ("optimizer_s", "optim"))


def breakdown(sets):
    """Per published run (bf16 and Float8 files): measured and predicted step, error and the
    predicted breakdown in seconds (compute includes the memory-bound element-wise work)."""
    from diffperf import predict

    for path in (PUBLISHED, PUBLISHED_FP8):
        runs = load_runs(path)
        print(f"{path.name}: id, measured s, predicted s, error %, "
              + ", ".join(short for _, short in PARTS))
        for i, rid in enumerate(runs.ids):
            base = load_system(runs.systems[i])
            system = load_system(runs.systems[i], sets.get(base.gpu))
            r = predict(runs.models[i], runs.parallels[i], system, runs.trainings[i])
            t, m = float(r.step_time_s), float(runs.step_time_s[i])
            parts = " ".join(f"{float(getattr(r.breakdown, k)):7.3f}" for k, _ in PARTS)
            print(f"  {rid:30s} {m:8.3f} {t:8.3f} {100 * (t / m - 1):+6.1f} {parts}")


def megatron_sc21(overlay):
    """Megatron-LM SC21 Table 1 (docs/published_megatron.py, interleaved reading): log
    residuals log(T_measured / T_predicted) = log(X_predicted / X_published)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("published_megatron",
                                                  ROOT / "docs" / "published_megatron.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    rows = mod.rows(str(overlay), True)
    r = np.log([x["predicted_tflops"] / x["published_tflops"] for x in rows])
    return r, [x["model"] for x in rows], rows


def span(values):
    v = [float(x) for x in values]
    return [min(v), max(v)]


def envelope_of(runs, gpu, precisions) -> dict:
    """The range the runs span (diffperf.trust.envelope_distance's dimensions). A recompute
    mode is in it only where a run measured it as a layout names it (trust.RECOMPUTE:
    Megatron's selective, full of every layer): not TorchTitan's op SAC
    (recompute_policy > 0), a fraction of the layers (recompute_layer_frac < 1), or a row
    whose fields do not map exactly (`fields_exact` 0 in the published CSVs)."""
    P = runs.parallels
    get = lambda k: [float(getattr(p, k)) for p in P]  # noqa: E731
    n = [float(p.tp * p.pp * p.dp * p.cp) for p in P]
    plain = [p for p, row in zip(P, runs.rows)
             if float(getattr(p, "recompute_policy", 0)) == 0
             and float(getattr(p, "recompute_layer_frac", 1)) == 1
             and str(row.get("fields_exact", "1")).strip() != "0"]
    rec = sorted({("none", "selective", "full")[int(p.recompute)] for p in plain})
    return dict(gpu=[gpu], precision=precisions, tp=span(get("tp")), pp=span(get("pp")),
                dp=span(get("dp")), cp=span(get("cp")), ep=span(get("ep")), gpus=span(n),
                micro_batch=span(get("micro_batch")),
                zero_stage=sorted({int(p.zero_stage) for p in P}), recompute=rec)


def regime(name, r, note, envelope, framework, ids=(), measured=None):
    """A regime record; `measured`: the stats when they come from elsewhere (the fit's)."""
    out = dict(name=name) | (measured if measured is not None else stats(r, ids, note))
    out["validated"] = bool(name == "fit" or out["mape_pct"] <= 10.0)
    out["envelope"] = envelope
    out["framework"] = framework
    out.pop("ids")
    return out


def coverage(regimes_r: dict, q_fit: dict, validated: dict) -> tuple:
    """Leave-one-out 95 % interval coverage of the held-out published runs: a run of a
    validated regime gets that regime's q computed without it; a run outside the envelope
    gets max(q_fit, the q of its own regime without it): its nearest extrapolation regime
    (diffperf.trust.trust)."""
    hit, n = 0, 0
    for key, r in regimes_r.items():
        r = np.asarray(r)
        for i in range(len(r)):
            rest = np.abs(np.delete(r, i))
            q = conformal_quantile(rest, 0.95)
            q = q if validated[key] else max(q_fit[key[0]], q)
            hit += abs(r[i]) <= q
            n += 1
    return hit, n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--write", action="store_true", help="write configs/efficiency/*.yaml")
    ap.add_argument("--skip-inside", action="store_true")
    ap.add_argument("--breakdown", action="store_true",
                    help="print each published run's step-time breakdown (shipped sets)")
    ap.add_argument("--fit-regimes", help="JSON {a100: stats, h100: stats} of an earlier run "
                    "(the fits' held-out rows do not depend on the published runs)")
    args = ap.parse_args()
    sets = {"a100": ROOT / "calibration/fitted/vtrain-a100.yaml",
            "h100": ROOT / "calibration/fitted/torch-h100.yaml"}
    for label, overlays in (("physics defaults", {g: None for g in sets}),
                            ("shipped sets", sets)):
        pub = published(overlays)
        for gpu, (r, ids, step, sub) in pub.items():
            s = stats(r, ids, "")
            print(f"{label:17s} {gpu}: n {s['n']} MAPE {s['mape_pct']:.1f} % median signed "
                  f"{s['median_signed_pct']:+.1f} % q95_log {s['q95_log']:.3f}")
            for i, rid in enumerate(ids):
                print(f"    {rid:30s} meas {sub.step_time_s[i]:8.3f} pred {step[i]:8.3f} "
                      f"{100 * (step[i] / sub.step_time_s[i] - 1):+6.1f} %")
    if args.breakdown:
        breakdown(sets)
    if args.skip_inside:
        return
    r_sc21, ids_sc21, _ = megatron_sc21(sets["a100"])
    s = stats(r_sc21, ids_sc21, "")
    print(f"Megatron SC21 Table 1 (a100 set): MAPE {s['mape_pct']:.2f} % q95 {s['q95_log']}")
    if args.fit_regimes:
        import json

        cached = json.loads(Path(args.fit_regimes).read_text())
        fit_a, fit_h = cached["a100"], cached["h100"]
    else:
        fit_a, fit_h = a100_inside(), h100_inside()
    print("a100 fit regime:", fit_a)
    print("h100 fit regime:", fit_h)
    pub_runs = load_runs(PUBLISHED)
    by_gpu = {g: subset(pub_runs, [i for i, s in enumerate(pub_runs.systems)
                                   if load_system(s).gpu == g]) for g in sets}
    vt = load_runs(DATA / "vtrain_a100.csv", None, VTRAIN_FACTS)
    h1 = load_runs(DATA / "h100_single_gpu.csv", "amp-bf16", None)
    FSDP = ("PyTorch FSDP: TorchTitan FSDP2 (bf16 all-gather, fp32 reduce-scatter) and "
            "fms-fsdp FSDP1 (bf16), flash attention (FlashAttention-2 where the run's "
            "source says so: attention_fa2), no vocabulary padding; activation "
            "checkpointing as each run states it (TorchTitan per-op SAC, fms-fsdp's fraction "
            "of blocks: recompute_policy, recompute_layer_frac); eager or compiled "
            "element-wise kernels (norm_extra_bytes, llama_eager_pointwise); "
            "data/published_fsdp.md")
    env_sc21 = dict(gpu=["a100"], precision=["fp16", "bf16"], tp=[1, 8], pp=[1, 64],
                    dp=[6, 32], cp=[1, 1], ep=[1, 1], gpus=[32, 3072], micro_batch=[1, 16],
                    zero_stage=[0], recompute=["full"])
    pa = published(sets)
    regimes = {
        "a100": [
            regime("fit", None, None, envelope_of(vt, "a100", ["fp16", "bf16"]),
                   "Megatron-DeepSpeed (2023): unfused attention with the fused softmax up to "
                   "2048 keys, DP all-reduce after the backward, dropout 0.1 "
                   "(calibration/reproduce.sh)",
                   measured=dict(fit_a)),
            regime("megatron-sc21", r_sc21, "Megatron-LM SC21 Table 1, 10 rows, 32-3072 A100 "
                   "(docs/published_megatron.py, interleaved reading; the micro-batch and vp "
                   "are not published: the fastest predicted that fits)", env_sc21,
                   "Megatron-LM (2021), the same facts as the fit"),
            regime("fsdp-published", pa["a100"][0], "data/published_fsdp.csv, "
                   "A100 rows", envelope_of(by_gpu["a100"], "a100", ["bf16"]), FSDP),
        ],
        "h100": [
            regime("fit", None, None, envelope_of(h1, "h100", ["amp-bf16", "bf16"]),
                   "PyTorch 2.11 eager, one GPU, fp32 weights under bf16 autocast, SDPA flash "
                   "attention (shared/data/README.md)", measured=dict(fit_h)),
            regime("fsdp-published", pa["h100"][0], "data/published_fsdp.csv, "
                   "H100 rows", envelope_of(by_gpu["h100"], "h100", ["bf16"]), FSDP),
        ]}
    for gpu, regs in regimes.items():
        for r in regs:
            print(gpu, r["name"], "n", r["n"], "MAPE", r["mape_pct"], "q95", r["q95_log"],
                  "validated", r["validated"])
    regimes_r = {("a100", "sc21"): r_sc21, ("a100", "fsdp"): pa["a100"][0],
                 ("h100", "fsdp"): pa["h100"][0]}
    validated = {("a100", "sc21"): regimes["a100"][1]["validated"],
                 ("a100", "fsdp"): regimes["a100"][2]["validated"],
                 ("h100", "fsdp"): regimes["h100"][1]["validated"]}
    hit, n = coverage(regimes_r, {"a100": fit_a["q95_log"], "h100": fit_h["q95_log"]},
                      validated)
    print(f"95 % interval coverage of held-out published runs (leave-one-out): {hit}/{n} = "
          f"{100 * hit / n:.1f} %")
    if not args.write:
        return
    for gpu, regs in regimes.items():
        overlay = yaml.safe_load(sets[gpu].read_text())
        doc = dict(name=f"{gpu}-default", gpu=gpu,
                   description=(f"shipped default efficiency set for {gpu.upper()} systems "
                                f"(docs/trust.md): the efficiencies of "
                                f"{sets[gpu].relative_to(ROOT)}, with the regimes they were "
                                f"checked on"),
                   created_by="python calibration/trust_sets.py --write",
                   overlay=str(sets[gpu].relative_to(ROOT)),
                   efficiency=overlay["efficiency"], regimes=regs,
                   interval_coverage_published=dict(covered=int(hit), runs=int(n)))
        out = ROOT / "configs" / "efficiency" / f"{gpu}.yaml"
        out.parent.mkdir(exist_ok=True)
        out.write_text(yaml.safe_dump(doc, sort_keys=False))
        print("wrote", out)


if __name__ == "__main__":
    main()
