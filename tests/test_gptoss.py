"""GPT-OSS's attention as the fused kernel computes it (docs/accuracy-gptoss.md): sliding-window
and full layers as separate kernels, each over the B x B score tiles it cannot skip
(Training.attn_tile; workload.flops.attention_tile_kappas, costs.compute.
attention_by_kind_time_s). Expected values are the docstrings' arithmetic, worked by hand.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import diffperf
from diffperf import Parallel
from diffperf.costs.compute import attention_by_kind_time_s, layer_times_s
from diffperf.workload.flops import (attention_by_kind, attention_io_bytes, attention_kappa,
                                     attention_tile_kappas, layer_ops)
from shipped import model as _model, system as _system

BF16 = diffperf.training("bf16")
TILED = BF16.replace(attn_tile=128.0)
GPT_OSS = _model("gpt-oss-120b")


def test_tile_kappas_of_gpt_oss_by_hand():
    """s 4096, w 128, B 128: n = 32 row blocks; a causal layer computes n (n + 1) / 2 = 528
    tiles, a window layer min(i, c) + 1 per row block with c = ceil(127 / 128) = 1:
    1 + 31 x 2 = 63 tiles; each tile 128^2 of the 4096^2 square."""
    k_full, k_win, f_win = (float(x) for x in attention_tile_kappas(GPT_OSS, TILED))
    assert k_full == pytest.approx(528 * 128**2 / 4096**2, rel=1e-6)  # 0.515625
    assert k_win == pytest.approx(63 * 128**2 / 4096**2, rel=1e-6)  # 0.0615234
    assert f_win == 0.5  # 18 of 36 layers
    # the exact band (attn_tile = 0's kappa) is about half the window layer's tiles
    band = (128 * 4096 - 128 * 127 / 2) / 4096**2
    assert k_win / band == pytest.approx(63 * 128**2 / (128 * 4096 - 128 * 127 / 2), rel=1e-6)
    assert 1.99 < k_win / band < 2.0
    # without flash attention every score is computed, as attention_kappa says
    nf = attention_tile_kappas(GPT_OSS, TILED.replace(flash_attention=0.0))
    assert [float(x) for x in nf[:2]] == [1.0, 1.0]


@pytest.mark.parametrize("window, tiles", [(512, 150), (1024, 252)])
def test_tile_counts_against_cudnn_window_timings(window, tiles):
    """cudnn-frontend PR #505 (cuDNN backend, B1 H16 d64 causal s 4096 backward): window /
    full time 171.0 / 558.2 = 0.306 for a 511-key left bound, 276.6 / 558.2 = 0.496 for 1023.
    Tiles: c = ceil((w - 1) / 128) = 4 or 8; N = 32 + c (c + 1) / 2 + c (31 - c) = 150, 252
    of 528: 0.284 and 0.477, within 7 % below the measured ratios (the per-block prologue and
    epilogue the count leaves out)."""
    m = GPT_OSS.replace(sliding_window=float(window))
    k_full, k_win, _ = (float(x) for x in attention_tile_kappas(m, TILED))
    assert k_win / k_full == pytest.approx(tiles / 528, rel=1e-6)
    measured = {512: 171.0 / 558.2, 1024: 276.6 / 558.2}[window]
    assert 0.9 < (tiles / 528) / measured < 1.0


@pytest.mark.parametrize("tile", [1e-30, 0.5, 1e30])
def test_any_tile_a_user_sets_gives_finite_kappas(tile):
    """attn_tile is clipped to [1, s]: a tile of one score counts the exact causal triangle
    (kappa_full = (s + 1) / 2s), a tile as large as the sequence computes it whole (1)."""
    k_full, k_win, _ = (float(x) for x in attention_tile_kappas(
        GPT_OSS, BF16.replace(attn_tile=tile)))
    assert np.isfinite(k_full) and np.isfinite(k_win) and 0 < k_win <= k_full <= 1
    if tile > 1e3:
        assert k_full == 1.0
    else:
        assert k_full == pytest.approx(4097 / 8192, rel=1e-6)
        assert k_win == pytest.approx((128 * 4096 - 128 * 127 / 2) / 4096**2, rel=1e-5)


def test_no_window_and_a_window_as_long_as_the_sequence():
    """A model without windows has f_win = 0; a window >= s is full causal attention."""
    llama = _model("llama3-8b")
    assert float(attention_tile_kappas(llama, TILED)[2]) == 0.0
    wide = GPT_OSS.replace(sliding_window=8192.0)
    assert float(attention_tile_kappas(wide, TILED)[2]) == 0.0


def test_attention_by_kind_time_on_h100_by_hand():
    """GPT-OSS on one H100 SXM (b 1, t 1): each kernel's roofline at its own efficiency,

        eta = attn_max / [(1 + (W_half / W)^gamma)(1 + d_half / 64)],  W = 64 x 4096^2 kappa
        t = max(4 x 4096^2 x 64 x 64 kappa / (F eta), io / (BW eta_mem))
    io = 2 B x 4096 x (64 + 8 + 8 + 64) x 64 = 75.5 MB (Q, K, V read, O written), and the
    mean layer (1 - 0.5) t_full + 0.5 t_win."""
    h100 = _system("h100-sxm-80gb")
    e = h100.eff
    par = Parallel(micro_batch=1.0)
    io = float(attention_io_bytes(GPT_OSS, par, TILED))
    assert io == 2 * 4096 * 144 * 64
    frac = float(h100.matmul_sustained_frac)
    F = float(h100.matmul_flops_per_s) * (frac / (797.5 / 989.4) if frac > 0 else 1.0)

    def kernel(kappa):
        work = 64 * 4096**2 * kappa
        eta = float(e.attn_max) / ((1 + (float(e.attn_half_work) / work) ** float(
            e.attn_exponent)) * (1 + float(e.attn_half_head_dim) / 64))
        flops = 4 * 4096**2 * 64 * 64 * kappa
        return max(flops / (F * eta), io / (float(h100.hbm_bandwidth_Bps) * float(e.mem_eff)))

    hand = 0.5 * kernel(528 / 1024) + 0.5 * kernel(63 / 1024)
    got = float(attention_by_kind_time_s(attention_by_kind(GPT_OSS, par, TILED), h100, TILED,
                                         io))
    assert got == pytest.approx(hand, rel=1e-5)
    # the one blended kernel of attn_tile = 0 (kappa 0.2654 at the mean work) is faster
    ops = layer_ops(GPT_OSS, par, BF16)
    blended = float(layer_times_s(ops, h100, BF16, io)[1])
    assert float(attention_kappa(GPT_OSS, BF16)) == pytest.approx(0.265381, rel=1e-5)
    assert blended < got


def test_attn_tile_128_moves_windowed_models_with_a_physical_gradient():
    """attn_tile = 128 moves a model with windows (its window layers cost their tiles), with
    finite gradients and a faster peak never slower: one value-and-gradient program (the
    layout's own features, `features_of`, and the XLA:CPU options predict uses) for both
    trainings. attn_tile = 0 (the default) leaving every prediction alone is
    tests/test_regression.py's (the public predict keeps the term). A model without windows
    moves only by the causal diagonal tiles (kappa (s + B) / 2s against 1/2)."""
    from diffperf.api import _normalize
    from diffperf.predict import features_of, predict_step
    from diffperf.search.kernel import _CPU_QUICK_OPTIONS

    h100 = _system("h100-sxm-80gb")
    par = _normalize(Parallel(dp=8.0, ep=8.0, micro_batch=1.0, global_batch=64.0))
    feats = features_of(GPT_OSS, par, TILED)
    assert feats == {"ep", "experts", "tiles"}
    opts = dict(compiler_options=_CPU_QUICK_OPTIONS) if jax.default_backend() == "cpu" else {}
    step = jax.jit(jax.value_and_grad(
        lambda s, t: predict_step(GPT_OSS, par, s, t, features=feats).step_time_s), **opts)
    base, _ = step(h100, BF16)
    tiled, grad = step(h100, TILED)
    assert float(tiled) > float(base)
    assert all(np.all(np.isfinite(np.asarray(g))) for g in jax.tree.leaves(grad))
    assert float(grad.matmul_flops_per_s) < 0 and float(grad.eff.attn_max) < 0
    assert "tiles" not in features_of(GPT_OSS, par, BF16)
    # the sinks' backward cost (attention_sink_backward_s, H100 1.52 ns per query row), in the
    # same program: a larger per-row cost never speeds the step, and removing it moves the step
    # by m L R tau (8 micro-batches x 36 layers x 262,144 rows x 1.52 ns = 0.1148 s; the
    # backward is on the critical path, the EP all-to-all of this layout is not hidden by it)
    assert float(grad.attn_sink_bwd_row_s) > 0
    no_sink, _ = step(h100.replace(attn_sink_bwd_row_s=0.0), TILED)
    assert float(tiled) - float(no_sink) == pytest.approx(8 * 36 * 262144 * 1.52e-9, rel=1e-3)
    # no window: the mean layer is the full one; kappa 0.5156 vs 0.5 (s 4096)
    llama = _model("llama3-8b")
    lpar = Parallel(dp=8.0, micro_batch=1.0, global_batch=64.0)
    full, _, f = attention_by_kind(llama, lpar, TILED)
    assert float(f) == 0.0
    ratio = float(jnp.sum(full.flops)) / float(jnp.sum(layer_ops(llama, lpar, BF16)
                                                         .attention.flops))
    assert ratio == pytest.approx((8192 + 128) / 8192, rel=1e-6)  # llama3-8b: s 8192


def test_attention_by_kind_gradient_contract(x64):
    """d t / d log(leaf) for the matmul peak, HBM bandwidth, attn_max and attn_half_work:
    matches finite differences (float64), finite, and the physical sign (faster rates never
    slow it, a larger half-work never speeds it)."""
    from jax.test_util import check_grads

    h100 = _system("h100-sxm-80gb")
    par = Parallel(micro_batch=1.0)
    kinds = attention_by_kind(GPT_OSS, par, TILED)
    io = attention_io_bytes(GPT_OSS, par, TILED)

    def t(logs):
        e = h100.eff.replace(attn_max=h100.eff.attn_max * jnp.exp(logs[2]),
                             attn_half_work=h100.eff.attn_half_work * jnp.exp(logs[3]))
        s = h100.replace(matmul_flops_per_s=h100.matmul_flops_per_s * jnp.exp(logs[0]),
                         hbm_bandwidth_Bps=h100.hbm_bandwidth_Bps * jnp.exp(logs[1]), eff=e)
        return attention_by_kind_time_s(kinds, s, TILED, io)

    x = jnp.zeros(4)
    check_grads(t, (x,), order=1, modes=("rev",), eps=1e-4)
    g = np.asarray(jax.grad(t)(x))
    assert np.all(np.isfinite(g))
    assert g[0] < 0 and g[1] <= 0 and g[2] < 0 and g[3] > 0


def test_cudnn_fe_gptoss_timings_as_transcribed():
    """data/kernels/cudnn_fe_gptoss_sdpa.csv (cudnn-frontend's GPT-OSS SDPA benchmark, data/
    README.md): every row's published TFLOP/s is the kept band's FLOPs over its time, forward
    4 N b h d and backward 10 N b h d (2.5 x, diffperf's FLASH_BACKWARD_WORK), N = w (w + 1) / 2
    + (s - w) w scores per head; so the times are transcribed as published and the FLOP count
    the comparison in calibration/gptoss_attention.py uses is the benchmark's own. By hand, one
    row: GB200 bf16 b 2, 128 heads, s 4096, w 128 forward: N = 8256 + 3968 x 128 = 516,160,
    4 x 516,160 x 256 x 64 = 33.83 GFLOP / 0.210 ms = 161 TFLOP/s (published 161)."""
    import csv
    from pathlib import Path

    from diffperf.costs.compute import FLASH_BACKWARD_WORK

    rows = list(csv.DictReader(open(Path(__file__).resolve().parent.parent / "data" / "kernels"
                                    / "cudnn_fe_gptoss_sdpa.csv")))
    assert len(rows) == 200 and {r["gpu"] for r in rows} == {"GB200", "GB300", "H200"}
    assert {r["backend"] for r in rows} == {"cudnn", "flash_attention_4"}
    for r in rows:
        b, s, h, d, w = (int(r[k]) for k in ("batch", "seq", "q_heads", "head_dim", "window"))
        n = w * (w + 1) // 2 + (s - w) * w
        flop = 4 * n * b * h * d * (FLASH_BACKWARD_WORK if r["pass"] == "bwd" else 1.0)
        tflops = flop / (float(r["time_ms"]) * 1e-3) / 1e12
        assert abs(tflops - float(r["tflops_published"])) <= 0.51 + 0.005 * tflops, r
    one = [r for r in rows if (r["gpu"], r["dtype"], r["seq"], r["window"], r["pass"],
                               r["cudnn_backend"]) == ("GB200", "bfloat16", "4096", "128", "fwd",
                                                       "92200")]
    assert [float(r["time_ms"]) for r in one] == [0.210]
    assert 4 * 516160 * 256 * 64 / 0.210e-3 / 1e12 == pytest.approx(161.1, abs=0.05)


def test_sink_backward_by_hand():
    """costs.compute.attention_sink_backward_s: phi_flash x sinks x R x tau_row, R = b (a / t)
    (s / c) query rows. GPT-OSS on one H100 (b 1, s 4096): R = 64 x 4096 = 262,144, x 1.52 ns =
    0.398 ms per layer backward; tp 2 halves the heads, cp 2 the rows; 0 for a model without
    sinks, on a GPU where it is not measured (GB200) and without flash attention."""
    from diffperf.costs.compute import attention_sink_backward_s
    from diffperf.workload.flops import query_rows

    h100, gb200 = _system("h100-sxm-80gb"), _system("gb200-nvl72")
    assert float(h100.attn_sink_bwd_row_s) == pytest.approx(1.52e-9, rel=1e-12)
    assert float(gb200.attn_sink_bwd_row_s) == 0.0

    def t(model, par, system=h100, training=BF16):
        return float(attention_sink_backward_s(query_rows(model, par), model.attention_sinks,
                                               system, training))

    one = Parallel(micro_batch=1.0)
    assert float(query_rows(GPT_OSS, one)) == 262144.0
    assert t(GPT_OSS, one) == pytest.approx(262144 * 1.52e-9, rel=1e-6)  # 0.3985 ms
    assert t(GPT_OSS, Parallel(micro_batch=4.0)) == pytest.approx(4 * 262144 * 1.52e-9)
    assert t(GPT_OSS, Parallel(tp=2.0, micro_batch=1.0)) == pytest.approx(131072 * 1.52e-9)
    assert t(GPT_OSS, Parallel(cp=2.0, micro_batch=1.0)) == pytest.approx(131072 * 1.52e-9)
    assert t(_model("llama3-8b"), one) == 0.0
    assert t(GPT_OSS, one, system=gb200) == 0.0
    assert t(GPT_OSS, one, training=BF16.replace(flash_attention=0.0)) == 0.0


def test_sink_backward_cost_is_the_h100_measurement():
    """configs/systems/h100-sxm-80gb.yaml attn_sink_bwd_row_ns = 1.52: the mean over the six
    measured (shape, layer kind) pairs of data/kernels/h100_gptoss_attention.csv of (cuDNN
    backward with the sink - without) / (b x 64 heads x s) query rows; each within 15 % of it
    (linear in rows: a window layer pays what a full one does), and the forward unchanged by
    the sink (within 3 %)."""
    import csv
    from pathlib import Path

    rows = list(csv.DictReader(open(Path(__file__).resolve().parent.parent / "data" / "kernels"
                                    / "h100_gptoss_attention.csv")))
    t = {(r["pass"], r["b"], r["s"], r["window_left"], r["sink"]): float(r["gpu_ms"])
         for r in rows if r["impl"] == "cudnn_fe"}
    per_row = []
    for b, s in (("1", "4096"), ("4", "4096"), ("2", "8192")):
        for w in ("127", ""):
            d = t[("bwd", b, s, w, "1")] - t[("bwd", b, s, w, "0")]
            per_row.append(d * 1e-3 / (int(b) * 64 * int(s)))
            assert t[("fwd", b, s, w, "1")] == pytest.approx(t[("fwd", b, s, w, "0")], rel=0.03)
    mean = sum(per_row) / len(per_row)
    assert float(_system("h100-sxm-80gb").attn_sink_bwd_row_s) == pytest.approx(mean, abs=5e-12)
    assert all(abs(v / mean - 1) < 0.15 for v in per_row)


def test_sink_backward_gradient_contract(x64):
    """d t_sink / d log(tau_row), d log(R): matches finite differences in float64, finite and
    positive (a costlier row or more rows never make it faster)."""
    from jax.test_util import check_grads

    from diffperf.costs.compute import attention_sink_backward_s

    h100 = _system("h100-sxm-80gb")

    def t(logs):
        s = h100.replace(attn_sink_bwd_row_s=h100.attn_sink_bwd_row_s * jnp.exp(logs[0]))
        return attention_sink_backward_s(262144.0 * jnp.exp(logs[1]), 1.0, s, BF16)

    x = jnp.zeros(2)
    check_grads(t, (x,), order=1, modes=("rev",), eps=1e-4)
    g = np.asarray(jax.grad(t)(x))
    assert np.all(np.isfinite(g)) and np.all(g > 0)


def test_cudnn_fe_rows_carry_their_licence():
    """cudnn-frontend was relicensed from MIT to Apache-2.0 in 2026-07 (PR #408): the rows of
    cudnn_fe_gptoss_sdpa.csv from its 2026-09 commits ship under Apache-2.0 (licence text and
    NOTICE beside the CSV, the NOTICE naming those commits), the earlier ones under MIT; a
    row from any other commit has no licence read for it (data/README.md, "Licences")."""
    import csv
    from pathlib import Path

    data = Path(__file__).resolve().parent.parent / "data"
    mit = {"df73764adb98b7445b77662ce07b1ea434c8f3ee", "fb682ce761a2705e40f9b5d528737a3e0eb33cec"}
    apache = {"a0312ccbd9ffccdef77faf5bf3ab40d46d602cb5",
              "07b111f1fea26339224d72aced86a5b02526d374",
              "546cc71225c86c75f4f2b059a01e8ed10fa8c603"}
    rows = list(csv.DictReader(open(data / "kernels" / "cudnn_fe_gptoss_sdpa.csv")))
    commits = [r["source_commit"] for r in rows]
    assert set(commits) == mit | apache
    assert (sum(c in mit for c in commits), sum(c in apache for c in commits)) == (140, 60)
    notice = (data / "NOTICE-cudnn-frontend").read_text()
    assert all(c in notice for c in apache) and not any(c in notice for c in mit)
    assert "Apache License\n                           Version 2.0" in (
        data / "LICENSE-cudnn-frontend-Apache-2.0").read_text()
    assert "Permission is hereby granted, free of charge" in (
        data / "LICENSE-cudnn-frontend").read_text()


def test_unmeasured_sink_cost_is_said():
    """predict / search say when a model with sinks runs on a GPU whose sink-gradient cost is
    not measured (attn_sink_bwd_row_s = 0 prices it as free): GB200 yes; the H100 (measured),
    a model without sinks, or no flash attention (the term is not read) no."""
    from diffperf.cli.options import unmeasured_cost_notes

    h100, gb200 = _system("h100-sxm-80gb"), _system("gb200-nvl72")
    (note,) = unmeasured_cost_notes(GPT_OSS, gb200, BF16)
    assert "gpt-oss-120b" in note and "gb200-nvl72" in note and "not measured" in note
    assert unmeasured_cost_notes(GPT_OSS, h100, BF16) == []
    # the other system files of the same 700 W H100 SXM carry the measurement (no note); the
    # H200 / Grand Teton's 500 W H100 (other memory, power) do not
    for name in ("h100-80gb-800gbps-node", "meta-h100-24k"):
        assert float(_system(name).attn_sink_bwd_row_s) == float(h100.attn_sink_bwd_row_s)
    assert len(unmeasured_cost_notes(GPT_OSS, _system("h200-sxm-141gb"), BF16)) == 1
    assert unmeasured_cost_notes(_model("llama3-8b"), gb200, BF16) == []
    assert unmeasured_cost_notes(GPT_OSS, gb200, BF16.replace(flash_attention=0.0)) == []


def test_sink_backward_cost_is_per_head():
    """data/kernels/h100_sink_heads.csv (calibration/device_h100_sink_heads.py): the same cuDNN
    graphs at 64 / 32 / 16 / 8 query heads (GPT-OSS at t = 1, 2, 4, 8). The sink's backward
    cost per b h s row stays within 15 % of the YAML's 1.52 ns at every head count (mean per
    head count 1.53 / 1.58 / 1.61 / 1.67 ns), while per b s it falls with the heads (~8x from 64
    to 8): the cost is per head, so R = b (a / t) (s / c) divides it by t as the term does.
    Pairs where a call is host-bound (gpu_ms < 1.5 x host_ms: one 8-head window pair) are
    left out."""
    import csv
    from pathlib import Path

    rows = list(csv.DictReader(open(Path(__file__).resolve().parent.parent / "data" / "kernels"
                                    / "h100_sink_heads.csv")))
    t = {(r["hq"], r["b"], r["s"], r["window_left"], r["sink"]): (float(r["gpu_ms"]),
                                                                  float(r["host_ms"]))
         for r in rows if r["pass"] == "bwd"}
    tau = float(_system("h100-sxm-80gb").attn_sink_bwd_row_s) * 1e9
    per_bhs, per_bs = {}, {}
    for (hq, b, s, w, sink), (g1, h1) in t.items():
        g0, h0 = t[(hq, b, s, w, "0")]
        if sink == "0" or g1 < 1.5 * h1 or g0 < 1.5 * h0:
            continue
        d_ns = (g1 - g0) * 1e6
        per_bhs.setdefault(int(hq), []).append(d_ns / (int(b) * int(hq) * int(s)))
        per_bs.setdefault(int(hq), []).append(d_ns / (int(b) * int(s)))
    assert sorted(per_bhs) == [8, 16, 32, 64] and sum(map(len, per_bhs.values())) == 23
    assert all(abs(v / tau - 1) < 0.15 for vs in per_bhs.values() for v in vs)
    mean = {h: sum(v) / len(v) for h, v in per_bs.items()}
    assert 6.0 < mean[64] / mean[8] < 8.5 and mean[64] > mean[32] > mean[16] > mean[8]


def test_keys_per_row_and_window_kernels_scale_with_query_rows():
    """calibration/attn_keys.py (docs/accuracy-gptoss.md, "Session 15: attention by keys per
    query row"). By hand: GPT-OSS s 4096, attn_tile 128 -> the window layer computes 63 tiles
    of 128 x 128 (kappa 0.0615), 63 x 128^2 / 4096 = 252 keys per query row; the full layer
    528 tiles -> 2112 keys; both are s x kappa of attention_tile_kappas. The measured cuDNN
    window kernels (data/kernels/h100_gptoss_attention.csv, no sink) at one kv = 252: 4x the
    query rows (b 1 -> b 4, 262,144 -> 1,048,576) take 3.46x (forward 0.0747 -> 0.2588 ms) and
    3.67x (backward 0.3107 -> 1.1406 ms) the time, while the price now (the work form, gamma
    1.2) grows 2.08x: the deficit moves with the rows at fixed keys, so no factor in keys per
    row alone can remove it (the reason the keys-only fit puts k_fwd at 0)."""
    import csv
    from pathlib import Path

    from calibration.attn_keys import keys_per_row
    from calibration.gptoss_attention import priced_ms

    assert keys_per_row(4096, 128, 128.0) == pytest.approx(252.0)
    assert keys_per_row(4096, 0, 128.0) == pytest.approx(2112.0)
    k_full, k_win, _ = attention_tile_kappas(GPT_OSS.replace(seq_len=4096.0), TILED)
    assert keys_per_row(4096, 128, 128.0) == pytest.approx(4096 * float(k_win), rel=1e-6)
    assert keys_per_row(4096, 0, 128.0) == pytest.approx(4096 * float(k_full), rel=1e-6)
    path = Path(__file__).resolve().parent.parent / "data" / "kernels" / "h100_gptoss_attention.csv"
    t = {(r["b"], r["pass"]): float(r["gpu_ms"]) for r in csv.DictReader(open(path))
         if r["impl"] == "cudnn_fe" and r["sink"] == "0" and r["window_left"] == "127"
         and r["s"] == "4096"}
    for p in ("fwd", "bwd"):
        measured = t[("4", p)] / t[("1", p)]
        priced = (priced_ms("h100-sxm-80gb", 4, 4096, 64, 8, 64, 128, p)
                  / priced_ms("h100-sxm-80gb", 1, 4096, 64, 8, 64, 128, p))
        assert 3.3 < measured < 4.0
        assert priced == pytest.approx(2.08, abs=0.03)


def test_two_factor_attention_efficiency_by_hand():
    """costs.compute.attention_efficiency's two-factor form (docs/accuracy-gptoss.md, "Session
    15: attention by keys per query row"). By hand at the all-host fit's constants (eta_max
    0.893, R_half 33,490, d_half 47, k 253 / 648), R = 262,144 query rows, kv = 252 keys
    (GPT-OSS's 128-key window at b 1, attn_tile 128), d_h 64:
        0.893 / ((1 + 33490 / 262144) (1 + 47 / 64)) = 0.893 / (1.127754 x 1.734375) = 0.456556
        forward  x 252 / (252 + 253) = 0.227826;   backward  x 252 / (252 + 648) = 0.127836.
    Off (attn_half_rows 0, the default) it is the work form whether or not rows are given;
    d eta / d k_pass < 0 (a longer fixed part per tile: slower) and finite."""
    from diffperf.costs.compute import attention_efficiency
    from diffperf.specs.system import Efficiency

    e = Efficiency(attn_max=0.893, attn_half_head_dim=47.0, attn_half_rows=33490.0,
                   attn_half_keys=253.0, attn_half_keys_bwd=648.0)
    R, kv = 262144.0, 252.0
    assert float(attention_efficiency(R * kv, 64.0, e, R)) == pytest.approx(0.227826, rel=1e-5)
    assert float(attention_efficiency(R * kv, 64.0, e, R, backward=True)) == pytest.approx(
        0.127836, rel=1e-5)
    off = Efficiency()
    assert float(attention_efficiency(R * kv, 64.0, off, R)) == pytest.approx(float(
        attention_efficiency(R * kv, 64.0, off)), rel=1e-6)
    g = jax.grad(lambda k: attention_efficiency(R * kv, 64.0, e.replace(attn_half_keys=k), R))(
        253.0)
    assert np.isfinite(float(g)) and float(g) < 0
    g0 = jax.grad(lambda r: attention_efficiency(R * kv, 64.0, off.replace(attn_half_rows=r),
                                                 R))(0.0)
    assert np.isfinite(float(g0))


def test_attention_group_size_is_inert_on_h100():
    """data/kernels/h100_attn_group.csv (calibration/device_h100_attn_group.py): cuDNN SDPA at 64
    query heads with 64 / 16 / 8 / 1 KV heads. At each head dim, shape, window and pass the
    no-sink times of the four group sizes agree within 12 % of their mean (the full layers
    within 5 %), so the two-factor attention efficiency needs no group term; d_h 128 runs the
    full forward at >= 1.25x the TFLOP/s of d_h 64."""
    import csv
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "data" / "kernels" / "h100_attn_group.csv"
    rows = [r for r in csv.DictReader(open(path)) if r["sink"] == "0"]
    by = {}
    for r in rows:
        by.setdefault((r["d"], r["b"], r["window_left"], r["pass"]), {})[r["hkv"]] = float(
            r["gpu_ms"])
    assert len(by) == 16 and all(sorted(v) == ["1", "16", "64", "8"] for v in by.values())
    for (d, b, w, p), v in by.items():
        mean = sum(v.values()) / 4
        assert max(abs(x / mean - 1) for x in v.values()) < (0.05 if w == "" else 0.12)
    tf = {(r["d"], r["b"], r["hkv"]): float(r["tflops_band"]) for r in rows
          if r["window_left"] == "" and r["pass"] == "fwd"}
    assert all(tf[("128", b, h)] >= 1.25 * tf[("64", b, h)] for _, b, h in tf if _ == "64")


def test_two_factor_fields_reach_overlays_and_rows_with_cp_and_tp():
    """The two-factor fields are overlay keys (load.efficiency_from_dict: counts, >= 0; a
    negative is refused there and by specs.validate.check_system), and their R and kv are the
    kernel's: R = b (a/t) (s/c) query rows (tp 2, cp 2, b 2, GPT-OSS 64 heads, s 4096:
    2 x 32 x 2048 = 131,072), each kind's kv = W / R = kappa s whatever c is (252 window keys,
    2112 full at attn_tile 128, as at cp 1): the same R for the full and the window kernel."""
    from diffperf.errors import SpecError
    from diffperf.load import efficiency_from_dict
    from diffperf.specs.validate import check_system
    from diffperf.workload.flops import query_rows

    keys = {"attn_half_rows": 33490, "attn_half_keys": 253, "attn_half_keys_bwd": 648}
    e = efficiency_from_dict(keys, "efficiency")
    assert (e.attn_half_rows, e.attn_half_keys, e.attn_half_keys_bwd) == (33490, 253, 648)
    h100 = _system("h100-sxm-80gb")
    for k in keys:
        with pytest.raises(SpecError, match=f"efficiency.{k}=-1"):
            efficiency_from_dict({k: -1}, "efficiency")
        with pytest.raises(SpecError, match=f"eff.{k}"):
            check_system(h100.replace(eff=h100.eff.replace(**{k: -1.0})))
    par = Parallel(tp=2.0, cp=2.0, micro_batch=2.0)
    m = GPT_OSS.replace(seq_len=4096.0)
    R = float(query_rows(m, par))
    assert R == 2 * 32 * 2048
    full, window, _ = attention_by_kind(m, par, TILED)
    for kind, kv in ((full, 2112.0), (window, 252.0)):
        work = float(kind.count[0] * kind.m[0] * kind.n[0])
        assert work / R == pytest.approx(kv, rel=1e-6)
