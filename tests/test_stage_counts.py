"""The three candidate pipeline stages (diffperf/workload/stages.py) and the one rule behind
them: `workload.pp.stage_layers` (JAX) and its numpy twin `specs.validate.stage_counts` agree;
what each candidate holds (layers, position, embedding, output layer) is the module
docstring's table; schedule, parameters and memory read it from there."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from diffperf import Model, Parallel, load_model, load_system
from diffperf.load import training_from_name
from diffperf.memory.device import device_memory, gathered_buffer_bytes
from diffperf.memory.xla import xla_device_memory
from diffperf.schedule.pipeline import critical_stage, stage_times_s
from diffperf.specs.validate import stage_counts
from diffperf.workload.params import (active_ffn_width, residual_shards,
                                      stage_expert_params_per_device, stage_params_per_device)
from diffperf.workload.pp import stage_layers
from diffperf.workload.stages import at_largest, each, pipeline_stages

TINY = Model(n_layers=8, hidden=64, ffn_hidden=256, n_heads=4, n_kv_heads=4, head_dim=16,
             vocab=100, seq_len=8)


def _grid():
    """(L, p, first, last): auto splits of L on p stages (even and uneven, p = 1 and 2) and
    given first / last counts that leave every middle stage >= 0 layers (p = 2: they add up
    to L, as check_layout requires)."""
    rows = []
    for L in (*range(1, 41), 61, 80, 96, 97, 126):
        for p in range(1, min(L, 24) + 1):
            rows.append((L, p, 0, 0))
            if p == 2:
                rows += [(L, 2, f, L - f) for f in range(1, L)]
            elif p > 2:
                rows += [(L, p, f, l) for f, l in itertools.product((1, 2, 3, 5), (1, 2, 4, 7))
                         if f + l <= L]
    return np.array(rows, dtype=np.float64).T


def test_stage_counts_is_the_twin_of_stage_layers():
    """Over the grid (every L <= 40 on every p <= L, a few larger models, given counts): the
    numpy twin returns stage_layers' (first, largest middle, last) exactly, p = 1 (all L) and
    p = 2 (no middle) included; the smallest middle differs from the largest by at most one
    layer and the middles add up to the layers left over."""
    L, p, f, l = _grid()
    assert {1.0, 2.0} <= set(p) and np.any(L % np.maximum(p, 1) != 0)  # the edge cases are in
    par = Parallel(pp=jnp.asarray(p, jnp.float32), pp_first_layers=jnp.asarray(f, jnp.float32),
                   pp_last_layers=jnp.asarray(l, jnp.float32))
    want = np.stack([np.asarray(x) for x in stage_layers(
        TINY.replace(n_layers=jnp.asarray(L, jnp.float32)), par)])
    first, mid_min, mid_max, last = stage_counts(
        dict(pp=p, pp_first_layers=f, pp_last_layers=l), dict(n_layers=L))
    np.testing.assert_array_equal(np.stack([first, mid_max, last]), want)
    middles = p > 2
    rest = (L - first - last)[middles]
    assert np.all(mid_max - mid_min <= 1) and np.all(mid_min[middles] >= 0)
    assert np.all(mid_min[middles] * (p[middles] - 2) <= rest)
    assert np.all(mid_max[middles] * (p[middles] - 2) >= rest)
    assert np.all((mid_min == L)[p == 1]) and np.all((mid_max == 0)[p == 2])


def test_pipeline_stages_table():
    """The module docstring's examples: Llama 3 405B, 126 layers on 16 stages, and the
    degenerate p = 1 (one stage holds all) and p = 2 (no middle stage)."""
    model = TINY.replace(n_layers=126)
    got = pipeline_stages(model, Parallel(pp=16))
    assert [list(map(float, x)) for x in (got.layers, got.position, got.embedding,
                                          got.output)] == [[7, 8, 7], [0, 1, 15], [1, 0, 0],
                                                           [0, 0, 1]]
    one = pipeline_stages(model, Parallel(pp=1))
    assert [list(map(float, x)) for x in (one.layers, one.position, one.embedding,
                                          one.output)] == [[126] * 3, [0] * 3, [1] * 3, [1] * 3]
    two = pipeline_stages(model, Parallel(pp=2))
    assert [list(map(float, x)) for x in (two.layers, two.position, two.embedding,
                                          two.output)] == [[63, 0, 63], [0, 1, 1], [1, 0, 0],
                                                           [0, 0, 1]]


def test_pipeline_stages_batched_leaves_keep_the_stage_axis_first():
    par = Parallel(pp=jnp.array([1.0, 2.0, 4.0]))
    got = pipeline_stages(TINY, par)
    layers = each(lambda n: n, got.layers)
    output = each(lambda o: o, got.output)
    assert layers.shape == output.shape == (3, 3)          # (candidate, batch)
    np.testing.assert_array_equal(layers[:, 2], [2, 2, 2])
    np.testing.assert_array_equal(output[:, 0], [1, 1, 1])


def test_each_and_at_largest_docstrings():
    # each: f per candidate, stacked on a leading axis of 3
    np.testing.assert_array_equal(np.asarray(each(lambda a, b: a * b, (1.0, 2.0, 3.0),
                                                  jnp.array([4.0, 5.0, 6.0]))), [4, 10, 18])
    # at_largest: key (3, 5, 5), v (10, 20, 30) -> 20 (the first of the equal largest)
    pick = at_largest(jnp.array([3.0, 5.0, 5.0]))
    assert float(pick(jnp.array([10.0, 20.0, 30.0]))) == 20.0
    assert float(pick((10.0, 20.0, 30.0))) == 20.0
    # its gradient goes to the one selected entry, finite where all candidates tie (p = 1)
    g = jax.grad(lambda t: at_largest(t)(t))(jnp.array([2.0, 2.0, 2.0]))
    np.testing.assert_array_equal(np.asarray(g), [1.0, 0.0, 0.0])


def test_stage_times_and_critical_stage_read_the_stages():
    """stage_times_s: t_i = n_i t + [emb_i] e_f + [out_i] e_l; p = 1: every candidate is the
    one stage (L t + e_f + e_l) and the critical one holds both extras; p = 2: the middle
    candidate is empty (0 s) and never the critical one."""
    t, e_f, e_l = 1.0, 0.25, 0.5
    one = pipeline_stages(TINY, Parallel(pp=1))
    times, total = stage_times_s(jnp.asarray(t), one, 8.0, e_f, e_l)
    np.testing.assert_array_equal(np.asarray(times), [8.75] * 3)
    assert float(total) == 8.75
    assert tuple(map(float, critical_stage(times, one))) == (8.0, 1.0, 1.0)
    two = pipeline_stages(TINY.replace(n_layers=7), Parallel(pp=2))   # (4, 0, 3)
    times, total = stage_times_s(jnp.asarray(t), two, 7.0, e_f, e_l)
    np.testing.assert_array_equal(np.asarray(times), [4.25, 0.0, 3.5])
    assert float(total) == 7.75
    assert tuple(map(float, critical_stage(times, two))) == (4.0, 1.0, 0.0)
    # A heavier output layer makes the last stage the slowest: 3 + 1.5 > 4 + 0.25.
    times, _ = stage_times_s(jnp.asarray(t), two, 7.0, e_f, 1.5)
    assert tuple(map(float, critical_stage(times, two))) == (3.0, 0.0, 1.0)


def test_stage_params_docstring_example():
    """Llama 3 8B (V 128256, h 4096, untied), 32 layers on p = 4, t = 1: first 8 N_l + V h,
    middle 8 N_l, last 8 N_l + V h; p = 1: 32 N_l + 2 V h (one stage holds both)."""
    model = load_model("llama3-8b")
    par = Parallel(pp=4)
    got = np.asarray(stage_params_per_device(model, par, pipeline_stages(model, par)),
                     np.float64)
    Vh = 128256 * 4096
    n_l = got[1] / 8
    np.testing.assert_allclose(got, [8 * n_l + Vh, 8 * n_l, 8 * n_l + Vh], rtol=1e-6)
    one = np.asarray(stage_params_per_device(model, Parallel(), pipeline_stages(
        model, Parallel())), np.float64)
    np.testing.assert_allclose(one, [32 * n_l + 2 * Vh] * 3, rtol=1e-6)


def test_moe_widths_and_expert_params_docstring_examples():
    """Mixtral 8x7B: f' = k C_f f_e = 2 x 1 x 14336; 8 layers' experts on t 2, e 8:
    8 x 8 x 3 x 4096 x 14336 / 16 = 704.6e6 (stage_expert_params_per_device)."""
    model = load_model("mixtral-8x7b")
    assert float(active_ffn_width(model)) == 2 * 14336
    assert float(active_ffn_width(load_model("llama3-8b"))) == 14336
    got = stage_expert_params_per_device(model, Parallel(tp=2, ep=8, dp=8), 8.0)
    assert float(got) == pytest.approx(8 * 8 * 3 * 4096 * 14336 / 16, rel=1e-6)


def test_residual_shards():
    """t_sp = t with sequence parallelism (Korthikanti et al. 2022), x G_x on the AxoNN grid."""
    assert float(residual_shards(Parallel(tp=8, sequence_parallel=1))) == 8
    assert float(residual_shards(Parallel(tp=8))) == 1
    assert float(residual_shards(Parallel(gx=2, gy=2))) == 2


def test_gathered_buffer_axonn_example():
    """gathered_buffer_bytes docstring: G_x = G_y = 2, G_z = 4, q_w = 2: two layers' blocks,
    2 x N_mat x 2 / 4 bytes, N_mat = one layer's matrix weights (4 h^2 attention + 8 h^2
    MLP for the GPT-style TINY: 12 x 64^2)."""
    train = training_from_name("bf16")
    got = gathered_buffer_bytes(TINY, Parallel(gx=2, gy=2, gz=4), train)
    n_mat = 12 * 64 ** 2
    assert float(got) == pytest.approx(2 * n_mat * float(train.weight_bytes) / 4, rel=1e-6)
    assert float(gathered_buffer_bytes(TINY, Parallel(gx=2, gy=2), train)) == 0.0


@pytest.mark.parametrize("memory_fn", [device_memory, xla_device_memory])
def test_memory_takes_the_callers_stages(memory_fn):
    """Passing the stages (computed once by the caller) gives the same memory as letting the
    memory model compute them."""
    model, system = load_model("llama3-8b"), load_system("h100-sxm-80gb")
    par = Parallel(tp=2, pp=3, dp=1, micro_batch=1, global_batch=6)
    train = training_from_name("xla-amp-bf16")
    a = memory_fn(model, par, system, train)
    b = memory_fn(model, par, system, train, pipeline_stages(model, par))
    for x, y in zip(a.__dict__.values(), b.__dict__.values()):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_slowest_stage_time_gradient_is_finite_at_a_tie():
    """pipeline_times_s at p = 1 (three equal candidates): the derivative of the busy time
    m t_max is m on the first candidate, 0 on the others; 1 of 2 when two tie."""
    from diffperf.schedule.pipeline import pipeline_times_s
    par = Parallel(micro_batch=1, global_batch=4)
    g = jax.grad(lambda t: pipeline_times_s(t, jnp.sum(t), par)[0])(jnp.array([2.0, 2.0, 2.0]))
    np.testing.assert_array_equal(np.asarray(g), [4.0, 0.0, 0.0])
    g = jax.grad(lambda t: pipeline_times_s(t, jnp.sum(t), par)[0])(jnp.array([1.0, 3.0, 3.0]))
    np.testing.assert_array_equal(np.asarray(g), [0.0, 4.0, 0.0])
