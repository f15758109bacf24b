"""Golden cases worked by hand (STYLE.md section 7, kinds 1 and 2).

Every expected value is written as the arithmetic of a published formula, with a comment on
where each term comes from (shared/PAPERS.md sections 5.1, 5.4, 5.5, 5.6, 5.9 and 6); none is a
number copied from diffperf's own output. Exact identities run under float64 (the `x64`
fixture turns it on for one test and back off); float32 results are checked against the same
arithmetic at float32 tolerance.
"""

from __future__ import annotations

import csv
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import diffperf
from diffperf import Efficiency, Model, Parallel, System, Tier, Training
from diffperf.costs.collectives import all_gather_s, all_reduce_s, all_to_all_s, send_recv_s
from diffperf.costs.tiers import p2p_tier_fractions, tier_ranks
from diffperf.memory.activations import layer_activation_bytes
from diffperf.memory.weights import gradient_bytes, optimizer_bytes, weight_bytes
from diffperf.predict import _flops_per_step
from diffperf.memory.activations import layers_in_flight
from diffperf.schedule.pipeline import critical_stage, pipeline_times_s, stage_times_s
from diffperf.workload.params import total_params
from diffperf.workload.pp import bubble_fraction, pp_message_bytes, stage_layers
from diffperf.workload.stages import pipeline_stages

NCCL_A100 = Path(__file__).resolve().parents[1] / "data" / "kernels" / "a100_nccl_allreduce.csv"




# GPT-3 175B (Brown et al. 2020, Table 2.1), the model of PAPERS.md sections 5.6 and 6.
GPT3 = dict(L=96, h=12288, a=96, s=2048, V=50257)


def _gpt3():
    return diffperf.load_model("gpt3-175b")


# --------------------------------------------------------------------------------------------
# FLOPs per iteration: Narayanan et al. SC21 Section 5.1 (PAPERS.md section 5.1)
# --------------------------------------------------------------------------------------------

def _narayanan_f_iter(B, s, L, h, V):
    """F_iter = 96 B s L h^2 (1 + s/(6h) + V/(16 L h)): full recompute, kappa = 1."""
    return 96 * B * s * L * h**2 * (1 + s / (6 * h) + V / (16 * L * h))


def _f_model(B, s, L, h, V):
    """F_model = 72 B s L h^2 (1 + s/(6h) + V/(12 L h)): no recompute, kappa = 1."""
    return 72 * B * s * L * h**2 * (1 + s / (6 * h) + V / (12 * L * h))


def _flash_backward_extra(B, s, L, h):
    """Extra work of the flash-attention backward, which recomputes QK^T: its attention part is
    2.5 x the forward instead of 2 x (PAPERS.md 5.1), i.e. 0.5 x the forward attention core
    4 B s^2 h kappa per layer (QK^T and AV, 2 B s^2 h each, kappa = 1)."""
    return 0.5 * 4 * B * s**2 * h * L


def test_hardware_flops_full_recompute_match_narayanan_per_op_sums(x64):
    # kappa = 1 by a full (bidirectional) attention square with the flash kernel on: the flash
    # kernel has no masked blocks to skip, so kappa = 1 - causal/2 = 1 (PAPERS.md 5.1).
    model = _gpt3().replace(causal=0.0)
    B = 1536.0
    par = Parallel(tp=8, pp=8, dp=16, micro_batch=1, global_batch=B, recompute=2)
    model_flops, hw_flops = _flops_per_step(model, par, Training())
    g = GPT3
    # F_iter: 4 passes of each layer (fwd, recompute, 2 x fwd for bwd), 3 of the logits; plus
    # the flash backward's recomputed QK^T, which Narayanan's equation does not contain.
    expected_hw = _narayanan_f_iter(B, g["s"], g["L"], g["h"], g["V"]) + _flash_backward_extra(
        B, g["s"], g["L"], g["h"])
    expected_model = _f_model(B, g["s"], g["L"], g["h"], g["V"])
    np.testing.assert_allclose(float(hw_flops), expected_hw, rtol=1e-12)
    np.testing.assert_allclose(float(model_flops), expected_model, rtol=1e-12)


def test_result_flops_match_narayanan_in_float32():
    """The same identities through the public predict() (float32, one compile)."""
    model = _gpt3().replace(causal=0.0)
    B = 1536.0
    g = GPT3
    sys_ = diffperf.load_system("a100-sxm-80gb")
    full = Parallel(tp=8, pp=8, dp=16, micro_batch=1, global_batch=B, recompute=2,
                    sequence_parallel=1)
    res = diffperf.predict(model, full, sys_)
    np.testing.assert_allclose(
        float(res.hardware_flops),
        _narayanan_f_iter(B, g["s"], g["L"], g["h"], g["V"])
        + _flash_backward_extra(B, g["s"], g["L"], g["h"]), rtol=1e-6)
    np.testing.assert_allclose(float(res.model_flops),
                               _f_model(B, g["s"], g["L"], g["h"], g["V"]), rtol=1e-6)
    # Model FLOPs do not depend on recompute (MFU basis, Korthikanti et al. Section 6).
    none = diffperf.predict(model, full.replace(recompute=0), sys_)
    np.testing.assert_allclose(float(none.model_flops), float(res.model_flops), rtol=1e-7)
    # Without recompute the executed work is F_model + the flash backward's extra only.
    np.testing.assert_allclose(
        float(none.hardware_flops),
        _f_model(B, g["s"], g["L"], g["h"], g["V"])
        + _flash_backward_extra(B, g["s"], g["L"], g["h"]), rtol=1e-6)


def test_model_flops_without_flash_match_f_model(x64):
    # kappa = 1 the other way: a causal mask but no flash kernel (the full square is computed).
    model = _gpt3()
    B = 512.0
    par = Parallel(tp=8, pp=8, dp=8, micro_batch=1, global_batch=B, recompute=0)
    model_flops, _ = _flops_per_step(model, par, Training(flash_attention=0.0))
    g = GPT3
    np.testing.assert_allclose(float(model_flops), _f_model(B, g["s"], g["L"], g["h"], g["V"]),
                               rtol=1e-12)


def test_hardware_flops_without_flash_attention_have_no_flash_backward_extra(x64):
    """Training(flash_attention=0): attention is not the fused kernel (scores are stored, see
    memory.activations and workload.flops.elementwise_bytes), so its backward is the plain
    2 x forward of its two matmuls (dV, dP, dQ, dK) with nothing recomputed. With full
    recompute and kappa = 1 the executed FLOPs are then exactly Narayanan's F_iter."""
    model = _gpt3()  # causal, but flash off -> kappa = 1
    B = 1536.0
    par = Parallel(tp=8, pp=8, dp=16, micro_batch=1, global_batch=B, recompute=2)
    _, hw_flops = _flops_per_step(model, par, Training(flash_attention=0.0))
    g = GPT3
    np.testing.assert_allclose(float(hw_flops),
                               _narayanan_f_iter(B, g["s"], g["L"], g["h"], g["V"]), rtol=1e-12)


def test_causal_flash_halves_the_attention_term(x64):
    # PAPERS.md 5.1: counting causal attention with kappa = 1/2 (flash skips masked blocks)
    # halves s/(6h) to s/(12h) in F_model.
    model = _gpt3()
    B = 512.0
    par = Parallel(tp=8, pp=8, dp=8, micro_batch=1, global_batch=B)
    model_flops, _ = _flops_per_step(model, par, Training())
    L, h, s, V = GPT3["L"], GPT3["h"], GPT3["s"], GPT3["V"]
    expected = 72 * B * s * L * h**2 * (1 + s / (12 * h) + V / (12 * L * h))
    np.testing.assert_allclose(float(model_flops), expected, rtol=1e-12)


def test_gpt3_training_compute_against_brown_et_al(x64):
    # PAPERS.md section 6: GPT-3 175B on 300e9 tokens. [D] F_model per token x 300e9 = 3.23e23
    # (kappa = 1); 6 N D ~ 3.14e23 (Brown et al. 2020 Table D.1 [S]) within a few percent (the
    # s/(6h) attention term is ~2.8 %).
    model = _gpt3().replace(causal=0.0)
    B, s, tokens = 1.0, GPT3["s"], 300e9
    par = Parallel(micro_batch=1, global_batch=B)
    model_flops, _ = _flops_per_step(model, par, Training())
    total = float(model_flops) / (B * s) * tokens
    assert round(total / 1e23, 2) == 3.23
    six_nd = 6 * float(total_params(model)) * tokens
    assert abs(total / six_nd - 1) < 0.03


# --------------------------------------------------------------------------------------------
# Parameter counts: Narayanan et al. SC21 Section 5.1, Table 1 (PAPERS.md sections 5.1, 6)
# --------------------------------------------------------------------------------------------

# (config name, published parameter column of Table 1 in billions, as printed)
MEGATRON_TABLE1 = [
    ("megatron-1.7b", "1.7"), ("megatron-3.6b", "3.6"), ("megatron-7.5b", "7.5"),
    ("megatron-18.4b", "18.4"), ("megatron-39.1b", "39.1"), ("megatron-76.1b", "76.1"),
    ("megatron-145.6b", "145.6"), ("megatron-310.1b", "310.1"), ("megatron-529.6b", "529.6"),
    ("megatron-1t", "1008.0"),
]


@pytest.mark.parametrize("name,published", MEGATRON_TABLE1)
def test_megatron_table1_parameter_counts(x64, name, published):
    m = diffperf.load_model(name)
    L, h, V, s = int(m.n_layers), int(m.hidden), int(m.vocab), int(m.seq_len)
    assert (V, s) == (51200, 2048)  # Table 1 setting (PAPERS.md section 6 header)
    n_formula = 12 * L * h**2 * (1 + 13 / (12 * h) + (V + s) / (12 * L * h))
    final_layernorm = 2 * h  # scale and shift of the last LayerNorm, not in Narayanan's N
    n = float(total_params(m))
    np.testing.assert_allclose(n, n_formula + final_layernorm, rtol=1e-12)
    # The same count as integers: 12 h^2 matrices + 13 h biases/norms per layer, (V + s) h
    # tied embedding and learned positions, 2 h final LayerNorm.
    assert n == 12 * L * h * h + 13 * L * h + (V + s) * h + 2 * h
    assert f"{n / 1e9:.1f}" == published


def test_llama3_8b_parameter_count(x64):
    # Llama 3 8B (config from Hugging Face meta-llama/Meta-Llama-3-8B): untied embeddings,
    # GQA 8 KV heads, SwiGLU, RMSNorm, no biases.
    m = diffperf.load_model("llama3-8b")
    L, h, f, a, akv, dh, V = 32, 4096, 14336, 32, 8, 128, 128256
    per_layer = (h * a * dh          # W_q
                 + 2 * h * akv * dh  # W_k, W_v (GQA)
                 + a * dh * h        # W_o
                 + 3 * h * f         # gate, up, down
                 + 2 * h)            # two RMSNorm scales
    expected = L * per_layer + 2 * V * h + h  # input embedding, output layer, final RMSNorm
    assert float(total_params(m)) == expected
    assert f"{expected / 1e9:.2f}" == "8.03"  # the published "8B" model's 8.03e9 parameters


# --------------------------------------------------------------------------------------------
# Activation memory per layer: Korthikanti et al. 2022, Table 2 (PAPERS.md section 5.6)
# --------------------------------------------------------------------------------------------

S, H, A, Bm = GPT3["s"], GPT3["h"], GPT3["a"], 1
SBH = S * Bm * H
KORTHIKANTI = [
    # (label, Parallel fields, bytes per layer from Table 2)
    ("no parallelism", dict(tp=1), SBH * (34 + 5 * A * S / H)),
    ("TP", dict(tp=8), SBH * (10 + 24 / 8 + 5 * A * S / (H * 8))),
    ("TP + SP", dict(tp=8, sequence_parallel=1), SBH * (34 / 8 + 5 * A * S / (H * 8))),
    ("TP + selective", dict(tp=8, recompute=1), SBH * (10 + 24 / 8)),
    ("TP + SP + selective", dict(tp=8, sequence_parallel=1, recompute=1), SBH * 34 / 8),
    ("full recompute", dict(tp=1, recompute=2), 2 * SBH),  # only the 16-bit layer input
    # Under SP the kept layer input is itself sequence-sharded: 2 s b h / t [D].
    ("TP + SP + full recompute", dict(tp=8, sequence_parallel=1, recompute=2), 2 * SBH / 8),
]


@pytest.mark.parametrize("label,fields,expected", KORTHIKANTI, ids=[k[0] for k in KORTHIKANTI])
def test_korthikanti_activation_bytes_per_layer(x64, label, fields, expected):
    # 16-bit activations, 1-byte dropout masks, scores stored (no flash): Table 2's setting.
    train = Training(flash_attention=0.0, dropout=1.0)
    par = Parallel(micro_batch=Bm, **fields)
    got = float(layer_activation_bytes(_gpt3(), par, train))
    assert got == expected


def test_korthikanti_worked_values(x64):
    # PAPERS.md section 6: s b h (34 + 5 a s / h) = 2048 x 12288 x 114 ~ 2.87e9 B per layer;
    # TP = 8 with SP and selective recompute: 34 s b h / 8 ~ 1.07e8 B (26.8x less).
    train = Training(flash_attention=0.0, dropout=1.0)
    full = float(layer_activation_bytes(_gpt3(), Parallel(micro_batch=1), train))
    small = float(layer_activation_bytes(
        _gpt3(), Parallel(micro_batch=1, tp=8, sequence_parallel=1, recompute=1), train))
    assert full == 2048 * 12288 * 114 == 2_868_903_936
    assert small == 34 * 2048 * 12288 / 8 == 106_954_752
    assert f"{full:.3g}" == "2.87e+09" and f"{small:.3g}" == "1.07e+08"
    assert round(full / small, 1) == 26.8


def test_flash_attention_keeps_softmax_statistics_only(x64):
    # With flash attention the 5 a s / h score term is never stored (PAPERS.md 5.6): the
    # selective row plus the fp32 softmax statistics, 4 bytes x b (a/t) s.
    train = Training(flash_attention=1.0, dropout=1.0)
    par = Parallel(micro_batch=1, tp=8, sequence_parallel=1)
    got = float(layer_activation_bytes(_gpt3(), par, train))
    assert got == SBH * 34 / 8 + 4 * 1 * (A / 8) * S


# --------------------------------------------------------------------------------------------
# ZeRO memory: Rajbhandari et al. SC20, Figure 1 (PAPERS.md sections 5.5 and 6)
# --------------------------------------------------------------------------------------------

PSI, N_D, K = 7.5e9, 64, 12  # parameters, data-parallel ranks, optimizer bytes per parameter
ZERO = [
    # (stage, bytes per device: 2 Psi weights + 2 Psi gradients + K Psi optimizer, sharded)
    (0, (2 + 2 + K) * PSI, "120.0"),
    (1, 2 * PSI + 2 * PSI + K * PSI / N_D, "31.4"),
    (2, 2 * PSI + (2 + K) * PSI / N_D, "16.6"),
    (3, (2 + 2 + K) * PSI / N_D, "1.875"),
]


@pytest.mark.parametrize("stage,expected,figure", ZERO)
def test_zero_model_state_bytes(x64, stage, expected, figure):
    train = Training()  # bf16 weights and grads (2 + 2), fp32 master + Adam m, v (4 + 8 = K)
    assert float(train.master_bytes + train.optimizer_bytes) == K
    par = Parallel(dp=N_D, zero_stage=stage)
    total = sum(float(f(PSI, par, train)) for f in (weight_bytes, gradient_bytes, optimizer_bytes))
    assert total == expected
    digits = len(figure.split(".")[1])
    assert f"{total / 1e9:.{digits}f}" == figure  # Figure 1's labels, GB = 1e9 B


# --------------------------------------------------------------------------------------------
# Collectives: ring and hierarchical all-reduce (PAPERS.md section 5.9; STYLE.md section 2)
# --------------------------------------------------------------------------------------------

def _system(tiers, coll_eff_intra=1.0, coll_eff_inter=1.0, coll_base_s=0.0):
    """A System built by hand; only the tiers and the collective efficiencies matter here."""
    return System(matmul_flops_per_s=312e12, matmul_fp32_flops_per_s=156e12,
                  vector_flops_per_s=19.5e12, hbm_bandwidth_Bps=2.039e12,
                  hbm_capacity_bytes=80.0 * 2**30, tiers=tuple(tiers),
                  eff=Efficiency(coll_eff_intra=coll_eff_intra, coll_eff_inter=coll_eff_inter,
                                 coll_base_s=coll_base_s))


def _one_tier(bw_Bps, alpha_s, **eff):
    return _system([Tier(domain_size=8.0, bandwidth_Bps=bw_Bps, latency_s=alpha_s)], **eff)


# DGX A100-like node: 8 GPUs on NVLink (300 GB/s per direction, 2.5 us), then one 25 GB/s NIC
# per GPU (5 us). Values of configs/systems/a100-sxm-80gb.yaml, restated here.
ALPHA_F, BW_F, ALPHA_S, BW_S = 2.5e-6, 300e9, 5e-6, 25e9


def _two_tier(bw_outer=BW_S, **eff):
    return _system([Tier(domain_size=8.0, bandwidth_Bps=BW_F, latency_s=ALPHA_F, name="nvlink"),
                    Tier(domain_size=2.0**20, bandwidth_Bps=bw_outer, latency_s=ALPHA_S,
                         name="ib")], **eff)


def test_ring_all_reduce_style_example():
    # STYLE.md section 2: V = 1 GB, n = 8, B = 400 GB/s, alpha = 5 us
    t = all_reduce_s(1e9, 8.0, 1.0, _one_tier(400e9, 5e-6))
    expected = (2 * (8 - 1) * 5e-6            # 2 (n-1) alpha = 70 us
                + 2 * (8 - 1) / 8 * 1e9 / 400e9)  # 2 (n-1)/n V/B = 4.375 ms
    np.testing.assert_allclose(float(t), expected, rtol=1e-6)
    np.testing.assert_allclose(float(t), 70e-6 + 4.375e-3, rtol=1e-6)


def test_ring_all_reduce_docstring_example_with_efficiency_and_call_cost():
    # collectives.all_reduce_s docstring: BW = 400 GB/s x 0.8, alpha = 5 us, plus t0.
    t0 = 15e-6
    t = all_reduce_s(1e9, 8.0, 1.0, _one_tier(400e9, 5e-6, coll_eff_intra=0.8, coll_base_s=t0))
    np.testing.assert_allclose(float(t), t0 + 70e-6 + 2 * 7 / 8 * 1e9 / (400e9 * 0.8),
                               rtol=1e-6)


def test_ring_all_gather_and_all_to_all_one_tier():
    # Thakur et al. 2005 (PAPERS.md 5.9): ring all-gather and pairwise all-to-all on n ranks,
    # (n-1) alpha + (n-1)/n S / B each.
    sys_ = _one_tier(400e9, 5e-6)
    expected = 7 * 5e-6 + 7 / 8 * 1e9 / 400e9
    np.testing.assert_allclose(float(all_gather_s(1e9, 8.0, 1.0, sys_)), expected, rtol=1e-6)
    np.testing.assert_allclose(float(all_to_all_s(1e9, 8.0, 1.0, sys_)), expected, rtol=1e-6)


def test_size_one_group_costs_nothing():
    assert float(all_reduce_s(1e9, 1.0, 1.0, _two_tier(coll_base_s=15e-6))) == 0.0


def _hierarchical_all_reduce(S, g, P):
    """PAPERS.md 5.9, two-tier all-reduce, g group members per node, P nodes, one NIC per GPU:
    RS intra (g) + AR inter (P) on S/g per GPU, g rails in parallel + AG intra (g)."""
    rs_intra = (g - 1) * ALPHA_F + (g - 1) / g * S / BW_F
    ar_inter = 2 * (P - 1) * ALPHA_S + 2 * (P - 1) / P * (S / g) / BW_S
    ag_intra = (g - 1) * ALPHA_F + (g - 1) / g * S / BW_F
    return rs_intra + ar_inter + ag_intra


def test_dp_group_of_64_with_stride_8_crosses_nodes_only():
    # DP group of 64 (tp = 8 inside each 8-GPU node): stride 8, so one member per node (g = 1)
    # and 64 nodes: a flat inter-node ring, 2 (n-1) alpha_s + 2 (n-1)/n S / BW_nic.
    S = 2.0 * 1.2e9  # bf16 gradients of 1.2e9 parameters
    t = all_reduce_s(S, 64.0, 8.0, _two_tier())
    expected = 2 * 63 * ALPHA_S + 2 * 63 / 64 * S / BW_S
    np.testing.assert_allclose(float(t), expected, rtol=1e-6)
    np.testing.assert_allclose(float(t), _hierarchical_all_reduce(S, g=1, P=64), rtol=1e-6)


@pytest.mark.parametrize("stride,g,P", [(8.0, 1, 64), (4.0, 2, 32), (1.0, 8, 8)])
def test_hierarchical_all_reduce_matches_papers_5_9(stride, g, P):
    # A group of 64 ranks `stride` apart has g = 8 / stride members in each 8-GPU node.
    S = 1e9
    t = all_reduce_s(S, 64.0, stride, _two_tier())
    np.testing.assert_allclose(float(t), _hierarchical_all_reduce(S, g, P), rtol=1e-6)


def _nccl_rows():
    with NCCL_A100.open(newline="") as fh:
        return [r for r in csv.DictReader(fh)
                if r["size_bytes"] == str(2**30) and r["placement"] == "out_of_place"]


def test_nccl_busbw_identity_a100_1gib():
    # PAPERS.md 5.9 / section 6: NCCL busbw = algbw x 2(n-1)/n, so with alpha = 0 and the tier
    # bandwidth set to the measured busbw, the ring time is the measured time.
    rows = {int(r["num_gpus"]): r for r in _nccl_rows()}
    assert sorted(rows) == list(range(2, 9))
    for n, row in rows.items():
        sys_ = _one_tier(float(row["busbw_GBps"]) * 1e9, 0.0)
        t = all_reduce_s(float(row["size_bytes"]), float(n), 1.0, sys_)
        # busbw is printed to 0.01 GB/s, i.e. ~5e-5 relative at 200 GB/s: 0.1 % is ample.
        np.testing.assert_allclose(float(t), float(row["time_s"]), rtol=1e-3, err_msg=f"n={n}")


# --------------------------------------------------------------------------------------------
# Tiers: which network levels a group spans (PAPERS.md sections 3.3, 3.6, 4.2)
# --------------------------------------------------------------------------------------------

def _tiers_8_and_1e6():
    return _system([Tier(domain_size=8.0, bandwidth_Bps=BW_F, latency_s=ALPHA_F),
                    Tier(domain_size=1e6, bandwidth_Bps=BW_S, latency_s=ALPHA_S)])


def test_tier_ranks_docstring_example():
    # n = 64, stride = 8, D = (8, 1e6): one member per node, 64 nodes.
    r = [float(x) for x in tier_ranks(64.0, 8.0, _tiers_8_and_1e6())]
    assert r == [1.0, 64.0]
    # TP group of 8 at stride 1: all 8 inside one node, nothing left for the outer tier.
    assert [float(x) for x in tier_ranks(8.0, 1.0, _tiers_8_and_1e6())] == [8.0, 1.0]


@pytest.mark.parametrize("n,stride,expected", [
    # docstring: stages at ranks 0, 4, 8, 12 in nodes of 8 -> boundaries 0-4 and 8-12 stay
    # inside a node, 4-8 crosses: one of three
    (4.0, 4.0, [2 / 3, 1 / 3]),
    (8.0, 1.0, [1.0, 0.0]),        # 8 adjacent stages fill one node: no boundary crosses
    (8.0, 8.0, [0.0, 1.0]),        # one stage per node: every boundary crosses
    (16.0, 1.0, [14 / 15, 1 / 15]),  # two nodes of 8 stages: only boundary 7-8 crosses
])
def test_p2p_tier_fractions(n, stride, expected):
    got = [float(x) for x in p2p_tier_fractions(n, stride, _tiers_8_and_1e6())]
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7)
    S = 1e8
    t = send_recv_s(S, n, stride, _tiers_8_and_1e6())
    # PAPERS.md 5.9 send/recv alpha + S/B on each link kind, mixed by the fractions (3.6).
    np.testing.assert_allclose(float(t), expected[0] * (ALPHA_F + S / BW_F)
                               + expected[1] * (ALPHA_S + S / BW_S), rtol=1e-6)


def test_tp_group_inside_a_node_never_touches_the_outer_tier():
    S = 2 * 2048 * 12288.0  # one TP all-reduce of GPT-3's b s h q_a
    times = [float(all_reduce_s(S, 8.0, 1.0, _two_tier(bw_outer=bw))) for bw in (1e9, 25e9, 1e12)]
    expected = 2 * 7 * ALPHA_F + 2 * 7 / 8 * S / BW_F  # one NVLink ring of 8
    np.testing.assert_allclose(times, [expected] * 3, rtol=1e-6)
    grad = jax.grad(lambda k: all_reduce_s(S, 8.0, 1.0, _two_tier(bw_outer=25e9 * k)))(1.0)
    assert float(grad) == 0.0


# --------------------------------------------------------------------------------------------
# Pipeline bubble: Narayanan et al. SC21 Sections 2.2, 2.2.2 (PAPERS.md section 5.4)
# --------------------------------------------------------------------------------------------

def _pipe(p, m, v):
    return Parallel(pp=p, dp=1, micro_batch=1, global_batch=m, vp=v)


def test_gemm_alignment_bytes_and_factor():
    """Leading dimensions in bytes: the largest power of two dividing them, capped at 16 B (one
    128-bit vector load); the factor (a / 16)^gamma of the worse of n and k; an empty
    dimension counts as aligned."""
    from diffperf.costs.roofline import alignment_bytes, alignment_factor

    dims = np.array([50257, 25128, 12564, 6282, 1024, 0, 3])
    np.testing.assert_array_equal(np.asarray(alignment_bytes(dims, 2.0)),
                                  [2, 16, 8, 4, 16, 16, 2])
    np.testing.assert_array_equal(np.asarray(alignment_bytes(dims, 4.0)),
                                  [4, 16, 16, 8, 16, 16, 4])
    phi = alignment_factor(np.array([50257.0, 6400.0]), np.array([12288.0, 12288.0]), 2.0, 0.4)
    np.testing.assert_allclose(np.asarray(phi), [(2 / 16) ** 0.4, 1.0], rtol=1e-6)


def test_vocab_rows_per_rank_padded_or_split():
    """Megatron-LM pads V up to a multiple of 128 t; vTrain's model code splits V // t."""
    from diffperf.load import training
    from diffperf.workload.flops import vocab_rows_per_rank

    gpt = Model(n_layers=96, hidden=12288, ffn_hidden=49152, n_heads=96, n_kv_heads=96,
                head_dim=128, vocab=50257, seq_len=2048)
    for pad, tp, want in ((128, 1, 50304), (128, 2, 25216), (128, 8, 6400),
                          (0, 1, 50257), (0, 2, 25128), (0, 8, 6282), (64, 8, 6336)):
        rows = vocab_rows_per_rank(gpt, Parallel(tp=tp), training("fp16", vocab_pad_to=pad))
        assert float(rows) == want, (pad, tp)


def test_pp_message_per_rank_megatron_and_axonn_grid():
    """S = b (s/c) h q_a / (t G_x): GPT-3 (h 12288, s 2048), b 2, bf16: 100.7 MB whole;
    tp 8 sends 1/8 (scatter/gather); the AxoNN grid's X ranks hold h / G_x each; Y and Z
    split neither the width nor the tokens of a micro-batch."""
    gpt = Model(n_layers=96, hidden=12288, ffn_hidden=49152, n_heads=96, n_kv_heads=96,
                head_dim=128, vocab=50257, seq_len=2048)
    whole = 2 * 2048 * 12288 * 2
    for par, want in ((Parallel(micro_batch=2), whole), (Parallel(micro_batch=2, tp=8), whole / 8),
                      (Parallel(micro_batch=2, cp=2), whole / 2),
                      (Parallel(micro_batch=2, gx=4, gy=2, gz=2), whole / 4)):
        np.testing.assert_allclose(float(pp_message_bytes(gpt, par, Training())), want,
                                   rtol=1e-6)


@pytest.mark.parametrize("v", [1, 2])
def test_bubble_fraction_p8_m64(v):
    par = _pipe(8, 64, v)
    expected = (8 - 1) / (v * 64)  # (p - 1)/(v m): 7/64, interleaved v = 2: 7/128
    np.testing.assert_allclose(float(bubble_fraction(par)), expected, rtol=1e-6)
    t = 0.25  # seconds of forward + backward of one micro-batch on one stage
    busy, bubble = pipeline_times_s(jnp.full(3, t), 8 * t, par)
    np.testing.assert_allclose(float(busy), 64 * t, rtol=1e-6)          # m t
    np.testing.assert_allclose(float(bubble), (8 - 1) / v * t, rtol=1e-6)  # (p - 1)/v t
    np.testing.assert_allclose(float(bubble / busy), expected, rtol=1e-6)


def test_interleaving_halves_the_bubble():
    b1 = float(bubble_fraction(_pipe(8, 64, 1)))
    b2 = float(bubble_fraction(_pipe(8, 64, 2)))
    np.testing.assert_allclose(b2, b1 / 2, rtol=1e-6)


def _stages(L, p, t, e_first, e_last, m=8, v=1, **given):
    """((busy, bubble), layers, stage times, stages) of a pipeline of L layers of t seconds
    each on p stages."""
    par = Parallel(pp=p, dp=1, micro_batch=1, global_batch=m, vp=v, **given)
    model = Model(n_layers=L, hidden=64, ffn_hidden=256, n_heads=4, n_kv_heads=4, head_dim=16,
                  vocab=100, seq_len=8)
    layers = stage_layers(model, par)
    stages = pipeline_stages(model, par)
    times, t_sum = stage_times_s(jnp.asarray(t), stages, float(L), e_first, e_last)
    return [float(x) for x in pipeline_times_s(times, t_sum, par)], layers, times, stages


def test_pipeline_times_docstring_and_unequal_stages():
    # Docstring: p = 4, m = 8, v = 1, t = 1 s per stage: 8 s busy + 3 s bubble.
    (busy, bubble), *_ = _stages(4, 4, 1.0, 0.0, 0.0)
    assert (busy, bubble) == (8.0, 3.0)
    # Unequal stages (embedding 0.5 s on the first, output layer 0.2 s on the last):
    # T = m t_max + (sum_i t_i - t_max)/v with t_max = 1.5, sum = 4 x 1 + 0.5 + 0.2.
    (busy, bubble), *_ = _stages(4, 4, 1.0, 0.5, 0.2)
    np.testing.assert_allclose([busy, bubble], [8 * 1.5, 4.7 - 1.5], rtol=1e-6)
    # One stage holds everything and has no bubble.
    (busy, bubble), *_ = _stages(4, 1, 1.0, 0.5, 0.2)
    np.testing.assert_allclose([busy, bubble], [8 * 4.7, 0.0], atol=1e-6)


def test_uneven_stages_llama3_405b():
    """Llama 3 405B (Dubey et al. 2024, 3.3.2): 126 layers on 16 stages, one layer fewer on
    the first and the last stage. Auto-balanced: c = ceil(126/16) = 8, D = 16 x 8 - 126 = 2
    -> (7, 8, 7). Stage docstring example: t = 1 s, e_f = 0.1 s, e_l = 0.7 s."""
    (busy, bubble), layers, times, stages = _stages(126, 16, 1.0, 0.1, 0.7, m=32)
    assert [float(x) for x in layers] == [7.0, 8.0, 7.0]
    np.testing.assert_allclose([float(x) for x in times], [7.1, 8.0, 7.7], rtol=1e-6)
    # The slowest stage (a middle one, 8 layers) sets the pace: m t_max = 32 x 8 s; the
    # bubble is the rest of one pass through every stage: 126.8 - 8 s.
    np.testing.assert_allclose([busy, bubble], [32 * 8.0, 126.8 - 8.0], rtol=1e-6)
    n, w_first, w_last = critical_stage(times, stages)
    assert (float(n), float(w_first), float(w_last)) == (8.0, 0.0, 0.0)
    # A heavy output layer (e_l = 1.5 s) makes the last stage the slowest: 7 + 1.5 > 8.
    _, layers, times, stages = _stages(126, 16, 1.0, 0.1, 1.5, m=32)
    n, w_first, w_last = critical_stage(times, stages)
    assert (float(n), float(w_first), float(w_last)) == (7.0, 0.0, 1.0)


def test_uneven_stages_given_and_auto():
    # Given counts: 10 layers as 2 + (3, 3) + 2 on 4 stages; the middle is the slowest.
    (busy, bubble), layers, _, _ = _stages(10, 4, 1.0, 0.0, 0.0, pp_first_layers=2,
                                           pp_last_layers=2)
    assert [float(x) for x in layers] == [2.0, 3.0, 2.0]
    np.testing.assert_allclose([busy, bubble], [8 * 3.0, 10.0 - 3.0], rtol=1e-6)
    # Middle layers that do not split evenly: 11 = 2 + (4, 3) + 2: the slowest middle has 4.
    _, layers, _, _ = _stages(11, 4, 1.0, 0.0, 0.0, pp_first_layers=2, pp_last_layers=2)
    assert float(layers[1]) == 4.0
    # Auto: D = 3 stages one short (the last, the first, then a middle one): 10 on 4 -> c = 3,
    # D = 2 -> (2, 3, 2); 96 on 8 -> even (12, 12, 12); 97 on 8 -> c = 13, D = 7 -> (12, 13, 12).
    for L, p, want in ((10, 4, [2, 3, 2]), (96, 8, [12, 12, 12]), (97, 8, [12, 13, 12]),
                       (5, 2, [3, 0, 2])):
        _, layers, _, _ = _stages(L, p, 1.0, 0.0, 0.0)
        assert [float(x) for x in layers] == want, (L, p)


def test_layers_in_flight_per_stage():
    """1F1B keeps p - i micro-batches on stage i; interleaving v chunks keeps
    2 (p - i - 1) + (v - 1) p + 1 chunks of n / v layers (Megatron's warm-up + 1)."""
    par = Parallel(pp=8, dp=1, micro_batch=1, global_batch=64)
    assert float(layers_in_flight(12.0, 0.0, par)) == 12 * 8   # docstring: 96
    assert float(layers_in_flight(12.0, 7.0, par)) == 12 * 1
    inter = par.replace(vp=2)
    # stage 0: 6 x (2 x 7 + 8 + 1) = 138 = 12 x 8 x (1 + 7/16), Megatron's interleave factor
    assert float(layers_in_flight(12.0, 0.0, inter)) == 6 * 23 == 12 * 8 * (1 + 7 / 16)
    assert float(layers_in_flight(12.0, 7.0, inter)) == 6 * (0 + 8 + 1)
    # Fewer micro-batches than stages: all of them in flight (m = 4 < p = 8).
    few = par.replace(global_batch=4)
    assert float(layers_in_flight(12.0, 0.0, few)) == 12 * 4


# --------------------------------------------------------------------------------------------
# Megatron's fused scale-mask-softmax and its fp32 fallback (unfused attention)
# --------------------------------------------------------------------------------------------

def _vtrain_small(seq_len=1024):
    """The vTrain single-node shape: h 1024, 16 heads of 64, GPT-2 vocabulary."""
    return Model(n_layers=24, hidden=1024, ffn_hidden=4096, n_heads=16, n_kv_heads=16,
                 head_dim=64, vocab=50257, seq_len=seq_len)


@pytest.mark.parametrize("tp,b,seq,max_seq,flash,q,want", [
    (8, 1, 1024, 2048, 0.0, 2.0, 1.0),  # 16/8 x 1 = 2 attention batches: not a multiple of 4
    (8, 2, 1024, 2048, 0.0, 2.0, 0.0),  # 4 batches: the fused kernel
    (4, 1, 1024, 2048, 0.0, 2.0, 0.0),  # 4 batches
    (2, 3, 1024, 2048, 0.0, 2.0, 0.0),  # 24 batches
    (1, 1, 4096, 2048, 0.0, 2.0, 1.0),  # key length above the kernel's 2048
    (1, 1, 4096, 4096, 0.0, 2.0, 0.0),  # ... unless the framework's kernel takes it
    (1, 1, 1024, 2048, 0.0, 4.0, 1.0),  # fp32 input: the kernel takes only fp16 / bf16
    (8, 1, 1024, 0, 0.0, 2.0, 0.0),     # no Megatron constraint: one softmax pass
    (8, 1, 1024, 2048, 1.0, 2.0, 0.0),  # flash attention has no separate softmax pass
])
def test_softmax_fallback_follows_megatrons_kernel_constraint(tp, b, seq, max_seq, flash, q,
                                                              want):
    # Megatron-DeepSpeed FusedScaleMaskSoftmax.forward: 16 < s_k <= 2048, s_q % 4 == 0,
    # b x heads-per-rank % 4 == 0, input in fp16 / bf16.
    from diffperf.workload.flops import softmax_fallback

    train = Training(flash_attention=flash, fused_softmax_max_seq=float(max_seq),
                     activation_bytes=q)
    got = softmax_fallback(_vtrain_small(seq), Parallel(tp=tp, micro_batch=b), train)
    assert float(got) == want


def test_softmax_fallback_costs_kernels_bytes_and_an_fp32_copy(x64):
    """The fallback (x.float(), x * scale, masked_fill_, softmax, .half()) against one
    softmax pass (r q w q): fp16: 4 more forward kernels, (r q w 4) + (r 4 w 4) x 3 +
    (r 4 w q) = 2 q + 32 bytes per score element against 2 q, and the softmax's fp32
    output (4 B) kept for the backward; fp32: no casts, 2 more kernels, 24 - 2 q = 16 B,
    nothing more kept."""
    from diffperf.memory.activations import layer_activation_parts
    from diffperf.workload.flops import layer_ops

    model = _vtrain_small()
    par = Parallel(tp=8, micro_batch=1, recompute=2)  # 2 attention batches: the fallback
    elements = 1 * (16 / 8) * 1024 * 1024  # b (a / t) s s
    for q, kernels, nbytes, kept in ((2.0, 4, 32, 4), (4.0, 2, 16, 0)):
        one_pass, fallback = (Training(flash_attention=0.0, activation_bytes=q,
                                       fused_softmax_max_seq=m) for m in (0.0, 2048.0))
        a, b = layer_ops(model, par, one_pass), layer_ops(model, par, fallback)
        assert float(b.n_kernels - a.n_kernels) == kernels
        assert float(b.elementwise_bytes - a.elementwise_bytes) == nbytes * elements
        # Full recompute: the fp32 copy is part of the layer rebuilt during its backward.
        (kept_a, work_a), (kept_b, work_b) = (layer_activation_parts(model, par, t)
                                              for t in (one_pass, fallback))
        assert float(kept_b) == float(kept_a)
        assert float(work_b - work_a) == kept * elements


def test_tp_host_sync_counts_nccl_calls_two_per_all_reduce_under_sp():
    """t_sync = n_calls (t - 1) tau_peer; an all-reduce equivalent is one NCCL call, or a
    reduce-scatter + all-gather (two calls) with sequence parallelism."""
    from diffperf.predict import _tp_host_sync_s
    from diffperf.workload.tp import tp_collectives_per_layer

    e = Efficiency(host_coll_peer_s=1e-5)
    for sp, calls in ((0, 1), (1, 2)):
        par = Parallel(tp=4, sequence_parallel=sp, recompute=2)
        n_f, n_b = tp_collectives_per_layer(par)
        f, b = _tp_host_sync_s(par, n_f, n_b, e)
        # 2 forward, 2 + 2 recomputed backward all-reduce equivalents; 3 peers.
        np.testing.assert_allclose([float(f), float(b)],
                                   [2 * calls * 3 * 1e-5, 4 * calls * 3 * 1e-5], rtol=1e-6)
    f, b = _tp_host_sync_s(Parallel(tp=1, sequence_parallel=1), 2.0, 2.0, e)
    assert float(f) == float(b) == 0.0


# --------------------------------------------------------------------------------------------
# Activation checkpointing as TorchTitan and fms-fsdp run it (workload.recompute), and the
# element-wise kernels of an eager Llama (workload.flops.eager_pointwise_bytes). Llama 3 8B:
# h 4096, a 32, a_kv 8, d 128, f 14336 (SwiGLU), L 32.
# --------------------------------------------------------------------------------------------

H8, A8, KV8, D8, F8, L8 = 4096, 32, 8, 128, 14336, 32
# Forward FLOPs per token of the block's linears (2 per multiply-add): wq, wk, wv, wo, w1, w3, w2
WQ, WK, WV, WO = 2 * H8 * A8 * D8, 2 * H8 * KV8 * D8, 2 * H8 * KV8 * D8, 2 * A8 * D8 * H8
W1 = W3 = W2 = 2 * H8 * F8


def _llama3_8b():
    return diffperf.load_model("llama3-8b")


def test_op_sac_recomputes_every_second_mm_of_the_block(x64):
    """TorchTitan's per-op SAC counts the block's mm calls wq(1) wk(2) wv(3) wo(4) w1(5) w3(6)
    w2(7) and recomputes the even ones: wk, wo, w3 (parallelize_llama.py `_custom_policy`)."""
    from diffperf.workload.recompute import sac_recompute_fracs

    rho = np.asarray(sac_recompute_fracs(_llama3_8b(), Parallel(recompute=1, recompute_policy=1)))
    # rows: fused QKV (wk's share of wq;wk;wv), out (wo), up (w3 of w1;w3), down (w2), the rest
    np.testing.assert_allclose(rho, [WK / (WQ + WK + WV), 1.0, W3 / (W1 + W3), 0.0] + [0.0] * 8)
    dense = WQ + WK + WV + WO + W1 + W3 + W2
    assert dense == 436_207_616 and WK + WO + W3 == 159_383_552  # 36.5 % of the forward
    # policy 2: linears the policy does not see as aten.mm (not torchao's Float8Linear,
    # whose Float8Tensor mm it sees and counts: policy 1): every linear recomputed
    rho2 = sac_recompute_fracs(_llama3_8b(), Parallel(recompute=1, recompute_policy=2))
    np.testing.assert_allclose(np.asarray(rho2), [1.0] * 4 + [0.0] * 8)


def test_hardware_flops_of_op_sac_and_of_a_fraction_of_full_recompute(x64):
    """hardware - model FLOPs per step = B L (flash backward 0.5 x attention + recompute):
    per-op SAC adds wk + wo + w3 per token (attention saved); full recompute of a fraction p
    of the layers adds p (dense + attention)."""
    B, s = 4, 8192
    # attention forward per sequence per layer: QK^T and AV, 2 s^2 a d each, causal flash 1/2
    attn = 2 * (2 * s * s * A8 * D8) * 0.5
    dense = s * (WQ + WK + WV + WO + W1 + W3 + W2)
    train = Training()
    model, extra = _llama3_8b(), {}
    for label, par, per_layer in (
            ("op-sac", Parallel(global_batch=B, recompute=1, recompute_policy=1),
             0.5 * attn + s * (WK + WO + W3)),
            ("megatron", Parallel(global_batch=B, recompute=1), 0.5 * attn + attn),
            ("full p=0.25", Parallel(global_batch=B, recompute=2, recompute_layer_frac=0.25),
             0.5 * attn + 0.25 * (dense + attn))):
        m, hw = _flops_per_step(model, par, train)
        extra[label] = float(hw - m)
        np.testing.assert_allclose(extra[label], B * L8 * per_layer, rtol=1e-12, err_msg=label)
    # p = 1 is the full mode, bit for bit
    m1, hw1 = _flops_per_step(model, Parallel(global_batch=B, recompute=2,
                                              recompute_layer_frac=1.0), train)
    m2, hw2 = _flops_per_step(model, Parallel(global_batch=B, recompute=2), train)
    assert float(hw1) == float(hw2) and float(m1) == float(m2)


def test_op_sac_keeps_the_saved_outputs_only(x64):
    """Kept per layer under per-op SAC (b 1, s 8192, t 1, bf16): the block input, wq, wv, w1,
    w2 outputs, the attention output (2 B each) and the fp32 softmax statistics."""
    from diffperf.memory.activations import layer_activation_parts, op_sac_kept_bytes

    s, model, train = 8192, _llama3_8b(), Training()
    par = Parallel(micro_batch=1, recompute=1, recompute_policy=1)
    expected = 2 * s * (H8 + A8 * D8 + KV8 * D8 + F8 + H8 + A8 * D8) + 4 * A8 * s
    assert expected == 521_142_272
    assert float(op_sac_kept_bytes(model, par, train)) == expected
    kept, rebuilt = layer_activation_parts(model, par, train)
    whole, _ = layer_activation_parts(model, Parallel(micro_batch=1, recompute=0), train)
    assert float(kept) == expected and float(rebuilt) == float(whole) - expected
    # tp 8 with SP: the sequence-parallel reduce-scatter outputs are saved as well, and the
    # block input is a sequence shard; the sharded outputs split 8 ways, w2's partial sum not
    par8 = Parallel(micro_batch=1, tp=8, sequence_parallel=1, recompute=1, recompute_policy=1)
    expected8 = (2 * s * H8 / 8 + 2 * s * (A8 * D8 + KV8 * D8 + F8 + A8 * D8) / 8 + 2 * s * H8
                 + 4 * A8 * s / 8 + 2 * 2 * s * H8 / 8)
    np.testing.assert_allclose(float(op_sac_kept_bytes(model, par8, train)), expected8,
                               rtol=1e-12)


def test_llama3_8b_layer_saved_bytes_under_te_and_torchao_fp8(x64):
    """What one Llama 3 8B layer keeps for its backward under FP8 current scaling (b 1,
    s 8192, t 1, flash, no dropout), by hand:
    - 16-bit, no recompute: s (8 h + 2 (2 (a + a_kv) d + 3 f)) + 4 a s = 1,141,899,264 B.
    - TE (no recompute): the QKV and MLP-up norm outputs and the MLP-down input are saved as
      their 1-byte column-wise FP8 copy: - s (2 h + f) (2 - 1) = - 184,549,376 B.
    - torchao Float8Linear under TorchTitan's per-op SAC (recompute_policy 1): the policy
      sees aten.mm on Float8Tensor operands and saves the odd GEMMs' bf16 outputs, as in
      bf16: 521,142,272 B (test_op_sac_keeps_the_saved_outputs_only).
    - Weight copies: TE keeps a row- and a column-wise FP8 copy of the layer's 218,103,808
      linear weights for the step (lowp_weight_cache 1): 436,207,616 B; torchao casts per
      forward (lowp_weight_cache 0): 0."""
    from diffperf.load import training as training_of
    from diffperf.memory.activations import layer_activation_parts
    from diffperf.workload.params import lowp_weight_cache_params

    s, model = 8192, _llama3_8b()
    bf16, fp8 = training_of("bf16"), training_of("fp8-current")
    none = Parallel(micro_batch=1, recompute=0)
    whole = s * (8 * H8 + 2 * (2 * (A8 + KV8) * D8 + 3 * F8)) + 4 * A8 * s
    assert whole == 1_141_899_264
    assert float(layer_activation_parts(model, none, bf16)[0]) == whole
    te_saving = s * (2 * H8 + F8) * (2 - 1)
    assert te_saving == 184_549_376
    assert float(layer_activation_parts(model, none, fp8)[0]) == whole - te_saving
    sac = Parallel(micro_batch=1, recompute=1, recompute_policy=1)
    assert float(layer_activation_parts(model, sac, fp8)[0]) == 521_142_272
    linear = (WQ + WK + WV + WO + W1 + W3 + W2) // 2  # FLOPs per token / 2
    assert linear == 218_103_808
    assert float(lowp_weight_cache_params(model, none, fp8)) == 2 * linear
    assert float(lowp_weight_cache_params(model, none, fp8.replace(lowp_weight_cache=0.0))) == 0


def test_op_sac_kept_bytes_on_a_layout_table_equal_each_layout(x64):
    """The memory functions take a whole layout table (test_parallelisms evaluates every row
    at once): per-op SAC's kept bytes of a table of layouts (policies 0, 1, 2; tp 1 and 8)
    equal each layout's own, row by row (not summed across layouts)."""
    from diffperf.memory.activations import op_sac_kept_bytes

    model, train = _llama3_8b(), Training()
    tps, policies = [1.0, 8.0, 1.0], [0.0, 1.0, 2.0]
    table = Parallel(micro_batch=1, recompute=1, tp=np.array(tps),
                     sequence_parallel=np.array([0.0, 1.0, 0.0]),
                     recompute_policy=np.array(policies))
    each = [float(op_sac_kept_bytes(model, Parallel(micro_batch=1, recompute=1, tp=t,
                                                    sequence_parallel=float(t > 1),
                                                    recompute_policy=r), train))
            for t, r in zip(tps, policies)]
    got = np.asarray(op_sac_kept_bytes(model, table, train))
    assert got.shape == (3,)
    np.testing.assert_allclose(got, each, rtol=1e-12)
    assert each[0] != each[2]  # policy 2 (linears not seen as aten.mm) saves no linear output


def test_fraction_of_layers_checkpointed_mixes_full_and_none(x64):
    """fms-fsdp's selective AC (p of the blocks checkpointed): the mean layer keeps
    p x (its input) + (1 - p) x (everything)."""
    from diffperf.memory.activations import layer_activation_parts

    model, train = _llama3_8b(), Training()
    none, _ = layer_activation_parts(model, Parallel(recompute=0), train)
    full, work = layer_activation_parts(model, Parallel(recompute=2), train)
    kept, work_p = layer_activation_parts(model, Parallel(recompute=2, recompute_layer_frac=0.4),
                                          train)
    np.testing.assert_allclose(float(kept), 0.4 * float(full) + 0.6 * float(none), rtol=1e-12)
    assert float(work_p) == float(work)  # a checkpointed layer still rebuilds itself whole


def test_eager_llama_pointwise_bytes_by_hand(x64):
    """Eager fp32 RMSNorm (36 B per element against a fused 4: 32 more, two norms), the fp32
    complex rotary on Q and K (2 q_a + 16 = 20 B per element), repeat_kv copies of K and V
    (read a_kv heads, write a), SiLU apart from the product (2 q_a per element of f)."""
    from diffperf.workload.flops import elementwise_bytes

    model, par = _llama3_8b(), Parallel(micro_batch=2)
    T = 2 * 8192
    base = float(elementwise_bytes(model, par, Training()))
    norms = 2 * 32 * T * H8
    rope = 20 * T * (A8 + KV8) * D8
    repeat = 2 * T * (KV8 + A8) * (D8 + D8)
    glu = 2 * 2 * T * F8
    assert norms == 4_294_967_296 and rope + repeat + glu == 2_952_790_016
    got = float(elementwise_bytes(model, par, Training(norm_extra_bytes=32.0,
                                                       llama_eager_pointwise=1.0)))
    assert got - base == norms + rope + repeat + glu
    # Llama 2 13B has a_kv = a: repeat_kv returns its input, no copy
    m13 = diffperf.Model(n_layers=40, hidden=5120, ffn_hidden=13824, n_heads=40, n_kv_heads=40,
                         head_dim=128, vocab=32000, seq_len=4096, gated_mlp=1)
    T13 = 2 * 4096
    got13 = float(elementwise_bytes(m13, par, Training(llama_eager_pointwise=1.0))
                  - elementwise_bytes(m13, par, Training()))
    assert got13 == 20 * T13 * 80 * 128 + 2 * 2 * T13 * 13824


def test_compiled_rope_kv_pass_bytes_by_hand(x64):
    """Compiled Llama code in front of an extern SDPA (TorchTitan repeat_kv, fms expand):
    rotate Q (read + write a heads), rotate K fused with its expansion (read a_kv, write a),
    expand V (read a_kv, write a); without GQA K is rotated in place and V untouched. Zero
    when the eager term already holds these ops, and zero by default."""
    import jax

    from diffperf.workload.flops import (elementwise_bytes, layer_ops,
                                         rope_kv_pass_bytes)

    model, par = _llama3_8b(), Parallel(micro_batch=2)
    T = 2 * 8192
    on = Training(rope_kv_pass=1.0)
    want = 2 * T * (2 * A8 * D8 + (KV8 + A8) * D8 + (KV8 + A8) * D8)
    assert want == 603_979_776
    assert float(elementwise_bytes(model, par, on) - elementwise_bytes(model, par, Training())
                 ) == want
    # TP 8: each rank's a / 8 query heads and a_kv / 8 KV heads, the same tokens
    par8 = Parallel(tp=8, micro_batch=2)
    assert float(rope_kv_pass_bytes(model, par8, on)) == want / 8
    # Llama 2 13B (a_kv = a): Q and K rotated in place, nothing expanded
    m13 = diffperf.Model(n_layers=40, hidden=5120, ffn_hidden=13824, n_heads=40, n_kv_heads=40,
                         head_dim=128, vocab=32000, seq_len=4096, gated_mlp=1)
    assert float(rope_kv_pass_bytes(m13, par, on)) == 2 * (2 * 4096) * (2 * 40 * 128
                                                                        + 2 * 40 * 128)
    both = Training(rope_kv_pass=1.0, llama_eager_pointwise=1.0)
    assert float(rope_kv_pass_bytes(model, par, both)) == 0.0
    # kernels: Q, K and (GQA) V, none under the eager term's own count
    k_on = float(layer_ops(model, par, on).n_kernels - layer_ops(model, par, Training()).n_kernels)
    assert k_on == 3.0
    assert float(layer_ops(model, par, both).n_kernels) == float(
        layer_ops(model, par, Training(llama_eager_pointwise=1.0)).n_kernels)
    # physical sign: more bytes per activation element, more traffic
    g = jax.grad(lambda q: rope_kv_pass_bytes(model, par, Training(rope_kv_pass=1.0,
                                                                    activation_bytes=q)))(2.0)
    assert np.isfinite(float(g)) and float(g) == want / 2


def test_rotary_and_repeat_kv_move_their_bytes_once_back():
    """The eager rotary and repeat_kv, and the compiled rope / K-V pass, run their backward
    in one pass of their forward bytes: on one H100, no recompute, one micro-batch, the
    element-wise compute grows by L [3 (dB / BW' + dK k_s) - B_once / BW'] when the eager
    kernels are switched on (BW' = BW_hbm x mem_eff; dK = 6 rotary + 2 repeat_kv kernels),
    B_once = rotary 20 T (a + a_kv) d + repeat_kv 2 T (a_kv + a) 2 d."""
    from diffperf.costs.xla import kernel_fixed_s
    from diffperf.workload.flops import elementwise_backward_once_bytes, elementwise_bytes

    model, system = _llama3_8b(), diffperf.load_system("h100-sxm-80gb")
    par = Parallel(micro_batch=2, global_batch=2)
    T = 2 * 8192
    eager, base = Training(llama_eager_pointwise=1.0), Training()
    once = 20 * T * (A8 + KV8) * D8 + 2 * T * (KV8 + A8) * 2 * D8
    assert once == 2_013_265_920
    assert float(elementwise_backward_once_bytes(model, par, eager)) == once
    compiled = Training(rope_kv_pass=1.0)
    assert float(elementwise_backward_once_bytes(model, par, compiled)) == 603_979_776
    assert float(elementwise_backward_once_bytes(model, par, base)) == 0.0
    bw = float(system.hbm_bandwidth_Bps) * float(system.eff.mem_eff)
    dB = float(elementwise_bytes(model, par, eager) - elementwise_bytes(model, par, base))
    k_s = float(kernel_fixed_s(system, base))
    want = L8 * (3.0 * (dB / bw + 8.0 * k_s) - once / bw)
    got = float(diffperf.predict(model, par, system, eager).breakdown.compute_s
                - diffperf.predict(model, par, system, base).breakdown.compute_s)
    np.testing.assert_allclose(got, want, rtol=1e-4)


def test_op_sac_recompute_time_and_collectives():
    """The recompute of one layer under per-op SAC is the recomputed share of each forward
    GEMM row plus every element-wise op (norms, rotary, SiLU, residuals), the attention kernel
    being saved; TP re-runs one all-reduce equivalent (the two SP input all-gathers)."""
    from diffperf.costs.compute import layer_times_s
    from diffperf.workload.flops import attention_io_bytes, layer_ops
    from diffperf.workload.recompute import sac_recompute_fracs
    from diffperf.workload.tp import tp_collectives_per_layer

    model, system = _llama3_8b(), diffperf.load_system("h100-sxm-80gb")
    train = Training(norm_extra_bytes=32.0, llama_eager_pointwise=1.0)
    par = Parallel(dp=8, micro_batch=2, global_batch=16, zero_stage=3, recompute=1,
                   recompute_policy=1)
    ops = layer_ops(model, par, train)
    dense, attn, other = layer_times_s(ops, system, train, attention_io_bytes(model, par, train))
    rho = sac_recompute_fracs(model, par)
    per_layer = float(np.sum(np.asarray(rho) * np.asarray(dense)) + other)
    res = diffperf.predict(model, par, system, train)
    # one micro-batch per step, 32 layers on the one stage
    np.testing.assert_allclose(float(res.breakdown.recompute_s), L8 * per_layer, rtol=1e-5)
    assert tp_collectives_per_layer(Parallel(tp=8, sequence_parallel=1, recompute=1,
                                             recompute_policy=1)) == (2.0, 3.0)
    n_f, n_b = tp_collectives_per_layer(Parallel(tp=8, recompute=2, recompute_layer_frac=0.5))
    assert (n_f, float(n_b)) == (2.0, 3.0)


def test_op_sac_keeps_the_expert_outputs_it_does_not_recompute(x64):
    """Per-op SAC on an MoE layer: `sac_recompute_fracs` takes the router and expert GEMMs as
    saved (rho = 0, no recompute time), so their outputs are kept for the backward, counted
    in the memory as well (Mixtral 8x7B: b 1, s 4096, t 1, bf16, E 8, k 2, f_e 14336,
    dropless): router s E, expert up (w1; w3) s k 2 f_e, expert down s k h, 2 B each."""
    from diffperf.memory.activations import layer_activation_parts, op_sac_kept_bytes

    s, E, k = 4096, 8, 2
    model = diffperf.load_model("mixtral-8x7b").replace(seq_len=float(s))
    train = Training()
    par = Parallel(micro_batch=1, recompute=1, recompute_policy=1)
    attention = H8 + A8 * D8 + KV8 * D8 + A8 * D8  # block input, wq, wv, attention output
    experts = s * E + s * k * 2 * F8 + s * k * H8  # router, expert up, expert down outputs
    expected = 2 * s * attention + 2 * experts + 4 * A8 * s
    assert expected == 646_512_640
    assert float(op_sac_kept_bytes(model, par, train)) == expected
    kept, rebuilt = layer_activation_parts(model, par, train)
    whole, _ = layer_activation_parts(model, Parallel(micro_batch=1, recompute=0), train)
    assert float(kept) == expected and float(rebuilt) == float(whole) - expected
