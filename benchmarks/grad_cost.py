"""Cost of d(step time)/d(every System leaf) relative to one prediction, both jitted.

    python benchmarks/grad_cost.py [--model gpt3-175b] [--system a100-sxm-80gb] [--batch 16384]

Three pairs, each timed after compilation (best of --repeat, block_until_ready), with the
compile time of each function printed apart:
  * single: one layout (the `predict` default: GPT-3 175B, tp 8, pp 8, dp 16 on 1024 GPUs);
    step time vs jax.grad of it w.r.t. the whole System pytree (reverse mode, all leaves);
  * batched, per layout: vmap(step time) vs vmap(grad) over --batch layouts of the search
    table: one gradient (all System leaves) per layout;
  * batched, summed: grad of the sum of the step times (one reverse pass for the batch).
Target (DESIGN.md): the gradient costs at most 3x one prediction.
"""

from __future__ import annotations

import argparse
import os
import sys
import time


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="gpt3-175b")
    p.add_argument("--system", default="a100-sxm-80gb")
    p.add_argument("--batch", type=int, default=1 << 14)
    p.add_argument("--repeat", type=int, default=20)
    args = p.parse_args()
    sys.path.insert(0, os.path.dirname(__file__))
    import jax
    import jax.numpy as jnp
    import numpy as np

    from _common import batched_parallel, best_of, machine
    from diffperf import Parallel, load_model, load_system
    from diffperf.api import _as_float
    from diffperf.predict import features_of, predict_step
    from diffperf.specs.batch import anonymous
    from diffperf.specs.training import Training

    S = __import__("diffperf.search", fromlist=["COLUMNS"])
    print(machine())
    model0, system0 = load_model(args.model), load_system(args.system)
    m, s, t = _as_float((anonymous(model0), anonymous(system0), anonymous(Training())))
    n_leaves = len(jax.tree.leaves(s))
    one = _as_float(Parallel(tp=8, pp=8, dp=16, micro_batch=1, global_batch=1536,
                             sequence_parallel=1, zero_stage=1, recompute=1))
    table = S.enumerate_layouts(model0, 1024, 1536)
    rows = table[table[:, -1] == 0][:args.batch]
    batch = _as_float(batched_parallel(S.COLUMNS[:-1], rows))

    # The terms that are 0 for every layout here (no MoE, CP or AxoNN grid) are left out of the
    # program, as the library's own callers do (predict.features_of).
    features = features_of(m, batch, t)

    def step(system, parallel):
        return predict_step(m, parallel, system, t, None, features).step_time_s

    pairs = {
        "single": (jax.jit(step), jax.jit(jax.grad(step)), one),
        f"per layout x {len(rows):,}": (
            jax.jit(jax.vmap(step, in_axes=(None, 0))),
            jax.jit(jax.vmap(jax.grad(step), in_axes=(None, 0))), batch),
        f"summed x {len(rows):,}": (
            jax.jit(jax.vmap(step, in_axes=(None, 0))),
            jax.jit(jax.grad(lambda sys, par: jnp.sum(jax.vmap(step, in_axes=(None, 0))(
                sys, par)))), batch),
    }
    print(f"gradient w.r.t. all {n_leaves} System leaves; float32; {args.repeat} repeats")
    for name, (f, g, par) in pairs.items():
        times = {}
        for label, fn in (("predict", f), ("grad", g)):
            start = time.perf_counter()
            jax.block_until_ready(fn(s, par))
            compile_s = time.perf_counter() - start
            times[label] = best_of(lambda: jax.block_until_ready(fn(s, par)), args.repeat)
            print(f"  {name:>20} {label:>7}: compile {compile_s:6.2f} s, "
                  f"run {times[label] * 1e3:9.3f} ms")
        print(f"  {name:>20}   ratio grad / predict = {times['grad'] / times['predict']:.2f}")


if __name__ == "__main__":
    main()
