"""Models of current training stacks (docs/models.md): parameter counts against the published
figures, the Hugging Face config.json reader on real configs (tests/data/hf, provenance in its
README), and the FLOPs of MLA, sliding windows, dense layers of MoE models and MTP by hand.

Tolerance of a published count: one unit of its last published digit ("30.5B" -> 0.1B,
"37B" -> 1B, "116.83B" -> 0.01B). Figures are rounded (Mistral 7.24B from 7.2417B) or cut
(Qwen's "3.3B" activated from 3.353B) to that digit, so a count within one unit agrees with
the figure; a misread of one architecture field moves the count by far more (Gemma-2-9B's
gated MLP: 1.5B; Qwen2-57B-A14B's shared expert: 6.2B; DeepSeek-V3's MLA: 9B).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import jax
import numpy as np
import pytest

import diffperf
from diffperf import Parallel
from diffperf.errors import SpecError
from diffperf.hf import DEFAULT_SEQ_LEN, hf_to_dict
from diffperf.load import model_notes
from diffperf.workload.flops import attention_kappa, layer_ops
from diffperf.workload.params import (active_params, embedding_params, mla_down_params,
                                      mtp_params, total_params)

HF = Path(__file__).resolve().parent / "data" / "hf"
BF16 = diffperf.training("bf16")
B = 1e9


def _hf(name, **kw):
    return diffperf.load_model(HF / f"{name}.json", **kw)


def _within_last_digit(value, published: str):
    """|value - published| <= one unit of the published figure's last digit (in billions)."""
    digits = published.split(".")[1] if "." in published else ""
    unit = 10.0 ** -len(digits)
    assert abs(value / B - float(published)) <= unit + 1e-9, (value / B, published)


def _no_input_embedding(m):
    """Active parameters without the input embedding table: the convention of DeepSeek's
    and OpenAI's published activated counts (a lookup, not a matmul)."""
    return active_params(m) - m.hidden * m.vocab


# (fixture, total, active or None, active convention, source of the figures)
HF_PUBLISHED = [
    ("llama-3-8b", "8.03", None, None, "Meta Llama 3 8B model card: 8.03B"),
    ("llama-3.1-8b", "8.03", None, None,
     "Llama 3.1 8B: the Llama 3 8B architecture (Meta card: 8.03B) with a 128K context"),
    ("qwen3-8b", "8.2", None, None, "Qwen3-8B model card: 8.2B parameters"),
    ("qwen2.5-7b", "7.61", None, None, "Qwen2.5-7B model card: 7.61B parameters"),
    ("qwen2-57b-a14b", "57.4", "14", active_params,
     "Qwen2 technical report (arXiv:2407.10671) Table 1: 57B total, 14B activated; Qwen2-57B-"
     "A14B card: 57.41B"),
    ("qwen3-30b-a3b", "30.5", "3.3", active_params,
     "Qwen3-30B-A3B model card: 30.5B total, 3.3B activated"),
    ("mistral-7b-v0.1", "7.24", None, None, "Mistral-7B-v0.1 card: 7.24B"),
    ("mixtral-8x7b", "46.7", "12.9", active_params,
     "Jiang et al. 2024 (Mixtral of Experts) Section 2: 47B total, 13B active; Mistral AI "
     "announcement: 46.7B total, 12.9B per token"),
    ("gemma-2-9b", "9.24", None, None, "Gemma-2-9B card: 9.24B parameters"),
    ("deepseek-v2-lite", "15.7", "2.4", _no_input_embedding,
     "DeepSeek-V2 paper (arXiv:2405.04434) Appendix B: 15.7B total, 2.4B activated"),
    ("deepseek-v3", "671", "37", _no_input_embedding,
     "DeepSeek-V3 report (arXiv:2412.19437) Section 4.2: 671B total, 37B activated"),
    ("gpt-neox-20b", "20.55", None, None,
     "Black et al. 2022 (GPT-NeoX-20B) Table 1: 20,556,321,792 (20.55B) parameters"),
    ("gpt-oss-120b", "116.83", "5.13", _no_input_embedding,
     "OpenAI gpt-oss model card (arXiv:2508.10925) Table 1: 116.83B total, 5.13B active"),
]


@pytest.mark.parametrize("name,total,active,convention,source", HF_PUBLISHED,
                         ids=[r[0] for r in HF_PUBLISHED])
def test_hf_config_parameter_counts_match_published(name, total, active, convention, source):
    m = _hf(name)
    _within_last_digit(float(total_params(m)), total)
    if active is not None:
        _within_last_digit(float(convention(m)), active)
    else:
        assert float(active_params(m)) == float(total_params(m))  # dense


def test_qwen3_8b_non_embedding_count_matches_the_card():
    """Qwen3-8B model card: 6.95B non-embedding parameters (untied: both V x h tables out);
    the card's 8.2B total is pinned in HF_PUBLISHED."""
    m = _hf("qwen3-8b")
    _within_last_digit(float(total_params(m)) - 2 * 151936 * 4096, "6.95")


def test_gemma3_text_config_non_embedding_count_matches_the_report():
    """Gemma 3 technical report (arXiv:2503.19786) Table 1, 12B: 10,759M non-embedding
    parameters (vision encoder 417M apart). The fixture's text_config gives 7 fields; head_dim
    256, vocab 262208, GeGLU, tied embeddings come from transformers' Gemma3TextConfig."""
    m = _hf("gemma-3-12b")
    non_embedding = float(total_params(m) - embedding_params(m))
    assert non_embedding / 1e6 == pytest.approx(10759, abs=1)
    assert float(m.head_dim) == 256 and float(m.vocab) == 262208
    assert float(m.tied_embeddings) == 1 and float(m.gated_mlp) == 1


# (YAML name, total, active convention, active, source)
YAML_PUBLISHED = [
    ("deepseek-v3", "671", _no_input_embedding, "37", "DeepSeek-V3 report Section 4.2"),
    ("deepseek-v2-lite", "15.7", _no_input_embedding, "2.4", "DeepSeek-V2 paper Appendix B"),
    ("qwen3-30b-a3b", "30.5", active_params, "3.3", "Qwen3-30B-A3B card"),
    ("qwen3-235b-a22b", "235", active_params, "22", "Qwen3 report Table 2 / card: 235B, 22B"),
    ("gpt-oss-120b", "116.83", _no_input_embedding, "5.13", "gpt-oss model card Table 1"),
    ("gpt-oss-20b", "20.91", _no_input_embedding, "3.61", "gpt-oss model card Table 1"),
    ("llama3.1-405b", "405.9", active_params, "405.9",
     "Llama 3 paper Table 3 (405B); Hugging Face Llama-3.1-405B: 405,853,388,800"),
    ("mixtral-8x7b", "46.7", active_params, "12.9", "Mistral AI: 46.7B / 12.9B"),
    ("deepseek-moe-16b", "16.4", active_params, "2.8",
     "DeepSeekMoE paper (arXiv:2401.06066) Section 5.1: 16.4B total, 2.8B activated"),
]


@pytest.mark.parametrize("name,total,convention,active,source", YAML_PUBLISHED,
                         ids=[r[0] for r in YAML_PUBLISHED])
def test_shipped_model_parameter_counts_match_published(name, total, convention, active,
                                                        source):
    m = diffperf.load_model(name)
    _within_last_digit(float(total_params(m)), total)
    _within_last_digit(float(convention(m)), active)


def test_deepseek_moe_16b_dense_first_layer_by_hand():
    """deepseek-moe-16b-base config.json: layer 0 has a dense SwiGLU FFN of 10944
    (first_k_dense_replace = 1), layers 1-27 have 64 routed + 2 shared experts of 1408 and a
    64 x 2048 router. Counted by hand: embeddings 2 V h, attention 4 h^2 per layer (MHA, no
    biases), RMSNorm weights (2 L + 1) h, dense FFN 3 h f, MoE layers 27 (66 x 3 h f_e + E h).
    Active: 2 shared + 6 routed experts per MoE layer."""
    m = diffperf.load_model("deepseek-moe-16b")
    assert float(m.moe_dense_layers) == 1
    h, V, L, f, fe = 2048, 102400, 28, 10944, 1408
    common = 2 * V * h + L * 4 * h * h + (2 * L + 1) * h + 3 * h * f
    total = common + 27 * (66 * 3 * h * fe + 64 * h)
    active = common + 27 * (8 * 3 * h * fe + 64 * h)
    assert float(total_params(m)) == total
    assert float(active_params(m)) == active


def test_deepseek_v3_mtp_is_apart_from_the_671b():
    """DeepSeek-V3's README: 685B on Hugging Face = 671B main model + 14B MTP module. The
    module is one MoE layer + the 2h x h projection + norms (11.61B); the checkpoint also
    stores its copies of the embedding and output tables (2 V h = 1.853B): 13.46B -> "14B",
    and 671.03 + 13.46 = 684.5 -> "685B"."""
    m = diffperf.load_model("deepseek-v3")
    mtp = float(mtp_params(m))
    assert float(m.mtp_layers) == 1
    copies = 2 * 129280 * 7168
    _within_last_digit(mtp + copies, "14")
    _within_last_digit(float(total_params(m)) + mtp + copies, "685")
    assert float(total_params(m.replace(mtp_layers=0.0))) == float(total_params(m))


def test_deepseek_v3_yaml_and_config_json_agree():
    yaml_m, hf_m = diffperf.load_model("deepseek-v3"), _hf("deepseek-v3")
    for f in ("n_layers", "hidden", "ffn_hidden", "head_dim", "v_head_dim", "kv_lora_rank",
              "q_lora_rank", "qk_rope_head_dim", "n_experts", "moe_topk", "moe_ffn_hidden",
              "n_shared_experts", "moe_dense_layers", "mtp_layers", "vocab", "seq_len"):
        assert float(getattr(yaml_m, f)) == float(getattr(hf_m, f)), f


# ------------------------------------------------------------- issue 19's misreads, fixed

def test_qwen25_training_sequence_is_not_max_position_embeddings():
    """Issue 19: Qwen2.5-7B took max_position_embeddings (131072) as the training sequence
    (765 GiB of activations, no note). Now the default 4096, said in a note; --seq-len wins."""
    m = _hf("qwen2.5-7b")
    assert float(m.seq_len) == DEFAULT_SEQ_LEN == 4096
    notes = model_notes(HF / "qwen2.5-7b.json")
    assert any("seq_len=4096" in n and "max_position_embeddings=131072" in n for n in notes)
    assert float(_hf("qwen2.5-7b", seq_len=8192).seq_len) == 8192
    assert any("use_sliding_window is false" in n for n in notes)


def test_qwen_sliding_window_follows_use_sliding_window_and_max_window_layers():
    """transformers' Qwen2Config (Qwen3, Qwen2-MoE, Qwen3-MoE alike) keeps sliding_window only
    when use_sliding_window (default false) and then on layers i >= max_window_layers. On the
    published Qwen2.5-7B file (use_sliding_window false) no layer slides; switched on, its
    max_window_layers 28 of 28 still leaves none; with max_window_layers 20, 8 layers slide;
    without the key the window is off (the class default), where Mistral's is on."""
    cfg = json.loads((HF / "qwen2.5-7b.json").read_text())

    def window(**over):
        d = hf_to_dict({k: v for k, v in {**cfg, **over}.items() if v is not None}, "q")[0]
        return d.get("sliding_window"), d.get("sliding_window_layers")

    assert window() == (None, None)
    assert window(use_sliding_window=True) == (None, None)
    assert window(use_sliding_window=True, max_window_layers=20, sliding_window=4096) == (4096, 8)
    assert window(use_sliding_window=None, sliding_window=4096) == (None, None)
    mistral = json.loads((HF / "mistral-7b-v0.1.json").read_text())
    assert hf_to_dict(mistral, "m")[0]["sliding_window_layers"] == 32  # no such key: on


def test_gemma2_counts_the_gated_mlp_and_tied_embeddings():
    """Issue 19: 8.00B instead of 9.24B (gelu_pytorch_tanh gating and tied embeddings
    missed). GeGLU is 3 matrices, the output layer is the input embedding."""
    m = _hf("gemma-2-9b")
    assert float(m.gated_mlp) == 1 and float(m.tied_embeddings) == 1
    assert float(total_params(m)) / B == pytest.approx(9.24, abs=0.01)
    # Gemma 2 alternates 4096-window local and global layers: 21 of 42 slide
    assert (float(m.sliding_window), float(m.sliding_layers)) == (4096, 21)


def test_qwen2_moe_counts_the_shared_expert():
    """Issue 19: 51.2B instead of 57.4B (shared_expert_intermediate_size dropped)."""
    m = _hf("qwen2-57b-a14b")
    assert float(m.n_shared_experts) == 1 and float(m.shared_expert_ffn_hidden) == 20480
    assert float(total_params(m)) / B == pytest.approx(57.41, abs=0.01)


def test_mistral_sliding_window_is_read_and_cuts_attention_flops():
    """Issue 19: Mistral's sliding window was ignored. At s = 8192 (window 4096, every layer,
    flash) the causal kernel computes w s - w (w - 1)/2 scores, not s (s + 1) / 2 ~ s^2 / 2:
    kappa = (4096 x 8192 - 4096 x 4095 / 2) / 8192^2 = 0.37503."""
    m = _hf("mistral-7b-v0.1", seq_len=8192)
    assert (float(m.sliding_window), float(m.sliding_layers)) == (4096, 32)
    expected = (4096 * 8192 - 4096 * 4095 / 2) / 8192**2
    assert float(attention_kappa(m, BF16)) == pytest.approx(expected, rel=1e-6)
    full = m.replace(sliding_window=0.0, sliding_layers=0.0)
    a_win = float(np.sum(layer_ops(m, Parallel(), BF16).attention.flops))
    a_full = float(np.sum(layer_ops(full, Parallel(), BF16).attention.flops))
    assert a_win / a_full == pytest.approx(expected / 0.5, rel=1e-6)
    # at the default 4096 the window covers the sequence: full causal, and a note says so
    assert float(attention_kappa(_hf("mistral-7b-v0.1"), BF16)) == pytest.approx(0.5)
    assert any("no effect" in n for n in model_notes(HF / "mistral-7b-v0.1.json"))


def test_gemma3_nested_text_config_is_read():
    """Issue 19: Gemma-3's nested text_config was refused. Now its language model is read,
    the vision tower named as not modeled; 5 local (1024) : 1 global layers."""
    m = _hf("gemma-3-12b")
    assert float(m.n_layers) == 48 and float(m.hidden) == 3840
    assert (float(m.sliding_window), float(m.sliding_layers)) == (1024, 40)
    notes = model_notes(HF / "gemma-3-12b.json")
    assert any("vision_config ignored" in n for n in notes)
    assert any("head_dim=256" in n for n in notes)  # defaults named


def test_falcon_loads_without_seq_len():
    """Issue 19: Falcon failed with missing required key 'seq_len'. Falcon-7B's multi_query
    is one K/V head; Falcon-40B's new_decoder_architecture has 8 (num_kv_heads). The files
    give no max_position_embeddings: transformers' FalconConfig default 2048 ("Pretrained
    Falcon models with RoPE support up to 2048 tokens") is the training sequence, noted."""
    f7, f40 = _hf("falcon-7b"), _hf("falcon-40b")
    assert float(f7.seq_len) == float(f40.seq_len) == 2048
    assert any("FalconConfig: max_position_embeddings=2048" in n
               for n in model_notes(HF / "falcon-7b.json"))
    assert (float(f7.n_heads), float(f7.n_kv_heads), float(f7.ffn_hidden)) == (71, 1, 4 * 4544)
    assert (float(f40.n_heads), float(f40.n_kv_heads)) == (128, 8)
    # Falcon ties lm_head to the word embeddings (FalconForCausalLM; no key in the file)
    assert float(f7.tied_embeddings) == 1
    assert float(total_params(f7)) / B == pytest.approx(6.92, abs=0.01)
    assert float(f7.seq_len) == 2048 and float(_hf("falcon-7b", seq_len=4096).seq_len) == 4096


def test_falcon_refinedweb_and_converted_files_read_the_same():
    """tiiuae/falcon-7b was published as a RefinedWebModel config (n_head, n_layer, auto_map;
    tests/data/hf/falcon-7b-refinedweb.json, a clone of the Hub file) before transformers'
    convert_custom_code_checkpoint.py rewrote it to the falcon form (falcon-7b.json). Both
    are the same model: every field diffperf uses agrees."""
    rw, conv = _hf("falcon-7b-refinedweb"), _hf("falcon-7b")
    for f in ("n_layers", "hidden", "n_heads", "n_kv_heads", "ffn_hidden", "vocab", "seq_len",
              "tied_embeddings", "gated_mlp", "biases"):
        assert float(getattr(rw, f)) == float(getattr(conv, f)), f
    assert float(total_params(rw)) == float(total_params(conv))


def test_gpt_neox_20b_trains_at_its_context_length():
    """GPT-NeoX-20B's context is max_position_embeddings = 2048, the sequence it was trained
    on (EleutherAI/gpt-neox configs/20B.yml: "seq-length": 2048): the default sequence is
    capped there (4096 would be a run the published model never had), and the note says so."""
    m = _hf("gpt-neox-20b")
    assert float(m.seq_len) == 2048
    notes = model_notes(HF / "gpt-neox-20b.json")
    assert any(n.startswith("seq_len=2048: the model's context length "
                            "max_position_embeddings=2048") for n in notes)
    assert float(_hf("gpt-neox-20b", seq_len=4096).seq_len) == 4096  # the user's choice wins


# Fields of the published files that diffperf does not read, each with no cost in the model:
# ids and launch flags (auto_map, pretraining_tp: a Megatron-era TP hint that transformers'
# Llama/DeepSeek code uses only to slice matmuls, same FLOPs), dropout rates (old GPT-NeoX
# names; 0 in GPT-NeoX-20B), Gemma 2's logit soft-caps and query scale (elementwise),
# cache_implementation and sliding_window_size (inference cache; the window is read from
# sliding_window), Qwen2.5's use_mrope (false: plain RoPE), GPT-OSS's initial_context_length
# (its pre-training context, 4096, equal to the default) and Falcon's
# apply_residual_connection_post_layernorm (false: the standard pre-LN residual).
UNREAD = {
    "deepseek-v2-lite": {"auto_map", "pretraining_tp"},
    "deepseek-v3": {"auto_map"},
    "falcon-7b": {"apply_residual_connection_post_layernorm"},
    "falcon-7b-refinedweb": {"apply_residual_connection_post_layernorm", "auto_map"},
    "falcon-40b": {"apply_residual_connection_post_layernorm"},
    "gemma-2-9b": {"attn_logit_softcapping", "cache_implementation", "final_logit_softcapping",
                   "query_pre_attn_scalar", "sliding_window_size"},
    "gemma-3-12b": set(),
    "gpt-neox-20b": {"attention_probs_dropout_prob", "hidden_dropout_prob"},
    "gpt-oss-120b": {"initial_context_length"},
    "llama-3-8b": {"pretraining_tp"},
    "llama-3.1-8b": {"pretraining_tp"},
    "mistral-7b-v0.1": set(),
    "mixtral-8x7b": set(),
    "qwen2-57b-a14b": set(),
    "qwen2.5-7b": {"use_mrope"},
    "qwen3-30b-a3b": set(),
    "qwen3-8b": set(),
}


@pytest.mark.parametrize("name", sorted(UNREAD))
def test_published_files_list_exactly_their_unread_fields(name):
    """Every field of a published config.json is either read or named in the notes as not
    read, and the fields not read are exactly those above (none with a cost)."""
    notes = hf_to_dict(json.loads((HF / f"{name}.json").read_text()), name)[1]
    listed = [n for n in notes if n.startswith("config.json fields not read: ")]
    got = set(listed[0].split(": ", 1)[1].split(", ")) if listed else set()
    assert got == UNREAD[name]


def test_fixture_bytes_are_the_recorded_copies():
    """tests/data/hf/SHA256SUMS pins each fixture's bytes: a copy is replaced only with its
    provenance (README.md), never edited by hand."""
    import hashlib
    sums = dict(line.split()[::-1] for line in (HF / "SHA256SUMS").read_text().splitlines()
                if line.strip())
    files = sorted(p.name for p in HF.glob("*.json"))
    assert sorted(sums) == files
    for name in files:
        assert hashlib.sha256((HF / name).read_bytes()).hexdigest() == sums[name], name


def test_every_fixture_lists_its_unread_fields_and_predict_prints_parameters(capsys):
    for path in sorted(HF.glob("*.json")):
        cfg = json.loads(path.read_text())
        d, notes = hf_to_dict(cfg, str(path))
        assert any(n.startswith("seq_len=") for n in notes), path.name
    from diffperf.cli.main import main
    code = main(["predict", "--json", "--model", str(HF / "gpt-oss-120b.json"), "--system",
                 "h100-sxm-80gb", "--gpus", "64", "--tp", "1", "--pp", "1", "--ep", "8",
                 "--global-batch", "64"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    assert out["parameters"]["total"] / B == pytest.approx(116.83, abs=0.01)
    assert out["parameters"]["active"] < out["parameters"]["total"]
    assert any("attention sinks" in n for n in out["notes"])


def test_unsupported_hf_architecture_is_refused_by_name():
    with pytest.raises(SpecError, match="cross_attention_layers"):
        hf_to_dict({"num_hidden_layers": 2, "hidden_size": 8, "num_attention_heads": 2,
                    "vocab_size": 8, "cross_attention_layers": [1]}, "x.json")


# microsoft/Phi-3-mini-4k-instruct config.json (Hugging Face), the architecture fields as
# published (transformers 4.40.2); its q/k/v and gate/up are fused matrices of the Llama shapes.
PHI3_MINI = {
    "architectures": ["Phi3ForCausalLM"], "model_type": "phi3", "hidden_act": "silu",
    "hidden_size": 3072, "intermediate_size": 8192, "max_position_embeddings": 4096,
    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 32,
    "original_max_position_embeddings": 4096, "rms_norm_eps": 1e-05, "rope_scaling": None,
    "rope_theta": 10000.0, "sliding_window": 2047, "tie_word_embeddings": False,
    "attention_bias": False, "vocab_size": 32064, "embd_pdrop": 0.0, "resid_pdrop": 0.0,
}


def test_phi3_mini_count_matches_the_report(tmp_path):
    """Phi-3 technical report (arXiv:2404.14219) Section 2: phi-3-mini, a 3.8 billion
    parameter model (3.82 B counted here)."""
    p = tmp_path / "config.json"
    p.write_text(json.dumps(PHI3_MINI))
    m = diffperf.load_model(p)
    _within_last_digit(float(total_params(m)), "3.8")
    assert float(m.sliding_window) == 2047 and float(m.sliding_layers) == 32


# moonshotai/Kimi-K2-Instruct config.json (https://huggingface.co/moonshotai/Kimi-K2-Instruct/
# blob/main/config.json; copy read in ai-dynamo/aiconfigurator, aic-core/src/aiconfigurator_core/
# model_configs/moonshotai--Kimi-K2-Instruct_config.json @ 095f58a51c4c), its architecture
# fields as published. Not shipped as a fixture: the model's licence is a modified MIT licence
# whose terms for redistributing its files were not checked here.
KIMI_K2 = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "kimi_k2",
    "attention_bias": False, "first_k_dense_replace": 1, "hidden_act": "silu",
    "hidden_size": 7168, "intermediate_size": 18432, "kv_lora_rank": 512,
    "max_position_embeddings": 131072, "moe_intermediate_size": 2048, "moe_layer_freq": 1,
    "n_group": 1, "n_routed_experts": 384, "n_shared_experts": 1, "norm_topk_prob": True,
    "num_attention_heads": 64, "num_experts_per_tok": 8, "num_hidden_layers": 61,
    "num_key_value_heads": 64, "num_nextn_predict_layers": 0, "q_lora_rank": 1536,
    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06,
    "routed_scaling_factor": 2.827, "scoring_func": "sigmoid", "tie_word_embeddings": False,
    "topk_group": 1, "topk_method": "noaux_tc", "v_head_dim": 128, "vocab_size": 163840,
}


def test_kimi_k2_is_read_as_the_deepseek_v3_architecture_it_names(tmp_path):
    """Kimi K2's config.json says model_type "kimi_k2" for DeepseekV3ForCausalLM (refused by
    its type before). Read as DeepSeek-V3, it must give the shape the model card lists (61
    layers, 1 dense, 384 experts, top 8, 1 shared, expert width 2048, 64 heads, MLA) and the
    count by hand (float32 sums: rel 1e-6, below one expert of one layer, 4.3e-5):
      attention / layer: h q_c + q_c + q_c a (d_nope + d_R) + h (d_c + d_R) + d_c
                         + d_c a (d_nope + d_v) + a d_v h;  norms 2 h
      MoE layer: (E + 1) 3 h f_e + E h (router);  dense layer: 3 h f;  embeddings 2 V h + h
    = 1,026.41 B total, 32.86 B active. Model card (moonshotai/Kimi-K2-Instruct): 1T total,
    32B activated; both pinned to their last digit. The tech report (arXiv:2507.20534) says
    1.04T / 32.6B, which this config does not give (1.04T would need the dense layer to be an
    MoE layer too: 1.0429T)."""
    h, V, a, E, fe = 7168, 163840, 64, 384, 2048
    attn = (h * 1536 + 1536 + 1536 * a * 192 + h * (512 + 64) + 512 + 512 * a * 256
            + a * 128 * h + 2 * h)
    shared = 61 * attn + 3 * h * 18432 + 60 * (3 * h * fe + E * h) + 2 * V * h + h
    p = tmp_path / "config.json"
    p.write_text(json.dumps(KIMI_K2))
    m = diffperf.load_model(p)
    assert (float(m.n_layers), float(m.moe_dense_layers), float(m.n_experts),
            float(m.moe_topk), float(m.n_shared_experts), float(m.moe_ffn_hidden),
            float(m.kv_lora_rank), float(m.q_lora_rank), float(m.head_dim),
            float(m.v_head_dim), float(m.mtp_layers)) == (61, 1, 384, 8, 1, 2048, 512, 1536,
                                                          192, 128, 0)
    assert float(total_params(m)) == pytest.approx(shared + 60 * E * 3 * h * fe, rel=1e-6)
    assert float(active_params(m)) == pytest.approx(shared + 60 * 8 * 3 * h * fe, rel=1e-6)
    _within_last_digit(float(total_params(m)) / 1000, "1")  # 1T: in thousands of billions
    _within_last_digit(float(active_params(m)), "32")
    notes = hf_to_dict(KIMI_K2, "x.json")[1]
    assert any("model_type='kimi_k2' with architectures ['DeepseekV3ForCausalLM']: read as "
               "a deepseek_v3 config" in n for n in notes)
    # the alias needs the class it stands for; another kimi_k2 stays refused by its type
    with pytest.raises(SpecError, match="model_type='kimi_k2' is not an architecture"):
        hf_to_dict(KIMI_K2 | {"architectures": ["KimiLinearForCausalLM"]}, "x.json")


# allenai/OLMo-2-1124-13B config.json (https://huggingface.co/allenai/OLMo-2-1124-13B, Apache
# 2.0; the copy read: mauer4/Attention-From-Scratch, weights/allenai/OLMo-2-1124-13B/config.json
# @ 381a295f1d0697f36e21decfafef5ed74006ae94), the fields as published; its
# model.safetensors.index.json there gives total_size 54,864,793,600 bytes of float32
# (torch_dtype) weights: 13,716,198,400 parameters.
OLMO2_13B = {
    "architectures": ["Olmo2ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "eos_token_id": 100257, "hidden_act": "silu", "hidden_size": 5120,
    "initializer_range": 0.02, "intermediate_size": 13824, "max_position_embeddings": 4096,
    "model_type": "olmo2", "num_attention_heads": 40, "num_hidden_layers": 40,
    "num_key_value_heads": 40, "pad_token_id": 100277, "rms_norm_eps": 1e-06,
    "rope_scaling": None, "rope_theta": 500000, "tie_word_embeddings": False,
    "torch_dtype": "float32", "transformers_version": "4.47.0", "use_cache": True,
    "vocab_size": 100352,
}


def test_olmo2_13b_count_is_its_checkpoint(tmp_path):
    """OLMo 2 is Llama's attention and MLP with post-norms and a QK-norm over the whole q / k
    projection (refused by type before). Its checkpoint holds 13,716,198,400 parameters
    (54,864,793,600 float32 bytes / 4); diffperf counts them all, the q_norm / k_norm weights
    ((a + a_kv) d_h = 10,240 per layer, qk_norm "projection") included (they were left out,
    in a note, before: 13,715,788,800). Float32 sums: rel 1e-7, 40 x 10,240 is 3e-5."""
    p = tmp_path / "config.json"
    p.write_text(json.dumps(OLMO2_13B))
    m = diffperf.load_model(p)
    assert float(m.gated_mlp) == 1 and float(m.rms_norm) == 1 and float(m.biases) == 0
    assert float(m.qk_norm) == 2
    assert float(total_params(m)) == pytest.approx(54_864_793_600 / 4, rel=1e-7)
    notes = hf_to_dict(OLMO2_13B, "x.json")[1]
    assert any("olmo2: norms after attention and MLP" in n and "whole q / k projection" in n
               for n in notes)
    assert not any(n.startswith("config.json fields not read") for n in notes)


def test_gated_mlp_is_the_family_module_not_the_activation_name():
    """transformers' LlamaMLP is gate x up whatever hidden_act says (a Llama with hidden_act
    gelu lost its gate matrix: 8.03 -> 6.15 B); GPTNeoXMLP has no gate even with silu."""
    llama = json.loads((HF / "llama-3.1-8b.json").read_text())
    gelu = diffperf.load_model(hf_to_dict(llama | {"hidden_act": "gelu"}, "x")[0])
    assert float(gelu.gated_mlp) == 1
    _within_last_digit(float(total_params(gelu)), "8.03")
    neox = json.loads((HF / "gpt-neox-20b.json").read_text())
    assert hf_to_dict(neox | {"hidden_act": "silu"}, "x")[0]["gated_mlp"] is False
    # no model_type: the activation's name decides, said in a note
    d, notes = hf_to_dict(_BASE | {"intermediate_size": 256, "hidden_act": "silu"}, "x")
    assert d["gated_mlp"] is True and any("hidden_act='silu'" in n for n in notes)
    # every family read by name says whether its MLP is gated (a type added to
    # SUPPORTED_TYPES alone would fall back to the activation's name, the bug above)
    from diffperf.hf import _GATED_TYPES, _UNGATED_TYPES, SUPPORTED_TYPES

    assert not set(SUPPORTED_TYPES) - set(_GATED_TYPES) - set(_UNGATED_TYPES)
    assert not set(_GATED_TYPES) & set(_UNGATED_TYPES)


def test_mlp_bias_is_read():
    """LlamaConfig.mlp_bias puts biases on gate/up/down: read (it was left unread, so a model
    with MLP biases only was counted without any), with a note that diffperf's one switch
    adds the attention's biases too."""
    llama = json.loads((HF / "llama-3.1-8b.json").read_text())
    d, notes = hf_to_dict(llama | {"mlp_bias": True}, "x")
    assert d["biases"] is True
    assert any("mlp_bias=true" in n and "the attention's" in n for n in notes)
    assert hf_to_dict(llama, "x")[0]["biases"] is False


_BASE = {"num_hidden_layers": 4, "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 100}


@pytest.mark.parametrize("cfg,named", [
    # an encoder with a decoder's field names (read as a causal decoder before)
    (_BASE | {"model_type": "bert", "type_vocab_size": 2}, "'bert'"),
    # Mamba + attention + MoE hybrid: read as 92.1 B against 52 B published before
    (_BASE | {"model_type": "jamba", "attn_layer_period": 8, "num_experts": 16,
              "num_experts_per_tok": 2}, "'jamba'"),
    # linear-attention (Gated DeltaNet) layers, one full-attention layer in 4
    (_BASE | {"model_type": "qwen3_next", "full_attention_interval": 4}, "'qwen3_next'"),
    # DeepSeek-V3.2's sparse attention (lightning indexer, top-2048 keys)
    (_BASE | {"model_type": "deepseek_v32", "index_topk": 2048}, "'deepseek_v32'"),
    (_BASE | {"model_type": "falcon_h1", "mamba_d_ssm": 3072}, "'falcon_h1'"),
    # wrappers around a text_config: Llama 4 (interleaved MoE, shared expert, chunked attention)
    ({"model_type": "llama4", "text_config": _BASE | {"model_type": "llama4_text"}},
     "'llama4_text' (the text_config of a model_type='llama4' config)"),
    # refused by their type, before their field names are looked at (Mamba, T5)
    ({"model_type": "mamba", "hidden_size": 768, "num_hidden_layers": 24, "vocab_size": 50280,
      "state_size": 16}, "'mamba'"),
    ({"model_type": "t5", "d_model": 512, "num_layers": 6, "num_heads": 8, "vocab_size": 32128},
     "'t5'"),
    ({"model_type": "gemma3", "text_config": _BASE | {"model_type": "gemma3n_text"}},
     "'gemma3n_text' (the text_config of a model_type='gemma3' config)"),
])
def test_unknown_hf_model_type_is_refused_by_name(cfg, named):
    with pytest.raises(SpecError, match=f"model_type={re.escape(named)} is not an architecture "
                                        f"diffperf reads"):
        hf_to_dict(cfg, "x.json")


def test_hf_config_without_model_type_says_how_it_is_read():
    _, notes = hf_to_dict(_BASE | {"intermediate_size": 256}, "x.json")
    assert any("model_type absent: read as a Llama-style decoder" in n for n in notes)


def test_model_yaml_rejects_inconsistent_features():
    base = dict(num_layers=4, hidden=64, num_heads=4, vocab=100, seq_len=128)
    with pytest.raises(SpecError, match="kv_lora_rank"):
        diffperf.load_model(base | dict(qk_rope_head_dim=8))
    with pytest.raises(SpecError, match="moe_dense_layers"):
        diffperf.load_model(base | dict(moe_dense_layers=1))
    with pytest.raises(SpecError, match="sliding_window_layers"):
        diffperf.load_model(base | dict(sliding_window=16, sliding_window_layers=5))


# ------------------------------------------------------------------------- FLOPs by hand

def test_deepseek_v3_moe_layer_forward_flops_per_token_by_hand():
    """One DeepSeek-V3 MoE layer's forward per token, s = 4096, causal, flash
    (DeepSeek-V2 arXiv:2405.04434 Section 2.1 eqs. (9)-(14) for MLA; V3 report Section 4.2):

    projections, 2 x weights (no absorption in training):
      W^DQ  7168 x 1536            = 11,010,048
      W^UQ;W^QR  1536 x 128 x 192  = 37,748,736
      W^DKV;W^KR 7168 x (512 + 64) =  4,128,768
      W^UK;W^UV  512 x 128 x 256   = 16,777,216
      W^O   128 x 128 x 7168       = 117,440,512      -> sum 187,105,280
    router 7168 x 256 = 1,835,008; 8 routed + 1 shared SwiGLU experts 9 x 3 x 7168 x 2048
    = 396,361,728; matmul FLOPs 2 x 585,302,016 = 1,170,604,032
    attention core: 2 x s/2 x 128 x (192 + 128) = 167,772,160 (kappa 1/2: s/2 keys on average)
    """
    m = diffperf.load_model("deepseek-v3").replace(moe_dense_layers=0.0)  # an MoE layer
    ops = layer_ops(m, Parallel(micro_batch=1.0), BF16)
    per_token = float(np.sum(ops.dense.flops)) / 4096
    assert per_token == pytest.approx(2 * (187_105_280 + 1_835_008 + 396_361_728), rel=1e-6)
    assert float(np.sum(ops.attention.flops)) / 4096 == pytest.approx(
        2 * 2048 * 128 * 320, rel=1e-6)
    assert float(mla_down_params(m)) == 11_010_048 + 1536 + 4_128_768 + 512
    # the 3 dense layers (SwiGLU 18432) make the mean layer of the 61
    dense_mlp = 2 * 3 * 7168 * 18432
    moe_mlp = 2 * (1_835_008 + 396_361_728)
    full = diffperf.load_model("deepseek-v3")
    mean = float(np.sum(layer_ops(full, Parallel(micro_batch=1.0), BF16).dense.flops)) / 4096
    assert mean == pytest.approx(2 * 187_105_280 + (3 * dense_mlp + 58 * moe_mlp) / 61,
                                 rel=1e-6)


def test_model_flops_count_active_experts_mla_and_mtp():
    """MFU's model FLOPs (the active-parameter convention of Megatron-LM's
    num_floating_point_operations, behind Megatron-Bridge's "model TFLOP/s"):
    3 B [(L + D) (layer matmuls + attention) + (1 + D) logits], L = 61, D = 1 MTP module;
    a layer's matmuls are 2 x the weights one token uses (MLA's projections, the router, 8
    routed + 1 shared experts, or the dense MLP; the mean of 3 dense and 58 MoE layers),
    never all 256 experts."""
    from diffperf.predict import _flops_per_step
    m = diffperf.load_model("deepseek-v3").replace(seq_len=16.0)
    B_ = 8.0
    par = Parallel(global_batch=B_, micro_batch=1.0)
    model_flops, hw = _flops_per_step(m, par, BF16)
    ops = layer_ops(m, Parallel(micro_batch=1.0), BF16)
    layer = float(np.sum(ops.dense.flops) + np.sum(ops.attention.flops))
    logits = 2 * 16 * 7168 * 129280
    assert float(model_flops) == pytest.approx(3 * B_ * (62 * layer + 2 * logits), rel=1e-6)
    # the layer's matmuls are 2 x the weights one token uses, not all 256 experts
    active_layer_weights = (187_105_280 + (3 * 3 * 7168 * 18432 + 58 * (
        1_835_008 + 396_361_728)) / 61)
    assert float(np.sum(ops.dense.flops)) / 16 == pytest.approx(2 * active_layer_weights,
                                                               rel=1e-6)


def test_gpt_oss_sliding_layers_attention_by_hand():
    """GPT-OSS: half of the layers use a 128-token window. s = 4096, flash: kappa =
    0.5 x 0.5 + 0.5 x (128 x 4096 - 128 x 127 / 2) / 4096^2 = 0.265381."""
    m = diffperf.load_model("gpt-oss-120b")
    band = (128 * 4096 - 128 * 127 / 2) / 4096**2
    assert float(attention_kappa(m, BF16)) == pytest.approx(0.25 + 0.5 * band, rel=1e-6)
    # without flash the scores are computed whole (masked): kappa 1 on every layer
    assert float(attention_kappa(m, BF16.replace(flash_attention=0.0))) == pytest.approx(1.0)
    # sinks: one parameter per head per layer, counted (one layer: float32 resolves it)
    from diffperf.workload.params import layer_vector_params
    no_sinks = m.replace(attention_sinks=0.0)
    assert float(layer_vector_params(m) - layer_vector_params(no_sinks)) == 64


def test_new_features_have_finite_physical_gradients():
    """Gradient contract on the new features (MLA, a dense layer in an MoE model, shared
    experts, an MTP stage; tests/test_gradients.py checks them and GPT-OSS's windows against
    finite differences): d step / d System leaf is finite, and a faster matmul peak or HBM
    never slows the step (derivative < 0, or <= 0 for the HBM). One jitted gradient program,
    with the XLA:CPU options `predict` compiles with there (search.kernel._CPU_QUICK_OPTIONS):
    ~7 s of CPU, where the same gradient run eagerly compiled ~500 ops one by one (~19 s)."""
    from diffperf.search.kernel import _CPU_QUICK_OPTIONS

    system = diffperf.load_system("h100-sxm-80gb")
    par = Parallel(tp=2.0, pp=3.0, dp=8.0, ep=2.0, micro_batch=1.0, global_batch=64.0,
                   sequence_parallel=1.0)
    model = diffperf.load_model("deepseek-v2-lite").replace(mtp_layers=1.0)
    options = dict(compiler_options=_CPU_QUICK_OPTIONS) if jax.default_backend() == "cpu" else {}
    grad = jax.jit(jax.grad(lambda s: diffperf.predict(model, par, s, BF16).step_time_s),
                   **options)(system)
    assert all(np.all(np.isfinite(np.asarray(g))) for g in jax.tree.leaves(grad))
    assert float(grad.matmul_flops_per_s) < 0
    assert float(grad.hbm_bandwidth_Bps) <= 0


def test_multimodal_wrapper_with_a_known_text_config_is_read():
    """A wrapper other than gemma3 (a vicuna-7b = Llama 2 7B text_config with every size
    written, 6.74 B parameters) is read from its text_config, said in the notes (it was
    refused by its wrapper type before); a text_config that leaves out the sizes of a type
    whose class defaults diffperf does not keep (qwen2) is refused naming what is missing
    (the published llava-1.5 file: test_llava_1_5_text_config_takes_llama_config_defaults)."""
    text = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 11008,
            "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
            "vocab_size": 32064, "rms_norm_eps": 1e-5, "hidden_act": "silu",
            "max_position_embeddings": 4096, "tie_word_embeddings": False}
    d, notes = hf_to_dict({"model_type": "llava", "image_token_index": 32000,
                           "text_config": text, "vision_config": {"hidden_size": 1024}},
                          "x.json")
    bare, _ = hf_to_dict(text, "x.json")
    assert {k: v for k, v in d.items() if k != "name"} == {
        k: v for k, v in bare.items() if k != "name"}
    assert any("text_config (model_type llama) of a llava config; vision_config ignored" in n
               for n in notes)
    assert any("the 'llava' wrapper's language model is read as a llama config (only gemma3 "
               "wrappers are checked against a published parameter count)" in n for n in notes)
    m = diffperf.load_model(d)
    assert float(total_params(m)) / B == pytest.approx(6.74, abs=0.01)
    with pytest.raises(SpecError, match=re.escape(
            "x.json: not a recognised Hugging Face config.json (needs num_hidden_layers, "
            "hidden_size, num_attention_heads; missing num_hidden_layers, hidden_size, "
            "num_attention_heads in the text_config of a model_type='llava' config "
            "(transformers fills absent fields from its config class's defaults, which "
            "diffperf keeps only for gemma3_text, llama, mistral: write them into "
            "text_config))")):
        hf_to_dict({"model_type": "llava", "text_config": {"model_type": "qwen2",
                                                           "vocab_size": 152128}}, "x.json")


def test_llava_1_5_text_config_takes_llama_config_defaults():
    """The text_config of llava-hf/llava-1.5-7b-hf's config.json as published (transformers
    4.36.0.dev0; quoted from the file, vision_config cut) names only vocab_size,
    max_position_embeddings and rms_norm_eps: a nested config leaves out what equals its
    class's defaults, and transformers builds LlamaConfig's (4096, 11008, 32 layers, 32 heads,
    silu). It was refused naming the sizes (review13a); it reads now as Llama 2 7B with 64
    more vocabulary rows, 6.74 B (LlavaForConditionalGeneration's language model), gated."""
    cfg = {"architectures": ["LlavaForConditionalGeneration"], "ignore_index": -100,
           "image_token_index": 32000, "model_type": "llava", "pad_token_id": 32001,
           "projector_hidden_act": "gelu",
           "text_config": {"_name_or_path": "lmsys/vicuna-7b-v1.5",
                           "architectures": ["LlamaForCausalLM"],
                           "max_position_embeddings": 4096, "model_type": "llama",
                           "rms_norm_eps": 1e-05, "torch_dtype": "float16",
                           "vocab_size": 32064},
           "tie_word_embeddings": False, "torch_dtype": "float16",
           "transformers_version": "4.36.0.dev0",
           "vision_config": {"hidden_size": 1024, "image_size": 336, "intermediate_size": 4096,
                             "model_type": "clip_vision_model", "num_attention_heads": 16,
                             "num_hidden_layers": 24, "patch_size": 14}}
    d, notes = hf_to_dict(cfg, "x.json")
    assert (d["num_layers"], d["hidden"], d["num_heads"], d["ffn_hidden"], d["vocab"],
            d["gated_mlp"], d["tied_embeddings"]) == (32, 4096, 32, 11008, 32064, True, False)
    assert any("fields absent from text_config take the defaults of transformers' "
               "LlamaConfig: hidden_act=silu, hidden_size=4096, intermediate_size=11008, "
               "num_attention_heads=32, num_hidden_layers=32, tie_word_embeddings=False" in n
               for n in notes)
    assert float(total_params(diffperf.load_model(d))) / B == pytest.approx(6.74, abs=0.01)
    # a top-level Llama config writes every field: a missing size is still refused there
    with pytest.raises(SpecError, match="missing intermediate_size"):
        hf_to_dict({"model_type": "llama", "num_hidden_layers": 4, "hidden_size": 64,
                    "num_attention_heads": 4, "vocab_size": 100}, "x.json")
    # the same text_config without its model_type: LlavaConfig assumes llama
    # (`text_config.get("model_type", "llama")`), so diffperf does, said in a note
    bare = {**cfg, "text_config": {k: v for k, v in cfg["text_config"].items()
                                   if k != "model_type"}}
    d2, notes2 = hf_to_dict(bare, "x.json")
    assert d2 == d
    assert "text_config names no model_type: read as llama, the type transformers' " \
           "LlavaConfig assumes for it" in notes2


def test_wrapper_text_config_types_are_those_transformers_assumes():
    """A text_config without model_type takes the type its wrapper's transformers class
    assumes (Mistral3Config: mistral, LlavaOnevisionConfig: qwen2, Gemma3Config: always
    Gemma3TextConfig), read as the same text_config with the type written; a wrapper that
    assumes none stays refused (tests/test_errors.py)."""
    text = {"hidden_size": 512, "intermediate_size": 1024, "num_hidden_layers": 4,
            "num_attention_heads": 8, "num_key_value_heads": 2, "vocab_size": 1000,
            "hidden_act": "silu", "head_dim": 64}
    for wrapper, mt in (("mistral3", "mistral"), ("llava_onevision", "qwen2"),
                        ("gemma3", "gemma3_text"), ("llava_next", "llama")):
        d, notes = hf_to_dict({"model_type": wrapper, "text_config": text}, "x.json")
        typed, _ = hf_to_dict({"model_type": wrapper, "text_config": text | {
            "model_type": mt}}, "x.json")
        assert d == typed, wrapper
        assert any(f"text_config names no model_type: read as {mt}" in n for n in notes)
