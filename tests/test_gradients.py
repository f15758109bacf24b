"""The gradient contract of `predict` (DESIGN.md "Differentiability conventions", STYLE.md 7.4).

- finite gradients of the step time w.r.t. every System leaf (Tier and Efficiency leaves
  included), in float32, over random valid configurations (hypothesis);
- gradients that match finite differences (`jax.test_util.check_grads`) under float64, in O(1)
  coordinates (a log-scale factor on every leaf), away from kinks;
- the physical sign: more bandwidth, HBM bandwidth or FLOP/s never slows a step, more capacity
  never makes a fitting layout not fit;
- float32 results equal the float64 ones within 1e-5 relative;
- the smooth variant converges to the hard one as the temperature falls.

Compilation dominates the run time, so every jitted function here is built once at module level
and called with float pytrees (`anonymous` specs: names blanked), which share one compilation.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from jax.test_util import check_grads

from diffperf import Parallel, Training, predict
from diffperf.errors import SpecError
from diffperf.predict import FEATURES, features_of, predict_step
from diffperf.search.kernel import _CPU_QUICK_OPTIONS
from diffperf.specs.batch import anonymous
from diffperf.specs.validate import check_inputs, check_layout
from shipped import model as _model, system as _system

MODELS = ("gpt-small", "megatron-1.7b", "llama3-8b", "gpt3-175b")
SYSTEMS = ("a100-sxm-80gb", "h100-sxm-80gb", "gb200-nvl72", "a100-4nic")
SMOOTH = 0.05  # the temperature of the smooth variant (calibration, differentiable search)

# Hardware rates (DESIGN.md): raising one never makes a step slower (d step / d leaf <= 0).
HARDWARE_RATES = ("matmul_flops_per_s", "matmul_fp32_flops_per_s", "vector_flops_per_s",
                  "hbm_bandwidth_Bps", "tiers[*].bandwidth_Bps", "matmul_fp8_flops_per_s",
                  "matmul_fp4_flops_per_s", "matmul_sustained_frac",
                  "matmul_fp8_sustained_frac", "matmul_fp4_sustained_frac",
                  "attn_fa2_fwd_frac", "attn_fa2_bwd_frac", "sfu_exp_per_s")
# Efficiencies multiply a peak rate, so they are rates too (those of them the System has).
RATE_LEAVES = HARDWARE_RATES + ("eff.mm_max", "eff.attn_max", "eff.mem_eff",
                                "eff.coll_eff_intra", "eff.coll_eff_inter")
# Costs: raising one never makes a step faster (d step / d leaf >= 0). Latencies, fixed times
# and the sizes at which an efficiency halves (those of them the System has).
COST_LEAVES = ("tiers[*].latency_s", "tiers[*].oversubscription", "eff.kernel_s",
               "eff.queued_kernel_s", "eff.host_kernel_s", "eff.host_layer_s",
               "eff.host_recompute_s", "eff.host_coll_peer_s", "eff.microbatch_s", "eff.step_s",
               "eff.coll_base_s",
               "eff.overlap_slowdown", "eff.mm_half_dim",
               "eff.attn_half_work", "eff.attn_half_head_dim")

HYPOTHESIS = dict(derandomize=True, database=None, deadline=None,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


# --------------------------------------------------------------------------------- helpers


def _floats(spec):
    """The spec with names blanked and every leaf a float array of the default dtype (float32,
    float64 under x64): the form `predict` itself passes to its jitted core. numpy arrays, not
    jnp ones: converting ~60 leaves with jnp.asarray costs ~10 ms a call."""
    dtype = np.dtype(jnp.result_type(float))
    return jax.tree.map(lambda x: np.asarray(x, dtype=dtype), anonymous(spec))


def _leaf_name(path) -> str:
    """'tiers[*].bandwidth_Bps' style name of a System leaf from its tree path."""
    name = jax.tree_util.keystr(path).lstrip(".")
    for i in range(8):
        name = name.replace(f"tiers[{i}]", "tiers[*]")
    return name


def _named_leaves(system):
    """[(exact name, pattern name, value)] of a System pytree."""
    return [(jax.tree_util.keystr(p).lstrip("."), _leaf_name(p), v)
            for p, v in jax.tree_util.tree_flatten_with_path(system)[0]]


def _scale_leaves(system, pattern, factor):
    """The system with every leaf whose pattern name is `pattern` multiplied by `factor`."""
    paths_leaves, treedef = jax.tree_util.tree_flatten_with_path(system)
    return jax.tree.unflatten(treedef, [
        v * factor if _leaf_name(p) == pattern else v for p, v in paths_leaves])


def _step_time(model, parallel, system, training, temperature):
    return predict(model, parallel, system, training, temperature=temperature).step_time_s


# (step time, d step time / d System), jitted once per temperature: the layout, the model and
# the hardware are data, so every configuration below (float32 or, under x64, float64) reuses
# one compilation per dtype.
# On XLA:CPU they are compiled with the options `predict` itself uses there (LLVM -O0, the
# classic emitters: api._predict_jit_cpu, search.kernel._CPU_QUICK_OPTIONS): the float64
# value-and-gradient programs compile several times faster, and the program under test is
# the flavour the library runs on CPU.
_JIT_OPTIONS = dict(compiler_options=_CPU_QUICK_OPTIONS) if jax.default_backend() == "cpu" else {}
_VALUE_AND_GRAD = {
    t: jax.jit(jax.value_and_grad(functools.partial(_step_time, temperature=t), argnums=2),
               **_JIT_OPTIONS)
    for t in (None, SMOOTH)}


def _value_and_grad(model, parallel, system, training, temperature):
    return _VALUE_AND_GRAD[temperature](_floats(model), _floats(parallel), _floats(system),
                                        _floats(training))


def _system_grad(model, parallel, system, training, temperature):
    return _value_and_grad(model, parallel, system, training, temperature)[1]


def _value(model, parallel, system, training, temperature):
    """The step time, from the same compiled function (predict's value under grad)."""
    return float(_value_and_grad(model, parallel, system, training, temperature)[0])


@st.composite
def configurations(draw):
    """(model, parallel, system) with a structurally valid layout of a shipped model on a
    shipped system: single-node and multi-node, every ZeRO stage, recompute mode and SP."""
    model = _model(draw(st.sampled_from(MODELS)))
    system = _system(draw(st.sampled_from(SYSTEMS)))
    heads, ffn, layers = int(model.n_heads), int(model.ffn_hidden), int(model.n_layers)
    tp = draw(st.sampled_from([t for t in (1, 2, 4, 8, 16) if heads % t == 0 and ffn % t == 0]))
    pp = draw(st.sampled_from([p for p in (1, 2, 3, 4, 6, 8, 12, 16) if layers % p == 0]))
    dp = draw(st.sampled_from((1, 2, 4, 8, 16, 64, 128)))
    micro_batch = draw(st.sampled_from((1, 2, 4, 8)))
    global_batch = micro_batch * dp * draw(st.sampled_from((1, 2, 3, 8, 32)))
    parallel = Parallel(
        tp=tp, pp=pp, dp=dp, micro_batch=micro_batch, global_batch=global_batch,
        zero_stage=draw(st.integers(0, 3)), recompute=draw(st.integers(0, 2)),
        sequence_parallel=draw(st.integers(0, 1)), dp_overlap=draw(st.integers(0, 1)),
        tp_overlap=draw(st.sampled_from((0.0, 0.5))) * (tp > 1))  # acts at tp > 1 only
    try:
        check_layout(model, parallel)
    except SpecError:
        assume(False)
    return model, parallel, system


def _describe(model, parallel, system):
    return (f"{model.name} on {system.name}: tp={parallel.tp} pp={parallel.pp} dp={parallel.dp} "
            f"b={parallel.micro_batch} B={parallel.global_batch} zero={parallel.zero_stage} "
            f"recompute={parallel.recompute} sp={parallel.sequence_parallel} "
            f"dp_overlap={parallel.dp_overlap} tp_overlap={parallel.tp_overlap}")




# --------------------------------------------------------------------------- finiteness

@pytest.mark.parametrize("temperature", [None, SMOOTH], ids=["hard", "smooth"])
@settings(max_examples=40, **HYPOTHESIS)
@given(config=configurations())
def test_gradient_finite_in_every_system_leaf(temperature, config):
    """jax.grad over the whole System pytree (peaks, HBM, every Tier leaf, every Efficiency
    leaf) is finite in float32 at every valid configuration (DESIGN.md)."""
    model, parallel, system = config
    grad = _system_grad(model, parallel, system, Training(), temperature)
    bad = {name: float(g) for name, _, g in _named_leaves(grad) if not np.isfinite(g)}
    assert not bad, f"non-finite d step / d leaf at {_describe(*config)}: {bad}"


def test_smooth_gradient_finite_when_tp_group_is_idle():
    """The smallest case of the finiteness contract for the smooth variant: tp = 1 with the
    default tp_overlap = 0 puts a 0 s TP collective behind a 0 s overlap window, so
    `exposed(0, 0, T)` evaluates the p-norm max of (0, 0). Its value is fine (0); its float32
    gradient must be too."""
    model, system = _model("gpt-small"), _system("a100-sxm-80gb")
    parallel = Parallel(tp=1, pp=1, dp=1, micro_batch=1, global_batch=1)
    grad = _system_grad(model, parallel, system, Training(), SMOOTH)
    bad = {name: float(g) for name, _, g in _named_leaves(grad) if not np.isfinite(g)}
    assert not bad, f"non-finite d step / d leaf (temperature={SMOOTH}, tp=1): {bad}"


def test_smooth_exposed_keeps_its_relative_accuracy_when_comm_is_far_below_the_window(x64):
    """`costs.smooth.exposed` at C = 0.2 s behind K = 1 s, temperature 0.05 (p = 20), by hand:
    exposed = (C^p + K^p)^(1/p) - K = K [(1 + r^p)^(1/p) - 1], r = 0.2, r^p = 1.048576e-14,
    = K r^p / p (1 + O(r^p)) = 5.24288e-16 s; d/dK = (1 + r^p)^(1/p - 1) - 1 = (1/p - 1) r^p
    = -9.961472e-15; d/dC = r^(p-1) (1 + r^p)^(1/p - 1) = 0.2^19 = 5.24288e-14 (to 1e-14
    relative). `smax(C, K) - K` gets the value 15 % wrong and d/dK 0.3 % wrong (cancellation
    of 1 + 5e-16 - 1), which made the compiled float64 gradient depend on XLA's fusion."""
    from diffperf.costs.smooth import exposed

    value, (d_c, d_k) = jax.value_and_grad(exposed, argnums=(0, 1))(0.2, 1.0, SMOOTH)
    assert SMOOTH == 0.05
    np.testing.assert_allclose(float(value), 5.24288e-16, rtol=1e-12)
    np.testing.assert_allclose(float(d_k), -9.961472e-15, rtol=1e-12)
    np.testing.assert_allclose(float(d_c), 5.24288e-14, rtol=1e-12)
    # C = 0 (an idle group) and K = 0 (no window): exact values, finite gradients
    for c, k, want in ((0.0, 1.0, 0.0), (1.0, 0.0, 1.0), (0.0, 0.0, 0.0)):
        value, grads = jax.value_and_grad(exposed, argnums=(0, 1))(c, k, SMOOTH)
        assert float(value) == want and all(np.isfinite(g) for g in grads), (c, k, grads)


# ----------------------------------------------------------------- finite differences (x64)

def _step_time_of(model, parallel, system, training, temperature, features):
    # checked=True: every float64 case passes check_inputs (`_x64_features`), so the hard
    # program leaves out the in-program valid_mask (True for them), as sensitivity's
    # elasticities do: the value and every gradient are the same bit for bit, the program
    # compiles ~3x faster (predict_step's docstring; the smooth program keeps the mask).
    return predict_step(model, parallel, system, training, temperature, features,
                        checked=True).step_time_s


@functools.cache
def _x64_value_and_grad(temperature, features):
    """(step time, d step time / d System) of predict_step with the static `features`, jitted
    once per (temperature, features) like _VALUE_AND_GRAD (same compiler options)."""
    return jax.jit(jax.value_and_grad(functools.partial(
        _step_time_of, temperature=temperature, features=features), argnums=2), **_JIT_OPTIONS)


def _log_step_time(model, parallel, system, training, temperature, features):
    """f(log_scale) = ln T(every System leaf x exp(log_scale[i])): O(1) coordinates, so
    check_grads' absolute step of 1e-4 is a relative step of 1e-4 on each leaf, whatever its
    unit (3e14 FLOP/s or 2.5e-6 s). Its derivative is the elasticity d ln T / d ln theta.

    The VJP given to check_grads is the chain rule on the jitted `jax.grad` of predict_step
    (the gradient that sensitivity and calibration use): d f / d s_i = theta_i (d T / d
    theta_i) / T. Letting JAX differentiate through the scaling instead means `jax.vjp` of a
    jitted function, whose transposed program XLA takes minutes to compile on CPU in float64.

    `features` (static): the terms predict_step traces (a superset of the case's
    `features_of`: the terms left out are exactly 0 for the case, test_properties.py::
    test_leaving_out_zero_features_changes_no_result), as sensitivity and calibration trace
    them; `_x64_features` gives each case the union over the float64 cases on a System of the
    same tree, so that they share one compiled program per temperature. XLA compiles a float64
    value-and-gradient program with every feature in 33 s of CPU (two tiers) and 78 s (Meta's
    four tiers), with the union of the cases' features in 22 s and 20 s.
    """
    leaves, treedef = jax.tree.flatten(system)
    base = jnp.stack(leaves)
    value_and_grad = _x64_value_and_grad(temperature, features)

    def evaluate(log_scale):
        theta = base * jnp.exp(log_scale)
        step, grad = value_and_grad(model, parallel, jax.tree.unflatten(treedef, list(theta)),
                                    training)
        return jnp.log(step), jnp.stack(jax.tree.leaves(grad)) * theta / step

    @jax.custom_vjp
    def f(log_scale):
        return evaluate(log_scale)[0]

    def f_bwd(elasticities, cotangent):
        return (cotangent * elasticities,)

    f.defvjp(evaluate, f_bwd)
    return f


# Layouts away from every kink of the hard model: no group fills a network domain exactly
# (D_i / stride strictly inside [1, n]), no pipeline chain ends on a domain boundary, no overlap
# window ties its communication, first and last pipeline stages differ. One case sets
# microbatch_s > 0 so that leaf has an elasticity too (a leaf at 0 has none).
CHECK_GRAD_CASES = {
    # 4 GPUs of one 8-GPU node: TP pairs, DP pairs two ranks apart, ZeRO-1, selective, SP
    "single-node-1.7b-a100": ("megatron-1.7b", "a100-sxm-80gb", dict(
        tp=2, pp=1, dp=2, micro_batch=2, global_batch=32, zero_stage=1, recompute=1,
        sequence_parallel=1), dict(microbatch_s=1e-3)),
    # 32 GPUs inside one NVL72 domain: TP 4, 2 stages, ZeRO-3 DP of 4, full recompute
    "single-domain-llama3-8b-gb200": ("llama3-8b", "gb200-nvl72", dict(
        tp=4, pp=2, dp=4, micro_batch=1, global_batch=64, zero_stage=3, recompute=2,
        sequence_parallel=1, tp_overlap=0.5), {}),
    # 16 GPUs on two nodes: FSDP2 (ZeRO-3 with the all-gather copy-out, one gather per
    # forward and one per backward), fp32 gradient reduce-scatter (grad_bytes 4 below)
    "fsdp2-llama3-8b-h100": ("llama3-8b", "h100-sxm-80gb", dict(
        tp=1, pp=1, dp=16, micro_batch=1, global_batch=32, zero_stage=3, recompute=2,
        zero3_regather=0, zero3_copy_out=1), {}),
    # TorchTitan FSDP2 on 16 GPUs: per-op SAC (wk, wo, w3 and every element-wise op
    # recomputed) with eager fp32 RMSNorm, rotary and repeat_kv (TRAINING_EXTRA)
    "fsdp2-op-sac-eager-llama3-8b-h100": ("llama3-8b", "h100-sxm-80gb", dict(
        tp=1, pp=1, dp=16, micro_batch=2, global_batch=32, zero_stage=3, recompute=1,
        recompute_policy=1, zero3_regather=0, zero3_copy_out=1), {}),
    # 16 GPUs on two nodes: a DP group of 16 spans both tiers (8 x 2), tp = 1
    "multi-node-gpt-small-a100-4nic": ("gpt-small", "a100-4nic", dict(
        tp=1, pp=1, dp=16, micro_batch=2, global_batch=64), {}),
    # 32 GPUs on four nodes: TP inside the node, DP of 4 split 2 x 2, stages across nodes
    "multi-node-llama3-8b-h100": ("llama3-8b", "h100-sxm-80gb", dict(
        tp=4, pp=2, dp=4, micro_batch=1, global_batch=64, zero_stage=3, recompute=2,
        sequence_parallel=1, tp_overlap=0.5), {}),
    # 6144 GPUs on Meta's 4-tier fabric: TP 4 inside the node, DP of 1536 (2 per node, 4 per
    # rack, 768 per pod) across two pods through the 1:7 oversubscribed aggregation layer:
    # every tier's leaves, the oversubscription included, move the step
    "multi-pod-llama3-8b-meta": ("llama3-8b", "meta-h100-24k", dict(
        tp=4, pp=1, dp=1536, micro_batch=1, global_batch=3072, zero_stage=1, recompute=1,
        sequence_parallel=1), {}),
    # 48 GPUs on six nodes: MLA (full-rank queries), 1 dense + 26 MoE layers with shared
    # experts, EP 2 inside a DP of 8 (4 ranks per node), 3 stages; an MTP module on the last
    "mla-moe-mtp-deepseek-v2-lite-h100": ("deepseek-v2-lite+mtp", "h100-sxm-80gb", dict(
        tp=2, pp=3, dp=8, ep=2, micro_batch=1, global_batch=64, zero_stage=1, recompute=1,
        sequence_parallel=1), {}),
    # 32 GPUs: GPT-OSS's 128-token sliding window on half the layers, sinks, biased experts;
    # half of the merged EP schedule's compute usable to hide the all-to-alls
    # (schedule.overlap.ep_merged_1f1b_exposed_s); the flex dispatcher (one copy per target
    # GPU, permuted after the dispatch: workload.flops.moe_permute_bytes)
    "sliding-moe-gpt-oss-20b-h100": ("gpt-oss-20b", "h100-sxm-80gb", dict(
        tp=2, pp=2, dp=8, ep=8, micro_batch=1, global_batch=64, zero_stage=1,
        sequence_parallel=1, ep_overlap=0.5, ep_dispatch=1), {}),
    # 1024 GPUs: DP of 16 with 9 ranks per NVL72 domain, 8 pipeline stages across racks
    "multi-node-gpt3-gb200": ("gpt3-175b", "gb200-nvl72", dict(
        tp=8, pp=8, dp=16, micro_batch=1, global_batch=512, zero_stage=1, recompute=2,
        sequence_parallel=1), {}),
}


# Training facts of a case beyond its precision (the eager element-wise kernels of
# workload.flops.eager_pointwise_bytes).
# The same case ran FlashAttention-2 (TorchTitan 2024-12: attention_fa2, at the H100's FA2 rate,
# costs.compute.attention_kernel_factor) and cuBLAS's persistent Hopper GEMMs beside its FSDP
# collectives (gemm_wave_split, schedule.overlap.overlap_sigma).
TRAINING_EXTRA = {"fsdp2-op-sac-eager-llama3-8b-h100": dict(norm_extra_bytes=32.0,
                                                            llama_eager_pointwise=1.0,
                                                            attention_fa2=1.0,
                                                            gemm_wave_split=1.0)}


# fms-fsdp's selective AC: 40 % of the blocks checkpointed, TP 2 with SP, across nodes
LAYER_FRAC = dict(tp=2, pp=1, dp=8, micro_batch=1, global_batch=32, zero_stage=3, recompute=2,
                  recompute_layer_frac=0.4, sequence_parallel=1, zero3_regather=0)


def test_op_sac_and_eager_kernels_obey_the_physical_signs():
    """Per-op SAC with eager element-wise kernels and FlashAttention-2, and full recompute of
    40 % of the layers (the compiled case keeps its rotary / K-V expansion passes,
    rope_kv_pass; FSDP2's reduce-scatter copy-in in every case with zero3_copy_out): finite
    gradients in every System leaf; more FLOP/s or HBM bandwidth
    (or a faster FA2 kernel, forward and backward) never slows the step;
    the recomputed element-wise work gives HBM bandwidth a larger elasticity than without it.
    (check_grads of the first: CHECK_GRAD_CASES["fsdp2-op-sac-eager-llama3-8b-h100"].)"""
    model_name, system_name, layout, _ = CHECK_GRAD_CASES["fsdp2-op-sac-eager-llama3-8b-h100"]
    model, system, parallel = _model(model_name), _system(system_name), Parallel(**layout)
    eager = Training(grad_bytes=4.0, **TRAINING_EXTRA["fsdp2-op-sac-eager-llama3-8b-h100"])
    elasticity = {}
    for label, training, par in (("eager", eager, parallel),
                                 ("fused", Training(grad_bytes=4.0, rope_kv_pass=1.0),
                                  parallel),
                                 ("layer-frac", Training(), Parallel(**LAYER_FRAC))):
        step, grad = _value_and_grad(model, par, system, training, None)
        bad = {n: float(g) for n, _, g in _named_leaves(grad) if not np.isfinite(g)}
        assert not bad, bad
        fa2 = ("attn_fa2_fwd_frac", "attn_fa2_bwd_frac") if label == "eager" else ()
        for leaf in ("matmul_flops_per_s", "hbm_bandwidth_Bps", "eff.mem_eff", "eff.mm_max",
                     *fa2):
            g = float(functools.reduce(getattr, leaf.split("."), grad))
            assert g < 0, (label, leaf, g)
        if fa2:  # FA2's own half-work is a cost: a later fall-off never speeds the step up
            assert float(grad.attn_fa2_half_flop) > 0, label
        # more compute lost beside the hidden collectives never speeds the step up
        assert float(grad.eff.overlap_slowdown) > 0, label
        elasticity[label] = float(grad.hbm_bandwidth_Bps * system.hbm_bandwidth_Bps / step)
    assert elasticity["eager"] < elasticity["fused"] < 0


def _check_grad_case(case):
    """(model, parallel, system, training) of CHECK_GRAD_CASES[case]."""
    model_name, system_name, layout, eff = CHECK_GRAD_CASES[case]
    system = _system(system_name)
    system = system.replace(eff=system.eff.replace(**eff))
    base, _, extra = model_name.partition("+")  # "+mtp": with one MTP module
    model = _model(base).replace(mtp_layers=1.0) if extra == "mtp" else _model(base)
    fp32_reduce = dict(grad_bytes=4.0) if case.startswith("fsdp2") else {}
    return model, Parallel(**layout), system, Training(**fp32_reduce,
                                                       **TRAINING_EXTRA.get(case, {}))


@pytest.mark.parametrize("temperature", [SMOOTH, None], ids=["smooth", "hard"])
@pytest.mark.parametrize("case", sorted(CHECK_GRAD_CASES))
def test_check_grads_in_log_coordinates(x64, case, temperature):
    """Reverse-mode d ln T / d ln(every System leaf) matches central finite differences
    (float64, check_grads' default tolerance 1e-5), for the smooth and the hard model."""
    specs = _check_grad_case(case)
    model, parallel, system, training = (_floats(x) for x in specs)
    f = _log_step_time(model, parallel, system, training, temperature, _x64_features(*specs))
    log_scale = jnp.zeros(len(jax.tree.leaves(system)))
    assert log_scale.dtype == jnp.float64
    assert np.isfinite(f(log_scale))
    check_grads(f, (log_scale,), order=1, modes=["rev"])


# Low-precision steps (docs/precision.md): FP8 with current scaling on Hopper (the amax pass,
# the weight cache over 4 micro-batches, ZeRO-3 with the FP8 parameter gather) and NVFP4 on
# Blackwell (the FP4 peak), both across nodes, away from kinks.
LOWP_CASES = {
    "fp8-current-llama3-8b-h100": ("llama3-8b", "h100-sxm-80gb", dict(
        tp=4, pp=2, dp=4, micro_batch=1, global_batch=64, zero_stage=3, recompute=1,
        sequence_parallel=1, tp_overlap=0.5), "fp8-current", dict(lowp_param_gather=1.0)),
    "nvfp4-llama3-8b-dgx-b200": ("llama3-8b", "dgx-b200", dict(
        tp=2, pp=2, dp=8, micro_batch=1, global_batch=64, zero_stage=1, recompute=2,
        sequence_parallel=1), "nvfp4", {}),
}


def _lowp_case(case):
    from diffperf.load import training_from_name

    model_name, system_name, layout, precision, over = LOWP_CASES[case]
    return (_model(model_name), Parallel(**layout), _system(system_name),
            training_from_name(precision, **over))


@pytest.mark.parametrize("case", sorted(LOWP_CASES))
def test_check_grads_low_precision(x64, case):
    """d ln T / d ln(every System leaf) of a low-precision step matches finite differences
    (float64), and the peak its GEMMs run at has a negative elasticity."""
    specs = _lowp_case(case)
    model, parallel, system, training = (_floats(x) for x in specs)
    features = _x64_features(*specs)
    f = _log_step_time(model, parallel, system, training, None, features)
    log_scale = jnp.zeros(len(jax.tree.leaves(system)))
    assert np.isfinite(f(log_scale))
    check_grads(f, (log_scale,), order=1, modes=["rev"])
    grad = _x64_value_and_grad(None, features)(model, parallel, system, training)[1]
    peak = "matmul_fp4_flops_per_s" if training.lowp_fp4 > 0 else "matmul_fp8_flops_per_s"
    assert float(getattr(grad, peak)) < 0


@pytest.mark.parametrize("temperature", [None, SMOOTH], ids=["hard", "smooth"])
@pytest.mark.parametrize("case", sorted(LOWP_CASES))
def test_more_low_precision_peak_never_slows_a_step(case, temperature):
    """Finite float32 gradients in every System leaf; d step / d (FP8, FP4, 16-bit peak)
    <= 0; the FP8 / FP4 peak x 1.5 and x 3 never gives a slower step; a bf16 step has no
    gradient in the FP8 / FP4 peaks."""
    model, parallel, system, training = _lowp_case(case)
    grad = _system_grad(model, parallel, system, training, temperature)
    bad = {name: float(g) for name, _, g in _named_leaves(grad) if not np.isfinite(g)}
    assert not bad, f"non-finite d step / d leaf ({case}): {bad}"
    for leaf in ("matmul_flops_per_s", "matmul_fp8_flops_per_s", "matmul_fp4_flops_per_s"):
        assert not float(getattr(grad, leaf)) > 0, (case, leaf)
    base = _value(model, parallel, system, training, temperature)
    for leaf in ("matmul_fp8_flops_per_s", "matmul_fp4_flops_per_s"):
        last = base
        for factor in (1.5, 3.0):
            t = _value(model, parallel, _scale_leaves(system, leaf, factor), training,
                       temperature)
            assert t <= last * (1 + 1e-6), (case, leaf, factor, t, last)
            last = t
    g16 = _system_grad(model, parallel, system, Training(), temperature)
    assert float(g16.matmul_fp8_flops_per_s) == 0 and float(g16.matmul_fp4_flops_per_s) == 0


# One XLA-compiled step (the H100 JAX runs' program, Training.xla_compiled = 1): its own
# terms (queued kernels, stacked residual traffic, remat without the down projection,
# gradient accumulation, fused optimizer) under the same contract. Single GPU, away from kinks.
XLA_CASES = {
    "xla-remat-accumulate": ("llama3-8b", "h100-sxm-80gb", dict(
        micro_batch=1, global_batch=2, recompute=2)),
    "xla-no-remat": ("megatron-1.7b", "h100-sxm-80gb", dict(micro_batch=2, global_batch=4)),
}


def _xla_case(case):
    from diffperf.load import training_from_name

    model_name, system_name, layout = XLA_CASES[case]
    return (_model(model_name), Parallel(**layout), _system(system_name),
            training_from_name("xla-amp-bf16"))


def _x64_cases():
    """(model, parallel, system, training) of every float64 check_grads case."""
    return ([_check_grad_case(c) for c in CHECK_GRAD_CASES] + [_lowp_case(c) for c in LOWP_CASES]
            + [_xla_case(c) for c in XLA_CASES])


@functools.cache
def _x64_features_of_tree(treedef):
    return frozenset().union(*(features_of(m, p, t) for m, p, s, t in _x64_cases()
                               if jax.tree.structure(anonymous(s)) == treedef))


def _x64_features(model, parallel, system, training):
    """The features of the float64 program of a case: the union of `features_of` over the
    float64 cases whose System has the same tree (number of tiers) as this one's, so every
    case on it runs one compiled program per temperature; a superset of the case's own."""
    features = _x64_features_of_tree(jax.tree.structure(anonymous(system)))
    assert features_of(model, parallel, training) <= features <= FEATURES
    check_inputs(model, parallel, system, training)  # the program is compiled checked=True
    return features


@pytest.mark.parametrize("case", sorted(XLA_CASES))
def test_check_grads_xla_program(x64, case):
    """d ln T / d ln(every System leaf) of an XLA step matches finite differences (float64),
    and the queued-kernel time has an elasticity (it is used)."""
    specs = _xla_case(case)
    model, parallel, system, training = (_floats(x) for x in specs)
    features = _x64_features(*specs)
    f = _log_step_time(model, parallel, system, training, None, features)
    log_scale = jnp.zeros(len(jax.tree.leaves(system)))
    check_grads(f, (log_scale,), order=1, modes=["rev"])
    grad = _x64_value_and_grad(None, features)(model, parallel, system, training)[1]
    assert float(grad.eff.queued_kernel_s) > 0


def test_xla_program_uses_queued_kernels_not_kernel_s():
    """Under xla_compiled = 1 the fixed time per kernel is eff.queued_kernel_s (d step > 0)
    and eff.kernel_s and the host floor have no effect (d step = 0); under 0 the converse."""
    from diffperf.load import training_from_name

    model, system = _model("megatron-1.7b"), _system("h100-sxm-80gb")
    parallel = Parallel(micro_batch=1, global_batch=2)
    xla = _system_grad(model, parallel, system, training_from_name("xla-amp-bf16"), None)
    eager = _system_grad(model, parallel, system, training_from_name("amp-bf16"), None)
    assert float(xla.eff.queued_kernel_s) > 0 and float(xla.eff.kernel_s) == 0
    assert float(xla.eff.host_kernel_s) == 0 and float(xla.eff.host_layer_s) == 0
    assert float(eager.eff.queued_kernel_s) == 0 and float(eager.eff.kernel_s) > 0


# ------------------------------------------------------------------------ physical sign


@pytest.mark.parametrize("temperature", [None, SMOOTH], ids=["hard", "smooth"])
@settings(max_examples=25, **HYPOTHESIS)
@given(config=configurations())
def test_faster_hardware_never_slows_a_step(temperature, config):
    """d step / d rate <= 0 and d step / d cost >= 0 (exact 0 allowed), and the finite step:
    every rate x 1.1 (alone, then all together) gives a step time <= the original, every cost
    x 0.9 likewise (1e-6 relative slack for float32 rounding). NaN gradients are
    test_gradient_finite_in_every_system_leaf's failure, not this test's."""
    model, parallel, system = config
    training = Training()
    grad = _system_grad(model, parallel, system, training, temperature)
    named = _named_leaves(grad)
    assert set(HARDWARE_RATES) | {"tiers[*].latency_s"} <= {pattern for _, pattern, _ in named}
    for name, pattern, g in named:
        if pattern in RATE_LEAVES:
            assert not g > 0, f"d step / d {name} = {float(g):.3e} > 0 at {_describe(*config)}"
        if pattern in COST_LEAVES:
            assert not g < 0, f"d step / d {name} = {float(g):.3e} < 0 at {_describe(*config)}"

    base = _value(model, parallel, system, training, temperature)
    faster_all = system
    for patterns, factor in ((RATE_LEAVES, 1.1), (COST_LEAVES, 0.9)):
        for pattern in patterns:
            faster = _scale_leaves(system, pattern, factor)
            faster_all = _scale_leaves(faster_all, pattern, factor)
            t = _value(model, parallel, faster, training, temperature)
            assert t <= base * (1 + 1e-6), (
                f"{pattern} x {factor}: step {t:.6e} s > {base:.6e} s at {_describe(*config)}")
    t = _value(model, parallel, faster_all, training, temperature)
    assert t <= base * (1 + 1e-6), f"all faster: {t:.6e} s > {base:.6e} s"


@settings(max_examples=20, **HYPOTHESIS)
@given(config=configurations())
def test_more_capacity_never_unfits(config):
    """More HBM capacity (or a larger usable fraction) keeps a fitting layout fitting, raises
    the fit margin and does not change the bytes it needs; more bandwidth does not change
    memory either."""
    model, parallel, system = config
    r = predict(model, parallel, system)
    bigger = [system.replace(hbm_capacity_bytes=system.hbm_capacity_bytes * 1.1),
              system.replace(eff=system.eff.replace(
                  mem_usable_frac=min(1.0, system.eff.mem_usable_frac * 1.05)))]
    for s in bigger:
        r2 = predict(model, parallel, s)
        assert r2.memory.capacity_bytes >= r.memory.capacity_bytes
        assert float(r2.memory.total_bytes) == float(r.memory.total_bytes)
        assert float(r2.fit_margin_frac) >= float(r.fit_margin_frac)
        if r.fits:
            assert r2.fits, f"fits on {system.name}, not with more capacity: {_describe(*config)}"
    faster = _scale_leaves(system, "hbm_bandwidth_Bps", 1.1)
    assert float(predict(model, parallel, faster).memory.total_bytes) == float(
        r.memory.total_bytes)


# ------------------------------------------------------------------- float32 vs float64

PRECISION_CASES = [
    ("gpt-small", "a100-sxm-80gb", dict(tp=1, dp=1, micro_batch=4, global_batch=32)),
    ("megatron-1.7b", "a100-4nic", dict(tp=2, pp=2, dp=8, micro_batch=2, global_batch=256,
                                        zero_stage=1, recompute=2)),
    ("llama3-8b", "h100-sxm-80gb", dict(tp=8, pp=1, dp=16, micro_batch=1, global_batch=128,
                                        zero_stage=3, sequence_parallel=1)),
    ("gpt3-175b", "gb200-nvl72", dict(tp=8, pp=16, dp=8, micro_batch=1, global_batch=1024,
                                      zero_stage=1, recompute=1, sequence_parallel=1)),
]


def test_float32_matches_float64(request):
    """Step time and total memory of the float32 default equal the float64 run within 1e-5
    relative (DESIGN.md), single- and multi-node, every pipeline/ZeRO regime above."""
    cases = [(_model(m), Parallel(**layout), _system(s)) for m, s, layout in PRECISION_CASES]
    f32 = [predict(*c) for c in cases]
    request.getfixturevalue("x64")
    f64 = [predict(*c) for c in cases]
    for (model, parallel, system), r32, r64 in zip(cases, f32, f64):
        assert r32.step_time_s.dtype == jnp.float32 and r64.step_time_s.dtype == jnp.float64
        where = _describe(model, parallel, system)
        np.testing.assert_allclose(float(r32.step_time_s), float(r64.step_time_s), rtol=1e-5,
                                   err_msg=f"step time, {where}")
        np.testing.assert_allclose(float(r32.memory.total_bytes), float(r64.memory.total_bytes),
                                   rtol=1e-5, err_msg=f"memory, {where}")
        assert bool(r32.fits) == bool(r64.fits)


# -------------------------------------------------------------------- smooth -> hard

@pytest.mark.parametrize("model_name, system_name, layout", [
    # TP all-reduces of one node fully overlappable with the GEMMs: comm and window are close
    ("megatron-1.7b", "a100-sxm-80gb", dict(tp=8, pp=1, dp=1, micro_batch=1, global_batch=8,
                                           tp_overlap=1.0)),
    # ZeRO-3 gathers across 8 nodes prefetched behind each layer: comm and window are close
    ("llama3-8b", "a100-4nic", dict(tp=8, pp=1, dp=8, micro_batch=1, global_batch=8,
                                   zero_stage=3)),
], ids=["single-node", "multi-node"])
def test_smooth_converges_to_hard(model_name, system_name, layout):
    """|T(temperature) - T_hard| / T_hard falls as the temperature falls (0.1, 0.01, 0.001),
    the last within 1e-3. The configurations have overlap windows close to their
    communication, so the smoothing shows at 0.1 (errors there > 1e-4). Everything runs
    eagerly (jax.disable_jit): the temperature is a static argument, so jitting would cost one
    compilation per temperature, and hard and smooth then run the very same float32 ops except
    for the smoothed maxima (a smoothed max whose arguments are far apart gives exactly the
    hard value, error 0)."""
    model, system, parallel = _model(model_name), _system(system_name), Parallel(**layout)
    with jax.disable_jit():
        hard = float(predict(model, parallel, system).step_time_s)
        errors = [abs(float(predict(model, parallel, system, temperature=t).step_time_s) - hard)
                  / hard for t in (0.1, 0.01, 0.001)]
    assert errors[0] > 1e-4, errors  # the smoothing is exercised
    assert errors[0] > errors[1] >= errors[2], errors
    assert errors[2] < 1e-3, errors
