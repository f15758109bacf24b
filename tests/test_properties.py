"""Properties of `predict` over random valid models, layouts, trainings and systems
(STYLE.md section 7, kind 3).

What test_gradients.py already covers is not repeated here (finite gradients, gradient signs
and the 10 % finite steps on shipped systems, float32 vs float64 at 4 layouts, smooth -> hard
at 2 layouts). This file checks, over random *batches*:

- accounting: step time finite and > 0; every exposed part (EXPOSED_PARTS) and every hidden
  part >= 0, the exposed parts sum to the step time; the memory parts (MEMORY_PARTS) sum to the
  total; `fits` is total <= capacity; 0 < MFU <= 1 (x the FP8 / FP4 peak ratio of a
  low-precision recipe); tokens/s = B s / T;
- the scaling-book bounds: compute <= step, each kind of communication (exposed + hidden)
  <= step, and hidden + exposed does not depend on the overlap switches (tp_overlap,
  dp_overlap), with nothing hidden when both are off;
- total model FLOPs do not depend on the layout (hardware FLOPs neither, recompute kept);
- memory does not depend on bandwidth, FLOP/s or latency;
- ZeRO-3 model-state memory <= ZeRO-2's <= ZeRO-1's <= ZeRO-0's;
- finite steps on random systems: more FLOP/s, HBM or network bandwidth (by a random factor
  in [1.05, 3]) or less latency never slows a step; more capacity changes no time and never
  makes a fitting layout not fit;
- gradients finite for every System leaf on random (perturbed) systems;
- float32 within 1e-5 relative of float64, and the smooth variant converging to the hard one,
  over a whole batch.

How: hypothesis draws the seeds of a batch of N configurations and `config_from_seed` builds
each (random models or shipped ones, layouts valid by construction, every precision, shipped
systems with every number multiplied by its own factor in [0.3, 3]); ONE jitted `vmap` of
`value_and_grad(predict_step)` evaluates the whole batch at once (a single compilation for the
file in float32, one more for the float64 check). Drawing each configuration field by field
through hypothesis costs ~10 ms a configuration; a seed costs ~1 ms. A failure names the
configuration and its seed (`Batch.describe`: `config_from_seed(seed)` rebuilds it), and the
examples are derandomized, so it reproduces.
"""

from __future__ import annotations

import copy
import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from diffperf import Parallel, load_model
from diffperf.predict import predict_step
from diffperf.result import EXPOSED_PARTS, HIDDEN_PARTS, MEMORY_PARTS
from diffperf.search.kernel import _CPU_QUICK_OPTIONS
from diffperf.specs.batch import stack
from diffperf.load import (_FRACTIONS, EFFICIENCY_KEYS, _configs_dir, model_from_dict,
                           model_names, system_from_dict, system_names, training)
from diffperf.specs.system import Efficiency
from diffperf.specs.training import PRECISIONS
from diffperf.specs.validate import check_layout

N = 96  # configurations per hypothesis example: one shape, hence one compilation
SETTINGS = dict(derandomize=True, database=None, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.large_base_example])
REL = 1e-5  # float32 accounting tolerance (sums of ~10 positive float32 terms)


# ------------------------------------------------------------------------------ strategies

@functools.lru_cache(maxsize=None)
def _shipped_model(name):
    return load_model(name)


@functools.lru_cache(maxsize=None)
def _system_dict(name):
    d = yaml.safe_load((_configs_dir() / "systems" / f"{name}.yaml").read_text())
    d.pop("sources", None)
    return d


MODEL_NAMES = tuple(model_names())
# A batch stacks its systems into one pytree, so they share one tier count: the shipped
# two-tier systems (the multi-tier fabrics have their own tests: test_fabric.py, and a
# check_grads case in test_gradients.py).
SYSTEM_NAMES = tuple(n for n in system_names() if len(_system_dict(n)["tiers"]) == 2)


def _divisors(n, limit):
    return [d for d in range(1, min(n, limit) + 1) if n % d == 0]


def _pick(rng, options):
    options = tuple(options)
    return options[int(rng.integers(len(options)))]


def _flag(rng):
    return bool(rng.integers(2))


def random_model(rng):
    """A random valid model dict, built through the loader (`model_from_dict` validates):
    MHA/GQA/MQA, gated or not, causal or full attention, dense or MoE (shared experts,
    capacity factor), head_dim tied to hidden or not."""
    heads = _pick(rng, (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96))
    head_dim = _pick(rng, (32, 64, 80, 96, 128))
    hidden = heads * head_dim if _flag(rng) else _pick(rng, (256, 768, 1024, 2048, 4096, 8192))
    experts = _pick(rng, (0, 0, 0, 4, 8, 16, 64))
    d = dict(
        num_layers=int(rng.integers(1, 97)), hidden=hidden, head_dim=head_dim, num_heads=heads,
        num_kv_heads=_pick(rng, _divisors(heads, heads)),
        ffn_hidden=_pick(rng, (1, 2, 4)) * hidden + _pick(rng, (0, 256)),
        vocab=_pick(rng, (256, 1000, 32000, 50257, 51200, 128256, 256000)),
        seq_len=_pick(rng, (128, 512, 1000, 2048, 4096, 8192, 32768)),
        gated_mlp=_flag(rng), attention=_pick(rng, ("causal", "full")),
        norm=_pick(rng, ("layernorm", "rmsnorm")), tied_embeddings=_flag(rng),
        biases=_flag(rng), learned_positions=_flag(rng), moe_experts=experts)
    if experts:
        topk = int(rng.integers(1, min(experts, 8) + 1))
        d.update(moe_topk=topk,
                 moe_ffn_hidden=_pick(rng, (256, 1408, 4096, 14336)),
                 moe_shared_experts=_pick(rng, (0, 1, 2)),
                 # at most E / k (load refuses more: Megatron-Core get_capacity); the same draws
                 moe_capacity_factor=min(_pick(rng, (1.0, 1.25, 2.0)), experts / topk))
    return model_from_dict(d, "random-model")


def random_layout(rng, model):
    """A layout valid for `model` by construction (check_layout's rules): every degree,
    interleaving, ZeRO stage, recompute mode, SP and overlap switch."""
    heads, kv = int(model.n_heads), int(model.n_kv_heads)
    ffn, layers, seq = int(model.ffn_hidden), int(model.n_layers), int(model.seq_len)
    experts = int(model.n_experts)
    tp = _pick(rng, [t for t in (1, 2, 4, 8, 16) if heads % t == 0 and ffn % t == 0
                     and (kv % t == 0 or t % kv == 0)])
    pp = _pick(rng, _divisors(layers, 16))
    vp = _pick(rng, _divisors(layers // pp, 4)) if pp > 1 else 1
    cp = _pick(rng, [c for c in (1, 1, 2, 4) if seq % c == 0])
    dp = _pick(rng, (1, 2, 4, 8, 16, 64))
    ep = _pick(rng, [e for e in _divisors(dp, dp) if experts % e == 0]) if experts else 1
    micro_batch = _pick(rng, (1, 2, 4))
    m = int(rng.integers(1, 17)) * (pp if vp > 1 else 1)
    return Parallel(
        tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, vp=vp, micro_batch=micro_batch,
        global_batch=micro_batch * dp * m, zero_stage=int(rng.integers(4)),
        recompute=int(rng.integers(3)), sequence_parallel=int(rng.integers(2)),
        dp_overlap=int(rng.integers(2)),
        tp_overlap=_pick(rng, (0.0, 0.5, 1.0)) * (tp > 1))  # acts at tp > 1 only


def random_system(rng):
    """A shipped system with every number (peaks, HBM, power, each tier's bandwidth, latency
    and inner domain size, every efficiency) multiplied by its own log-uniform factor in
    [0.3, 3] (one time in four: the shipped system as it is, default efficiencies); fractions
    are capped at 1 and the outer tier keeps the whole cluster. Built by `system_from_dict`."""
    name = _pick(rng, SYSTEM_NAMES)
    d = copy.deepcopy(_system_dict(name))
    eff = {k: float(getattr(Efficiency(), k)) for k in EFFICIENCY_KEYS}
    perturbed = rng.integers(4) > 0
    if perturbed:
        factors = iter(np.exp(rng.uniform(np.log(0.3), np.log(3.0), size=64)).tolist())
        factor = lambda: next(factors)  # noqa: E731
        for k in ("matmul_TFLOPs", "matmul_fp32_TFLOPs", "vector_TFLOPs",
                  "hbm_bandwidth_GBps", "hbm_capacity_GiB", "power_W"):
            if d.get(k) is not None:
                d[k] = d[k] * factor()
        for i, tier in enumerate(d["tiers"]):
            tier["bandwidth_GBps"] *= factor()
            tier["latency_us"] *= factor()
            if i < len(d["tiers"]) - 1:
                tier["domain_size"] *= factor()
                if i > 0:  # nested: no smaller than the tier inside it
                    tier["domain_size"] = max(tier["domain_size"], d["tiers"][i - 1]["domain_size"])
        eff = {k: min(v * factor(), 1.0) if k in _FRACTIONS else v * factor()
               for k, v in eff.items()}
        eff["floor_pnorm"] = max(eff["floor_pnorm"], 1.0)  # a p-norm max needs p >= 1
    d["efficiency"] = eff
    label = f"{name} (perturbed)" if perturbed else name
    return system_from_dict(d, label).replace(name=label)


@dataclasses.dataclass
class Config:
    seed: int
    model: object
    parallel: Parallel
    system: object
    training: object


def config_from_seed(seed) -> Config:
    """A random configuration: a shipped model (half the time) or a random one, a valid
    layout, a random or shipped system, and any precision with or without flash attention
    and dropout. Deterministic in `seed`."""
    rng = np.random.default_rng(seed)
    model = _shipped_model(_pick(rng, MODEL_NAMES)) if _flag(rng) else random_model(rng)
    train = training(_pick(rng, sorted(PRECISIONS)), flash_attention=float(_flag(rng)),
                     dropout=float(_flag(rng)))
    return Config(seed, model, random_layout(rng, model), random_system(rng), train)


def batches():
    """N configurations; hypothesis draws their seeds (derandomized; shrinking sends the
    seeds that do not matter to 0, which isolates the failing configuration)."""
    return st.lists(st.integers(0, 2**32 - 1), min_size=N, max_size=N).map(
        lambda seeds: [config_from_seed(s) for s in seeds])


# ------------------------------------------------------------------------------ evaluation

def _floats(tree):
    dtype = np.dtype(jnp.result_type(float))  # float32, float64 under x64
    return jax.tree.map(lambda x: np.asarray(x, dtype=dtype), tree)


class Batch:
    """The N configurations as stacked pytrees (leading axis), validated."""

    def __init__(self, cfgs):
        self.cfgs = cfgs
        self.model = stack([c.model for c in cfgs])
        self.parallel = stack([c.parallel for c in cfgs])
        self.system = stack([c.system for c in cfgs])
        self.training = stack([c.training for c in cfgs])
        check_layout(self.model, self.parallel, where="strategy")  # valid by construction

    def describe(self, i) -> str:
        c = self.cfgs[int(i)]
        m, p = c.model, c.parallel
        model = {f.name: float(getattr(m, f.name)) for f in dataclasses.fields(m)
                 if f.name != "name"}
        layout = {f.name: getattr(p, f.name) for f in dataclasses.fields(p)}
        return (f"config[{int(i)}] (config_from_seed({c.seed})): model {m.name} {model}; "
                f"layout {layout}; system {c.system.name}; training {c.training.name} "
                f"(flash {float(c.training.flash_attention):g}, "
                f"dropout {float(c.training.dropout):g})")


def _step_and_result(model, parallel, system, training_):
    r = predict_step(model, parallel, system, training_)
    return r.step_time_s, r


# The one compiled function of this file (float32): per configuration, the Result and
# d step / d System (every leaf).
# On XLA:CPU both are compiled with the options `predict` itself uses there (LLVM -O0, the
# classic emitters: api._predict_jit_cpu, search.kernel._CPU_QUICK_OPTIONS): they compile
# about twice as fast, and the program checked is the flavour the library runs on CPU.
_JIT_OPTIONS = dict(compiler_options=_CPU_QUICK_OPTIONS) if jax.default_backend() == "cpu" else {}
_VALUE_AND_GRAD = jax.jit(jax.vmap(jax.value_and_grad(_step_and_result, argnums=2,
                                                      has_aux=True)), **_JIT_OPTIONS)
# Forward only, for the float64 comparison (a second compilation, under x64).
_FORWARD = jax.jit(jax.vmap(predict_step), **_JIT_OPTIONS)


def evaluate(batch, *, model=None, parallel=None, system=None):
    """(Result, system gradient) of the batch, with any of its parts replaced."""
    args = _floats((batch.model if model is None else model,
                    batch.parallel if parallel is None else parallel,
                    batch.system if system is None else system, batch.training))
    (_, result), grad = _VALUE_AND_GRAD(*args)
    return jax.tree.map(np.asarray, result), grad


def _first_bad(mask):
    mask = np.asarray(mask)
    return int(np.argmax(mask)) if mask.any() else None


def _check(batch, ok, what):
    """Assert `ok` for every configuration; name the first that fails."""
    bad = _first_bad(~np.asarray(ok, bool))
    assert bad is None, f"{what} fails at {batch.describe(bad)}"


def _scaled(tree, factor, keep):
    """`tree` with the leaves whose path satisfies keep(path) multiplied by factor."""
    return jax.tree_util.tree_map_with_path(
        lambda path, x: x * factor if keep(jax.tree_util.keystr(path)) else x, tree)


# ------------------------------------------------------------------------------ properties

@settings(max_examples=6, **SETTINGS)
@given(cfgs=batches())
def test_step_and_memory_accounting(cfgs):
    batch = Batch(cfgs)
    r, _ = evaluate(batch)
    T, b, mem = r.step_time_s, r.breakdown, r.memory
    _check(batch, np.isfinite(T) & (T > 0), "step time finite and > 0")
    for k in (*EXPOSED_PARTS, *HIDDEN_PARTS):
        v = getattr(b, k)
        _check(batch, np.isfinite(v) & (v >= 0), f"breakdown.{k} finite and >= 0")
    total = sum(getattr(b, k).astype(np.float64) for k in EXPOSED_PARTS)
    _check(batch, np.abs(total - T) <= REL * T, "exposed parts sum to step_time_s")
    for k in MEMORY_PARTS:
        v = getattr(mem, k)
        _check(batch, np.isfinite(v) & (v >= 0), f"memory.{k} finite and >= 0")
    parts = sum(getattr(mem, k).astype(np.float64) for k in MEMORY_PARTS)
    _check(batch, np.abs(parts - mem.total_bytes) <= REL * mem.total_bytes,
           "memory parts sum to total_bytes")
    _check(batch, r.fits == (mem.total_bytes <= mem.capacity_bytes), "fits = total <= capacity")
    # MFU is model FLOPs over the 16-bit peak; a recipe whose GEMMs run in FP8 / FP4 can
    # exceed 1 by at most the ratio of the peak it runs at (specs.training, low precision).
    tr, sy = batch.training, batch.system
    lowp = np.maximum(np.maximum(np.asarray(tr.lowp_fprop), np.asarray(tr.lowp_dgrad)),
                      np.asarray(tr.lowp_wgrad)) > 0
    peak = np.where(np.asarray(tr.lowp_fp4) > 0, np.asarray(sy.matmul_fp4_flops_per_s),
                    np.asarray(sy.matmul_fp8_flops_per_s))
    bound = np.where(lowp, np.maximum(peak / np.asarray(sy.matmul_flops_per_s), 1.0), 1.0)
    _check(batch, (r.mfu > 0) & (r.mfu <= bound), "0 < MFU <= 1 (x the low-precision peak "
                                                  "ratio)")
    tokens = batch.parallel.global_batch * batch.model.seq_len / T
    _check(batch, np.abs(r.tokens_per_s - tokens) <= REL * tokens, "tokens/s = B s / T")
    _check(batch, r.hardware_flops >= r.model_flops * (1 - 1e-6), "hardware >= model FLOPs")


@settings(max_examples=6, **SETTINGS)
@given(cfgs=batches())
def test_compute_and_each_communication_fit_in_the_step(cfgs):
    """max(compute, comm) <= step (the scaling-book lower bound), per kind of communication;
    exposed + hidden = the whole communication, whatever the overlap switches; with both
    switches off nothing is hidden (tp_overlap = 0, dp_overlap = 0; CP always overlaps)."""
    batch = Batch(cfgs)
    r, _ = evaluate(batch)
    b, T = r.breakdown, r.step_time_s.astype(np.float64)
    slack = T * (1 + REL)
    _check(batch, b.compute_s + b.recompute_s <= slack, "compute + recompute <= step")
    for kind in ("tp", "cp", "dp"):
        comm = getattr(b, f"{kind}_exposed_s") + getattr(b, f"{kind}_hidden_s")
        _check(batch, comm <= slack, f"{kind} exposed + hidden <= step")
    off = batch.parallel.replace(tp_overlap=0 * batch.parallel.tp_overlap,
                                 dp_overlap=0 * batch.parallel.dp_overlap)
    r0, _ = evaluate(batch, parallel=off)
    b0 = r0.breakdown
    for kind in ("tp", "dp"):
        _check(batch, getattr(b0, f"{kind}_hidden_s") == 0, f"{kind}_hidden_s = 0 without overlap")
        with_overlap = getattr(b, f"{kind}_exposed_s") + getattr(b, f"{kind}_hidden_s")
        without = getattr(b0, f"{kind}_exposed_s")
        _check(batch, np.abs(with_overlap - without) <= REL * np.maximum(without, 1e-30) + 1e-12,
               f"{kind} exposed + hidden independent of the overlap switch")


@settings(max_examples=6, **SETTINGS)
@given(cfgs=batches())
def test_model_flops_do_not_depend_on_the_layout(cfgs):
    """The same model, global batch, training and recompute on one device (tp = pp = dp = cp =
    ep = vp = 1, micro-batch 1) has the same model FLOPs and hardware FLOPs."""
    batch = Batch(cfgs)
    r, _ = evaluate(batch)
    p = batch.parallel
    one = np.ones_like(p.tp)
    single = p.replace(tp=one, pp=one, dp=one, cp=one, ep=one, vp=one, micro_batch=one,
                       zero_stage=0 * one, sequence_parallel=0 * one)
    r1, _ = evaluate(batch, parallel=single)
    for k in ("model_flops", "hardware_flops"):
        a, b = getattr(r, k), getattr(r1, k)
        _check(batch, np.abs(a - b) <= 1e-6 * b, f"{k} independent of the layout")


@settings(max_examples=6, **SETTINGS)
@given(cfgs=batches())
def test_zero_stages_order_model_state_memory(cfgs):
    """weights + gradients + optimizer states: ZeRO-3 <= ZeRO-2 <= ZeRO-1 <= ZeRO-0."""
    batch = Batch(cfgs)
    p = batch.parallel
    states = []
    for stage in range(4):
        r, _ = evaluate(batch, parallel=p.replace(zero_stage=np.full_like(p.zero_stage, stage)))
        m = r.memory
        states.append(m.weights_bytes.astype(np.float64) + m.gradients_bytes
                      + m.optimizer_bytes)
    for lo in range(3):
        _check(batch, states[lo + 1] <= states[lo] * (1 + 1e-6),
               f"model-state memory of ZeRO-{lo + 1} <= ZeRO-{lo}")


# System leaves grouped by resource (paths of the stacked System pytree).
RESOURCES = {
    "FLOP/s": lambda path: path.endswith("flops_per_s"),
    "HBM bandwidth": lambda path: path == ".hbm_bandwidth_Bps",
    "inner tier bandwidth": lambda path: path == ".tiers[0].bandwidth_Bps",
    "outer tier bandwidth": lambda path: path == ".tiers[1].bandwidth_Bps",
    "all bandwidths and FLOP/s": lambda path: path.endswith(("_Bps", "flops_per_s")),
}


@settings(max_examples=6, **SETTINGS)
@given(cfgs=batches(), factor=st.floats(1.05, 3.0))
def test_more_hardware_never_hurts(cfgs, factor):
    """On random systems: each resource x factor never slows a step (1e-6 relative slack for
    float32 rounding) and leaves memory unchanged; latency / factor likewise; more capacity
    changes no time and keeps a fitting layout fitting."""
    batch = Batch(cfgs)
    r, _ = evaluate(batch)
    T = r.step_time_s.astype(np.float64)
    variants = {name: _scaled(batch.system, factor, keep) for name, keep in RESOURCES.items()}
    variants["latency / factor"] = _scaled(batch.system, 1 / factor,
                                           lambda path: path.endswith("latency_s"))
    for name, system in variants.items():
        r2, _ = evaluate(batch, system=system)
        _check(batch, r2.step_time_s <= T * (1 + 1e-6), f"{name} x {factor:.3g} never slower")
        for k in (*MEMORY_PARTS, "total_bytes", "capacity_bytes"):
            _check(batch, getattr(r2.memory, k) == getattr(r.memory, k),
                   f"memory.{k} independent of {name}")
    bigger = _scaled(batch.system, factor, lambda path: path == ".hbm_capacity_bytes")
    r3, _ = evaluate(batch, system=bigger)
    _check(batch, r3.step_time_s == r.step_time_s, "step time independent of HBM capacity")
    _check(batch, r3.memory.total_bytes == r.memory.total_bytes, "memory independent of capacity")
    _check(batch, r3.fits | ~r.fits, f"capacity x {factor:.3g} keeps a fitting layout fitting")


@settings(max_examples=6, **SETTINGS)
@given(cfgs=batches())
def test_gradient_finite_for_every_system_leaf_on_random_systems(cfgs):
    batch = Batch(cfgs)
    _, grad = evaluate(batch)
    for path, g in jax.tree_util.tree_flatten_with_path(grad)[0]:
        _check(batch, np.isfinite(np.asarray(g)),
               f"d step / d {jax.tree_util.keystr(path)} finite")




@functools.lru_cache(maxsize=None)
def _fixed_batch():
    """One batch of N configurations from seeds 0..N-1, for the checks that switch float64 on
    (a fixture, which @given cannot wrap) or run eagerly (one batch is enough). (Hypothesis'
    first derandomized example is its minimal one: N copies of seed 0.)"""
    return Batch([config_from_seed(s) for s in range(N)])


def test_float32_matches_float64_over_a_batch(request):
    """Step time, every exposed part (relative to the step) and total memory of the float32
    default within 1e-5 relative of float64, over a whole random batch."""
    batch = _fixed_batch()
    r32, _ = evaluate(batch)
    request.getfixturevalue("x64")
    r64 = jax.tree.map(np.asarray, _FORWARD(*_floats((batch.model, batch.parallel,
                                                      batch.system, batch.training))))
    assert r64.step_time_s.dtype == np.float64 and r32.step_time_s.dtype == np.float32
    T = r64.step_time_s
    _check(batch, np.abs(r32.step_time_s - T) <= 1e-5 * T, "float32 step time within 1e-5")
    for k in EXPOSED_PARTS:
        _check(batch, np.abs(getattr(r32.breakdown, k) - getattr(r64.breakdown, k)) <= 1e-5 * T,
               f"float32 breakdown.{k} within 1e-5 of the step")
    M = r64.memory.total_bytes
    _check(batch, np.abs(r32.memory.total_bytes - M) <= 1e-5 * M, "float32 memory within 1e-5")


TEMPERATURES = (0.1, 0.01, 0.001)


def test_smooth_converges_to_hard_over_a_batch():
    """|T(t) - T_hard| / T_hard <= 2 (2^t - 1) for every configuration: each smooth max is a
    p-norm with p = 1/t, at most 2^(1/p) = 2^t times the hard max, and the windows it is taken
    over add up to at most about twice the step. The largest error over the batch does not grow
    as the temperature falls, and is below 1.5e-3 at t = 0.001 (in float32 it is often exactly
    0 below t = 0.1: (lo/hi)^(1/t) underflows, and the smooth max returns the hard one).
    Eager (jax.disable_jit): the temperature is static, so jitting would compile once per
    temperature."""
    batch = _fixed_batch()
    hard, _ = evaluate(batch)
    T = hard.step_time_s.astype(np.float64)
    args = (batch.model, batch.parallel, batch.system, batch.training)
    worst = []
    with jax.disable_jit():
        for t in TEMPERATURES:
            smooth = jax.vmap(functools.partial(predict_step, temperature=t))(*_floats(args))
            err = np.abs(np.asarray(smooth.step_time_s) - T) / T
            _check(batch, err <= 2 * (2**t - 1) + 1e-5, f"smooth (t={t}) within 2 (2^t - 1)")
            worst.append(float(err.max()))
    assert worst[0] > 0, worst  # the smoothing is exercised
    assert worst[0] >= worst[1] >= worst[2], worst
    assert worst[2] < 1.5e-3, worst


def test_leaving_out_zero_features_changes_no_result():
    """predict_step(features=features_of(...)) equals the full program for every configuration
    of the fixed batch, exact and smooth (t = 0.1): the terms a search leaves out of its
    program (EP all-to-alls, CP exchange, AxoNN grid, expert DP group, XLA's, low-precision
    GEMM rows, the MoE and MLA GEMM rows, the merged EP schedule's chunk windows, PyTorch's
    experimental CP, the wave-split sigmas) are exactly 0 when features_of says so; and
    predict_step(checked=True), which leaves out the in-program valid_mask for inputs a
    caller has validated (every row here is valid), gives the same numbers bit for bit.
    Half of the batch's CP + EP rows (no other feature) get ep_overlap, cp_torch and
    gemm_wave_split set, so those three gated terms are compared both ways: left out on every
    other row (CP and EP rows among them), kept beside the rows' other features on these (one
    feature set more). Configurations grouped by their feature set; eager (no compile). Each
    feature set runs on the whole batch and is compared on its own rows: one shape for every
    call, so the eager ops compile once (a sub-batch per set recompiled them all: 70 s)."""
    from diffperf.predict import FEATURES, features_of

    cfgs = _fixed_batch().cfgs
    keys = [features_of(c.model, c.parallel, c.training) for c in cfgs]
    on = [i for i, k in enumerate(keys) if k == {"cp", "ep", "experts"}][::2]
    cfgs = [dataclasses.replace(c, parallel=c.parallel.replace(ep_overlap=1.0),
                                training=c.training.replace(cp_torch=1.0, gemm_wave_split=1.0))
            if i in on else c for i, c in enumerate(cfgs)]
    batch = Batch(cfgs)
    args = _floats((batch.model, batch.parallel, batch.system, batch.training))
    keys = [features_of(c.model, c.parallel, c.training) for c in batch.cfgs]
    assert len(set(keys)) >= 3 and any(k != FEATURES for k in keys), set(keys)
    assert all("axonn" not in k for k in keys)  # no grid in random_layout
    new = {"ep_overlap", "cp_torch", "wave_split"}
    assert on and all(new <= keys[i] for i in on), on
    assert any("cp" in k and "ep" in k and not new & k for k in keys), set(keys)
    with jax.disable_jit():
        for t in (None, 0.1):
            full = jax.vmap(functools.partial(predict_step, temperature=t))(*args)
            # checked=True (inputs valid: the mask is not traced) changes no number either
            assert np.all(np.asarray(full.valid))
            checked = jax.vmap(functools.partial(predict_step, temperature=t, checked=True))(
                *args)
            for a, b in zip(jax.tree.leaves(checked), jax.tree.leaves(full)):
                np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg="checked")
            for key in set(keys):
                idx = np.flatnonzero([k == key for k in keys])
                part = jax.vmap(functools.partial(predict_step, temperature=t,
                                                  features=key))(*args)
                for a, b in zip(jax.tree.leaves(part), jax.tree.leaves(full)):
                    np.testing.assert_allclose(np.asarray(a)[idx], np.asarray(b)[idx], rtol=1e-6,
                                               atol=0, err_msg=f"features {sorted(key)}")


def test_features_of_names_each_feature():
    from diffperf.predict import FEATURES, features_of

    dense, moe = _shipped_model("gpt3-175b"), _shipped_model("mixtral-8x7b")
    assert features_of(dense, Parallel()) == frozenset()
    assert features_of(dense, Parallel(cp=2.0)) == {"cp"}
    assert features_of(dense, Parallel(gy=2.0)) == {"axonn"}
    assert features_of(moe, Parallel(dp=8.0)) == {"experts"}
    assert features_of(moe, Parallel(dp=8.0, ep=np.array([1.0, 8.0]))) == {"experts", "ep"}
    assert features_of(dense, Parallel(), training("xla-amp-bf16")) == {"xla"}
    assert features_of(dense, Parallel(), training("amp-bf16")) == frozenset()
    assert features_of(dense, Parallel(), training("fp8-current")) == {"lowp"}
    assert features_of(dense, Parallel(), training("fp8-current", lowp_te_quantizer=1.0)) == {
        "lowp", "te_quant"}
    assert features_of(dense, Parallel(), training("bf16", lowp_te_quantizer=1.0)) == frozenset()
    assert features_of(_shipped_model("deepseek-v2-lite"), Parallel(dp=8.0)) == {"experts",
                                                                                  "mla"}
    assert features_of(dense, Parallel(), training("mxfp8", lowp_layer_frac=0.0)) == frozenset()
    assert features_of(dense, Parallel(), training("amp-bf16").replace(
        lowp_wgrad=np.array([0.0, 1.0]))) == {"lowp"}
    tiled = training("bf16").replace(attn_tile=128.0)
    assert features_of(dense, Parallel(), tiled) == {"tiles"}
    assert features_of(dense, Parallel(tp=2.0, sequence_parallel=1.0, tp_userbuffers=1.0)) \
        == {"tpub"}
    assert features_of(dense, Parallel(tp=2.0, sequence_parallel=1.0, tp_userbuffers=2.0)) \
        == {"tpub", "ubpipe"}
    assert features_of(dense, Parallel(), training("bf16", gemm_wave_split=1.0)) == {
        "wave_split"}
    assert features_of(dense, Parallel(cp=2.0), training("bf16", cp_torch=1.0)) == {"cp",
                                                                                    "cp_torch"}
    assert features_of(moe, Parallel(dp=8.0, ep=8.0, ep_overlap=np.array([0.0, 0.5]))) == {
        "experts", "ep", "ep_overlap"}
    assert features_of(moe, Parallel(dp=8.0), training("bf16", moe_host_sync=1.0)) == {
        "experts", "host_sync"}
    assert features_of(dense, Parallel(), training("bf16", moe_host_sync=1.0)) == frozenset()
    seen = []  # a traced leaf: values unknown, so every feature stays in the program
    jax.make_jaxpr(lambda cp: seen.append(features_of(dense, Parallel(cp=cp))) or cp)(1.0)
    jax.make_jaxpr(lambda w: seen.append(features_of(dense, Parallel(), training(
        "bf16").replace(gemm_wave_split=w))) or w)(1.0)
    assert seen == [FEATURES, FEATURES]
