"""The gradient contract of a layer's memory-bound part when a per-row framework fact adds
element-wise work to it (shared by tests/test_osact.py and tests/test_dropless.py)."""

import jax
import jax.numpy as jnp
import numpy as np
from jax.test_util import check_grads

from diffperf import Parallel
from diffperf.costs.compute import layer_times_s
from diffperf.workload.flops import attention_io_bytes, layer_ops


def check_fact_part(model, system, with_fact, without_fact, without_model=None):
    """At ep 8, dp 8, micro-batch 1: the memory-bound part (layer_times_s[2]) with the fact set
    matches finite differences in log(HBM bandwidth, mem_eff, kernel_s) (call under x64), its
    gradient is finite with the physical sign (more bandwidth or efficiency never slows it, a
    slower launch never speeds it), and the fact makes the part slower than without it (a
    model fact: `without_model`, the model without it, under the same training)."""
    par = Parallel(micro_batch=1.0, ep=8.0, dp=8.0)
    ops = layer_ops(model, par, with_fact)
    io = attention_io_bytes(model, par, with_fact)

    def t(logs):
        e = system.eff.replace(mem_eff=system.eff.mem_eff * jnp.exp(logs[1]),
                               kernel_s=system.eff.kernel_s * jnp.exp(logs[2]))
        s = system.replace(hbm_bandwidth_Bps=system.hbm_bandwidth_Bps * jnp.exp(logs[0]), eff=e)
        return layer_times_s(ops, s, with_fact, io)[2]

    x = jnp.zeros(3)
    check_grads(t, (x,), order=1, modes=("rev",), eps=1e-4)
    g = np.asarray(jax.grad(t)(x))
    assert np.all(np.isfinite(g))
    assert g[0] < 0 and g[1] < 0 and g[2] > 0
    bare = model if without_model is None else without_model
    base = float(layer_times_s(layer_ops(bare, par, without_fact), system, without_fact, io)[2])
    assert float(t(x)) > base
