"""Megatron-Bridge runs (data/megatron_bridge.csv) and the MoE layout they use.

Expert tensor parallelism (Parallel.etp; Megatron-Core's --expert-tensor-parallel-size, 1 in
the Bridge MoE recipes): golden values by hand for the expert GEMM shape, the expert-data-
parallel degree, the all-to-all tier and the TP collectives of an MoE layer; the gradient
contract of the step time in the system leaves. The CSV: every row loads and predicts (one
vmap per system), finite, with no refusal.
"""

from __future__ import annotations

import csv
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from diffperf import Parallel, SpecError, Training, load_runs, predict
from diffperf.costs.collectives import all_to_all_s, hierarchical_all_to_all_s
from diffperf.workload.flops import moe_permute_bytes
from diffperf.specs.validate import check_layout
from diffperf.workload.ep import (domain_hit_fraction, ep_a2a_bytes, ep_stride,
                                  expert_dp_degree, expert_token_share, expert_tp,
                                  moe_mlp_on_tp)
from diffperf.workload.flops import layer_ops
from diffperf.workload.params import layer_params_per_device
from shipped import model as _model, system as _system

ROOT = Path(__file__).resolve().parent.parent
CSV = ROOT / "data" / "megatron_bridge.csv"
BF16 = Training()
MIXTRAL = _model("mixtral-8x7b").replace(seq_len=4096.0)


def test_expert_tp_and_expert_data_parallel_degree_by_hand():
    # etp = 0: the experts are TP-split like the rest (t_e = t), copies over d c / e.
    old = Parallel(tp=2, dp=16, ep=8, cp=1, sequence_parallel=1)
    assert float(expert_tp(old)) == 2 and float(expert_dp_degree(old)) == 16 / 8
    # etp = 1, t = 2, d = 16, e = 32 (Qwen3-235B on DGX-H100 in the Bridge tables): the 32
    # EP ranks are the t d = 32 ranks of a stage, one copy of each expert: N_e = 2 16 / 32 = 1.
    new = Parallel(tp=2, dp=16, ep=32, etp=1, sequence_parallel=1)
    assert float(expert_tp(new)) == 1 and float(expert_dp_degree(new)) == 1.0
    assert float(expert_token_share(new)) == 0.5


def test_expert_gemm_sees_the_per_expert_tokens_and_full_width_under_etp_1():
    # Mixtral (E 8, k 2, f_e 14336, SwiGLU), b 1, s 4096, t 2 with SP, e 8, etp 1:
    # each rank routes 4096 / 2 tokens; its E / e = 1 expert gets 8 x 2048 x 2 / 8 = 4096
    # tokens (m), at full width n = 2 f_e = 28672 (up) and k = f_e = 14336 (down).
    par = Parallel(tp=2, dp=4, ep=8, etp=1, micro_batch=1, sequence_parallel=1)
    g = layer_ops(MIXTRAL, par, BF16).dense
    assert float(g.m[5]) == 2048 * 2 * 8 / 8 and float(g.m[6]) == 4096
    assert float(g.n[5]) == 2 * 14336 and float(g.k[6]) == 14336
    assert float(g.count[5]) == 8 / 8
    # etp = 0 (t_e = t = 2): the TP group gathers its 2 shards first, m = 4096 x 2 x 8 / 8
    # and the widths are split by t.
    old = layer_ops(MIXTRAL, par.replace(etp=0, ep=4), BF16).dense
    assert float(old.m[5]) == 4096 * 2 * 4 / 8 and float(old.n[5]) == 2 * 14336 / 2
    # The same total expert FLOPs per rank either way at equal e (work is conserved).
    a = layer_ops(MIXTRAL, par.replace(ep=4), BF16).dense
    b = layer_ops(MIXTRAL, par.replace(etp=0, ep=4), BF16).dense
    fl = lambda g: float(jnp.sum((g.m * g.n * g.k * g.count)[5:7]))  # noqa: E731
    np.testing.assert_allclose(fl(a), fl(b), rtol=1e-6)


def test_expert_parameters_per_device_split_by_etp_not_tp():
    par = Parallel(tp=2, dp=8, ep=8, etp=1, sequence_parallel=1)
    E, h, fe = 8, 4096, 14336
    experts = E * 3 * h * fe
    with_etp = float(layer_params_per_device(MIXTRAL, par))
    with_tp = float(layer_params_per_device(MIXTRAL, par.replace(etp=0)))
    # etp 1 holds experts / e; etp = t holds experts / (t e): the difference is experts / (2 e).
    np.testing.assert_allclose(with_etp - with_tp, experts / 8 - experts / 16, rtol=1e-6)


def test_ep_group_under_etp_1_is_adjacent_ranks_inside_the_nvlink_domain():
    # etp = 1: Megatron-Core's expert order tp-ep-dp puts the 8 EP ranks next to each other
    # (stride t_e = 1) even though tp = 2 sits inside dp: the all-to-all stays on NVLink.
    par = Parallel(tp=2, dp=4, ep=8, etp=1, sequence_parallel=1)
    assert float(ep_stride(par, 2.0)) == 1.0
    assert float(ep_stride(par.replace(etp=0, ep=4), 2.0)) == 2.0
    h100 = _system("h100-sxm-80gb")
    S = float(ep_a2a_bytes(MIXTRAL, par, BF16))
    assert S == 2 * 2048 * 4096 * 2  # k T_r h q_a, T_r = 4096 / 2 under SP
    nvl = h100.tiers[0]
    hand = (h100.eff.coll_base_s + 7 * nvl.latency_s
            + 7 / 8 * S / (nvl.bandwidth_Bps * h100.eff.coll_eff_intra))
    np.testing.assert_allclose(float(all_to_all_s(S, 8.0, 1.0, h100)), hand, rtol=1e-5)


def test_moe_layer_with_untp_experts_has_only_the_attention_tp_collectives():
    par = Parallel(tp=2, dp=4, ep=8, etp=1, sequence_parallel=1)
    assert float(moe_mlp_on_tp(MIXTRAL, par)) == 0.0
    assert float(moe_mlp_on_tp(MIXTRAL, par.replace(etp=0, ep=4))) == 1.0
    assert float(moe_mlp_on_tp(_model("llama3-8b"), Parallel(tp=2))) == 1.0


def test_etp_rules_are_checked_with_clear_messages():
    with pytest.raises(SpecError, match="etp=3 is not allowed"):
        check_layout(MIXTRAL, Parallel(tp=2, dp=4, ep=8, etp=3, sequence_parallel=1), 8)
    with pytest.raises(SpecError, match="needs sequence_parallel=1"):
        check_layout(MIXTRAL, Parallel(tp=2, dp=4, ep=8, etp=1), 8)
    with pytest.raises(SpecError, match=r"ep x etp=8 x 1 must divide tp x cp x dp=4"):
        check_layout(MIXTRAL, Parallel(tp=1, dp=4, ep=8, etp=1), 4)
    # ep = 8 > dp = 4 is a valid layout once the expert group takes the tp x dp ranks.
    check_layout(MIXTRAL, Parallel(tp=2, dp=4, ep=8, etp=1, sequence_parallel=1,
                                   global_batch=8), 8)


def test_moe_layer_cost_gradient_contract_with_etp_1(x64):
    """The expert GEMMs (per-expert shape) and the EP all-to-all of an etp = 1 layer, as
    functions of log-scale factors on the matmul peak, HBM and NVLink bandwidth: gradients
    match finite differences (check_grads, float64), are finite, and a faster part never
    slows the layer."""
    from jax.test_util import check_grads

    from diffperf.costs.compute import gemm_times_s

    h100 = _system("h100-sxm-80gb")
    par = Parallel(tp=2, dp=4, ep=8, etp=1, micro_batch=1, sequence_parallel=1)
    g = layer_ops(MIXTRAL, par, BF16).dense
    S = ep_a2a_bytes(MIXTRAL, par, BF16)

    def layer_s(logs):
        s = h100.replace(matmul_flops_per_s=h100.matmul_flops_per_s * jnp.exp(logs[0]),
                         hbm_bandwidth_Bps=h100.hbm_bandwidth_Bps * jnp.exp(logs[1]),
                         tiers=(h100.tiers[0].replace(
                             bandwidth_Bps=h100.tiers[0].bandwidth_Bps * jnp.exp(logs[2])),
                                *h100.tiers[1:]))
        gemm = jnp.sum(gemm_times_s(g, s, BF16, s.eff.mm_max, s.eff.mm_half_dim)[5:7])
        return gemm + 4.0 * all_to_all_s(S, 8.0, ep_stride(par, 2.0), s)

    x = jnp.zeros(3)
    check_grads(layer_s, (x,), order=1, modes=("rev",), eps=1e-4)
    grad = jax.grad(layer_s)(x)
    assert np.all(np.isfinite(np.asarray(grad))) and np.all(np.asarray(grad) <= 0.0)
    assert float(grad[0]) < 0.0 and float(grad[2]) < 0.0  # FLOP/s and NVLink both matter


def test_moe_permutation_traffic_by_hand():
    # Qwen3-30B-A3B-like MoE: h 2048, k 8; b 4, s 4096, t = 1, e = 8, bf16: permute +
    # unpermute 2 (1 + 8) and two chunk sorts 4 x 8 copies of T h q bytes.
    qwen = MIXTRAL.replace(hidden=2048.0, moe_topk=8.0, n_experts=128.0)
    par = Parallel(dp=8, ep=8, micro_batch=4)
    T = 4 * 4096
    assert float(moe_permute_bytes(qwen, par, BF16)) == 2 * 2048 * T * (2 * 9 + 32)
    # e = 1: no chunk sorts; dense: nothing.
    assert float(moe_permute_bytes(qwen, par.replace(ep=1), BF16)) == 2 * 2048 * T * 18
    assert float(moe_permute_bytes(_model("llama3-8b"), par.replace(ep=1), BF16)) == 0.0
    # etp = 1 < t = 2 under SP: each rank permutes its sequence shard only (T / 2).
    sp = Parallel(tp=2, dp=4, ep=8, etp=1, micro_batch=4, sequence_parallel=1)
    assert float(moe_permute_bytes(qwen, sp, BF16)) == 2 * 2048 * (T / 2) * (2 * 9 + 32)


def test_flex_dispatch_permutes_one_copy_per_target_rank_by_hand():
    """Megatron-Core's flex dispatcher (DeepEP / HybridEP) sends a token once per EP rank that
    holds one of its experts and permutes it to the local experts after the dispatch, with no
    chunk sorts: permute + unpermute 2 (r + k) copies of T h q, r = e p_g,
    p_g = 1 - C(E - E/e, k) / C(E, k). Qwen3 30B-A3B-like (E 128, k 8) at e = 8:
    p_g = 1 - C(112, 8) / C(128, 8), r = 5.339 (against 2 (1 + 8) + 32 = 50 for alltoall)."""
    from math import comb

    from diffperf.workload.flops import flex_rank_copies
    qwen = MIXTRAL.replace(hidden=2048.0, moe_topk=8.0, n_experts=128.0)
    par = Parallel(dp=8, ep=8, micro_batch=4, ep_dispatch=1)
    T = 4 * 4096
    r = 8 * (1 - comb(112, 8) / comb(128, 8))
    np.testing.assert_allclose(float(flex_rank_copies(qwen, par)), r, rtol=1e-5)
    np.testing.assert_allclose(float(moe_permute_bytes(qwen, par, BF16)),
                               2 * 2048 * T * 2 * (r + 8), rtol=1e-5)
    # one expert per rank (e = E): every one of the k experts is a different rank, r = k
    one = qwen.replace(n_experts=8.0)
    np.testing.assert_allclose(float(flex_rank_copies(one, par)), 8.0, rtol=1e-5)
    # e = 1: no dispatch, the single-rank permutation of the alltoall form
    assert float(moe_permute_bytes(qwen, par.replace(ep=1), BF16)) == 2 * 2048 * T * 18


def test_hierarchical_dispatch_sends_one_copy_per_remote_domain():
    from math import comb

    # Hypergeometric: P(a token's 8 of 128 experts include one of the other node's 64).
    np.testing.assert_allclose(float(domain_hit_fraction(8.0, 128.0, 2.0)),
                               1 - comb(64, 8) / comb(128, 8), rtol=1e-6)
    np.testing.assert_allclose(float(domain_hit_fraction(8.0, 256.0, 8.0)),
                               1 - comb(224, 8) / comb(256, 8), rtol=1e-5)
    assert float(domain_hit_fraction(8.0, 128.0, 1.0)) == 0.0
    h100 = _system("h100-sxm-80gb")
    nvl, ib = h100.tiers[0], h100.tiers[1]
    e = h100.eff
    S = 134e6
    # Inside one node: the pairwise all-to-all exactly.
    np.testing.assert_allclose(float(hierarchical_all_to_all_s(S, 8.0, 1.0, 8.0, 128.0, h100)),
                               float(all_to_all_s(S, 8.0, 1.0, h100)), rtol=1e-6)
    # Two nodes (n 16, k 8, E 128): InfiniBand carries N p / k = 2 p / 8 of the pairwise
    # volume 8/16 S; NVLink the local 7/16 S and the forwarded 8/16 x 7/8 S.
    p = 1 - comb(64, 8) / comb(128, 8)
    hand = (e.coll_base_s + 15 * ib.latency_s
            + S * (7 / 16 + 8 / 16 * 7 / 8) / (nvl.bandwidth_Bps * e.coll_eff_intra)
            + 2 * p / 8 * 8 / 16 * S / (ib.bandwidth_Bps * e.coll_eff_inter))
    got = float(hierarchical_all_to_all_s(S, 16.0, 1.0, 8.0, 128.0, h100))
    np.testing.assert_allclose(got, hand, rtol=1e-5)
    assert got < float(all_to_all_s(S, 16.0, 1.0, h100))


def test_hierarchical_dispatch_gradient_contract(x64):
    from jax.test_util import check_grads

    h100 = _system("h100-sxm-80gb")

    def t(logs):
        tiers = tuple(tr.replace(bandwidth_Bps=tr.bandwidth_Bps * jnp.exp(x))
                      for tr, x in zip(h100.tiers, logs[:2]))
        nvl = tiers[0].replace(domain_size=tiers[0].domain_size * jnp.exp(logs[2]))
        return hierarchical_all_to_all_s(134e6, 32.0, 1.0, 8.0, 128.0,
                                         h100.replace(tiers=(nvl, tiers[1])))

    x = jnp.zeros(3)
    check_grads(t, (x,), order=1, modes=("rev",), eps=1e-4)
    g = np.asarray(jax.grad(t)(x))
    assert np.all(np.isfinite(g)) and g[0] < 0 and g[1] < 0  # faster links: faster
    assert g[2] < 0  # a larger NVLink domain: fewer domains to cross


def _write(tmp_path, rows):
    path = tmp_path / "runs.csv"
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return path


def test_model_config_column_gives_the_architecture_and_is_checked(tmp_path):
    row = dict(id="r1", num_gpus=8, num_layers=32, hidden=4096, num_heads=32, vocab=32000,
               seq_len=4096, tp=1, pp=1, dp=8, ep=8, global_batch=64, micro_batch=1,
               step_time_s=1.0, model_config="mixtral-8x7b", system="h100-sxm-80gb")
    runs = load_runs(_write(tmp_path, [row]))
    m = runs.models[0]
    assert float(m.n_experts) == 8 and float(m.moe_ffn_hidden) == 14336
    assert float(m.seq_len) == 4096  # the row's, not the config's 32768
    with pytest.raises(SpecError, match=r"num_layers=31 differs from model_config"):
        load_runs(_write(tmp_path, [row | dict(num_layers=31)]))


def test_every_bridge_row_loads_and_predicts_finite():
    """Every row of data/megatron_bridge.csv through load_runs and one vmap per system: no
    refusal, finite positive step times."""
    from diffperf.cli.validate_cmd import load_systems
    from diffperf.validation import predict_runs

    rows = list(csv.DictReader(open(CSV)))
    assert len(rows) == 222
    for r in rows[:5]:  # step time derived from the printed throughput
        step = int(r["global_batch"]) * int(r["seq_len"]) / (
            float(r["tokens_per_s_per_gpu"]) * int(r["num_gpus"]))
        np.testing.assert_allclose(float(r["step_time_s"]), step, rtol=1e-5)
    runs = load_runs(CSV)
    systems = load_systems(runs, None, None)
    step, _, _ = predict_runs(runs, systems)  # one program: the system batched per row
    assert np.all(np.isfinite(step)) and np.all(step > 0)
    # The same as predicting one row alone with its own system (two systems checked).
    for i in (0, runs.systems.index("h100-sxm-80gb")):
        one = predict(runs.models[i], runs.parallels[i], systems[runs.systems[i]],
                      runs.trainings[i]).step_time_s
        np.testing.assert_allclose(step[i], float(one), rtol=2e-5)


def _recipe_facts():
    """calibration/bridge_recipe_facts.py as a module (its tables of the recipes' facts)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "bridge_recipe_facts", Path(__file__).parent.parent / "calibration" / "bridge_recipe_facts.py")
    facts = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(facts)
    return facts


def test_ep_dispatch_column_follows_each_rows_performance_recipe():
    """ep_dispatch = 1 exactly where the row's Megatron-Bridge performance recipe
    (perf_recipes/<model>/<system>/, snapshot 067f987d) runs the flex dispatcher with a DeepEP /
    HybridEP backend; Megatron-Core uses the backend only with moe_token_dispatcher_type
    "flex" (moe_utils.py), so GPT-OSS's BF16 recipes, which keep the bridge's "alltoall", are 0.
    A CSV fact, so that a re-transcription or an edit cannot silently swap the two exchanges.
    Ten rows differ from the snapshot: their own release ran alltoall."""
    facts = _recipe_facts()
    ALLTOALL_BY_RELEASE = facts.ALLTOALL_BY_RELEASE
    flex = {  # (model, system, precision) -> recipe dispatcher is flex
        ("gpt-oss-120b", "dgx-b300", "bf16"), ("gpt-oss-120b", "dgx-b300", "mxfp8"),
        ("gpt-oss-120b", "gb200-nvl72", "mxfp8"), ("gpt-oss-120b", "gb300-nvl72", "mxfp8")}
    rows = [r for r in csv.DictReader(open(CSV)) if int(r["ep"]) > 1]
    for r in rows:
        key = (r["model"], r["system"], r["precision"])
        if r["model"] in ("deepseek-v3", "qwen3-30b-a3b"):
            want = 1
        elif r["model"] == "gpt-oss-120b":
            want = int(key in flex)
        else:  # Qwen3 235B-A22B: alltoall on DGX-H100, on DGX-B200 at 64 GPUs / BF16 / FP8-CS
            want = int(not (r["system"] == "h100-sxm-80gb" or (
                r["system"] == "dgx-b200" and (r["num_gpus"] == "64" or r["precision"] != "mxfp8"))))
        # rows whose own release ran the alltoall dispatcher (bridge_recipe_facts.py,
        # ALLTOALL_BY_RELEASE: read at Megatron-Bridge v0.2.0 ... v0.5.1)
        if (r["model"], r["system"], r["precision"], r["num_gpus"]) in ALLTOALL_BY_RELEASE.get(
                r["container"], ()):
            want = 0
        # token-drop rows (25.09): apply_moe_token_drop asserts the alltoall dispatcher
        if r["moe_token_drop"] == "1":
            want = 0
        assert int(r["ep_dispatch"]) == want, (r["id"], r["ep_dispatch"], want)
    # the rows whose EP group leaves one NVLink domain, where the two exchanges differ
    by_id = {r["id"]: r for r in rows}
    assert by_id["mb-26_02-dgx-b200-gpt-oss-120b-bf16-64g"]["ep_dispatch"] == "0"
    # 26.02 (v0.3.0): no backend in QWEN3_30B_A3B_PRETRAIN_CONFIG_B200_FP8_MX_V1, so
    # apply_flex_dispatcher_backend leaves the recipe's alltoall; 26.04 (v0.4.0) sets flex
    assert by_id["mb-26_02-dgx-b200-qwen3-30b-a3b-mxfp8-8g"]["ep_dispatch"] == "0"
    assert by_id["mb-26_04-dgx-b200-qwen3-30b-a3b-mxfp8-8g"]["ep_dispatch"] == "1"
    assert by_id["mb-26_04-dgx-h100-qwen3-30b-a3b-fp8-current-16g"]["ep_dispatch"] == "1"
    # 26.02 (v0.3.0) H100 preset names deepep, which the 26.02 container lacks (known-issues.md)
    assert by_id["mb-26_02-dgx-h100-qwen3-30b-a3b-fp8-current-16g"]["ep_dispatch"] == "0"
    # 25.09 token drop (run_script.py v0.1.0rc3 -> apply_moe_token_drop: alltoall only)
    assert by_id["mb-25_09-dgx-b200-qwen3-30b-a3b-fp8-current-8g"]["ep_dispatch"] == "0"
    assert by_id["mb-25_09-dgx-h100-deepseek-v3-fp8-current-1024g"]["ep_dispatch"] == "1"


def test_ep_overlap_facts_follow_each_rows_container_release():
    """`ep_overlap=1` in the CSV's set column exactly where the row's container release's
    performance recipe sets overlap_moe_expert_parallel_comm (calibration/bridge_recipe_facts.py,
    A2A_OVERLAP: read at Megatron-Bridge v0.1.0rc3 ... v0.6.0, one tag per container), and the
    CSV is what that file writes (so a re-transcription cannot drift from it). Spot checks read
    by hand from the release presets: Qwen3 30B-A3B GB200 MXFP8 has no overlap at 26.04
    (v0.4.0 QWEN3_30B_A3B_PRETRAIN_CONFIG_GB200_FP8_MX_V1: cuda_graph_scope router +
    preprocess, moe_a2a_overlap default False) and has it at 26.06 (v0.5.0: full_iteration,
    moe_a2a_overlap=True); at 25.09 only DeepSeek-V3 on H100 (run_script.py A2A_1F1B)."""
    facts = _recipe_facts()
    rows = {r["id"]: r for r in csv.DictReader(open(CSV))}
    for r in rows.values():
        written = facts.row_facts(
            r, {"overlap", "layout", "attn", "moe_act", "recompute", "quant_pad", "waves",
                "expert_loop", "tp_ub", "te_quant", "cudnn_norm", "swizzle", "host_sync"})
        mine = [f for f in r["set"].split(";") if f and f.split("=")[0] in facts.OWNED]
        assert mine == written, (r["id"], r["set"], written)
    has = lambda i: "ep_overlap=1" in rows["mb-" + i]["set"].split(";")  # noqa: E731
    assert not has("26_04-dgx-gb200-qwen3-30b-a3b-mxfp8-8g")
    assert has("26_06-dgx-gb200-qwen3-30b-a3b-mxfp8-8g")
    assert has("26_08-dgx-gb200-qwen3-30b-a3b-mxfp8-8g")
    assert has("25_09-dgx-h100-deepseek-v3-fp8-current-1024g")
    assert not has("25_09-dgx-gb200-qwen3-30b-a3b-mxfp8-8g")
    assert sum(has(i[3:]) for i in rows) == 39


def test_merged_ep_schedule_exposes_each_phase_by_hand():
    """Megatron-Core's EP all-to-all overlap (model_chunk_schedule_plan.py: comm combine_bwd |
    dispatch_fwd, dispatch_bwd | combine_fwd against compute A_f | M_b, M_f | A_b), by hand,
    no deferred wgrad: c = 1 ms, A_f = 0.6, M_f = 1, M_b = 2, A_b = 1.2, o = 1: step 1
    max(1, 2) + max(1, 1) - 3 = 0, step 2 (combine_fwd behind A_b, the next layer's combine_bwd
    behind A_f) max(1, 1.2) + max(1, 0.6) - 1.8 = 0.4 ms, the combine_bwd's; o = 0.5: step 1
    max(1, 1) + max(1, 0.5) - 1.5 = 0.5 (dispatch_bwd's), step 2 max(1, 0.6) + max(1, 0.3) - 0.9
    = 1.1, of which the combine_fwd's 1 - 0.6 = 0.4; o = 0: all 4 ms exposed, 2 per pass. A
    full recompute's two extra all-to-alls (c_x = 2 ms) are not paired: the backward's whole."""
    from diffperf.schedule.overlap import ep_merged_1f1b_exposed_s as merged
    ms = 1e-3
    f, fh, b, bh = (float(x) for x in merged(ms, 0.0, 0.6 * ms, ms, 2 * ms, 1.2 * ms, 1.0))
    np.testing.assert_allclose([f, fh, b, bh], [0, 2 * ms, 0.4 * ms, 1.6 * ms], atol=1e-9)
    f, fh, b, bh = (float(x) for x in merged(ms, 0.0, 0.6 * ms, ms, 2 * ms, 1.2 * ms, 0.5))
    np.testing.assert_allclose([f, b], [0.4 * ms, 0.5 * ms + 0.7 * ms], rtol=1e-6)
    np.testing.assert_allclose([f + fh, b + bh], [2 * ms, 2 * ms], rtol=1e-6)
    f, fh, b, bh = (float(x) for x in merged(ms, 0.0, 0.6 * ms, ms, 2 * ms, 1.2 * ms, 0.0))
    np.testing.assert_allclose([f, fh, b, bh], [2 * ms, 0, 2 * ms, 0], atol=1e-9)
    f, fh, b, bh = (float(x) for x in merged(ms, 2 * ms, 0.6 * ms, ms, 2 * ms, 1.2 * ms, 1.0))
    np.testing.assert_allclose([f, b], [0.0, 0.4 * ms + 2 * ms], atol=1e-9)
    np.testing.assert_allclose(b + bh, 4 * ms, rtol=1e-6)


def test_merged_ep_schedule_steps_follow_each_micro_batchs_event_chain_by_hand():
    """Each node of the merged schedule waits only for its own micro-batch's previous node
    (ScheduleNode's per-chunk CUDA event), a deferred weight gradient (delay_wgrad_compute,
    which Megatron-Bridge sets with the overlap) for none. c = 1 ms, o = 1:
    - M_b = 2, M_f = 0.5, no deferred wgrad: dispatch_bwd waits for all of M_b, M_f for
      dispatch_fwd: max(1, 2) + max(1, 0.5) - 2.5 = 0.5 ms exposed (the dispatch_bwd's), where
      one window max(2 c, M_b + M_f) would hide both all-to-alls;
    - the same with M_b,w = 1 ms deferred: dispatch_bwd waits for the 1 ms dgrad only:
      max(max(1, 1) + 1, max(1, 2) + 0.5) - 2.5 = 0;
    - A_b = 2 of which A_b,w = 1 deferred, A_f = 0.5: the next layer's combine_bwd hides behind
      A_b,w + A_f: max(max(1, 1) + 1, max(1, 2) + 0.5) - 2.5 = 0, where the phase form
      (combine_bwd behind A_f alone) exposed 0.5;
    - M_b = 1.5 of which 0.5 deferred, M_f = 0.2, A's large: dispatch_fwd ends with the 1 ms
      dgrad, dispatch_bwd then runs behind M_b,w + M_f = 0.7 ms only: max(max(1, 1) + 1,
      max(1, 1.5) + 0.2) - 1.7 = 0.3 ms, the backward's;
    - M_b = 0.5 of which 0.25 deferred, M_f = 0.2: dispatch_fwd outlasts all 0.5 ms of M_b
      (0.5 ms, the forward's), dispatch_bwd waits for it and runs behind M_f only:
      max(max(1, 0.25) + 1, max(1, 0.5) + 0.2) - 0.7 = 1.3 ms, 0.8 the backward's."""
    from diffperf.schedule.overlap import ep_merged_1f1b_exposed_s as merged
    ms = 1e-3
    big = 10 * ms
    run = lambda af, mf, mb, ab, mbw=0.0, abw=0.0: [float(x) for x in merged(  # noqa: E731
        ms, 0.0, af, mf, mb, ab, 1.0, mlp_bw_s=mbw, attn_bw_s=abw)]
    f, _, b, _ = run(big, 0.5 * ms, 2 * ms, big)
    np.testing.assert_allclose([f, b], [0.0, 0.5 * ms], atol=1e-9)
    f, _, b, _ = run(big, 0.5 * ms, 2 * ms, big, mbw=ms)
    np.testing.assert_allclose([f, b], [0.0, 0.0], atol=1e-9)
    f, _, b, _ = run(0.5 * ms, big, big, 2 * ms, abw=ms)
    np.testing.assert_allclose([f, b], [0.0, 0.0], atol=1e-9)
    f, _, b, _ = run(0.5 * ms, big, big, 2 * ms)
    np.testing.assert_allclose([f, b], [0.0, 0.5 * ms], atol=1e-9)
    f, _, b, _ = run(big, 0.2 * ms, 1.5 * ms, big, mbw=0.5 * ms)
    np.testing.assert_allclose([f, b], [0.0, 0.3 * ms], atol=1e-9)
    f, _, b, _ = run(big, 0.2 * ms, 0.5 * ms, big, mbw=0.25 * ms)
    np.testing.assert_allclose([f, b], [0.5 * ms, 0.8 * ms], atol=1e-9)


def test_predict_defers_each_chunks_weight_gradient_in_the_merged_ep_schedule(monkeypatch):
    """predict hands the merged schedule each chunk's weight-gradient GEMMs as deferred
    (Megatron-Bridge sets delay_wgrad_compute with the overlap): M_b,w = the wgrad rows of the
    MLP chunk, A_b,w the rest, both x the TP-free share of the backward, inside M_b and A_b."""
    import importlib
    from diffperf.api import _as_float
    from diffperf.costs.compute import layer_pass_gemm_times_s

    pr = importlib.import_module("diffperf.predict")  # the module, not diffperf.predict()
    seen = {}
    real = pr.ep_merged_1f1b_exposed_s

    def spy(*args, **kw):
        seen["args"], seen["kw"] = args, kw
        return real(*args, **kw)

    monkeypatch.setattr(pr, "ep_merged_1f1b_exposed_s", spy)
    qwen = _model("qwen3-235b-a22b")
    par = Parallel(tp=2, pp=8, vp=4, dp=16, ep=32, etp=1, micro_batch=1, sequence_parallel=1,
                   global_batch=8192, ep_overlap=1.0)
    M, P, S, T = _as_float((qwen, par, _system("h100-sxm-80gb"), BF16))
    pr._layer_parts(M, P, S, T, None, features=pr.features_of(M, P, T))
    mlp_b, attn_b = seen["args"][4:6]
    mbw, abw = float(seen["kw"]["mlp_bw_s"]), float(seen["kw"]["attn_bw_s"])
    _, _, wgrad = layer_pass_gemm_times_s(layer_ops(M, P, T), S, T, None, False, None)
    mlp = np.asarray(pr._MLP_ROWS)
    free = mbw / float(np.sum(mlp * np.asarray(wgrad)))
    assert 0.0 < free <= 1.0
    np.testing.assert_allclose(abw, free * float(np.sum((1 - mlp) * np.asarray(wgrad))),
                               rtol=1e-5)
    assert 0.0 < mbw < float(mlp_b) and 0.0 < abw < float(attn_b)


def test_merged_ep_schedule_windows_hold_each_chunks_memory_bound_kernels_by_hand():
    """Megatron-Core's merged EP schedule runs each MoE layer as attn (norms, attention, its
    residual add, router, alltoall's permute) and mlp (chunk sorts, experts, activation,
    quantization padding) on the compute stream, dispatch and combine (the all-to-alls, the
    unpermute, the MLP's residual add) on the communication stream. Qwen3 235B-A22B on DGX-H100
    (h 4096, k 8, f_e 1536, SwiGLU; b 1, s 4096, t 2 with SP, etp 1, e 32, alltoall, bf16
    tokens, moe_quant_pad): T = 4096, T_sp = T_e = 2048, by hand
    A = 2 (7 T_sp h) + 2 h T_e (1 + 8) + Q = 117.4e6 + 151.0e6 + 75.5e6 B (Q: the per-head
    QK-norm, a 64, a_kv 4 > t, d_h 128: 2 x 2 T (64 + 4 + 4 for the key's copy) 128 / t),
    M = 2 T 8 f_e 3 / 2 + 2 h T_e 32 + 4 x 2 h 8 T_e = 151.0e6 + 536.9e6 + 536.9e6 B,
    C = 2 (3 T_sp h) + 2 h T_e 9 = 201.3e6 B, and A + M + C = elementwise_bytes."""
    from diffperf.workload.flops import ep_chunk_elementwise_bytes, elementwise_bytes

    qwen = _model("qwen3-235b-a22b")
    par = Parallel(tp=2, pp=8, dp=16, ep=32, etp=1, micro_batch=1, sequence_parallel=1,
                   global_batch=8192)
    tr = Training(moe_quant_pad=1.0)
    h, f_e, T, T_sp = 4096, 1536, 4096, 2048
    Q = 2 * 2 * T * (64 + 4 + 4) * 128 / 2  # the per-head QK-norm (75.5e6 B)
    A = 2 * 7 * T_sp * h + 2 * h * T_sp * 9 + Q
    M = 2 * T * 8 * f_e * 3 / 2 + 2 * h * T_sp * 32 + 4 * 2 * h * 8 * T_sp
    C = 2 * 3 * T_sp * h + 2 * h * T_sp * 9
    a, m, a_once, m_once = (float(x) for x in ep_chunk_elementwise_bytes(qwen, par, tr))
    # the QK-norm's backward excess (0.5 norms + 2 copies: 0.5 x 71.3e6 + 2 x 4.2e6 B)
    X = 0.5 * 2 * 2 * T * 68 * 128 / 2 + 2 * 2 * 2 * T * 4 * 128 / 2
    np.testing.assert_allclose([a, m, a_once, m_once], [A, M, X, 4 * 2 * h * 8 * T_sp],
                               rtol=1e-6)
    np.testing.assert_allclose(a + m + C, float(elementwise_bytes(qwen, par, tr)), rtol=1e-6)
    # flex (HybridEP / DeepEP): the permute follows the dispatch and the unpermute precedes
    # the combine, both in the expert chunk: 2 (r + k) copies in M, none in A or C.
    from diffperf.workload.flops import flex_rank_copies
    flex = par.replace(ep_dispatch=1)
    r = float(flex_rank_copies(qwen, flex))
    a, m, _, _ = (float(x) for x in ep_chunk_elementwise_bytes(qwen, flex, tr))
    np.testing.assert_allclose(a, 2 * 7 * T_sp * h + Q, rtol=1e-6)
    np.testing.assert_allclose(m, M - 2 * h * T_sp * 32 + 2 * h * T_sp * 2 * (r + 8),
                               rtol=1e-6)
    np.testing.assert_allclose(a + m + 2 * 3 * T_sp * h,
                               float(elementwise_bytes(qwen, flex, tr)), rtol=1e-6)


def test_merged_ep_schedule_unpaired_warmup_and_cooldown_passes_by_hand():
    """Megatron-Core's combined 1F1B runs the first stage's warm-up forwards (interleaved:
    2 (p - 1) + (v - 1) p, + 1 under EP overlap) and as many cool-down backwards without a
    partner pass. p 8, v 4: W = 14 + 24 + 1 = 39; GBS 8192 over dp 16 at b 1 (m 512):
    u = 39 / 2048; GBS 2048 (m 128): 39 / 512; no pipeline: the first forward and the last
    backward, 1 / m; W beyond the m v passes: every pass alone (u = 1). In predict: an
    unpaired pass exposes its all-to-alls whole, so with ep_overlap the exposed time is
    (1 - u) x the merged schedule's + u x all of it."""
    from diffperf.schedule.overlap import ep_merged_unpaired_frac as unpaired
    par = Parallel(tp=2, pp=8, vp=4, dp=16, ep=32, etp=1, micro_batch=1, global_batch=8192,
                   sequence_parallel=1)
    np.testing.assert_allclose(float(unpaired(par)), 39 / 2048, rtol=1e-6)
    np.testing.assert_allclose(float(unpaired(par.replace(global_batch=2048))), 39 / 512,
                               rtol=1e-6)
    np.testing.assert_allclose(float(unpaired(Parallel(dp=8, ep=8, global_batch=512,
                                                       micro_batch=1))), 1 / 64, rtol=1e-6)
    assert float(unpaired(par.replace(global_batch=64))) == 1.0
    # predict: ep_overlap = 0 exposes the same as before (every pass alone already)
    ds = _model("deepseek-moe-16b")
    h100 = _system("h100-sxm-80gb")
    base = Parallel(dp=16, ep=16, micro_batch=1, global_batch=64, zero_stage=1)
    off, on = (predict(ds, base.replace(ep_overlap=o), h100).breakdown for o in (0.0, 1.0))
    assert float(off.ep_hidden_s) == 0.0
    total = float(off.ep_exposed_s)
    # m = 4 micro-batches: at most 3/4 of the all-to-all time can hide
    assert 0.0 < float(on.ep_hidden_s) <= 0.75 * total * (1 + 1e-6)


def test_merged_ep_schedule_gradient_contract(x64):
    """Smooth (temperature > 0): check_grads on log-inputs; more all-to-all time exposes more,
    more compute in any phase exposes less, a larger overlap fraction exposes less."""
    from jax.test_util import check_grads
    from diffperf.schedule.overlap import ep_merged_1f1b_exposed_s as merged

    def total(logs):
        c, af, mf, mb, ab, o, mbw, abw = (v * jnp.exp(x) for v, x in zip(
            (1e-3, 0.6e-3, 1e-3, 2e-3, 1.2e-3, 0.8, 0.6e-3, 0.3e-3), logs))
        f, _, b, _ = merged(c, 0.0, af, mf, mb + mbw, ab + abw, o, temperature=0.05,
                            mlp_bw_s=mbw, attn_bw_s=abw)
        return f + b

    x = jnp.zeros(8)
    check_grads(total, (x,), order=1, modes=("rev",), eps=1e-4)
    g = np.asarray(jax.grad(total)(x))
    assert np.all(np.isfinite(g)) and g[0] > 0 and np.all(g[1:] < 0), g
