"""One compile per shape (DESIGN.md, STYLE.md section 4): a new layout, new hardware values or
another model of the same kind must not retrace or recompile `predict`; a system with another
number of network tiers (tree structure) may compile once. And `predict` works under `jax.jit`,
`jax.vmap` and `jax.grad`, agreeing with the plain call.

Compilations are counted as optax's test utility `log_compilations` counts them: a handler on
the "jax" logger while `jax.log_compiles()` is on. JAX then logs "Compiling <name> ..."
(jax._src.interpreters.pxla) for every XLA compilation and "Finished tracing <name> ..."
(jax._src.dispatch) for every trace; both lists must stay empty. The trace-cache size of the
jitted core (`_cache_size`, a private JAX method present in JAX 0.10) is checked as well.
"""

from __future__ import annotations

import contextlib
import logging
import re

import jax
import jax.numpy as jnp
import numpy as np

from diffperf import Parallel, Tier, Training, ZeroStage, predict, stack, training
from diffperf.api import _predict_program
from diffperf.search.kernel import _CPU_QUICK_OPTIONS

_predict_jit = _predict_program()[0]  # the jitted core predict runs on this backend
from shipped import model as _model, system as _system

BASE_MODEL = "megatron-1.7b"
BASE_SYSTEM = "a100-sxm-80gb"
BASE_LAYOUT = dict(tp=2, pp=2, dp=4, micro_batch=2, global_batch=64, zero_stage=1,
                   recompute=1, sequence_parallel=1)


class _CompileLog(logging.Handler):
    """Collects the names of the functions JAX compiles and traces."""

    _COMPILING = re.compile(r"^Compiling (\S+)")
    _TRACING = re.compile(r"^Finished tracing(?: \+ transforming)? (\S+)")

    def __init__(self):
        super().__init__(level=logging.DEBUG)
        self.compiled: list[str] = []
        self.traced: list[str] = []

    def emit(self, record):
        message = record.getMessage()
        if m := self._COMPILING.match(message):
            self.compiled.append(m.group(1))
        elif m := self._TRACING.match(message):
            self.traced.append(m.group(1))


@contextlib.contextmanager
def count_compiles():
    """Context that yields a _CompileLog of everything compiled or traced inside it."""
    log = _CompileLog()
    logger = logging.getLogger("jax")
    old_level = logger.level
    logger.addHandler(log)
    logger.setLevel(min(old_level or logging.WARNING, logging.WARNING))
    try:
        with jax.log_compiles(True):
            yield log
    finally:
        logger.removeHandler(log)
        logger.setLevel(old_level)


def _cache_size(jitted):
    """Entries in a jitted function's trace cache (JAX private API; None if unavailable)."""
    size = getattr(jitted, "_cache_size", None)
    return size() if callable(size) else None



def _warm():
    """The base prediction, run so that everything it compiles is compiled."""
    result = predict(_model(BASE_MODEL), Parallel(**BASE_LAYOUT), _system(BASE_SYSTEM))
    assert np.isfinite(float(result.step_time_s))
    return result


def _assert_nothing_compiled(log, what):
    assert log.compiled == [], f"{what} compiled {log.compiled}"
    assert log.traced == [], f"{what} retraced {log.traced}"


# --------------------------------------------------------------------------- the counter

def test_counter_sees_a_compilation():
    """The counter is not vacuous: a new jitted function compiles once, its second call not."""
    f = jax.jit(lambda x: 2.0 * x + 1.0)
    with count_compiles() as log:
        f(np.float32(1.0))
    assert len(log.compiled) == 1 and "lambda" in log.compiled[0], log.compiled
    with count_compiles() as log:
        f(np.float32(2.0))
    assert log.compiled == []


# ------------------------------------------------------------------------------ no retrace

LAYOUTS = [
    dict(tp=4, pp=1, dp=8, micro_batch=1, global_batch=64),
    dict(tp=8, pp=4, dp=2, micro_batch=4, global_batch=512, zero_stage=3, recompute=2),
    dict(tp=1, pp=6, vp=2, dp=1, micro_batch=1, global_batch=12, recompute="full"),
    dict(tp=2, pp=1, dp=16, cp=2, micro_batch=1, global_batch=32, zero_stage=ZeroStage.GRADIENTS,
         recompute="selective", sequence_parallel=1, dp_overlap=0, tp_overlap=0.5),
    dict(tp=2.0, pp=3.0, dp=2.0, micro_batch=2.0, global_batch=8.0),  # floats, not ints
]


def test_new_layout_does_not_compile():
    """Degrees, batch sizes, ZeRO stage, recompute (by number, name or enum), SP, overlap
    switches and interleaving are leaves: another layout reuses the compiled predict."""
    _warm()
    before = _cache_size(_predict_jit)
    model, system = _model(BASE_MODEL), _system(BASE_SYSTEM)
    with count_compiles() as log:
        results = [predict(model, Parallel(**layout), system) for layout in LAYOUTS]
    _assert_nothing_compiled(log, "a new layout")
    assert _cache_size(_predict_jit) == before
    times = [float(r.step_time_s) for r in results]
    assert all(np.isfinite(times)) and len(set(times)) == len(times), times


def test_new_hardware_values_do_not_compile():
    """New values of any System leaf (peaks, HBM, tiers, efficiencies, reliability) and every
    shipped two-tier system file reuse the compiled predict."""
    _warm()
    before = _cache_size(_predict_jit)
    model, parallel, base = _model(BASE_MODEL), Parallel(**BASE_LAYOUT), _system(BASE_SYSTEM)
    systems = [
        base.replace(hbm_bandwidth_Bps=3.35e12, matmul_flops_per_s=989e12),
        base.replace(tiers=(base.tiers[0].replace(bandwidth_Bps=450e9, domain_size=16.0),
                            base.tiers[1].replace(latency_s=1e-5))),
        base.replace(eff=base.eff.replace(mm_max=0.7, host_layer_s=3e-3, coll_eff_inter=0.6)),
        base.replace(reliability=base.reliability.replace(restart_s=60.0, storage_write_Bps=7e12,
                                                          failure_rate_per_s=1e-8)),
        *(_system(name) for name in ("h100-sxm-80gb", "gb200-nvl72", "a100-4nic",
                                     "a100-sxm-40gb", "b200-sxm-180gb", "mi300x", "tpu-v5p")),
    ]
    assert all(len(s.tiers) == len(base.tiers) for s in systems)
    with count_compiles() as log:
        results = [predict(model, parallel, s) for s in systems]
    _assert_nothing_compiled(log, "new hardware values")
    assert _cache_size(_predict_jit) == before
    assert all(np.isfinite(float(r.step_time_s)) for r in results)


def test_new_model_of_same_kind_does_not_compile():
    """Model dimensions and switches (GQA, SwiGLU, MoE, encoder attention, tied embeddings)
    and the training precision are leaves: other models reuse the compiled predict."""
    _warm()
    before = _cache_size(_predict_jit)
    system = _system(BASE_SYSTEM)
    parallel = Parallel(tp=1, pp=1, dp=8, micro_batch=1, global_batch=64)
    models = ["gpt-small", "llama3-8b", "gpt3-175b", "mixtral-8x7b", "deepseek-moe-16b",
              "vit-era5"]
    with count_compiles() as log:
        results = [predict(_model(name), parallel, system) for name in models]
        results += [predict(_model(BASE_MODEL), parallel, system, training(precision))
                    for precision in ("fp32", "bf16-pure", "amp-bf16", "xla-amp-bf16")]
        results.append(predict(_model(BASE_MODEL), parallel, system,
                               training("bf16", checkpoint_interval_s=1800.0)))
    _assert_nothing_compiled(log, "another model or precision")
    assert _cache_size(_predict_jit) == before
    assert all(np.isfinite(float(r.step_time_s)) for r in results)


def test_temperature_zero_reuses_the_exact_model():
    """temperature=0 is the exact model (DESIGN.md): same compiled function, same value."""
    hard = _warm()
    with count_compiles() as log:
        zero = predict(_model(BASE_MODEL), Parallel(**BASE_LAYOUT), _system(BASE_SYSTEM),
                       temperature=0.0)
    _assert_nothing_compiled(log, "temperature=0")
    assert float(zero.step_time_s) == float(hard.step_time_s)


def _three_tiers(system, rail_size, rail_bw):
    """The system with a rail-optimised leaf switch tier between NVLink and the fabric."""
    nvlink, fabric = system.tiers
    rail = Tier(domain_size=rail_size, bandwidth_Bps=rail_bw, latency_s=3e-6, name="rail")
    return system.replace(tiers=(nvlink, rail, fabric))


def test_another_number_of_tiers_compiles_once():
    """The number of tiers is tree structure: a three-tier system may compile predict once;
    a second three-tier system with other values then compiles nothing."""
    _warm()
    model, parallel, base = _model(BASE_MODEL), Parallel(**BASE_LAYOUT), _system(BASE_SYSTEM)
    with count_compiles() as log:
        first = predict(model, parallel, _three_tiers(base, 256.0, 50e9))
    assert [n for n in log.compiled if "predict" in n] in ([], ["jit(_predict_impl)"]), log.compiled
    assert len(log.compiled) <= 1, log.compiled
    with count_compiles() as log:
        second = predict(model, parallel, _three_tiers(_system("h100-sxm-80gb"), 128.0, 40e9))
    _assert_nothing_compiled(log, "a second three-tier system")
    assert np.isfinite(float(first.step_time_s)) and np.isfinite(float(second.step_time_s))


# ------------------------------------------------------------------ jit, vmap and grad

def test_jit_vmap_grad_agree_with_scalar_call():
    """jax.jit(jax.vmap(jax.value_and_grad(predict ... step_time))) over a stack of layouts
    (diffperf.stack) works: each value equals the plain predict() of that layout, and the
    gradient w.r.t. the system is finite and matches a central finite difference of plain
    predict() calls, as elasticities d ln T / d ln theta (relative step 1e-3, float32)."""
    model, system = _model("llama3-8b"), _system("h100-sxm-80gb")
    layouts = [  # away from kinks: no group fills a domain exactly, no tied overlap window
        Parallel(tp=4, pp=2, dp=4, micro_batch=1, global_batch=64, zero_stage=3, recompute=2,
                 sequence_parallel=1, tp_overlap=0.5),
        Parallel(tp=2, pp=1, dp=2, micro_batch=2, global_batch=32, zero_stage=1, recompute=1),
        Parallel(tp=8, pp=4, dp=2, micro_batch=1, global_batch=256, recompute=2),
    ]

    def step_time(parallel, system):
        return predict(model, parallel, system).step_time_s

    # compiled with the options predict uses on XLA:CPU (search.kernel._CPU_QUICK_OPTIONS):
    # about twice as fast to compile, and the flavour the scalar calls below run
    options = dict(compiler_options=_CPU_QUICK_OPTIONS) if jax.default_backend() == "cpu" else {}
    batched = jax.jit(jax.vmap(jax.value_and_grad(step_time, argnums=1), in_axes=(0, None)),
                      **options)
    values, grads = batched(stack(layouts), system)

    scalar = np.array([float(predict(model, p, system).step_time_s) for p in layouts])
    np.testing.assert_allclose(np.asarray(values), scalar, rtol=1e-5)
    assert all(np.all(np.isfinite(np.asarray(g))) for g in jax.tree.leaves(grads))

    leaves = {
        "hbm_bandwidth_Bps": (lambda s: s.hbm_bandwidth_Bps, lambda s, f: s.replace(
            hbm_bandwidth_Bps=s.hbm_bandwidth_Bps * f)),
        "matmul_flops_per_s": (lambda s: s.matmul_flops_per_s, lambda s, f: s.replace(
            matmul_flops_per_s=s.matmul_flops_per_s * f)),
        "tiers[1].bandwidth_Bps": (lambda s: s.tiers[1].bandwidth_Bps, lambda s, f: s.replace(
            tiers=(s.tiers[0], s.tiers[1].replace(bandwidth_Bps=s.tiers[1].bandwidth_Bps * f)))),
    }
    h = 1e-3
    for name, (get, scale) in leaves.items():
        elasticity = np.asarray(get(grads)) * float(get(system)) / scalar
        fd = np.array([
            (float(predict(model, p, scale(system, 1 + h)).step_time_s)
             - float(predict(model, p, scale(system, 1 - h)).step_time_s)) / (2 * h) / t
            for p, t in zip(layouts, scalar)])
        np.testing.assert_allclose(elasticity, fd, rtol=2e-2, atol=2e-3, err_msg=name)


def test_validity_mask_is_compiled_once_in_a_gradient_program():
    """The rules of `valid_mask` appear once in the optimized XLA program of a value and
    gradient whose backward pass has several fusions (specs.validate.computed_once). XLA's
    loop fusion used to copy the whole mask into every fusion that read the cotangent of the
    masked step, select(valid, g, 0): predict's value-and-gradient program with every
    feature then compiled in ~56 s of CPU instead of ~22 s (benchmarks/README.md, "Session
    13: suite time"). Counted by the mask's is-finite checks (one per finite-checked System
    and Training leaf), which nothing else here computes."""
    from diffperf.specs.batch import anonymous
    from diffperf.specs.validate import valid_mask

    specs = [jax.tree.map(lambda x: np.asarray(x, np.float32), anonymous(x)) for x in (
        _model(BASE_MODEL), Parallel(**BASE_LAYOUT), _system(BASE_SYSTEM), Training())]

    def masked(model, parallel, system, train):
        # several expensive ops (each a fusion root) read the masked value's cotangent
        t = sum(jnp.exp(-x / jnp.float32(1e12)) * jnp.log1p(x) for x in jax.tree.leaves(system))
        return jnp.where(valid_mask(model, parallel, system, train), t, jnp.inf)

    options = dict(compiler_options=_CPU_QUICK_OPTIONS) if jax.default_backend() == "cpu" else {}

    def count(f):
        return jax.jit(f, **options).lower(*specs).compile().as_text().count(" is-finite(")

    alone = count(valid_mask)
    assert alone > 0
    assert count(jax.value_and_grad(masked, argnums=2)) == alone
