"""ZeRO-3 / FSDP at scale and HSDP (issue 13 part 1, issue 14 item 1): per-micro-batch gathers
and reduce-scatters per pass, the recompute pass, prefetch windows, shard and replica groups,
buffers, and the communication floor that data parallelism cannot scale past."""

from __future__ import annotations

import numpy as np
import pytest

from diffperf import Parallel, Training, load_model, load_system, predict
from diffperf.costs.collectives import ring_group, ring_phase_calls_s, ring_phase_s
from diffperf.memory.device import zero3_buffer_bytes
from diffperf.predict import _dp_times
from diffperf.schedule.overlap import (dp_step_exposed_s, zero3_layer_exposed_s,
                                       zero3_microbatch_edge_s)
from diffperf.workload.dp import zero3_prefetch_frac, zero_groups
from diffperf.workload.params import layer_params_per_device

BF16 = Training()
GPT3 = load_model("gpt3-175b")
A100 = load_system("a100-sxm-80gb")


def _floats(xs):
    return [float(x) for x in xs]


def test_zero3_layer_exposure_docstring():
    # AG 30 ms, RS 30 ms, K_f 20 ms, K_b 60 ms, two gathers in the backward (recompute):
    # forward max(30 - 20, 0) = 10 ms; backward C_b = 2 x 30 + 30 = 90 ms, 90 - 60 = 30 ms.
    e_f, h_f, e_b, h_b = _floats(zero3_layer_exposed_s(0.030, 0.030, 0.020, 0.060, 1.0, 2.0, 1.0))
    np.testing.assert_allclose([e_f, h_f, e_b, h_b], [0.010, 0.020, 0.030, 0.060], rtol=1e-6)
    # Prefetch f = 0.25: 75 % of each gather waits on the critical path: forward
    # max(10, 0.75 x 30) = 22.5 ms, backward max(30, 0.75 x 60) = 45 ms.
    e_f, _, e_b, _ = _floats(zero3_layer_exposed_s(0.030, 0.030, 0.020, 0.060, 0.25, 2.0, 1.0))
    np.testing.assert_allclose([e_f, e_b], [0.0225, 0.045], rtol=1e-6)
    # dp_overlap = 0: everything exposed.
    e_f, h_f, e_b, h_b = _floats(zero3_layer_exposed_s(0.030, 0.030, 0.020, 0.060, 1.0, 2.0, 0.0))
    np.testing.assert_allclose([e_f, h_f, e_b, h_b], [0.030, 0.0, 0.090, 0.0], rtol=1e-6)


def test_microbatch_edge_and_split_calls_docstrings():
    # schedule.overlap.zero3_microbatch_edge_s: H_f 20 ms + min(RS 30 ms, H_b 60 ms) = 50 ms;
    # a backward that hid less than the reduce-scatter moves only what it hid.
    np.testing.assert_allclose(float(zero3_microbatch_edge_s(0.020, 0.060, 0.030)), 0.050,
                               rtol=1e-6)
    np.testing.assert_allclose(float(zero3_microbatch_edge_s(0.0, 0.010, 0.030)), 0.010,
                               rtol=1e-6)
    # costs.collectives.ring_phase_calls_s: 2 calls, t0 20 us, A 35 us, S B 1 ms -> 1.11 ms.
    ring = ring_group(2.0, 1.0, A100)._replace(latency_s=35e-6, s_per_byte=1e-12,
                                                 base_s=20e-6)
    np.testing.assert_allclose(float(ring_phase_calls_s(ring, 1e9, 1.0, 1.0, 2.0)), 1.11e-3,
                               rtol=1e-6)
    # one call is ring_phase_s itself; a group of one rank pays nothing
    np.testing.assert_allclose(float(ring_phase_calls_s(ring, 1e9, 2.0, 2.0, 1.0)),
                               float(ring_phase_s(ring, 1e9, 2.0, 2.0)), rtol=1e-7)
    lone = ring._replace(active=0.0)
    assert float(ring_phase_calls_s(lone, 1e9, 1.0, 1.0, 4.0)) == 0.0


def test_prefetch_fraction_shard_groups_and_buffers_docstrings():
    # workload.dp.zero3_prefetch_frac: W = 5e7 (DeepSpeed's default bucket), GPT-3 layer / 8
    layer = 1.81e9 / 8
    f = float(zero3_prefetch_frac(Parallel(zero3_prefetch_params=5e7), layer))
    np.testing.assert_allclose(f, 5e7 / layer, rtol=1e-6)                    # 0.22
    assert float(zero3_prefetch_frac(Parallel(), layer)) == 1.0                # FSDP: whole layer
    # workload.dp.zero_groups: 64 ranks 8 apart, shard groups of 8 -> (8, 8) and (8, 64)
    (g, s_g), (r, s_r) = zero_groups(64.0, 8.0, Parallel(zero_shard=8, zero_stage=1))
    assert _floats((g, s_g, r, s_r)) == [8.0, 8.0, 8.0, 64.0]
    # ... and at ZeRO 0 nothing is sharded: the whole group, zero_shard inert (review14d)
    (g, _), (r, _) = zero_groups(64.0, 8.0, Parallel(zero_shard=8))
    assert _floats((g, r)) == [64.0, 1.0]
    (g, _), (r, _) = zero_groups(64.0, 8.0, Parallel())                        # 0: all of them
    assert _floats((g, r)) == [64.0, 1.0]
    # memory.device.zero3_buffer_bytes: (1 + f) N q_w + N q_g = 3 x 0.226 GB x 2 B
    np.testing.assert_allclose(float(zero3_buffer_bytes(layer, Parallel(), BF16)),
                               layer * (2 * 2 + 2), rtol=1e-6)


def test_zero3_per_layer_collectives_by_hand():
    """One layer's gather and reduce-scatter: ring phases (PAPERS.md 5.5, 5.9) of the layer's
    parameters (q_w = 2) and gradients (q_g = 2) over the d ranks, one call each (FSDP)."""
    par = Parallel(dp=256, micro_batch=4, global_batch=1024, zero_stage=3, recompute=2)
    dp = _dp_times(GPT3, par, A100, BF16)
    ring = ring_group(256.0, 1.0, A100)
    layer = float(layer_params_per_device(GPT3, par))
    np.testing.assert_allclose(float(dp["layer_gather_s"]),
                               float(ring_phase_s(ring, layer * 2.0, 1.0, 1.0)), rtol=1e-6)
    np.testing.assert_allclose(float(dp["layer_reduce_s"]),
                               float(ring_phase_s(ring, layer * 2.0, 1.0, 1.0)), rtol=1e-6)
    # DeepSpeed-style sub-module calls: 4 calls pay 4 fixed costs and latencies, bytes once.
    four = _dp_times(GPT3, par.replace(zero3_calls_per_layer=4), A100, BF16)
    extra = 3 * (float(ring.base_s) + float(ring.latency_s))
    np.testing.assert_allclose(float(four["layer_gather_s"]) - float(dp["layer_gather_s"]),
                               extra, rtol=1e-5)


def _fsdp(d, B=1024, **facts):
    par = Parallel(dp=d, micro_batch=B // d, global_batch=B, zero_stage=3, recompute=2, **facts)
    return predict(GPT3, par, A100)


def test_zero3_data_parallel_floor_at_fixed_batch():
    """Issue 13: GPT-3 175B, FSDP over d ranks only, global batch fixed at 1024 sequences, one
    micro-batch per rank per step (m = 1, b = 1024 / d). Per step every rank gathers each
    layer's weights in the forward, twice in the backward (full recompute re-gathers) and
    reduce-scatters its gradients: 96 x (3 AG + RS) of the whole 3.6 GB layer, whatever d. The
    compute halves with d, that volume does not: doubling d from 512 to 1024 must not halve
    the step, and the step never undercuts its communication (the scaling-book bound)."""
    r512, r1024 = _fsdp(512), _fsdp(1024)
    dp = _dp_times(GPT3, Parallel(dp=1024, micro_batch=1, global_batch=1024, zero_stage=3,
                                  recompute=2), A100, BF16)
    floor = 96 * (3 * float(dp["layer_gather_s"]) + float(dp["layer_reduce_s"]))
    t512, t1024 = float(r512.step_time_s), float(r1024.step_time_s)
    assert t1024 > 0.55 * t512, (t512, t1024)
    assert t1024 >= floor
    comm = float(r1024.breakdown.dp_exposed_s + r1024.breakdown.dp_hidden_s)
    np.testing.assert_allclose(comm, floor, rtol=1e-4)  # all of it, hidden or not, per step
    # Far from the floor (d = 128, 8 sequences per rank) the same doubling nearly halves it.
    t128, t256 = float(_fsdp(128).step_time_s), float(_fsdp(256).step_time_s)
    assert t256 < 0.53 * t128


def test_deepspeed_prefetch_and_regather_cost_time():
    """DeepSpeed ZeRO-3 (2021) vs PyTorch FSDP, framework facts: a 5e7-element prefetch bucket
    leaves most of a 1.8e9-parameter layer's gathers on the critical path, and full recompute
    gathering the layer again adds a gather; both only slow a step, and the exposed part of
    each gather is at least (1 - f) of it."""
    fsdp = _fsdp(256, zero3_regather=0)
    regather = _fsdp(256, zero3_regather=1)
    deepspeed = _fsdp(256, zero3_regather=1, zero3_prefetch_params=5e7)
    t = [float(r.step_time_s) for r in (fsdp, regather, deepspeed)]
    assert t[0] <= t[1] < t[2], t  # 4 sequences per rank: compute hides the third gather
    # At one sequence per rank the communication is exposed: the third gather costs time.
    assert float(_fsdp(1024, zero3_regather=0).step_time_s) < float(_fsdp(1024).step_time_s)
    par = Parallel(dp=256, micro_batch=4, global_batch=1024, zero_stage=3, recompute=2,
                   zero3_prefetch_params=5e7)
    dp = _dp_times(GPT3, par, A100, BF16)
    f = float(dp["prefetch"])
    wait = 96 * (1 - f) * 3 * float(dp["layer_gather_s"])  # 3 gathers per layer, m = 1
    assert float(deepspeed.breakdown.dp_exposed_s) >= wait


def test_hsdp_shards_inside_the_node_and_replicates_across():
    """HSDP (zero_shard = 8, the 8 GPUs of a node): weights are gathered over NVLink only,
    so the per-layer collectives are far cheaper than FSDP over all 256 ranks, at the price
    of 32x more model-state memory (sharded over 8 instead of 256) and an all-reduce of the
    1/8 gradient shard across the 32 replicas."""
    full = Parallel(dp=256, micro_batch=4, global_batch=1024, zero_stage=3, recompute=2)
    hsdp = full.replace(zero_shard=8)
    t_full, t_hsdp = _dp_times(GPT3, full, A100, BF16), _dp_times(GPT3, hsdp, A100, BF16)
    assert float(t_hsdp["layer_gather_s"]) < 0.5 * float(t_full["layer_gather_s"])
    m_full, m_hsdp = predict(GPT3, full, A100).memory, predict(GPT3, hsdp, A100).memory
    np.testing.assert_allclose(float(m_hsdp.optimizer_bytes), 32 * float(m_full.optimizer_bytes),
                               rtol=1e-5)
    # The replicas' all-reduce of the 1/8 shard (2 phases over 32 ranks 8 apart) is in the
    # per-layer reduce: the difference from RS alone over the node.
    layer = float(layer_params_per_device(GPT3, hsdp))
    node, repl = ring_group(8.0, 1.0, A100), ring_group(32.0, 8.0, A100)
    want = float(ring_phase_s(node, layer * 2, 1.0, 1.0)) + float(
        ring_phase_s(repl, layer * 2 / 8, 2.0, 2.0))
    np.testing.assert_allclose(float(t_hsdp["layer_reduce_s"]), want, rtol=1e-5)


def test_zero2_reduces_every_micro_batch():
    """ZeRO-2 keeps gradients sharded, so each micro-batch's backward reduce-scatters them
    (DeepSpeed stage 2, FSDP SHARD_GRAD_OP); ZeRO-1 reduces once per step. With nothing
    hidden (dp_overlap = 0) the exposed reduction is m times the per-step one."""
    for z, times in ((1, 1.0), (2, 8.0)):
        par = Parallel(dp=8, micro_batch=1, global_batch=64, zero_stage=z, dp_overlap=0)
        e, h = dp_step_exposed_s(0.5, 0.1, 1.0, par)
        np.testing.assert_allclose([float(e), float(h)], [times * 0.5 + 0.1, 0.0], atol=1e-9)


@pytest.mark.parametrize("d", [64, 512])
def test_zero3_breakdown_accounts_for_every_collective(d):
    """Exposed + hidden DP time = m L (3 AG + RS) (every collective once, the first gather and
    last reduce-scatter of each micro-batch exposed, not counted twice); parts sum to the step."""
    from diffperf.result import EXPOSED_PARTS

    r = _fsdp(d)
    b = r.breakdown
    m = 1024 / d / (1024 // d)  # one micro-batch per rank per step
    par = Parallel(dp=d, micro_batch=1024 // d, global_batch=1024, zero_stage=3, recompute=2)
    dp = _dp_times(GPT3, par, A100, BF16)
    want = m * 96 * (3 * float(dp["layer_gather_s"]) + float(dp["layer_reduce_s"]))
    np.testing.assert_allclose(float(b.dp_exposed_s + b.dp_hidden_s), want, rtol=1e-5)
    total = sum(float(getattr(b, k)) for k in EXPOSED_PARTS)
    np.testing.assert_allclose(total, float(r.step_time_s), rtol=1e-5)
    assert float(b.dp_exposed_s) > 0 and float(b.dp_hidden_s) >= 0


def test_nonlayer_units_at_the_memory_peak_by_hand():
    """memory.device.nonlayer_unit_bytes, Llama 3 8B (V h = 128256 x 4096 = 525,336,576; N_l =
    218,112,000), t = 1, q_w = 2, q_g = 4 (TorchTitan's fp32 reduce), FSDP f = 1. Root unit
    (Psi_r = 2 V h): start X = 2 Psi_r + 2 V h, end Y = 6 Psi_r; the end wins unless the
    micro-batch frees more than Y - X = 3.152 GB (slack). Without the fact, any ZeRO-3: the
    output unit in place of a layer's, X = 6 V h + 2 N_l - 8 N_l, end Y = 6 V h (embedding),
    less the room a larger working layer leaves. Two stages: the first holds the embedding,
    the last the output."""
    import jax
    import jax.numpy as jnp

    from diffperf import training
    from diffperf.memory.device import nonlayer_unit_bytes
    from diffperf.workload.params import stage_params_per_device
    from diffperf.workload.stages import pipeline_stages

    model, tb = load_model("llama3-8b"), training("bf16").replace(grad_bytes=4.0)
    vh, n_l = 128256 * 4096, 218_112_000

    def run(par, slack, room=0.0, m=model):
        st = pipeline_stages(m, par)
        return np.asarray(nonlayer_unit_bytes(m, par, tb, st,
                                              stage_params_per_device(m, par, st),
                                              jnp.full(3, slack), room))

    root = Parallel(dp=8, zero_stage=3, zero3_root_unit=1)
    x_root, y_root = 2 * vh * 2 + vh * 2, 2 * vh * 6              # 3.152 / 6.304 GB
    np.testing.assert_allclose(run(root, 0.0), [y_root] * 3, rtol=1e-6)
    np.testing.assert_allclose(run(root, 10e9), [x_root] * 3, rtol=1e-6)
    off = root.replace(zero3_root_unit=0)
    x_def = vh * 6 + n_l * 2 - n_l * (2 * 2 + 4)                  # 1,843,347,456
    assert x_def == 1_843_347_456
    np.testing.assert_allclose(run(off, 10e9), [x_def] * 3, rtol=1e-6)
    np.testing.assert_allclose(run(off, 1e9), [x_def + (6 * vh - x_def - 1e9)] * 3, rtol=1e-6)
    # a working layer 1 GB above the loss's buffers hides 1 GB of the output unit's excess;
    # the root unit, held throughout, hides nowhere
    np.testing.assert_allclose(run(off, 10e9, 1e9), [x_def - 1e9] * 3, rtol=1e-6)
    np.testing.assert_allclose(run(root, 10e9, 1e9), [x_root] * 3, rtol=1e-6)
    # tied embeddings (p = 1): the output's gradient, V h q_w = 1.051 GB, waits for the
    # embedding's in the one AccumulateGrad, through the layers' backward: no room hides it
    tied = model.replace(tied_embeddings=1.0)
    np.testing.assert_allclose(run(off, 10e9, 1e9, tied), [2 * vh] * 3, rtol=1e-6)
    np.testing.assert_allclose(run(off, 10e9, 0.0, tied), [x_def] * 3, rtol=1e-6)
    two_off = Parallel(dp=4, pp=2, zero_stage=3)                  # own copies: nothing held
    np.testing.assert_allclose(run(two_off, 10e9, 1e9, tied), run(two_off, 10e9, 1e9),
                               rtol=1e-6)
    assert np.all(run(off.replace(zero_stage=1), 0.0) == 0.0)     # below ZeRO-3: nothing
    two = Parallel(dp=4, pp=2, zero_stage=3, zero3_root_unit=1)    # (first, no middle, last)
    np.testing.assert_allclose(run(two, 10e9), [2 * vh, 0.0, 4 * vh], rtol=1e-6)
    np.testing.assert_allclose(run(two.replace(zero3_root_unit=0), 0.0),
                               [6 * vh, 0.0, x_def], rtol=1e-6)
    # physical sign: a larger vocabulary holds more; d X / d V = (2 q_w + q_w) h per stage
    # (float32 gradient of the function alone, no new program)
    def held(v):
        m = model.replace(vocab=v)
        st = pipeline_stages(m, root)
        return nonlayer_unit_bytes(m, root, tb, st, stage_params_per_device(m, root, st),
                                   jnp.full(3, 10e9)).sum()

    g = float(jax.grad(held)(128256.0))
    assert np.isfinite(g) and g == pytest.approx(3 * 6 * 4096, rel=1e-5)
