"""Layouts per second of `diffperf.search` after compilation, and the compile time apart.

    python benchmarks/search_throughput.py [--model gpt3-175b] [--gpus 1024]
        [--global-batch 1536] [--chunk 65536] [--devices N] [--repeat 5] [--quick] [--no-flat]

Reports, for the full layout table of the job (every placement), each kernel compiled once
(trace + lower + XLA compile + first call, every placement in one program) and then timed
over the whole table (the jitted chunk calls alone, block_until_ready), the kernels taking
turns so that a change in the machine's load hits them alike:
  * ranking: the kernel with `search.RANK_FIELDS` (step time, fits, memory, MFU, tokens/s:
    what ranking every layout needs; what `diffperf search` runs on the table);
  * full Result: the kernel with every field (breakdown and memory parts), as before;
then search() warm (chunk calls + host-side gather into table order, ranking fields), and
the flat jax.jit(jax.vmap(predict_step)) over up to 131,072 of the layouts (unfactored).
Beside each kernel's wall time, the CPU seconds the process used (every thread): unlike the
wall time it does not depend on what else runs on the machine; on an idle machine with c
cores the wall time approaches CPU / c (XLA's intra-op pool keeps every core busy).
`--devices N` makes N host devices (XLA_FLAGS=--xla_force_host_platform_device_count=N) and
shards each call over them (search_sharded); on a GPU machine, the first N GPUs.
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
    p.add_argument("--quick", action="store_true", help="the quick-compiling kernels (LLVM "
                   "-O0) instead of the optimized ones")
    args = p.parse_args()
    if args.devices:
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                                   f" --xla_force_host_platform_device_count={args.devices}")
    sys.path.insert(0, os.path.dirname(__file__))
    import jax
    import numpy as np

    import diffperf.search as S
    from _common import batched_parallel, best_of, cpu_seconds, machine
    from diffperf import load_model, load_system
    from diffperf.api import _as_float
    from diffperf.predict import predict_step
    from diffperf.search import kernel as K
    from diffperf.specs.batch import anonymous
    from diffperf.specs.training import Training

    chunk = args.chunk or S.DEFAULT_CHUNK
    devices = jax.devices()[:args.devices] if args.devices else None
    model, system = load_model(args.model), load_system(args.system)
    print(machine())
    start = time.perf_counter()
    table = S.enumerate_layouts(model, args.gpus, args.global_batch)
    print(f"job: {args.model} on {args.gpus} x {args.system}, global batch "
          f"{args.global_batch}: {len(table):,} layouts enumerated in "
          f"{time.perf_counter() - start:.3f} s")
    m, s, t = _as_float((anonymous(model), anonymous(system), anonymous(Training())))
    n_dev = len(devices) if devices else 1
    keys, cell, per = K._grid(table, S.PLACEMENTS, chunk, n_dev)
    features = K._table_features(m, keys, t)
    opts = K._CPU_QUICK_OPTIONS if args.quick else K._CPU_COMPILER_OPTIONS
    print(f"XLA:CPU options (on CPU) {opts}; {len(keys):,} outer rows x 24 grid cells, calls of "
          f"{per * 24:,} cells ({chunk:,} per device), {n_dev} device(s); features "
          f"{sorted(features)}")
    chunks = [K._chunk_parallel(keys[i:i + per], np.float32, features)
              for i in range(0, len(keys), per)]
    kernel = K._kernel(devices, optimize=not args.quick)
    calls = {}
    for name, fields in (("ranking (RANK_FIELDS)", S.RANK_FIELDS), ("full Result", None)):
        def call(c, fields=fields):
            return kernel(m, c, s, t, None, features, fields)

        start = time.perf_counter()
        jax.block_until_ready(call(chunks[0]))
        print(f"{name}: compile (trace + lower + XLA + first call) "
              f"{time.perf_counter() - start:.2f} s", flush=True)
        calls[name] = (call, chunks)
    best = {name: float("inf") for name in calls}
    cpu = {name: float("inf") for name in calls}
    for _ in range(args.repeat):  # the kernels take turns
        for name, (call, cs) in calls.items():
            c0 = cpu_seconds()
            best[name] = min(best[name], best_of(
                lambda call=call, cs=cs: jax.block_until_ready([call(c) for c in cs]), 1))
            cpu[name] = min(cpu[name], cpu_seconds() - c0)
    base = best["full Result"]
    for name, sec in best.items():
        print(f"kernel, {name}: {len(table):,} layouts in {sec:.3f} s = "
              f"{len(table) / sec:,.0f} layouts/s ({base / sec:.2f}x the full-Result kernel); "
              f"CPU {cpu[name]:.3f} s = {len(table) / cpu[name]:,.0f} layouts per CPU second "
              f"(load {os.getloadavg()[0]:.2f})")
    sec = best_of(lambda: S.search(model, system, None, table, chunk=chunk, devices=devices,
                                   validate=False, optimize=not args.quick,
                                   fields=S.RANK_FIELDS), args.repeat)
    print(f"search() warm, RANK_FIELDS: {sec:.3f} s = {len(table) / sec:,.0f} layouts/s "
          f"(incl. host-side gather into table order)")
    if args.no_flat:
        return
    flat = jax.jit(jax.vmap(predict_step, in_axes=(None, 0, None, None, None, None)),
                   static_argnums=(4, 5))
    n = min(len(table), 1 << 17)
    rows = table[table[:, -1] == 0][:n]
    par = batched_parallel(S.COLUMNS[:-1], rows, np.float32)
    start = time.perf_counter()
    jax.block_until_ready(flat(m, par, s, t, None, features))
    compile_s = time.perf_counter() - start
    sec = best_of(lambda: jax.block_until_ready(flat(m, par, s, t, None, features)), args.repeat)
    print(f"flat vmap (default XLA options): compile {compile_s:.2f} s; {len(rows):,} layouts "
          f"in {sec:.3f} s = {len(rows) / sec:,.0f} layouts/s")


if __name__ == "__main__":
    main()
