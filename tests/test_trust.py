"""Trust (docs/trust.md): default efficiency sets per GPU generation, envelopes, intervals;
the published FSDP runs (data/published_fsdp.csv); FSDP2 copy-out and the DP overlap slowdown."""

import json
from pathlib import Path

import numpy as np
import pytest

from diffperf import Parallel, load_model, load_runs, load_system, predict, training
from diffperf import trust as tr
from diffperf.cli.main import main
from diffperf.costs.collectives import all_gather_s, reduce_scatter_s
from diffperf.errors import SpecError
from diffperf.memory.device import zero3_buffer_bytes
from diffperf.predict import _dp_times
from diffperf.schedule.overlap import (dp_hidden_slowdown_s, overlap_sigma,
                                       tp_userbuffers_sigmas, zero3_root_unit_s)
from diffperf.workload.dp import (root_unit_params, zero3_copy_out_bytes,
                                  zero3_rs_copy_in_bytes)
from diffperf.workload.params import layer_params_per_device

ROOT = Path(__file__).resolve().parents[1]
PUBLISHED = ROOT / "data" / "published_fsdp.csv"


# ------------------------------------------------------------------ envelopes and intervals

ENV = dict(gpu=["a100"], precision=["bf16"], tp=[1, 8], pp=[1, 8], dp=[1, 64], cp=[1, 1],
           ep=[1, 1], gpus=[2, 512], micro_batch=[1, 8], zero_stage=[0, 1],
           recompute=["full"])


def _cols(**kw):
    base = dict(tp=8, pp=4, dp=16, cp=1, ep=1, micro_batch=1, zero_stage=1, recompute=2,
                gx=1, gy=1, gz=1)
    return tr.layout_columns(Parallel(**(base | kw)))


def test_envelope_distance_by_hand():
    """0 inside; |log2| of how far a degree lies outside; CATEGORY_WEIGHT per category."""
    assert tr.envelope_distance(_cols(), ENV, "bf16", "a100")[0] == 0.0  # 512 GPUs
    assert tr.envelope_distance(_cols(tp=16, dp=8), ENV, "bf16", "a100")[0] == pytest.approx(1.0)
    # 1024 GPUs (one doubling) and ZeRO-3 (a category): 1 + 4
    d = tr.envelope_distance(_cols(dp=32, zero_stage=3), ENV, "bf16", "a100")[0]
    assert d == pytest.approx(1.0 + tr.CATEGORY_WEIGHT)
    # selective recompute, fp16, h100: three categories
    d = tr.envelope_distance(_cols(recompute=1), ENV, "fp16", "h100")[0]
    assert d == pytest.approx(3 * tr.CATEGORY_WEIGHT)
    # micro-batch 32 against [1, 8]: log2(4) = 2
    assert tr.envelope_distance(_cols(micro_batch=32), ENV, "bf16", "a100")[0] == pytest.approx(2)


def _set(q_fit=0.2, q_other=0.3, validated=False):
    other = dict(ENV, zero_stage=[3], gpus=[64, 128], tp=[1, 1], dp=[64, 128])
    return dict(name="t", gpu="a100", measured=True, path=None, regimes=[
        dict(name="fit", q95_log=q_fit, validated=True, envelope=ENV, mape_pct=5.0, n=10,
             runs="r"),
        dict(name="fsdp", q95_log=q_other, validated=validated, envelope=other)])


def test_trust_inside_and_outside_by_hand():
    """Inside the fit's envelope: q_fit; outside: max(q_fit, q of the nearest extrapolation
    regime); a validated held-out regime joins the envelope with its own q, and a set with
    no extrapolation regime widens to UNMEASURED_Q."""
    cols = tr.layout_columns(np.array([[8, 4, 16, 1, 1, 1, 1, 1536, 1, 1, 1, 1, 2, 1, 0],
                                       [1, 1, 64, 1, 1, 1, 1, 64, 1, 1, 1, 3, 2, 0, 0],
                                       [4, 1, 256, 1, 1, 1, 3, 1536, 1, 1, 1, 3, 1, 1, 0]]),
                             ("tp", "pp", "dp", "cp", "ep", "vp", "micro_batch",
                              "global_batch", "gx", "gy", "gz", "zero_stage", "recompute",
                              "sequence_parallel", "placement"))
    t = tr.trust(cols, _set(), "bf16", "a100")
    assert list(t["inside"]) == [True, False, False]
    assert t["q"] == pytest.approx([0.2, 0.3, 0.3])
    assert list(t["regime"]) == ["fit", "fsdp", "fsdp"]
    assert t["score"][0] == 1.0 and 0 < t["score"][2] < t["score"][1] < 1
    t = tr.trust(cols, _set(q_fit=0.4), "bf16", "a100")
    assert t["q"] == pytest.approx([0.4, 0.4, 0.4])  # never narrower than inside
    t = tr.trust(cols, _set(validated=True), "bf16", "a100")
    assert list(t["inside"]) == [True, True, False]
    assert t["q"] == pytest.approx([0.2, 0.3, tr.UNMEASURED_Q])
    assert t["regime"][2] == "unmeasured"
    lo, hi = tr.interval(np.array([10.0]), np.array([0.2]))
    assert (lo[0], hi[0]) == pytest.approx((10 * np.exp(-0.2), 10 * np.exp(0.2)))


def test_unmeasured_gpu_falls_back_to_physics_and_says_so():
    s = tr.default_set("mi300x")
    assert s["name"] == tr.PHYSICS and not s["measured"] and "no measured runs" in s["note"]
    system, rec = tr.resolve(load_system("mi300x"), None)
    assert system.eff == load_system("mi300x").eff and rec["name"] == tr.PHYSICS
    t = tr.trust(_cols(), rec, "bf16", "mi300x")
    assert not t["inside"][0] and t["q"][0] == tr.UNMEASURED_Q


@pytest.mark.parametrize("gpu", ["a100", "h100"])
def test_shipped_sets_record_their_error_and_regimes(gpu):
    """configs/efficiency/GPU.yaml: the fitted efficiencies of its overlay, regimes starting
    with the fit's own, each with an envelope and a held-out q; the set is applied by
    default."""
    s = tr.default_set(gpu)
    assert s["measured"] and s["regimes"][0]["name"] == "fit"
    assert all(r["q95_log"] > 0 and r["n"] > 0 and "envelope" in r for r in s["regimes"])
    assert any(r["name"] == "fsdp-published" for r in s["regimes"])
    name = {"a100": "a100-sxm-80gb", "h100": "h100-sxm-80gb"}[gpu]
    system, rec = tr.resolve(load_system(name), None)
    assert rec["path"] == s["path"]
    assert float(system.eff.mm_max) == pytest.approx(s["efficiency"]["mm_max"])


def test_system_gpu_key_is_checked(tmp_path):
    d = (ROOT / "configs" / "systems" / "a100-sxm-80gb.yaml").read_text()
    p = tmp_path / "s.yaml"
    p.write_text(d.replace("gpu: a100", "gpu: a10O"))
    with pytest.raises(SpecError, match=r"gpu='a10O' is not allowed.*allowed: a100, h100"):
        load_system(p)
    assert load_system("a100-sxm-80gb").gpu == "a100"


# ------------------------------------------------------------------------ published runs

def test_published_fp8_rows_carry_the_kernel_and_cp_facts():
    """Float8 rows: FlashAttention-2 (TorchTitan 2024-12), and the cp > 1 rows all-gather K/V
    (TorchTitan's default rotate method, cp_ring=0) with PyTorch's experimental CP
    (cp_torch=1); the series' cp 1 baseline sets neither (no K/V exchange); step = seq / (TPS x 8) with one sequence
    per FSDP rank (TPS counts each sequence once): CP 8, 262144 / (548 x 8) = 59.796 s."""
    runs = load_runs(PUBLISHED.parent / "published_fsdp_fp8.csv")
    by = dict(zip(runs.ids, range(len(runs))))
    assert len(runs) == 7
    assert all(float(t.attention_fa2) == 1 for t in runs.trainings)
    for rid, i in by.items():
        cp = float(runs.parallels[i].cp)
        assert float(runs.parallels[i].cp_ring) == (0 if cp > 1 else 1), rid
        # PyTorch's experimental context_parallel() runs only where CP is on (cp > 1)
        assert float(runs.trainings[i].cp_torch) == (float(runs.parallels[i].cp) > 1), rid
    assert runs.step_time_s[by["tt-h100-l3-8b-n8-cp8-fp8"]] == pytest.approx(
        262144 / (548 * 8), rel=1e-5)
    # torch._scaled_mm runs cuBLAS's persistent Hopper kernels beside FSDP's collectives
    assert all(float(t.gemm_wave_split) == 1 for t in runs.trainings)
    # torchao Float8Linear: no FP8 weight copy held across the step; under op SAC the policy
    # sees its Float8Tensor mm as aten.mm and saves the odd ones (policy 1, as bf16)
    assert all(float(t.lowp_weight_cache) == 0 for t in runs.trainings)
    assert [float(runs.parallels[by[r]].recompute_policy) for r in
            ("tt-h100-l3-8b-n8-fp8", "tt-h100-l3-8b-n128-fp8")] == [1.0, 1.0]


def test_published_fsdp_csv_loads_with_its_row_facts():
    """Each row's `set` facts reach its specs: FSDP2 rows reduce in fp32 and copy out, FSDP1
    rows reduce in bf16; HSDP rows shard over the node (zero_shard 8); TorchTitan's op SAC
    and eager kernels, fms-fsdp's fraction of checkpointed blocks (p = 3 (HFU / MFU - 1))."""
    runs = load_runs(PUBLISHED)
    assert len(runs) == 22 and np.all(np.isfinite(runs.step_time_s))
    by = dict(zip(runs.ids, range(len(runs))))
    tt, fms = by["tt-h100-l3-8b-n8-eager"], by["fms-h100-l2-7b-hsdp"]
    assert float(runs.trainings[tt].grad_bytes) == 4
    assert float(runs.parallels[tt].zero3_copy_out) == 1
    assert float(runs.trainings[fms].grad_bytes) == 2
    assert float(runs.parallels[fms].zero3_copy_out) == 0
    assert float(runs.parallels[fms].zero_shard) == 8 and float(runs.parallels[tt].zero_shard) == 0
    # FSDP's root unit (embedding, final norm, output) on every row, FSDP1 and FSDP2
    assert all(float(p.zero3_root_unit) == 1 for p in runs.parallels)
    assert float(runs.parallels[tt].recompute_policy) == 1
    assert float(runs.trainings[tt].norm_extra_bytes) == 32
    assert float(runs.trainings[tt].llama_eager_pointwise) == 1
    compiled = by["tt-h100-l3-8b-n8-compile"]
    assert float(runs.trainings[compiled].llama_eager_pointwise) == 0
    # compiled rows keep the rotary / K-V expansion passes in front of SDPA (rope_kv_pass),
    # eager rows hold them in llama_eager_pointwise
    ropes = {rid: float(runs.trainings[i].rope_kv_pass) for rid, i in by.items()}
    assert ropes["tt-h100-l3-8b-n8-compile"] == 1 and ropes["tt-h100-l3-8b-n8-eager"] == 0
    assert ropes["fms-h100-l2-70b"] == 1 and ropes["tt-a100-l3-8b-sac-op"] == 0
    # The attention kernel (data/published_fsdp.md): FlashAttention-2 in every row but the
    # 405B one, whose torch nightly is not stated
    fa2 = {rid: float(runs.trainings[i].attention_fa2) for rid, i in by.items()}
    assert fa2.pop("tt-h100-l31-405b-n128-tp8") == 0
    assert set(fa2.values()) == {1.0}
    # cuBLAS's persistent GEMMs beside NCCL (two waves): every H100 row, no A100 row
    waves = {rid: float(runs.trainings[i].gemm_wave_split) for rid, i in by.items()}
    assert all(w == (1.0 if "-h100-" in rid else 0.0) for rid, w in waves.items())
    # fms-fsdp README: A100 13B HFU 0.69, MFU 0.61 -> p = 3 (0.69 / 0.61 - 1) = 0.39
    fms13 = runs.parallels[by["fms-a100-l2-13b"]]
    assert float(fms13.recompute) == 2
    assert float(fms13.recompute_layer_frac) == pytest.approx(3 * (0.69 / 0.61 - 1), abs=5e-3)
    # step = global batch x seq / (tokens/s/GPU x GPUs): 16 x 8192 / (5762 x 8)
    assert runs.step_time_s[tt] == pytest.approx(16 * 8192 / (5762 * 8), rel=1e-5)


def test_run_row_facts_are_checked(tmp_path):
    text = PUBLISHED.read_text().replace("zero3_regather=0", "zero3_regathr=0", 1)
    p = tmp_path / "r.csv"
    p.write_text(text)
    with pytest.raises(SpecError, match=r"framework facts\): --set: unknown field 'zero3_re"):
        load_runs(p)


# ------------------------------------------------------------------------------ physics

def test_zero3_copy_out_bytes_by_hand():
    """Llama 3 8B layer: 4096 (4096 + 2 x 1024 + 4096) + 3 x 4096 x 14336 + 2 x 4096 (norms)
    = 218,112,000 parameters; bf16 gathers: 2 x 2 x P bytes per gather; 0 without FSDP2."""
    P = float(layer_params_per_device(load_model("llama3-8b"), Parallel()))
    assert P == 4096 * (4096 + 2 * 1024 + 4096) + 3 * 4096 * 14336 + 2 * 4096
    tb = training("bf16")
    assert float(zero3_copy_out_bytes(P, tb, 1.0)) == 4.0 * P
    assert float(zero3_copy_out_bytes(P, tb, 0.0)) == 0.0
    # reduce-scatter copy-in: read the bf16 gradient, write the reduce dtype (TorchTitan fp32)
    assert float(zero3_rs_copy_in_bytes(P, tb.replace(grad_bytes=4.0), 1.0)) == 6.0 * P \
        == 1_308_672_000
    assert float(zero3_rs_copy_in_bytes(P, tb, 1.0)) == 4.0 * P  # bf16 reduction
    assert float(zero3_rs_copy_in_bytes(P, tb, 0.0)) == 0.0
    assert float(dp_hidden_slowdown_s(0.387, 0.1)) == pytest.approx(0.0387)


def test_copy_out_adds_one_copy_per_gather_to_the_step():
    """ZeRO-3 on one 8-GPU node, 1 stage, full recompute without re-gather (FSDP: 2 gathers
    per layer pass), m = 2 micro-batches: the step grows by m L (2 t_copy + t_in) exactly,
    t_copy = 4 P / (BW_hbm mem_eff) per gather, t_in = (2 + 2) P / (BW_hbm mem_eff) the
    reduce-scatter copy-in of the bf16 preset per backward."""
    model, system = load_model("llama3-8b"), load_system("h100-sxm-80gb")
    par = Parallel(dp=8, micro_batch=1, global_batch=16, zero_stage=3, recompute=2,
                   zero3_regather=0)
    tb = training("bf16")
    base = predict(model, par, system, tb)
    with_copy = predict(model, par.replace(zero3_copy_out=1), system, tb)
    P = float(layer_params_per_device(model, par))
    t_copy = 4.0 * P / (float(system.hbm_bandwidth_Bps) * float(system.eff.mem_eff))
    assert float(_dp_times(model, par.replace(zero3_copy_out=1), system, tb)["copy_out_s"]) \
        == pytest.approx(t_copy, rel=1e-5)
    dp = _dp_times(model, par.replace(zero3_copy_out=1), system, tb)
    assert float(dp["rs_copy_in_s"]) == pytest.approx(t_copy, rel=1e-5)
    want = 2 * 32 * (2 * t_copy + t_copy)
    assert float(with_copy.step_time_s - base.step_time_s) == pytest.approx(want, rel=1e-3)
    assert float(with_copy.breakdown.dp_exposed_s - base.breakdown.dp_exposed_s) == \
        pytest.approx(want, rel=1e-3)


def test_root_unit_adds_its_gather_and_reduce_scatter_by_hand():
    """FSDP's root unit (zero3_root_unit): Llama 3 8B on one 8-GPU node, ZeRO-3, m = 2: the
    root holds the untied embedding and output, 2 V h = 1,050,673,152 parameters (diffperf's
    stage count leaves out the final norm's h); the step grows by m (AG + RS + copies)
    exactly: a ring all-gather of the bf16 root (2 Psi bytes) and a reduce-scatter of its
    fp32 gradients (4 Psi) over the 8 ranks, FSDP2's copy-out 4 Psi and reduce-scatter
    copy-in 6 Psi bytes at the HBM's rate; nothing without the fact or without ZeRO-3."""
    model, system = load_model("llama3-8b"), load_system("h100-sxm-80gb")
    par = Parallel(dp=8, micro_batch=1, global_batch=16, zero_stage=3, recompute=2,
                   zero3_regather=0, zero3_copy_out=1)
    tb = training("bf16").replace(grad_bytes=4.0)
    P_layer = float(layer_params_per_device(model, par))
    root = 2 * 128256 * 4096
    dp = _dp_times(model, par, system, tb)
    assert float(root_unit_params(dp["P"], P_layer, 32.0)) == pytest.approx(root, rel=1e-6)
    assert float(dp["root_s"]) == 0.0  # the fact is off
    on = par.replace(zero3_root_unit=1)
    ag = float(all_gather_s(2.0 * root, 8, 1, system))
    rs = float(reduce_scatter_s(4.0 * root, 8, 1, system))
    copies = 10.0 * root / (float(system.hbm_bandwidth_Bps) * float(system.eff.mem_eff))
    assert float(_dp_times(model, on, system, tb)["root_s"]) == pytest.approx(
        ag + rs + copies, rel=1e-5)
    base, with_root = predict(model, par, system, tb), predict(model, on, system, tb)
    want = 2 * (ag + rs + copies)
    assert float(with_root.step_time_s - base.step_time_s) == pytest.approx(want, rel=1e-3)
    assert float(with_root.breakdown.dp_exposed_s - base.breakdown.dp_exposed_s) == \
        pytest.approx(want, rel=1e-3)
    # memory (memory.device.nonlayer_unit_bytes): a micro-batch's activations (logits 12.6
    # GB) exceed the end-of-backward extra, so the start of the backward is the peak. Without
    # the fact ZeRO-3 still gathers the output whole: buffers = B_l + 6 V h + 2 N_l - B_l +
    # workspace; the root unit holds 2 Psi_r + 2 V h instead: 6 N_l = 1,308,672,000 B more.
    vh = 128256 * 4096
    b_l = float(zero3_buffer_bytes(P_layer, par, tb))
    assert float(base.memory.buffers_bytes) == pytest.approx(
        6 * vh + 2 * P_layer + float(system.eff.mem_reserved_bytes), rel=1e-6)
    assert float(base.memory.buffers_bytes) > b_l + float(system.eff.mem_reserved_bytes)
    assert float(with_root.memory.total_bytes - base.memory.total_bytes) == pytest.approx(
        6 * P_layer, rel=1e-4)
    assert float(with_root.memory.buffers_bytes) == pytest.approx(
        b_l + 2 * root + 2 * vh + float(system.eff.mem_reserved_bytes), rel=1e-6)
    z1 = dict(zero_stage=1, zero3_copy_out=0)
    assert float(_dp_times(model, on.replace(**z1), system, tb)["root_s"]) == 0.0
    # gradient contract of zero3_root_unit_s in log coordinates under x64 (the cost function
    # alone, no predict program): finite, matches finite differences, each part costs time
    import jax
    from jax.test_util import check_grads
    with jax.enable_x64(True):
        f = lambda x: zero3_root_unit_s(*jax.numpy.exp(x), on)  # noqa: E731
        x = jax.numpy.log(jax.numpy.array([ag, rs, copies]))
        check_grads(f, (x,), order=1, modes=("rev",))
        g = jax.grad(f)(x)
    assert np.all(np.isfinite(np.asarray(g))) and np.all(np.asarray(g) > 0)


def test_hidden_dp_communication_slows_compute():
    """The hidden DP seconds cost overlap_slowdown x themselves (arXiv:2507.03114): the
    step difference between sigma and 0 is sigma x dp_hidden_s; none when nothing hides."""
    model, system = load_model("llama3-8b"), load_system("h100-sxm-80gb")
    par = Parallel(dp=64, micro_batch=2, global_batch=128, zero_stage=3, recompute=2)
    tb = training("bf16")
    off = system.replace(eff=system.eff.replace(overlap_slowdown=0.0))
    r0, r1 = predict(model, par, off, tb), predict(model, par, system, tb)
    hidden = float(r1.breakdown.dp_hidden_s)
    assert hidden > 0
    sigma = float(system.eff.overlap_slowdown)
    assert float(r1.step_time_s - r0.step_time_s) == pytest.approx(sigma * hidden, rel=1e-4)
    exposed = predict(model, par.replace(dp_overlap=0, zero_stage=1), system, tb)
    assert float(exposed.breakdown.dp_hidden_s) == 0.0


def test_overlap_sigma_by_hand():
    """Compute lost per hidden communication second: sigma_0 without the fact; with it the
    GEMMs (share g) run two waves beside NCCL: 1 - (1 - s0) / (2 g (1 - s0) + 1 - g).
    g = 0.8, s0 = 0.19: 1 - 0.81 / (1.296 + 0.2) = 0.458556; g = 1: exactly one half (every
    kernel at half speed); g = 0: s0. Gradient contract in log coordinates under x64: finite,
    matches finite differences, more GEMM share or a larger s0 loses more."""
    import jax
    from jax.test_util import check_grads

    assert float(overlap_sigma(0.19, 0.8, 0.0)) == pytest.approx(0.19, abs=0)
    assert float(overlap_sigma(0.19, 0.8, 1.0)) == pytest.approx(1 - 0.81 / 1.496, rel=1e-6)
    assert float(overlap_sigma(0.19, 0.8, 1.0)) == pytest.approx(0.458556, abs=1e-6)
    assert float(overlap_sigma(0.19, 1.0, 1.0)) == pytest.approx(0.5, rel=1e-6)
    assert float(overlap_sigma(0.19, 0.0, 1.0)) == pytest.approx(0.19, rel=1e-6)
    with jax.enable_x64(True):
        f = lambda x: overlap_sigma(jax.numpy.exp(x[0]), jax.numpy.exp(x[1]), 1.0)  # noqa: E731
        x = jax.numpy.log(jax.numpy.array([0.19, 0.8]))
        check_grads(f, (x,), order=1, modes=("rev",))
        g = jax.grad(f)(x)
    assert np.all(np.isfinite(np.asarray(g))) and np.all(np.asarray(g) > 0)


def test_overlap_sigma_never_cheapens_the_hidden_seconds():
    """The fact only adds loss: a persistent GEMM beside NCCL takes w = max(2, 1 / (1 -
    sigma_0)) x its time, never less than a many-wave kernel there. At sigma_0 = 0.6 (a fit
    may give it: overlap_slowdown is any fraction) w = 2.5 = 1 / 0.4, so sigma = 1 - 0.4 /
    (g 2.5 x 0.4 + 1 - g) = 0.6 at every g (two waves alone would give 0.5 at g = 1, below
    sigma_0); at sigma_0 = 0.5 both are 2 (continuous); below, the formula is unchanged."""
    for g in (0.0, 0.3, 0.8, 1.0):
        assert float(overlap_sigma(0.6, g, 1.0)) == pytest.approx(0.6, rel=1e-6)
        assert float(overlap_sigma(0.5, g, 1.0)) == pytest.approx(0.5, rel=1e-6)
        for s0 in (0.05, 0.19, 0.45, 0.6, 0.9):
            assert float(overlap_sigma(s0, g, 1.0)) >= s0 - 1e-7
    assert float(overlap_sigma(0.3, 0.5, 1.0)) == pytest.approx(1 - 0.7 / (0.7 + 0.5),
                                                                rel=1e-6)


def test_tp_userbuffers_sigmas_by_hand():
    """TP hidden behind the GEMMs as TE userbuffers runs it: forward sigma_0 (SM margin or
    copy engine: no wave split), backward half at overlap_sigma(s0, 1, split) (bulk
    reduce-scatter beside the full-SM wgrad GEMM), half at sigma_0. s0 = 0.19, split 1:
    (0.19, (0.19 + 0.5) / 2 = 0.345); split 0: (0.19, 0.19) exactly. Gradient contract in log
    sigma_0 under x64: finite, matches finite differences, a larger sigma_0 loses more."""
    import jax
    from jax.test_util import check_grads

    f, b = tp_userbuffers_sigmas(0.19, 1.0)
    assert float(f) == 0.19 and float(b) == pytest.approx(0.345, rel=1e-6)
    assert tuple(float(x) for x in tp_userbuffers_sigmas(0.19, 0.0)) == (0.19, 0.19)
    with jax.enable_x64(True):
        loss = lambda x: sum(tp_userbuffers_sigmas(jax.numpy.exp(x), 1.0))  # noqa: E731
        x = jax.numpy.log(jax.numpy.array(0.19))
        check_grads(loss, (x,), order=1, modes=("rev",))
        g = float(jax.grad(loss)(x))
    assert np.isfinite(g) and g > 0


def test_gemm_wave_split_slows_the_hidden_dp_seconds_by_hand():
    """The fact changes only the price of the hidden seconds: the step grows by exactly
    (sigma - sigma_0) x dp_hidden_s (tp 1: no TP hides), sigma = overlap_sigma(sigma_0, g, 1)
    with g = the GEMMs' share of a layer's compute: 4 x its forward GEMMs under full
    recompute (forward, 2 x backward, the recomputed forward) over its compute + recompute
    (the step's, less the embedding and output layer, per micro-batch and layer)."""
    from diffperf.costs.compute import layer_dense_times_s
    from diffperf.predict import _head_parts
    from diffperf.workload.flops import layer_ops

    model, system = load_model("llama3-8b"), load_system("h100-sxm-80gb")
    par = Parallel(dp=64, micro_batch=2, global_batch=128, zero_stage=3, recompute=2)
    tb = training("bf16")
    on = tb.replace(gemm_wave_split=1.0)
    r0, r1 = predict(model, par, system, tb), predict(model, par, system, on)
    first, last = _head_parts(model, par, system, on, None)
    m, L = float(par.n_microbatches), 32.0
    layer_work = (float(r1.breakdown.compute_s + r1.breakdown.recompute_s) / m
                  - float(first["compute_s"] + last["compute_s"])) / L
    dense, _ = layer_dense_times_s(layer_ops(model, par, on), system, on)
    g = 4.0 * float(dense) / layer_work
    s0 = float(system.eff.overlap_slowdown)
    sigma = float(overlap_sigma(s0, g, 1.0))
    hidden = float(r0.breakdown.dp_hidden_s)
    assert 0.6 < g < 1.0 and float(r1.breakdown.dp_hidden_s) == hidden > 0
    assert float(r1.breakdown.overlap_slowdown_s) == pytest.approx(sigma * hidden, rel=1e-4)
    assert float(r1.step_time_s - r0.step_time_s) == pytest.approx((sigma - s0) * hidden,
                                                                   rel=1e-4)


# --------------------------------------------------------------------------------- CLI

def test_cli_predict_json_reports_the_set_and_the_envelope(capsys):
    """No overlay: the A100 set; GPT-3 175B ZeRO-1, selective recompute lies outside the
    envelope (recompute 'selective' was never measured) and its interval is widened."""
    assert main(["predict", "--json", "--no-cache", "--gpus", "64", "--tp", "8", "--pp", "8",
                 "--global-batch", "64"]) == 0
    d = json.loads(capsys.readouterr().out)
    s = d["efficiency_set"]
    assert s["name"] == "a100-default" and s["measured"] and s["heldout_mape_pct"] > 0
    t = d["trust"]
    assert t["inside_envelope"] is False and t["q95_log"] > s["heldout_q95_log"]
    lo, hi = t["interval_95_s"]
    T = d["result"]["step_time_s"]
    assert lo < T < hi and hi / T == pytest.approx(np.exp(t["q95_log"]), rel=1e-6)
    assert main(["predict", "--json", "--no-cache", "--gpus", "64", "--tp", "8", "--pp", "8",
                 "--global-batch", "64", "--recompute", "full", "--zero-stage", "0",
                 "--precision", "fp16"]) == 0
    t = json.loads(capsys.readouterr().out)["trust"]
    assert t["inside_envelope"] is True
    assert main(["predict", "--json", "--no-cache", "--gpus", "64", "--tp", "8", "--pp", "8",
                 "--global-batch", "64", "--calibration", "none"]) == 0
    assert json.loads(capsys.readouterr().out)["efficiency_set"]["name"] == tr.PHYSICS


def test_cli_validate_reports_the_set_of_each_system(capsys, tmp_path):
    """validate with no overlay: each system's GPU set (grand-teton-h100 -> h100, the fms
    A100 cluster -> a100), named in --json and in the text."""
    lines = PUBLISHED.read_text().splitlines()
    pick = [lines[0]] + [ln for ln in lines if ln.startswith(("tt-h100-l3-8b-n8-eager,",
                                                               "fms-a100-l2-7b-hsdp,"))]
    p = tmp_path / "two.csv"
    p.write_text("\n".join(pick) + "\n")
    assert main(["validate", str(p), "--json"]) == 0
    sets = json.loads(capsys.readouterr().out)["efficiency_sets"]
    assert {k: v["name"] for k, v in sets.items()} == {
        "grand-teton-h100": "h100-default", "a100-80gb-400gbps-node": "a100-default"}
    assert main(["validate", str(p), "--calibration", "none"]) == 0
    assert "physics-defaults" in capsys.readouterr().out


def test_render_trust_says_when_no_error_was_measured_outside(capsys):
    """Outside the envelope with no measured extrapolation regime, the text says the error
    there is unknown and gives the x/÷ factor, instead of naming 'unmeasured' as a regime;
    with a measured one it names that regime."""
    from diffperf.cli.predict_cmd import render_trust

    # describe() of a set with regimes always carries its first regime's held-out error
    base = dict(efficiency_set=dict(name="a100-default", gpu="a100", measured=True, path=None,
                                    note=None, heldout_mape_pct=5.5, heldout_q95_log=0.17,
                                    heldout_n=319, heldout_runs="vTrain"))
    for regime, q, want, not_want in (
            ("unmeasured", tr.UNMEASURED_Q, "no error measured outside it: interval widened "
             "to x/÷ 1.65", "nearest measured regime"),
            ("fsdp-published", 0.3, "nearest measured regime: fsdp-published",
             "no error measured")):
        rec = dict(base, trust=dict(inside_envelope=False, envelope_score=0.11, regime=regime,
                                    q95_log=q, interval_95_s=[1.0, 2.0]))
        render_trust(rec)
        out = " ".join(capsys.readouterr().out.split())
        assert want in out and not_want not in out, out
    # a set with no envelope at all (an overlay without regimes, the physics defaults): not
    # "OUTSIDE its envelope (score 0.00 ...)", there is none to be outside of
    for es in (dict(name="torch-h100", gpu="h100", measured=True, path=None, note=None,
                    heldout_mape_pct=9.8),
               dict(name="physics-defaults", gpu=None, measured=False, path=None,
                    note="the physics defaults")):
        rec = dict(efficiency_set=es, trust=dict(inside_envelope=False, envelope_score=0.0,
                                                 regime="unmeasured", q95_log=tr.UNMEASURED_Q,
                                                 interval_95_s=[1.0, 2.0]))
        render_trust(rec)
        out = " ".join(capsys.readouterr().out.split())
        assert "not checked (the set records no envelope): interval x/÷ 1.65" in out, out
        assert "OUTSIDE" not in out, out


def test_op_sac_and_layer_fraction_are_no_measured_recompute_mode():
    """The regimes list a recompute mode only where runs measured it as a layout names it
    (calibration/trust_sets.envelope_of leaves out TorchTitan's per-op SAC and a fraction of
    the layers checkpointed): such a layout is inside no regime that lists 'selective' or
    'full', while the same layout with the plain mode is."""
    from diffperf import Parallel

    env = dict(gpu=["h100"], precision=["bf16"], tp=[1, 8], pp=[1, 8], dp=[1, 64], cp=[1, 1],
               ep=[1, 1], gpus=[1, 512], micro_batch=[1, 4], zero_stage=[3],
               recompute=["selective", "full"])
    plain = Parallel(dp=16, zero_stage=3, recompute=1)
    for p, inside in ((plain, True), (plain.replace(recompute_policy=1.0), False),
                      (plain.replace(recompute=2, recompute_layer_frac=0.5), False),
                      (plain.replace(recompute=2), True)):
        d = tr.envelope_distance(tr.layout_columns(p), env, "bf16", "h100")
        assert (float(d[0]) == 0.0) == inside, (p.recompute, d)


def test_unnamed_recompute_marks_only_the_mode_a_fact_changes():
    """search's --set facts apply to every layout of a table: per-op SAC changes only the
    'selective' rows, a fraction of the layers only the 'full' rows."""
    r = np.array([0.0, 1.0, 2.0])
    np.testing.assert_array_equal(tr.unnamed_recompute(r, 1.0, 1.0), [0.0, tr.NOT_A_MODE, 2.0])
    np.testing.assert_array_equal(tr.unnamed_recompute(r, 0.0, 0.4), [0.0, 1.0, tr.NOT_A_MODE])
    np.testing.assert_array_equal(tr.unnamed_recompute(r), r)
    # Megatron-Core recompute_modules other than the default ["core_attn"]: only 'selective'
    mla = dict(core_attn=0.0, mla_up_proj=1.0)
    np.testing.assert_array_equal(tr.unnamed_recompute(r, 0.0, 1.0, mla),
                                  [0.0, tr.NOT_A_MODE, 2.0])
    np.testing.assert_array_equal(tr.unnamed_recompute(r, 0.0, 1.0, dict(core_attn=1.0)), r)
    cols = tr.layout_columns(Parallel(recompute=1, recompute_core_attn=0, recompute_mlp=1))
    assert float(cols["recompute"][0]) == tr.NOT_A_MODE
    assert float(tr.layout_columns(Parallel(recompute=1))["recompute"][0]) == 1.0
