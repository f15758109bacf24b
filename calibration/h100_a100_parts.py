"""Which component of the step does the model get wrong on H100 (issue 21)? The published FSDP
runs of data/published_fsdp.csv, predicted with each GPU's shipped set, split by component,
and for each row the factor on ONE component alone that would close the row's gap
(docs/accuracy-hopper.md, "Session 11: what is common to the H100 rows").

    python calibration/h100_a100_parts.py

Components are read off the prediction's own sensitivities (jax.grad of the step in log
coordinates, so each is in seconds of the step):
    gemm  = -dT/dln mm_max          (dense GEMMs and the logits GEMM: t ~ 1 / mm_max)
    attn  = -dT/dln eta_attn        (attn_max and, on FA2 rows, attn_fa2_fwd/bwd_frac together)
    mem   = -dT/dln mem_eff         (memory-bound element-wise work, optimizer, copies)
    comm  = -dT/dln coll_eff        (intra and inter tier together: exposed collectives and,
                                     through the hidden seconds, the overlap slowdown)
    slow  = dT/dln overlap_slowdown (= sigma x hidden seconds)
and for the gap g = measured - predicted:
    gemm x = 1 + g / gemm,  attn x = 1 + g / attn,  mem x = 1 + g / mem,
    sigma  = (slow + g) / hidden    (the overlap slowdown that alone would close it)
A component whose factor is the same on every row of a GPU is a candidate for that GPU's
common gap; one whose factor scatters is not. Nothing here is fitted or written.
"""

from __future__ import annotations

import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from diffperf import load_runs, load_system, predict  # noqa: E402

PUBLISHED = ROOT / "data" / "published_fsdp.csv"
SETS = {"a100": ROOT / "configs/efficiency/a100.yaml", "h100": ROOT / "configs/efficiency/h100.yaml"}
# Same model, same code base, both GPUs (fms-fsdp README @5a296af: 128 A100 / 96 H100, 2
# sequences of 4096 per GPU; TorchTitan 8B: different local batch and dates, see the docs).
PAIRS = (("fms-a100-l2-7b-hsdp", "fms-h100-l2-7b-hsdp"), ("fms-a100-l2-13b", "fms-h100-l2-13b"),
         ("fms-a100-l2-34b", "fms-h100-l2-34b"), ("fms-a100-l2-70b", "fms-h100-l2-70b"))


def parts(model, parallel, system, training):
    """(step, gemm, attn, mem, comm, slow, hidden) seconds (module docstring)."""
    def step(logs):
        e = system.eff
        e = e.replace(mm_max=e.mm_max * jnp.exp(logs[0]), attn_max=e.attn_max * jnp.exp(logs[1]),
                      mem_eff=e.mem_eff * jnp.exp(logs[2]),
                      coll_eff_intra=e.coll_eff_intra * jnp.exp(logs[3]),
                      coll_eff_inter=e.coll_eff_inter * jnp.exp(logs[3]),
                      overlap_slowdown=e.overlap_slowdown * jnp.exp(logs[4]))
        s = system.replace(eff=e, attn_fa2_fwd_frac=system.attn_fa2_fwd_frac * jnp.exp(logs[1]),
                           attn_fa2_bwd_frac=system.attn_fa2_bwd_frac * jnp.exp(logs[1]))
        return predict(model, parallel, s, training).step_time_s
    x = jnp.zeros(5)
    g = np.asarray(jax.grad(step)(x), float)
    b = predict(model, parallel, system, training).breakdown
    hidden = float(b.dp_hidden_s + b.tp_hidden_s + b.cp_hidden_s)
    return (float(step(x)), -g[0], -g[1], -g[2], -g[3], g[4], hidden)


def main():
    runs = load_runs(PUBLISHED)
    rows = {}
    print(f"{'run':28s} {'meas':>7s} {'pred':>7s} {'err %':>6s} {'gemm':>7s} {'attn':>7s} "
          f"{'mem':>7s} {'comm':>7s} {'slow':>7s} {'hidden':>7s} | {'gemm x':>6s} {'attn x':>6s} "
          f"{'mem x':>6s} {'sigma':>6s}")
    for i, rid in enumerate(runs.ids):
        gpu = load_system(runs.systems[i]).gpu
        system = load_system(runs.systems[i], SETS.get(gpu))
        T, gemm, attn, mem, comm, slow, hid = parts(runs.models[i], runs.parallels[i], system,
                                                    runs.trainings[i])
        meas = float(runs.step_time_s[i])
        gap = meas - T
        sigma = (slow + gap) / hid if hid > 0 else float("nan")
        rows[rid] = (meas, T, gemm, attn, mem, comm, slow, hid)
        print(f"{rid:28s} {meas:7.3f} {T:7.3f} {100 * (T / meas - 1):+6.1f} {gemm:7.3f} "
              f"{attn:7.3f} {mem:7.3f} {comm:7.3f} {slow:7.3f} {hid:7.3f} | {1 + gap / gemm:6.3f} "
              f"{1 + gap / attn:6.3f} {1 + gap / mem:6.3f} {sigma:6.3f}")
    print("\nfms-fsdp, same code base: A100 / H100 step ratio, measured and predicted, and the "
          "predicted ratio of each component")
    print(f"{'model':18s} {'measured':>8s} {'predicted':>9s} {'gemm':>6s} {'attn':>6s} {'mem':>6s} "
          f"{'slow':>6s} {'hidden':>6s}")
    for a, h in PAIRS:
        A, H = rows[a], rows[h]
        r = lambda k: A[k] / H[k]  # noqa: E731
        print(f"{a[9:]:18s} {A[0] / H[0]:8.3f} {A[1] / H[1]:9.3f} {r(2):6.3f} {r(3):6.3f} "
              f"{r(4):6.3f} {r(6):6.3f} {r(7):6.3f}")


if __name__ == "__main__":
    main()
