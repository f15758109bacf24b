"""Fixed time per kernel of a training step compiled as one XLA program (JAX `jit`).

Applies only where training.xla_compiled = 1 and returns the eager value (bit for bit)
otherwise. The XLA program's work (bytes, GEMMs) is in workload/xla.py.
"""

from __future__ import annotations

import jax.numpy as jnp


def kernel_fixed_s(system, training):
    """Fixed GPU time per kernel:

        eager (xla_compiled = 0):  eff.kernel_s         a kernel launched on its own
        XLA   (xla_compiled = 1):  eff.queued_kernel_s  a kernel of one compiled program
    One jitted step is enqueued as a whole (XLA's thunks, captured in CUDA graphs where it
    can), so the GPU never waits for the host between kernels: what is left per kernel is the
    gap between dependent kernels and the tail of the last wave. kernel_s is fitted to
    microbenchmarks that time one kernel launch with CUDA events (~20 us on the H100 of
    data/kernels, the smallest GEMMs), which includes the launch itself.
    Source: NVIDIA, "Getting Started with CUDA Graphs" (2019): launch overhead of short
    kernels issued back to back falls from ~3.4 us to ~2.6 us per kernel with a graph, against
    tens of us for a kernel timed alone [C]; XLA GPU command buffers (OpenXLA docs,
    xla_gpu_enable_command_buffer) [B]. Example: 1000 kernels at 3 us: 3 ms.
    """
    return jnp.where(training.xla_compiled > 0, system.eff.queued_kernel_s,
                     system.eff.kernel_s)
