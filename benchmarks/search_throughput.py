"""Layouts per second of `diffperf.search` after compilation, and the compile time apart.

    python benchmarks/search_throughput.py [--model gpt3-175b] [--gpus 1024]
        [--global-batch 1536] [--chunk 131072] [--devices N] [--repeat 5]

Reports, for the full layout table of the job (every placement):
  * compile: trace + lower + XLA compile of the search kernel (one for every placement);
  * kernel: the jitted chunk calls alone (block_until_ready), the steady-state speed of the
    factored evaluation (search.py docstring);
  * search(): the whole library call warm (chunk calls + host-side gather into rows);
  * flat vmap: jax.jit(jax.vmap(predict_step)) over the same layouts, one row per layout,
    for comparison (the unfactored form).
`--devices N` makes N host devices (XLA_FLAGS=--xla_force_host_platform_device_count=N) and
shards each call over them (search_sharded).
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
    p.add_argument("--gpus", type=int, default=1024)
    p.add_argument("--global-batch", type=int, default=1536)
    p.add_argument("--chunk", type=int, default=None)
    p.add_argument("--devices", type=int, default=None)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--no-flat", action="store_true", help="skip the flat-vmap comparison")
    p.add_argument("--quick", action="store_true", help="the quick-compiling kernel (LLVM "
                   "-O0) instead of the optimized one, as search() picks below QUICK_BELOW")
    args = p.parse_args()
    if args.devices:
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                                   f" --xla_force_host_platform_device_count={args.devices}")
    sys.path.insert(0, os.path.dirname(__file__))
    import jax
    import numpy as np

    from _common import batched_parallel, best_of, machine
    from diffperf import load_model, load_system
    from diffperf.api import _as_float
    from diffperf.predict import predict_step
    from diffperf.specs.batch import anonymous
    from diffperf.specs.training import Training

    S = sys.modules["diffperf.search"] if "diffperf.search" in sys.modules else __import__(
        "diffperf.search", fromlist=["search"])
    chunk = args.chunk or S.DEFAULT_CHUNK
    devices = jax.devices() if args.devices else None
    model, system = load_model(args.model), load_system(args.system)
    print(machine())
    start = time.perf_counter()
    table = S.enumerate_layouts(model, args.gpus, args.global_batch)
    print(f"job: {args.model} on {args.gpus} x {args.system}, global batch "
          f"{args.global_batch}: {len(table):,} layouts enumerated in "
          f"{time.perf_counter() - start:.3f} s")
    m, s, t = _as_float((anonymous(model), anonymous(system), anonymous(Training())))
    n_dev = len(devices) if devices else 1
    keys, cell, per = S._grid(table, S.PLACEMENTS, chunk, n_dev)
    features = S._table_features(m, keys, t)
    kernel = S._kernel(devices, optimize=not args.quick)
    print(f"kernel: {'quick (LLVM -O0)' if args.quick else 'optimized (LLVM -O1)'} XLA:CPU "
          f"options")
    dtype = np.float32
    chunks = [S._chunk_parallel(keys[i:i + per], dtype, features)
              for i in range(0, len(keys), per)]
    start = time.perf_counter()
    jax.block_until_ready(kernel(m, chunks[0], s, t, None, features))
    print(f"compile (trace + lower + XLA + first call), every placement: "
          f"{time.perf_counter() - start:.2f} s; {len(table):,} layouts, {len(keys):,} outer "
          f"rows x 24, calls of {per * 24:,} grid cells; features {sorted(features)}")

    def run_kernel():
        jax.block_until_ready([kernel(m, c, s, t, None, features) for c in chunks])

    cells = sum(len(c.tp) * 24 for c in chunks)
    sec = best_of(run_kernel, args.repeat)
    print(f"kernel: {len(table):,} layouts ({cells:,} grid cells incl. padding) in {sec:.3f} s "
          f"= {len(table) / sec:,.0f} layouts/s  (batch {chunk:,} layouts per call per device, "
          f"{n_dev} device(s))")
    sec = best_of(lambda: S.search(model, system, None, table, chunk=chunk, devices=devices,
                                   validate=False, optimize=not args.quick), args.repeat)
    print(f"search() warm: {sec:.3f} s = {len(table) / sec:,.0f} layouts/s (incl. host-side "
          f"gather of the 28 result fields into table order)")
    if args.no_flat:
        return
    flat = jax.jit(jax.vmap(predict_step, in_axes=(None, 0, None, None, None, None)),
                   static_argnums=(4, 5))
    n = min(len(table), 1 << 17)
    rows = table[table[:, -1] == 0][:n]
    par = batched_parallel(S.COLUMNS[:-1], rows, dtype)
    start = time.perf_counter()
    jax.block_until_ready(flat(m, par, s, t, None, features))
    compile_s = time.perf_counter() - start
    sec = best_of(lambda: jax.block_until_ready(flat(m, par, s, t, None, features)), args.repeat)
    print(f"flat vmap (default XLA options): compile {compile_s:.2f} s; {len(rows):,} layouts "
          f"in {sec:.3f} s = {len(rows) / sec:,.0f} layouts/s")


if __name__ == "__main__":
    main()
