"""Transformer Engine's userbuffers TP overlap as Megatron-Bridge's FP8 configurations run it
(Parallel.tp_userbuffers; schedule.overlap.tp_userbuffers_block_s, workload.tp.tp_ub_*,
predict._tp_userbuffers_parts; docs/accuracy-bridge.md "Session 12: TP overlap as userbuffers
runs it"). Expected values are the docstrings' arithmetic, worked by hand. No predict_step is
compiled here: the layer is evaluated eagerly.
"""

from __future__ import annotations

import csv
import importlib
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import diffperf
from diffperf import Parallel
from diffperf.costs.collectives import all_gather_s, reduce_scatter_s
from diffperf.costs.compute import layer_pass_gemm_times_s, memory_time_s
from diffperf.schedule.overlap import (UB_PIPE_SPLITS, tp_pipeline_rs_s, tp_userbuffers_block_s,
                                       ub_pipe_sm_margin)
from diffperf.specs.parallel import UB_PIPE_COMM_SMS
from diffperf.workload.flops import layer_ops
from diffperf.workload.groups import stride
from diffperf.workload.tp import tp_ub_message_bytes, tp_ub_reduce_bytes, tp_ub_scale_bytes
from shipped import model as _model, system as _system

pr = importlib.import_module("diffperf.predict")  # the module, not diffperf.predict()

FP8 = diffperf.training("fp8-current")
MX = diffperf.training("mxfp8")
L405 = _model("llama3.1-405b")
# DGX-H100 Llama 3.1 405B (Bridge 25.09-26.06): TP 8, PP 8, CP 2, VP 8, MBS 1, SP
H100_405 = Parallel(tp=8.0, pp=8.0, cp=2.0, vp=8.0, dp=8.0, micro_batch=1.0,
                    global_batch=512.0, sequence_parallel=1.0)
# the docstring example (ms -> s): t, AG_f, AG_b, RS, AG_w, R, G_c, G_r, D_c, W_c, D_r
EXAMPLE = (0.6e-3, 0.6e-3, 1.2e-3, 0.0, 0.05e-3, 1.6e-3, 1.2e-3, 1.6e-3, 1.6e-3, 1.2e-3)


def test_block_by_hand():
    """t = 4 (ms): e1 = 3 max(0, 0.2 - 0.4) = 0, e2 = 3 max(0, 0.4 - 0.3) = 0.3: forward
    exposed 0.3 + R 0.05 = 0.35, hidden 0.6 + 1.2 - 0.3 = 1.5; backward e3 = e4 = e5 = e6 = 0,
    hidden 0.6 + 0 + 0.6 + 1.2 = 2.4, of it bulk 0.6 + 1.2 = 1.8. A slower exchange (AG_f =
    AG_b = 1.8 ms, RS = 2.4 ms, AG_w = 0.5 ms; GEMMs as above): e1 = 3 (0.6 - 0.4) = 0.6, e2 =
    3 (0.8 - 0.3) = 1.5; e3 = 3 (0.6 - 0.3) = 0.9, e4 = 0.5 - 0.3 = 0.2, e5 = 1.8 - 1.6 =
    0.2, e6 = 2.4 - 1.6 = 0.8: forward 0.6 + 1.5 + 0.05 = 2.15 exposed, 1.8 + 2.4 - 2.1 =
    2.1 hidden; backward 0.9 + 0.2 + 0.2 + 0.8 = 2.1 exposed, (1.8 + 0.5 + 1.8 + 2.4) - 2.1 =
    4.4 hidden, bulk (1.8 + 2.4) - (0.2 + 0.8) = 3.2."""
    got = [float(x) for x in tp_userbuffers_block_s(*EXAMPLE, 4.0)]
    np.testing.assert_allclose(got, [0.35e-3, 1.5e-3, 0.0, 2.4e-3, 1.8e-3], rtol=1e-6,
                               atol=1e-12)
    slow = (1.8e-3, 1.8e-3, 2.4e-3, 0.5e-3) + EXAMPLE[4:]
    got = [float(x) for x in tp_userbuffers_block_s(*slow, 4.0)]
    np.testing.assert_allclose(got, [2.15e-3, 2.1e-3, 2.1e-3, 4.4e-3, 3.2e-3], rtol=1e-6)


def test_block_gradient_contract():
    """Public cost function: under x64 on log-inputs the gradients are finite and match finite
    differences (smooth form, t = 0.1), and the physical signs hold: exposed seconds grow with
    every collective and shrink with every GEMM window."""
    from jax.test_util import check_grads

    slow = (1.8e-3, 1.8e-3, 2.4e-3, 0.5e-3) + EXAMPLE[4:]
    with jax.enable_x64(True):
        def exposed_total(x):
            v = jnp.exp(x)
            f, _, b, _, _ = tp_userbuffers_block_s(*v, 4.0, temperature=0.1)
            return f + b

        x = jnp.log(jnp.array(slow, dtype=jnp.float64))
        check_grads(exposed_total, (x,), order=1, modes=("rev",))
        g = np.asarray(jax.grad(exposed_total)(x))
    assert np.all(np.isfinite(g))
    assert np.all(g[:5] > 0), g  # AG_f, AG_b, RS, AG_w, R: more exposed
    assert np.all(g[5:] <= 0) and np.any(g[5:] < 0), g  # GEMM windows: less exposed


def test_message_and_reduce_bytes_by_hand():
    """Llama 3.1 405B, s 8192, cp 2, b 1: T = 4096, h = 16384. FP8 current scaling (q_l = 1,
    activations BF16): S_ag,f = S_ag,b = 4096 x 16384 = 67,108,864 B, S_rs = 134,217,728 B;
    MXFP8: the buffers carry the 1-byte data only (67,108,864 B), the 1x32 scales go by NCCL:
    4096 x 16384 / 32 = 2,097,152 B (FP8, BF16: none); reduction at t = 8: 9/8 x 134,217,728 =
    150,994,944 B. BF16: every size 134,217,728 B."""
    f, b, r = (float(x) for x in tp_ub_message_bytes(L405, H100_405, FP8))
    assert (f, b, r) == (67_108_864.0, 67_108_864.0, 134_217_728.0)
    f, b, _ = (float(x) for x in tp_ub_message_bytes(L405, H100_405, MX))
    assert f == b == 67_108_864.0
    assert float(tp_ub_scale_bytes(L405, H100_405, MX)) == 2_097_152.0
    assert float(tp_ub_scale_bytes(L405, H100_405, FP8)) == 0.0
    bf16 = diffperf.training("bf16")
    assert float(tp_ub_scale_bytes(L405, H100_405, bf16)) == 0.0
    bf = [float(x) for x in tp_ub_message_bytes(L405, H100_405, bf16)]
    assert bf == [134_217_728.0] * 3
    assert float(tp_ub_reduce_bytes(L405, H100_405, FP8)) == pytest.approx(150_994_944.0)
    assert float(tp_ub_reduce_bytes(L405, H100_405.replace(tp=1.0), FP8)) == 0.0


def _parts(parallel, training, system, features):
    return pr._layer_parts(L405, parallel, system, training, None, features=features)[0]


def _by_hand(ub, tr, system):
    """The userbuffers layer's pieces from the cost functions: (AG_f, AG_b, RS, R, the NCCL
    scale all-gather, whole GEMM times f, d, w, chunk GEMM times fc, dc of one chunk)."""
    t = float(ub.tp)
    s_f, s_b, s_rs = tp_ub_message_bytes(L405, ub, tr)
    st = stride(pr._placed(ub), "tp")
    ag_f, ag_b = all_gather_s(s_f, t, st, system), all_gather_s(s_b, t, st, system)
    rs = reduce_scatter_s(s_rs, t, st, system)
    red = memory_time_s(tp_ub_reduce_bytes(L405, ub, tr), system)
    s_sc = float(tp_ub_scale_bytes(L405, ub, tr))
    sc = float(all_gather_s(s_sc, t, st, system)) if s_sc > 0 else 0.0
    ops = layer_ops(L405, ub, tr)
    f, d, w = (np.asarray(x) for x in layer_pass_gemm_times_s(ops, system, tr, None, True))
    m = np.asarray(ops.dense.m, dtype=float).copy()
    m[:4] /= t
    fc, dc, _ = (np.asarray(x) for x in layer_pass_gemm_times_s(
        ops.replace(dense=ops.dense.replace(m=jnp.asarray(m))), system, tr, None, True))
    return (float(ag_f), float(ag_b), float(rs), float(red), sc, f, d, w, fc, dc)


def test_layer_parts_conserve_the_collectives_and_gate_exactly():
    """DGX-H100 405B layer, FP8 (wave split on): the feature with tp_userbuffers = 0 changes
    nothing (bit for bit); with 1, exposed + hidden TP seconds = every collective of the two
    blocks (forward AG_f + RS, backward AG_b + AG_f + RS each) + the two reductions + the
    ring-exchange GEMMs' time as t chunks of m / t tokens beyond the whole GEMMs', each
    recomputed here from the cost functions; the exposed TP seconds fall well below the
    tp_overlap = 0 exchange. Megatron's recompute "mlp" re-runs the MLP block's forward
    only: exposed and hidden grow by that block's (`tp_userbuffers_block_s` on rows 2, 3,
    + its chunks' extra time), not by half of both blocks'."""
    system = _system("h100-sxm-80gb")
    tr = FP8.replace(gemm_wave_split=1.0)
    feats = pr.features_of(L405, H100_405, tr)
    assert feats == {"cp", "lowp", "wave_split"}
    base = _parts(H100_405, tr, system, feats)
    same = _parts(H100_405, tr, system, feats | {"tpub"})
    for k in base:
        assert float(base[k]) == float(same[k]), k
    ub = H100_405.replace(tp_userbuffers=1.0)
    assert pr.features_of(L405, ub, tr) == {"cp", "lowp", "wave_split", "tpub"}
    got = _parts(ub, tr, system, feats | {"tpub"})
    t = 8.0
    ag_f, ag_b, rs, red, sc, f, d, w, fc, dc = _by_hand(ub, tr, system)
    assert sc == 0.0  # per-tensor FP8: no scales gathered
    chunks = t * (fc[:4].sum() + dc[1] + dc[3]) - (f[:4].sum() + d[1] + d[3])
    assert chunks > 0  # smaller GEMMs run at a lower efficiency
    total = 2 * (2 * ag_f + ag_b + 2 * rs) + 2 * red + chunks
    np.testing.assert_allclose(float(got["tp_exposed_s"] + got["tp_hidden_s"]), total,
                               rtol=1e-5)
    assert float(got["tp_exposed_s"]) < 0.3 * float(base["tp_exposed_s"])
    assert float(got["tp_hidden_s"]) > 0.5 * float(base["tp_exposed_s"])
    rec = _parts(ub.replace(recompute=1.0, recompute_mlp=1.0), tr, system, feats | {"tpub"})
    e_mlp, h_mlp, *_ = (float(x) for x in tp_userbuffers_block_s(
        ag_f, ag_b, rs, 0.0, red, t * fc[2], t * fc[3], d[2], w[2], t * dc[3], t))
    e_mlp += t * (fc[2] + fc[3]) - (f[2] + f[3])
    np.testing.assert_allclose(float(rec["tp_exposed_s"] - got["tp_exposed_s"]), e_mlp,
                               rtol=1e-4, atol=1e-9)
    np.testing.assert_allclose(float(rec["tp_hidden_s"] - got["tp_hidden_s"]), h_mlp,
                               rtol=1e-4)


def test_mxfp8_scales_gathered_by_nccl_before_each_userbuffers_gather():
    """GB200 405B layer (TP 4, CP 2), MXFP8: the buffers carry the data only; each
    userbuffers all-gather of a block-scaled tensor waits for an NCCL all-gather of its scales
    (TE fill_userbuffers_buffer_for_all_gather): per block 1 before the forward ring, 2 before
    the backward ring and the bulk re-gather (all exposed), 1 before the column-wise re-gather
    of the output gradient (AG_w, after the ring). Exposed + hidden = the FP8 sum with AG_w
    (= AG_b) once per block, + 8 scale gathers; at least the 6 that wait on the main stream
    are exposed."""
    system = _system("gb200-nvl72")
    ub = H100_405.replace(tp=4.0, dp=16.0, tp_userbuffers=1.0)
    got = _parts(ub, MX, system, pr.features_of(L405, ub, MX))
    t = 4.0
    ag_f, ag_b, rs, red, sc, f, d, w, fc, dc = _by_hand(ub, MX, system)
    assert sc > 0
    chunks = t * (fc[:4].sum() + dc[1] + dc[3]) - (f[:4].sum() + d[1] + d[3])
    total = 2 * (2 * ag_f + 2 * ag_b + 2 * rs) + 2 * red + chunks + 8 * sc
    np.testing.assert_allclose(float(got["tp_exposed_s"] + got["tp_hidden_s"]), total,
                               rtol=1e-5)
    assert float(got["tp_exposed_s"]) >= 6 * sc + 2 * red


def test_fact_on_the_bridge_rows():
    """calibration/bridge_recipe_facts.py fact 10 sets tp_userbuffers = 1 on exactly the Llama
    rows with TP > 1 and sequence parallelism that are not NVFP4 (44 rows: the recipes turn
    the overlap on with an FP8 userbuffers configuration, off for NVFP4), and the shipped CSV
    carries it."""
    from calibration.bridge_recipe_facts import row_facts

    rows = list(csv.DictReader((Path(__file__).resolve().parent.parent / "data"
                                / "megatron_bridge.csv").open(newline="")))
    on = [r for r in rows if "tp_userbuffers=1" in row_facts(r, {"tp_ub"})]
    assert len(on) == 44
    assert all(r["model"].startswith("llama") and int(r["tp"]) > 1
               and r["sequence_parallel"] == "1" and r["precision"] != "nvfp4" for r in on)
    assert not any(r["precision"] == "nvfp4" and "tp_userbuffers=1" in r["set"] for r in rows)
    assert all(("tp_userbuffers=1" in r["set"]) == (r in on) for r in rows)


def test_search_traces_the_term_when_the_fact_is_given():
    """A search given tp_userbuffers = 1 as a framework fact (`search(..., parallel=...)`, its
    base Parallel) must trace the term: the table's features take the base's facts."""
    from diffperf.search.kernel import KEYS, _table_features

    keys = np.ones((2, len(KEYS)))
    assert "tpub" not in _table_features(L405, keys, FP8)
    assert "tpub" in _table_features(L405, keys, FP8, Parallel(tp_userbuffers=1.0))


# ------------------------------------------------------------------ tp_userbuffers = 2 (TE 1.8)

def test_pipeline_rs_by_hand():
    """tp_pipeline_rs_s, n = 4 (ms): RS 0.4, G 1.2: c = 0.1, g = 0.3, exposed 0.1 + 3 x 0 =
    0.1, hidden 0.3; RS 2.0: c = 0.5, exposed 0.5 + 3 (0.5 - 0.3) = 1.1, hidden 0.9; n = 1:
    no pipeline, the whole RS exposed after the GEMM."""
    got = [float(x) for x in tp_pipeline_rs_s(0.4e-3, 1.2e-3, 4.0)]
    np.testing.assert_allclose(got, [0.1e-3, 0.3e-3], rtol=1e-6)
    got = [float(x) for x in tp_pipeline_rs_s(2.0e-3, 1.2e-3, 4.0)]
    np.testing.assert_allclose(got, [1.1e-3, 0.9e-3], rtol=1e-6)
    got = [float(x) for x in tp_pipeline_rs_s(2.0e-3, 1.2e-3, 1.0)]
    np.testing.assert_allclose(got, [2.0e-3, 0.0], atol=1e-12)


def test_pipeline_rs_matches_te18_stream_order():
    """tp_pipeline_rs_s against an event simulation of TE 1.8 split_overlap_rs
    (gemm_overlap=True): GEMM chunk i ends at (i + 1) g; the comm stream runs chunk i's
    reduce-scatter (c each) after GEMM chunk i ends and after the previous one; exposed = the
    last reduce-scatter's end less the GEMMs' n g."""
    for rs, gemm, n in ((0.4, 1.2, 4), (2.0, 1.2, 4), (1.3, 1.2, 4), (0.9, 0.5, 3),
                        (3.0, 0.1, 2)):
        c, g, end = rs / n, gemm / n, 0.0
        for i in range(n):
            end = max(end, (i + 1) * g) + c
        got = [float(x) for x in tp_pipeline_rs_s(rs, gemm, float(n))]
        np.testing.assert_allclose(got, [end - gemm, rs - (end - gemm)], rtol=1e-5,
                                   atol=1e-7)


def test_pipeline_rs_gradient_contract():
    """Public cost function: x64, log-inputs, smooth form (t = 0.1): gradients finite and
    equal to finite differences; exposed grows with the reduce-scatter, shrinks with the GEMM
    (the slow case, where chunks are exposed)."""
    from jax.test_util import check_grads

    with jax.enable_x64(True):
        def e(x):
            v = jnp.exp(x)
            return tp_pipeline_rs_s(v[0], v[1], 4.0, temperature=0.1)[0]

        x = jnp.log(jnp.array([2.0e-3, 1.2e-3], dtype=jnp.float64))
        check_grads(e, (x,), order=1, modes=("rev",))
        g = np.asarray(jax.grad(e)(x))
    assert np.all(np.isfinite(g)) and g[0] > 0 and g[1] < 0, g


def test_block_pipe_replaces_the_forward_reduce_scatter_only():
    """tp_userbuffers_block_s with pipe = (on, e_p, h_p): on = 1 puts e_p for e2 + R and h_p
    for RS - e2 in the forward (docstring example: e1 = 0, so forward exposed = e_p, hidden =
    AG_f + h_p), the backward unchanged; on = 0 is the ring-exchange form bit for bit."""
    ring = [float(x) for x in tp_userbuffers_block_s(*EXAMPLE, 4.0)]
    off = [float(x) for x in tp_userbuffers_block_s(*EXAMPLE, 4.0, pipe=(0.0, 7.0, 9.0))]
    assert off == ring
    on = [float(x) for x in tp_userbuffers_block_s(*EXAMPLE, 4.0,
                                                   pipe=(1.0, 0.1e-3, 0.2e-3))]
    np.testing.assert_allclose(on[:2], [0.1e-3, 0.6e-3 + 0.2e-3], rtol=1e-6)
    assert on[2:] == ring[2:]


def test_layer_parts_pipeline_conserve_and_gate():
    """DGX-H100 70B layer (TP 4, CP 2, FP8 delayed; NeMo 24.07's row): "ubpipe" with
    tp_userbuffers = 1 changes nothing (bit for bit); with 2, exposed + hidden = the
    tp_userbuffers = 1 total less the two forward ring reduce-scatters (RS at BF16) and their
    reductions, plus the pipelined reduce-scatters at the FP8 bytes (fp8_buf: = AG_f), less the
    row fprops' ring chunks (t chunks of m / t tokens) plus their pipeline chunks (4 slices
    of n / 4 output columns on 132 - num_sm SMs: x 132/108 proj, x 132/116 fc2), each
    recomputed here from the cost functions; the pipelined chunks' time beyond the whole GEMM
    is exposed, so the forward exposed seconds are at least that."""
    system = _system("h100-sxm-80gb")
    tr = diffperf.training("fp8-delayed")
    l70 = _model("llama3-70b")
    p = Parallel(tp=4.0, pp=4.0, cp=2.0, vp=5.0, dp=2.0, micro_batch=1.0, global_batch=128.0,
                 sequence_parallel=1.0, tp_userbuffers=1.0)
    feats = pr.features_of(l70, p, tr)
    assert "tpub" in feats and "ubpipe" not in feats
    one = pr._layer_parts(l70, p, system, tr, None, features=feats)[0]
    same = pr._layer_parts(l70, p, system, tr, None, features=feats | {"ubpipe"})[0]
    for k in one:
        assert float(one[k]) == float(same[k]), k
    p2 = p.replace(tp_userbuffers=2.0)
    assert pr.features_of(l70, p2, tr) == feats | {"ubpipe"}
    two = pr._layer_parts(l70, p2, system, tr, None, features=feats | {"ubpipe"})[0]
    t = 4.0
    st = stride(pr._placed(p2), "tp")
    s_f, _, s_rs = tp_ub_message_bytes(l70, p2, tr)
    ag_f = float(all_gather_s(s_f, t, st, system))
    rs = float(reduce_scatter_s(s_rs, t, st, system))
    rs_p = float(reduce_scatter_s(s_f, t, st, system))
    red = float(memory_time_s(tp_ub_reduce_bytes(l70, p2, tr), system))
    ops = layer_ops(l70, p2, tr)
    f = np.asarray(layer_pass_gemm_times_s(ops, system, tr, None, True)[0])
    m = np.asarray(ops.dense.m, dtype=float).copy()
    m[:4] /= t
    fc = np.asarray(layer_pass_gemm_times_s(
        ops.replace(dense=ops.dense.replace(m=jnp.asarray(m))), system, tr, None, True)[0])
    n = np.asarray(ops.dense.n, dtype=float).copy()
    n[[1, 3]] /= UB_PIPE_SPLITS
    fp = np.asarray(layer_pass_gemm_times_s(
        ops.replace(dense=ops.dense.replace(n=jnp.asarray(n))), system, tr, None, True)[0])
    sms = float(system.gpu_sms)  # the H100 SXM5's 132 (configs/systems/h100-sxm-80gb.yaml)
    margin = np.array([sms / (sms - x) for x in UB_PIPE_COMM_SMS])
    assert sms == 132.0 and np.allclose(margin, [132 / 108, 132 / 116])
    pipe_gemm = UB_PIPE_SPLITS * margin * fp[[1, 3]]
    ring_rows = t * fc[[1, 3]]
    assert rs_p == pytest.approx(ag_f, rel=1e-6) and rs_p < 0.6 * rs  # FP8 vs BF16
    total_one = float(one["tp_exposed_s"] + one["tp_hidden_s"])
    want = total_one - 2 * (rs + red) + 2 * rs_p + float(np.sum(pipe_gemm - ring_rows))
    np.testing.assert_allclose(float(two["tp_exposed_s"] + two["tp_hidden_s"]), want,
                               rtol=1e-5)
    assert float(two["tp_exposed_s"]) > float(np.sum(pipe_gemm - f[[1, 3]]))


def test_ub_pipe_sm_margin_by_hand():
    """schedule.overlap.ub_pipe_sm_margin: S / (S - num_sm) for num_sm 24 (proj) and 16 (fc2),
    S = System.gpu_sms: H100 SXM5 132 -> 132/108, 132/116; B200 148 -> 148/124, 148/132;
    S <= num_sm (0: unknown, refused by validate) -> 1, no margin, finite. More SMs never
    slow the GEMM: d margin / dS = -num_sm / (S - num_sm)^2 < 0."""
    got = [np.asarray(ub_pipe_sm_margin(s)) for s in (132.0, 148.0, 0.0, 20.0)]
    np.testing.assert_allclose(got[0], [132 / 108, 132 / 116], rtol=1e-6)
    np.testing.assert_allclose(got[1], [148 / 124, 148 / 132], rtol=1e-6)
    np.testing.assert_array_equal(got[2], [1.0, 1.0])
    np.testing.assert_allclose(got[3], [1.0, 20 / 4], rtol=1e-6)
    grad = jax.grad(lambda s: ub_pipe_sm_margin(s)[0])(132.0)
    assert float(grad) == pytest.approx(-24 / 108**2, rel=1e-5)
    assert float(jax.grad(lambda s: ub_pipe_sm_margin(s)[0])(0.0)) == 0.0
