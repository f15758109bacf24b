"""Every validation rule raises SpecError naming the field, the value and what is allowed.

STYLE.md section 5: validate at the boundary (load.py, specs/validate.py, the CLI) on
concrete values, before anything is traced; `pytest.raises(SpecError, match=re.escape(...))`
for each rule. Nothing here compiles: errors must come before tracing.
"""

from __future__ import annotations

import csv
import json
import re

import numpy as np
import pytest
import yaml

import diffperf
from diffperf import Parallel, SpecError, load_model, load_runs, load_system
from diffperf.specs.batch import stack
from diffperf.load import apply_overlay
from diffperf.specs.validate import check_inputs, check_layout


def _raises(fragment):
    return pytest.raises(SpecError, match=re.escape(fragment))


def test_spec_error_is_a_value_error():
    assert issubclass(SpecError, ValueError)


# --------------------------------------------------------------------------------------------
# YAML files: systems
# --------------------------------------------------------------------------------------------

def _system_dict():
    return {
        "name": "test-gpu", "matmul_TFLOPs": 312, "vector_TFLOPs": 19.5,
        "hbm_bandwidth_GBps": 2039, "hbm_capacity_GiB": 80,
        "tiers": [
            {"name": "nvlink", "domain_size": 8, "bandwidth_GBps": 300, "latency_us": 2.5},
            {"name": "ib", "domain_size": 1048576, "bandwidth_GBps": 25, "latency_us": 5},
        ],
    }


def _write_yaml(tmp_path, d, name="sys.yaml"):
    p = tmp_path / name
    p.write_text(yaml.safe_dump(d))
    return p


def test_valid_system_yaml_loads_in_si_units(tmp_path):
    s = load_system(_write_yaml(tmp_path, _system_dict()))
    assert float(s.tiers[1].bandwidth_Bps) == 25e9      # GB/s -> B/s
    assert float(s.tiers[0].latency_s) == pytest.approx(2.5e-6, rel=1e-12)  # us -> s
    assert float(s.hbm_capacity_bytes) == 80 * 2**30    # GiB -> B
    assert float(s.matmul_flops_per_s) == 312e12        # TFLOP/s -> FLOP/s


@pytest.mark.parametrize("bw", [-25, 0])
def test_system_non_positive_bandwidth(tmp_path, bw):
    d = _system_dict()
    d["tiers"][1]["bandwidth_GBps"] = bw
    p = _write_yaml(tmp_path, d)
    with _raises(f"{p}.tiers[1].bandwidth_GBps={bw} must be > 0"):
        load_system(p)


def test_system_negative_latency(tmp_path):
    d = _system_dict()
    d["tiers"][0]["latency_us"] = -1
    p = _write_yaml(tmp_path, d)
    with _raises(f"{p}.tiers[0].latency_us=-1 must be >= 0"):
        load_system(p)


def test_system_key_typo_suggests_closest(tmp_path):
    d = _system_dict()
    d["hbm_bandwith_GBps"] = d.pop("hbm_bandwidth_GBps")
    p = _write_yaml(tmp_path, d)
    with _raises(f"{p}: unknown key 'hbm_bandwith_GBps'; did you mean 'hbm_bandwidth_GBps'? "
                 "(allowed: "):
        load_system(p)


def test_tier_key_typo_suggests_closest(tmp_path):
    d = _system_dict()
    d["tiers"][0]["bandwidth_GBs"] = d["tiers"][0].pop("bandwidth_GBps")
    p = _write_yaml(tmp_path, d)
    with _raises(f"{p}.tiers[0]: unknown key 'bandwidth_GBs'; did you mean 'bandwidth_GBps'?"):
        load_system(p)


def test_efficiency_key_typo_suggests_closest(tmp_path):
    d = _system_dict() | {"efficiency": {"mm_maxx": 0.7}}
    p = _write_yaml(tmp_path, d)
    with _raises(f"{p}.efficiency: unknown key 'mm_maxx'; did you mean 'mm_max'?"):
        load_system(p)


def test_system_missing_required_key(tmp_path):
    d = _system_dict()
    del d["hbm_bandwidth_GBps"]
    p = _write_yaml(tmp_path, d)
    with _raises(f"{p}: missing required key 'hbm_bandwidth_GBps'"):
        load_system(p)


def test_system_value_not_a_number(tmp_path):
    d = _system_dict() | {"matmul_TFLOPs": "fast"}
    p = _write_yaml(tmp_path, d)
    with _raises(f"{p}.matmul_TFLOPs='fast' must be a number"):
        load_system(p)


@pytest.mark.parametrize("value", [2, 0.5, "sometimes"])
def test_system_fp8_non_tn_gemm_is_a_flag(tmp_path, value):
    """System key fp8_non_tn_gemm (TE nvte_is_non_tn_fp8_gemm_supported: Blackwell) is 0/1:
    any other value is refused at load, naming the file, the key and the value."""
    assert float(load_system(_write_yaml(tmp_path, _system_dict() | {
        "fp8_non_tn_gemm": 1})).fp8_non_tn_gemm) == 1.0
    p = _write_yaml(tmp_path, _system_dict() | {"fp8_non_tn_gemm": value}, "bad.yaml")
    with _raises(f"{p}.fp8_non_tn_gemm={value!r} must be true or false"):
        load_system(p)


def test_system_value_not_finite(tmp_path):
    p = tmp_path / "sys.yaml"
    p.write_text(yaml.safe_dump(_system_dict()).replace("matmul_TFLOPs: 312",
                                                         "matmul_TFLOPs: .inf"))
    with _raises(f"{p}.matmul_TFLOPs=inf must be a finite number"):
        load_system(p)


def test_tier_oversubscription_at_least_one(tmp_path):
    from diffperf.load import _configs_dir

    d = yaml.safe_load((_configs_dir() / "systems" / "meta-h100-24k.yaml").read_text())
    d["tiers"][3]["oversubscription"] = 0.5
    path = tmp_path / "sys.yaml"
    path.write_text(yaml.safe_dump(d))
    with _raises(f"{path}.tiers[3].oversubscription=0.5 must be >= 1"):
        diffperf.load_system(path)


@pytest.mark.parametrize("tiers", [None, []])
def test_system_needs_tiers(tmp_path, tiers):
    d = _system_dict()
    if tiers is None:
        del d["tiers"]
    else:
        d["tiers"] = tiers
    p = _write_yaml(tmp_path, d)
    with _raises(f"{p}.tiers must be a non-empty list of network tiers "
                 "(keys: name, domain_size, bandwidth_GBps, latency_us, oversubscription)"):
        load_system(p)


def test_system_tier_not_a_mapping(tmp_path):
    d = _system_dict()
    d["tiers"][0] = [8, 300, 2.5]
    p = _write_yaml(tmp_path, d)
    with _raises(f"{p}.tiers[0]: expected a mapping of keys to values, got list"):
        load_system(p)


def test_system_tiers_must_nest(tmp_path):
    d = _system_dict()
    d["tiers"][1]["domain_size"] = 4
    p = _write_yaml(tmp_path, d)
    with _raises(f"{p}.tiers[1].domain_size=4 must be >= tiers[0].domain_size=8 "
                 "(tiers are nested, innermost first)"):
        load_system(p)


@pytest.mark.parametrize("key,value,rule", [
    ("mm_max", 1.5, "must be in [0.001, 1]"),
    ("coll_eff_inter", 0, "must be in [0.001, 1]"),
    ("mm_half_dim", 0, "must be > 0"),
])
def test_system_efficiency_ranges(tmp_path, key, value, rule):
    p = _write_yaml(tmp_path, _system_dict() | {"efficiency": {key: value}})
    with _raises(f"{p}.efficiency.{key}={float(value):g} {rule}"):
        load_system(p)


def test_system_efficiency_negative(tmp_path):
    p = _write_yaml(tmp_path, _system_dict() | {"efficiency": {"kernel_s": -1}})
    with _raises(f"{p}.efficiency.kernel_s=-1 must be >= 0"):
        load_system(p)


def test_system_reliability_loads_in_si_units(tmp_path):
    """The `reliability:` keys (configs/README.md): per device-hour -> per device-second,
    GB/s -> B/s, seconds as they are; an absent mapping keeps the defaults."""
    from diffperf import Reliability

    rel = {"failure_rate_per_device_hour": 3.6, "storage_write_GBps": 500, "restart_s": 90}
    s = load_system(_write_yaml(tmp_path, _system_dict() | {"reliability": rel}))
    assert float(s.reliability.failure_rate_per_s) == pytest.approx(1e-3, rel=1e-12)
    assert float(s.reliability.storage_write_Bps) == 500e9
    assert float(s.reliability.restart_s) == 90.0
    assert load_system(_write_yaml(tmp_path, _system_dict(), "b.yaml")).reliability == (
        Reliability())


@pytest.mark.parametrize("key,value,rule", [
    ("failure_rate_per_device_hour", 0, "must be > 0"),
    ("failure_rate_per_device_hour", -2e-5, "must be > 0"),
    ("storage_write_GBps", 0, "must be > 0"),
    ("storage_write_GBps", -1, "must be > 0"),
    ("restart_s", -60, "must be >= 0"),
])
def test_system_reliability_values(tmp_path, key, value, rule):
    """A zero or negative failure rate or storage bandwidth, or a negative restart time, is
    refused (a restart of 0 s is an ideal, allowed; a rate of 0 has no optimal interval)."""
    p = _write_yaml(tmp_path, _system_dict() | {"reliability": {key: value}})
    with _raises(f"{p}.reliability.{key}={float(value):g} {rule}"):
        load_system(p)


def test_system_reliability_unknown_key_and_not_a_mapping(tmp_path):
    p = _write_yaml(tmp_path, _system_dict() | {"reliability": {"restart_min": 10}})
    with _raises(f"{p}.reliability: unknown key 'restart_min'; did you mean 'restart_s'? "
                 "(allowed: failure_rate_per_device_hour, restart_s, storage_write_GBps)"):
        load_system(p)
    p = _write_yaml(tmp_path, _system_dict() | {"reliability": [600]}, "c.yaml")
    with _raises(f"{p}.reliability: expected a mapping of keys to values, got list"):
        load_system(p)


def test_overlay_unknown_key_and_bad_value():
    s = load_system("a100-sxm-80gb")
    with _raises("overlay: unknown key 'efficency'; did you mean 'efficiency'?"):
        apply_overlay(s, {"efficency": {"mm_max": 0.5}})
    with _raises("overlay.efficiency.mm_max=2 must be in [0.001, 1]"):
        apply_overlay(s, {"efficiency": {"mm_max": 2.0}})


def test_unknown_system_name_suggests():
    with _raises("unknown system 'h100-sxm'; did you mean 'h100-sxm-80gb'? (shipped: "):
        load_system("h100-sxm")


# --------------------------------------------------------------------------------------------
# YAML files: models, and malformed files
# --------------------------------------------------------------------------------------------

def _model_dict(**over):
    return {"name": "m", "num_layers": 4, "hidden": 256, "num_heads": 4, "vocab": 1000,
            "seq_len": 128} | over


def test_model_key_typo_suggests_closest(tmp_path):
    d = _model_dict()
    d["num_layer"] = d.pop("num_layers")
    p = _write_yaml(tmp_path, d, "m.yaml")
    with _raises(f"{p}: unknown key 'num_layer'; did you mean 'num_layers'? (allowed: "):
        load_model(p)


def test_unknown_model_name_suggests():
    with _raises("unknown model 'gpt3-175'; did you mean 'gpt3-175b'? (shipped: "):
        load_model("gpt3-175")


@pytest.mark.parametrize("over,message", [
    (dict(num_kv_heads=3), ": num_kv_heads=3 must divide num_heads=4; allowed num_kv_heads: "
                           "1, 2, 4"),
    (dict(hidden=250), ": hidden=250 is not a multiple of num_heads=4; give head_dim "
                       "explicitly"),
    (dict(hidden=256.5), ".hidden=256.5 must be a whole number"),
    (dict(num_layers=0), ".num_layers=0 must be > 0"),
    (dict(moe_experts=2, moe_topk=3, moe_ffn_hidden=64), ": moe_topk=3 must be in "
                                                          "1..moe_experts=2"),
    (dict(moe_experts=8, moe_topk=2), ": moe_ffn_hidden must be > 0 when moe_experts=8"),
    (dict(attention="casual"), ".attention='casual' is not allowed; did you mean 'causal'? "
                               "(allowed: causal, full)"),
    (dict(norm="rmsnorn"), ".norm='rmsnorn' is not allowed; did you mean 'rmsnorm'? "
                           "(allowed: layernorm, rmsnorm)"),
    (dict(gated_mlp="maybe"), ".gated_mlp='maybe' must be true or false"),
    # a quoted value in a typed file (session 15): was read as the number / flag it spells
    (dict(hidden="256"), ".hidden='256' is a string (type str), not a number; allowed: a "
                         "number, written without quotes"),
    (dict(moe_experts=" 0"), ".moe_experts=' 0' is a string (type str), not a number"),
    (dict(gated_mlp="true"), ".gated_mlp='true' is a string (type str), not true / false; "
                             "allowed: true or false, unquoted"),
    # architecture features (load.py _architecture_features; docs/models.md)
    (dict(qk_rope_head_dim=64), ": qk_rope_head_dim / q_lora_rank describe multi-head latent "
                                "attention and need kv_lora_rank > 0 (got kv_lora_rank=0)"),
    (dict(q_lora_rank=128), ": qk_rope_head_dim / q_lora_rank describe multi-head latent "
                            "attention and need kv_lora_rank > 0 (got kv_lora_rank=0)"),
    (dict(kv_lora_rank=64, qk_rope_head_dim=64, head_dim=64),
     ": qk_rope_head_dim=64 must be < head_dim=64 (head_dim = qk_nope_head_dim + "
     "qk_rope_head_dim under MLA)"),
    (dict(moe_dense_layers=1), ": moe_dense_layers=1 needs moe_experts > 0"),
    # QK-norm (session 16): MLA norms its latents, not its queries and keys
    (dict(kv_lora_rank=64, qk_rope_head_dim=32, head_dim=64, qk_norm="head"),
     ".qk_norm='head' with kv_lora_rank=64: multi-head latent attention norms its latents "
     "(counted with kv_lora_rank), not its queries and keys; allowed: none"),
    (dict(moe_dense_layers=4, moe_experts=8, moe_topk=2, moe_ffn_hidden=64),
     ": moe_dense_layers=4 must be < num_layers=4 (for a dense model set moe_experts: 0)"),
    (dict(sliding_window=64, sliding_window_layers=5),
     ": sliding_window_layers=5 must be <= num_layers=4"),
    (dict(sliding_window_layers=2), ": sliding_window_layers=2 needs sliding_window > 0"),
])
def test_model_rules(tmp_path, over, message):
    p = _write_yaml(tmp_path, _model_dict(**over), "m.yaml")
    with _raises(f"{p}{message}"):
        load_model(p)


def test_model_missing_required_key(tmp_path):
    d = _model_dict()
    del d["vocab"]
    p = _write_yaml(tmp_path, d, "m.yaml")
    with _raises(f"{p}: missing required key 'vocab'"):
        load_model(p)


def test_malformed_yaml(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("num_layers: [4, 8\nhidden: 256\n")
    with _raises(f"{p}: malformed YAML: "):
        load_model(p)


def test_yaml_top_level_not_a_mapping(tmp_path):
    p = tmp_path / "list.yaml"
    p.write_text("- 1\n- 2\n")
    with _raises(f"{p}: expected a YAML mapping at the top level, got list"):
        load_system(p)


def test_yaml_file_missing(tmp_path):
    p = tmp_path / "nowhere.yaml"
    with _raises(f"{p}: cannot read (No such file or directory)"):
        load_model(p)


# --------------------------------------------------------------------------------------------
# Hugging Face config.json
# --------------------------------------------------------------------------------------------

# meta-llama/Meta-Llama-3-8B config.json (Hugging Face), as published.
LLAMA3_8B_HF = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 128000, "eos_token_id": 128001, "hidden_act": "silu", "hidden_size": 4096,
    "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 8192,
    "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32,
    "num_key_value_heads": 8, "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": None,
    "rope_theta": 500000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "transformers_version": "4.40.0.dev0", "use_cache": True, "vocab_size": 128256,
}


def _write_json(tmp_path, obj, name="config.json"):
    p = tmp_path / name
    p.write_text(json.dumps(obj))
    return p


def test_hf_llama3_8b_config_loads(tmp_path):
    # the training sequence is never max_position_embeddings: the shipped YAML's 8192 is given
    m = load_model(_write_json(tmp_path, LLAMA3_8B_HF), seq_len=8192)
    got = {f: float(getattr(m, f)) for f in (
        "gated_mlp", "rms_norm", "n_kv_heads", "n_heads", "n_layers", "hidden", "ffn_hidden",
        "head_dim", "vocab", "seq_len", "tied_embeddings", "biases", "learned_positions",
        "causal", "n_experts")}
    assert got == dict(gated_mlp=1.0, rms_norm=1.0, n_kv_heads=8.0, n_heads=32.0, n_layers=32.0,
                       hidden=4096.0, ffn_hidden=14336.0, head_dim=128.0, vocab=128256.0,
                       seq_len=8192.0, tied_embeddings=0.0, biases=0.0, learned_positions=0.0,
                       causal=1.0, n_experts=0.0)
    # The same model as the shipped YAML, leaf for leaf.
    shipped = load_model("llama3-8b")
    for f in got:
        assert float(getattr(shipped, f)) == got[f], f


def test_hf_unsupported_field_is_named(tmp_path):
    cfg = LLAMA3_8B_HF | {"cross_attention_layers": [3, 8]}
    p = _write_json(tmp_path, cfg)
    with _raises(f"{p}: Hugging Face fields not supported by diffperf's model: "
                 "cross_attention_layers (write a diffperf model YAML instead)"):
        load_model(p)


def test_hf_mla_without_head_dims_is_named(tmp_path):
    p = _write_json(tmp_path, LLAMA3_8B_HF | {"kv_lora_rank": 512, "q_lora_rank": 1536})
    with _raises(f"{p}: kv_lora_rank=512 (multi-head latent attention) needs qk_nope_head_dim "
                 "and qk_rope_head_dim"):
        load_model(p)


def test_hf_not_a_model_config(tmp_path):
    p = _write_json(tmp_path, {"hidden_size": 64, "vocab_size": 100})
    with _raises(f"{p}: not a recognised Hugging Face config.json (needs num_hidden_layers, "
                 "hidden_size, num_attention_heads; missing num_hidden_layers, "
                 "num_attention_heads)"):
        load_model(p)


def test_hf_malformed_json(tmp_path):
    p = tmp_path / "config.json"
    p.write_text('{"hidden_size": 4096,')
    with _raises(f"{p}: malformed JSON: "):
        load_model(p)


def test_hf_json_not_an_object(tmp_path):
    p = _write_json(tmp_path, [1, 2, 3])
    with _raises(f"{p}: expected a JSON object at the top level"):
        load_model(p)


@pytest.mark.parametrize("over,message", [
    (dict(model_type=3), ": model_type=3 must be a string"),
    (dict(vocab_size=None), ": missing vocab_size (the tokenizer's vocabulary size, a whole "
                            "number >= 1)"),
    # Qwen2-MoE's dense layers are a list of indices
    (dict(model_type="qwen2_moe", num_experts=8, num_experts_per_tok=2,
          moe_intermediate_size=64, mlp_only_layers=3),
     ": mlp_only_layers=3 must be a list of layer indices"),
    (dict(model_type="qwen2_moe", num_experts=8, num_experts_per_tok=2,
          moe_intermediate_size=64, mlp_only_layers=[0, -1]),
     ": mlp_only_layers[]=-1 must be a whole number in 0..2^31"),
    # DeepSeek's leading dense layers are a count
    (dict(model_type="deepseek_v3", n_routed_experts=8, num_experts_per_tok=2,
          moe_intermediate_size=64, first_k_dense_replace=1.5),
     ": first_k_dense_replace=1.5 must be a whole number in 0..2^31"),
    (dict(model_type="deepseek_v3", n_routed_experts=8, num_experts_per_tok=2,
          moe_intermediate_size=64, first_k_dense_replace=1, moe_layer_freq=-1),
     ": moe_layer_freq=-1 must be a whole number in 1..2^31"),
    # Qwen2-MoE's MoE layers are (i + 1) % decoder_sparse_step == 0: 0 was read as 1
    (dict(model_type="qwen2_moe", num_experts=8, num_experts_per_tok=2,
          moe_intermediate_size=64, decoder_sparse_step=0),
     ": decoder_sparse_step=0 must be a whole number in 1..2^31"),
    # a GPT-2 with a cross-attention block in every layer, an encoder-decoder
    (dict(add_cross_attention=True), ": Hugging Face fields not supported by diffperf's "
                                     "model: add_cross_attention (write a diffperf model "
                                     "YAML instead)"),
    (dict(is_encoder_decoder=True), ": Hugging Face fields not supported by diffperf's "
                                    "model: is_encoder_decoder (write a diffperf model YAML "
                                    "instead)"),
    # a JSON string that parses (session 15): was read as the number / flag it spells;
    # transformers' @strict config classes (PR #41250) refuse a str there too
    (dict(intermediate_size="14336"), ": intermediate_size='14336' is a string (type str), "
                                      "not a number; allowed: a number, written without "
                                      "quotes"),
    (dict(model_type="mixtral", num_local_experts="0", num_experts_per_tok=2),
     ": num_local_experts='0' is a string (type str), not a number"),
    (dict(model_type="mistral", sliding_window=4096, use_sliding_window="false"),
     ": use_sliding_window='false' is a string (type str), not true / false; allowed: true "
     "or false, unquoted"),
    (dict(tie_word_embeddings="yes"), ": tie_word_embeddings='yes' is a string (type str), "
                                      "not true / false"),
    # JSON's Infinity / 1e400 (Python's json reads them): named by the config.json field (was:
    # "config.json.vocab=inf", diffperf's key)
    (dict(vocab_size=float("inf")), ": vocab_size=inf must be a finite number"),
])
def test_hf_field_rules(tmp_path, over, message):
    p = _write_json(tmp_path, LLAMA3_8B_HF | over)
    with _raises(f"{p}{message}") as err:
        load_model(p)
    if "is a string" in message:  # the field and its value ride on the error
        key = message.split("=")[0].lstrip(": ")
        assert (err.value.field, err.value.value) == (key, over[key])


def test_hf_missing_vocab_size(tmp_path):
    cfg = {k: v for k, v in LLAMA3_8B_HF.items() if k != "vocab_size"}
    p = _write_json(tmp_path, cfg)
    with _raises(f"{p}: missing vocab_size (the tokenizer's vocabulary size, a whole number "
                 ">= 1)"):
        load_model(p)


def test_hf_invalid_values_are_checked_like_yaml(tmp_path):
    p = _write_json(tmp_path, LLAMA3_8B_HF | {"num_key_value_heads": 5})
    with _raises(f"{p}: num_kv_heads=5 must divide num_heads=32; allowed num_kv_heads: "
                 "1, 2, 4, 8, 16, 32"):
        load_model(p)


# --------------------------------------------------------------------------------------------
# Training precision
# --------------------------------------------------------------------------------------------

def test_unknown_precision_suggests():
    with _raises("precision='bf61' is not allowed; did you mean 'bf16'? "
                 "(allowed: bf16, fp16, amp-bf16, xla-amp-bf16, bf16-pure, fp32, fp8-delayed, "
                 "fp8-current, fp8-blockwise, mxfp8, nvfp4, fp8)"):
        diffperf.training("bf61")


def test_unknown_training_field_suggests():
    with _raises("training: unknown field 'activaton_bytes'; did you mean 'activation_bytes'?"):
        diffperf.training("bf16", activaton_bytes=2.0)


# --------------------------------------------------------------------------------------------
# Layout rules (specs/validate.py check_layout), and predict() before tracing
# --------------------------------------------------------------------------------------------

def _small(**over):
    return diffperf.load_model((_model_dict(num_heads=24, hidden=768, num_kv_heads=8,
                                                ffn_hidden=3072, num_layers=12, seq_len=2048)
                                    | over))


MODULES_WHY = ("Megatron-Core's TransformerLayer reads recompute_modules only under "
               "recompute_granularity 'selective'")
LAYOUT_RULES = [
    # (Parallel fields, n_devices, message after "parallel: ")
    (dict(tp=1.5), None, "tp=1.5 must be a whole number >= 1"),
    (dict(dp=0), None, "dp=0 must be a whole number >= 1"),
    (dict(micro_batch=0), None, "micro_batch=0 must be a whole number >= 1"),
    (dict(zero_stage=4), None, "zero_stage=4 is not allowed (allowed: 0, 1, 2, 3)"),
    (dict(recompute=3), None, "recompute=3 is not allowed (allowed: 0, 1, 2)"),
    (dict(sequence_parallel=2), None, "sequence_parallel=2 is not allowed (allowed: 0, 1)"),
    (dict(dp_overlap=0.5), None, "dp_overlap=0.5 is not allowed (allowed: 0, 1)"),
    (dict(tp_overlap=1.5), None, "tp_overlap=1.5 must be in [0, 1]"),
    (dict(tp=5), None, "tp=5 must divide model.num_heads=24; allowed tp: "
                       "1, 2, 3, 4, 6, 8, 12, 24"),
    (dict(tp=3), None, "tp=3 and model.num_kv_heads=8: one must divide the other (KV heads are "
                       "split, or replicated, across TP ranks)"),
    (dict(pp=13), None, "pp=13, vp=1: every middle pipeline stage must hold at least vp "
                        "layers, the first and last at least max(vp - 1, 1); model.num_layers=12 "
                        "gives the first, middle and last stages 1, 1-1 and 0"),
    (dict(pp=4, vp=4, global_batch=8), None,
     "pp=4, vp=4: every middle pipeline stage must hold at least vp layers, the first and last "
     "at least max(vp - 1, 1); model.num_layers=12 gives the first, middle and last stages 3, "
     "3-3 and 3"),
    (dict(pp=4, pp_first_layers=5, pp_last_layers=6), None,
     "pp=4, vp=1: every middle pipeline stage must hold at least vp layers, the first and last "
     "at least max(vp - 1, 1); model.num_layers=12 gives the first, middle and last stages 5, "
     "0-1 and 6"),
    (dict(zero_shard=3, dp=4, zero_stage=3, global_batch=8), None,
     "zero_shard=3 must divide dp x cp=4 (the ranks that hold the same weights); allowed: "
     "1, 2, 4"),
    (dict(zero_shard=1.5, dp=4, zero_stage=3, global_batch=8), None,
     "zero_shard=1.5 must be a whole number >= 0 (0: shard over all dp x cp ranks)"),
    (dict(zero3_prefetch_params=-1), None,
     "zero3_prefetch_params=-1 must be >= 0 (0: the next layer whole, as PyTorch FSDP; "
     "DeepSpeed's stage3_prefetch_bucket_size is 5e7)"),
    (dict(zero3_calls_per_layer=0), None, "zero3_calls_per_layer=0 must be a whole number >= 1"),
    # infinity is not a whole number (passed `k != round(k)` before: issue frontdoor)
    (dict(zero3_calls_per_layer=float("inf")), None,
     "zero3_calls_per_layer=inf must be a whole number >= 1 (at most 2147483647)"),
    (dict(zero3_regather=2), None, "zero3_regather=2 is not allowed (allowed: 0, 1)"),
    (dict(zero3_root_unit=2), None, "zero3_root_unit=2 is not allowed (allowed: 0 root unit "
     "not priced, 1 FSDP's root unit gathered and reduce-scattered exposed)"),
    (dict(zero3_copy_out=2), None, "zero3_copy_out=2 is not allowed (allowed: 0 FSDP1 / "
     "DeepSpeed flat buffers, 1 FSDP2 copy-out)"),
    (dict(tp_userbuffers=3), None, "tp_userbuffers=3 is not allowed (allowed: 0 the "
     "tp_overlap form, 1 Transformer Engine userbuffers as Megatron-Bridge's FP8 "
     "configurations run it, 2 as NeMo Framework Launcher 24.07's H100 FP8 configuration "
     "runs it on TE 1.8: pipelined forward reduce-scatters)"),
    (dict(recompute=1, recompute_policy=3), None,
     "recompute_policy=3 is not allowed (allowed: 0, 1, 2)"),
    (dict(recompute=2, recompute_layer_frac=0), None,
     "recompute_layer_frac=0 must be in (0, 1] (the fraction of the layers that full "
     "recompute checkpoints; 1: every layer)"),
    (dict(recompute=1, recompute_layer_frac=0.5), None,
     "recompute_layer_frac=0.5 needs full recompute (recompute=2; got recompute=1): only full "
     "recompute checkpoints a fraction of the layers; allowed: 1 with recompute 0 or 1"),
    (dict(recompute=2, recompute_policy=1), None,
     "recompute_policy=1 needs selective recompute (recompute=1; got recompute=2): it picks the "
     "ops selective recompute re-runs (1, 2: TorchTitan's per-op SAC); allowed: 0 with "
     "recompute 0 or 2"),
    (dict(recompute=1, recompute_mlp=2), None, "recompute_mlp=2 is not allowed (allowed: 0, 1)"),
    (dict(recompute=2, recompute_mlp=1), None,
     "recompute_mlp=1 needs Megatron's selective recompute (recompute=1, recompute_policy=0; "
     f"got recompute=2, recompute_policy=0): {MODULES_WHY}; allowed: 0 with another recompute "
     "mode"),
    (dict(recompute=1, recompute_policy=1, recompute_core_attn=0), None,
     "recompute_core_attn=0 needs Megatron's selective recompute (recompute=1, "
     f"recompute_policy=0; got recompute=1, recompute_policy=1): {MODULES_WHY}; allowed: 1 "
     "with another recompute mode"),
    (dict(recompute=1, recompute_mla_up_proj=1), None,
     "recompute_mla_up_proj=1 needs multi-latent attention (model.kv_lora_rank > 0; got 0); "
     "allowed: 0"),
    (dict(recompute=1, recompute_moe_act=1), None,
     "recompute_moe_act=1 acts only on MoE layers (the routed experts' activation "
     "recompute); allowed: 0 for a dense model (moe_experts = 0)"),
    (dict(pp=4, pp_first_layers=2), None,
     "pp_first_layers=2 and pp_last_layers=0: give both (> 0) or neither (0: stages balanced "
     "automatically)"),
    (dict(pp_first_layers=-1, pp_last_layers=2), None,
     "pp_first_layers=-1 must be a whole number >= 0 (0: balanced automatically)"),
    (dict(pp_first_layers=6, pp_last_layers=6), None,
     "pp_first_layers=6 needs pp > 1 (one stage holds every layer)"),
    (dict(pp=2, pp_first_layers=5, pp_last_layers=5), None,
     "pp=2: pp_first_layers + pp_last_layers=10 must equal model.num_layers=12"),
    (dict(cp=3), None, "cp=3 must divide model.seq_len=2048"),
    (dict(ep=2, dp=2, global_batch=2), None,
     "ep=2 needs an MoE model (model.moe_experts=0); allowed ep: 1"),
    (dict(dp=4, micro_batch=3, global_batch=32), None,
     "global_batch=32 must be a multiple of micro_batch x dp=3 x 4"),
    (dict(vp=2, global_batch=4), None, "vp=2 needs pp > 1"),
    (dict(pp=4, vp=3, global_batch=6), None,
     "interleaved schedule (vp=3) needs micro-batches per step m=6 to be a multiple of pp=4"),
    (dict(tp=8, dp=4, global_batch=4), 64,
     "tp x cp x dp x pp = 32 must equal number of devices=64"),
]


@pytest.mark.parametrize("fields,n_devices,message", LAYOUT_RULES,
                         ids=[m.split(" ")[0] for _, _, m in LAYOUT_RULES])
def test_layout_rules(fields, n_devices, message):
    with _raises(f"parallel: {message}") as err:
        check_layout(_small(), Parallel(**fields), n_devices)
    _names_its_field(err.value)


def _names_its_field(err):
    """Every rule's SpecError carries the field it names (and that field's value): a runs
    CSV's --set hint and the overlay hint read it (session 15: many layout / model rules
    carried none)."""
    assert err.field is not None, str(err)
    named = "devices" if err.field == "n_devices" else err.field.split(".")[-1]
    assert named in str(err), (err.field, str(err))
    assert err.value is not None, str(err)


def test_every_layout_model_training_system_rule_carries_its_field():
    """A table of bad inputs beyond LAYOUT_RULES (the AxoNN grid, the MoE layout rules, the
    model, training and system leaves, the job's size, the precision on a device): every
    SpecError names its field (SpecError.field / .value). Host-side numpy, no compile."""
    from diffperf.load import training
    from diffperf.specs.validate import (check_job, check_model, check_precision,
                                         check_system, check_training)

    moe = diffperf.load_model("mixtral-8x7b")
    small, a100 = _small(), load_system("a100-sxm-80gb")
    cases = [
        lambda: check_layout(small, Parallel(gx=2, tp=2)),
        lambda: check_layout(small, Parallel(gx=5)),
        lambda: check_layout(small, Parallel(gy=5)),
        lambda: check_layout(small, Parallel(gy=3, gx=2)),
        lambda: check_layout(small, Parallel(gz=2, dp=1, global_batch=3)),
        lambda: check_layout(moe, Parallel(gx=2)),
        lambda: check_layout(moe, Parallel(ep=4, dp=2, global_batch=2)),
        lambda: check_layout(moe, Parallel(ep=16, dp=16, global_batch=16)),
        lambda: check_layout(moe, Parallel(tp=2, etp=3)),
        lambda: check_layout(moe, Parallel(tp=2, etp=1, ep=2, dp=1)),
        lambda: check_layout(small, Parallel(placement=99)),
        lambda: check_layout(small, Parallel(tp=2), 3),
        lambda: check_layout(_small(ffn_hidden=3020), Parallel(tp=8)),
        lambda: check_model(small.replace(n_layers=0.5)),
        lambda: check_model(small.replace(gated_mlp=2.0)),
        lambda: check_model(moe.replace(moe_topk=9.0)),
        lambda: check_model(moe.replace(capacity_factor=-1.0)),
        lambda: check_model(small.replace(hidden=float("nan"))),
        lambda: check_training(training("bf16", grad_bytes=0.0)),
        lambda: check_training(training("bf16", attn_tile=0.5)),
        lambda: check_system(a100.replace(power_W=0.0)),
        lambda: check_job(Parallel(dp=2**21, global_batch=2**21), a100),
        lambda: check_precision(a100, training("fp8-current")),
    ]
    for case in cases:
        with pytest.raises(SpecError) as err:
            case()
        _names_its_field(err.value)


def test_tp_must_divide_ffn_hidden():
    with _raises("parallel: tp=8 must divide model.ffn_hidden=3020"):
        check_layout(_small(ffn_hidden=3020), Parallel(tp=8))


def test_ep_rules_on_an_moe_model():
    moe = diffperf.load_model("mixtral-8x7b")  # 8 routed experts
    with _raises("parallel: ep=4 must divide dp=2 (or set etp=1: the expert group then takes "
                 "the tp x cp x dp ranks)"):
        check_layout(moe, Parallel(ep=4, dp=2, global_batch=2))
    with _raises("parallel: ep=16 must divide model.moe_experts=8"):
        check_layout(moe, Parallel(ep=16, dp=16, global_batch=16))


def test_tp_userbuffers_is_refused_on_an_moe_model():
    moe = diffperf.load_model("mixtral-8x7b")  # 8 routed experts
    with _raises("parallel: tp_userbuffers=1 with model.moe_experts=8: the userbuffers TP "
                 "overlap is modelled for dense models only (allowed: tp_userbuffers 0 for MoE "
                 "models)") as err:
        check_layout(moe, Parallel(tp=2, sequence_parallel=1, tp_userbuffers=1))
    # the model decides it: the field goes on the error (a runs CSV's --set says so)
    assert (err.value.field, err.value.value) == ("tp_userbuffers", 1.0)


def test_unknown_hf_model_type_messages_are_whole():
    """hf._check_type's refusals, quoted whole (the head of each is the file name)."""
    from diffperf.hf import SUPPORTED_TYPES, hf_to_dict

    base = {"num_hidden_layers": 4, "hidden_size": 64, "num_attention_heads": 4,
            "vocab_size": 100}
    with _raises(f"x.json: model_type='llama4_text' (the text_config of a "
                 f"model_type='llama4' config) is not an architecture diffperf reads (allowed: "
                 f"{', '.join(SUPPORTED_TYPES)}): its layers may not be the attention and "
                 f"MLP/MoE layers diffperf models (Mamba or linear-attention layers, an "
                 f"encoder); if they are, write a diffperf model YAML (configs/README.md)"):
        hf_to_dict({"model_type": "llama4", "text_config": base | {"model_type": "llama4_text"}},
                   "x.json")
    with _raises("x.json: the text_config of a model_type='custom_vlm' config names no "
                 f"model_type, so its architecture cannot be told (allowed text_config "
                 f"model_type: {', '.join(SUPPORTED_TYPES)}; assumed only for the wrappers "
                 f"whose transformers class assumes one: llava, llava_next, llava_next_video, "
                 f"vipllava, mistral3, llava_onevision, paligemma, gemma3); write a diffperf "
                 f"model YAML (configs/README.md) for its language model"):
        hf_to_dict({"model_type": "custom_vlm", "text_config": base}, "x.json")
    # review13g: a wrapper whose model_type is no string (a list) raised TypeError
    # ('unhashable type') in the lookup of the type its class assumes, not a SpecError
    with _raises("x.json: the text_config of a model_type=\"['llava']\" config names no "
                 f"model_type, so its architecture cannot be told (allowed text_config "
                 f"model_type: {', '.join(SUPPORTED_TYPES)}; assumed only for the wrappers "
                 f"whose transformers class assumes one: llava, llava_next, llava_next_video, "
                 f"vipllava, mistral3, llava_onevision, paligemma, gemma3); write a diffperf "
                 f"model YAML (configs/README.md) for its language model"):
        hf_to_dict({"model_type": ["llava"], "text_config": base}, "x.json")
    # transformers assumes a type only where the key is absent (`text_config.get("model_type",
    # "llama")`): an empty one reaches CONFIG_MAPPING[""] there and is refused here
    with _raises("x.json: the text_config of a model_type='llava' config names no model_type"):
        hf_to_dict({"model_type": "llava", "text_config": base | {"model_type": ""}}, "x.json")
    with _raises(f"x.json: model_type='bert' is not an architecture diffperf reads (allowed: "
                 f"{', '.join(SUPPORTED_TYPES)}): its layers may not be the attention and "
                 f"MLP/MoE layers diffperf models (Mamba or linear-attention layers, an "
                 f"encoder); if they are, write a diffperf model YAML (configs/README.md)"):
        hf_to_dict(base | {"model_type": "bert"}, "x.json")


def test_global_batch_divisibility_is_exact_at_large_dp():
    # 262143 = 2 x 131072 - 1 sequences cannot be split into micro-batches of 8 over dp = 16384
    # (micro_batch x dp = 131072): m = 1.99999 is not a whole number of micro-batches.
    with _raises("parallel: global_batch=262143 must be a multiple of micro_batch x dp="
                 "8 x 16384"):
        check_layout(_small(), Parallel(dp=16384, micro_batch=8, global_batch=262143))


def test_batched_layout_reports_the_index():
    batch = stack([Parallel(tp=2), Parallel(tp=5)])
    with _raises("parallel[1]: tp=5 must divide model.num_heads=24"):
        check_layout(_small(), batch)


def test_predict_validates_before_tracing():
    m, s = diffperf.load_model("llama3-8b"), diffperf.load_system("h100-sxm-80gb")
    with _raises("parallel: tp=3 must divide model.num_heads=32; allowed tp: 1, 2, 4, 8, 16, 32"):
        diffperf.predict(m, Parallel(tp=3), s)
    with _raises("parallel.recompute='ful' is not allowed; did you mean 'full'? (allowed: none, selective, full)"):
        diffperf.predict(m, Parallel(recompute="ful"), s)
    with _raises("temperature=-1.0 must be >= 0"):
        diffperf.predict(m, Parallel(), s, temperature=-1.0)


# --------------------------------------------------------------------------------------------
# Measured-runs CSV (load.py load_runs)
# --------------------------------------------------------------------------------------------

RUN_COLUMNS = ["id", "system", "num_gpus", "num_layers", "hidden", "num_heads", "vocab",
               "seq_len", "tp", "pp", "dp", "global_batch", "micro_batch", "recompute",
               "precision", "gated_mlp", "status", "step_time_s"]
GOOD_ROW = dict(id="r1", system="h100-sxm-80gb", num_gpus="1", num_layers="2", hidden="256",
                num_heads="4", vocab="1000", seq_len="128", tp="1", pp="1", dp="1",
                global_batch="4", micro_batch="2", recompute="none", precision="bf16",
                gated_mlp="0", status="ok", step_time_s="0.1")


def _write_csv(tmp_path, rows, columns=RUN_COLUMNS):
    p = tmp_path / "runs.csv"
    with p.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=columns, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow(r)
    return p


def test_valid_runs_csv_loads(tmp_path):
    oom = GOOD_ROW | dict(id="r2", status="oom", step_time_s="")
    runs = load_runs(_write_csv(tmp_path, [GOOD_ROW, oom]))
    assert runs.ids == ["r1", "r2"] and len(runs) == 2
    assert list(runs.ran) == [True, False]


def test_runs_missing_column_suggests(tmp_path):
    cols = [c if c != "step_time_s" else "step_s" for c in RUN_COLUMNS]
    row = GOOD_ROW | {"step_s": "0.1"}
    p = _write_csv(tmp_path, [row], cols)
    with _raises(f"{p}: missing column 'step_time_s'; did you mean 'step_s'? "
                 f"(have: {', '.join(cols)})"):
        load_runs(p)


def test_runs_no_rows(tmp_path):
    p = _write_csv(tmp_path, [])
    with _raises(f"{p}: no runs (the CSV has a header but no rows)"):
        load_runs(p)


def test_runs_duplicate_id(tmp_path):
    p = _write_csv(tmp_path, [GOOD_ROW, GOOD_ROW | dict(step_time_s="0.2")])
    with _raises(f"{p}: row 3 (id r1): duplicate id 'r1'"):
        load_runs(p)


def test_runs_blank_id(tmp_path):
    p = _write_csv(tmp_path, [GOOD_ROW | dict(id=" ")])
    with _raises(f"{p}: row 2 (id ?): blank 'id'"):
        load_runs(p)


@pytest.mark.parametrize("column", ["hidden", "tp", "num_gpus", "micro_batch"])
def test_runs_blank_cell(tmp_path, column):
    p = _write_csv(tmp_path, [GOOD_ROW | {column: ""}])
    with _raises(f"{p}: row 2 (id r1): blank cell in column '{column}'"):
        load_runs(p)


def test_runs_blank_step_time_when_ran(tmp_path):
    p = _write_csv(tmp_path, [GOOD_ROW | dict(step_time_s="")])
    with _raises(f"{p}: row 2 (id r1): blank cell in column 'step_time_s' (status ok)"):
        load_runs(p)


def test_runs_non_positive_step_time(tmp_path):
    p = _write_csv(tmp_path, [GOOD_ROW | dict(step_time_s="-1")])
    with _raises(f"{p}: row 2 (id r1).step_time_s=-1 must be > 0"):
        load_runs(p)


def test_runs_bad_status(tmp_path):
    p = _write_csv(tmp_path, [GOOD_ROW | dict(status="crashed")])
    with _raises(f"{p}: row 2 (id r1).status='crashed' is not allowed (allowed: ok, oom)"):
        load_runs(p)


def test_runs_bad_recompute_name_suggests(tmp_path):
    p = _write_csv(tmp_path, [GOOD_ROW | dict(recompute="ful")])
    with _raises(f"{p}: row 2 (id r1).recompute='ful' is not allowed; did you mean 'full'? "
                 "(allowed: none, selective, full)"):
        load_runs(p)


def test_runs_not_a_number(tmp_path):
    p = _write_csv(tmp_path, [GOOD_ROW | dict(tp="two")])
    with _raises(f"{p}: row 2 (id r1).tp='two' must be a number"):
        load_runs(p)


def test_runs_layout_must_match_num_gpus(tmp_path):
    p = _write_csv(tmp_path, [GOOD_ROW | dict(num_gpus="8", dp="2")])
    with _raises(f"{p}: row 2 (id r1): tp x cp x dp x pp = 2 must equal num_gpus=8"):
        load_runs(p)


def test_runs_global_batch_divisibility(tmp_path):
    p = _write_csv(tmp_path, [GOOD_ROW | dict(global_batch="5")])
    with _raises(f"{p}: row 2 (id r1): global_batch=5 must be a multiple of micro_batch x "
                 "dp=2 x 1"):
        load_runs(p)


def test_runs_tp_must_divide_heads(tmp_path):
    p = _write_csv(tmp_path, [GOOD_ROW | dict(tp="3", num_gpus="3")])
    with _raises(f"{p}: row 2 (id r1): tp=3 must divide model.num_heads=4; allowed tp: 1, 2, 4"):
        load_runs(p)


def test_runs_unknown_precision_names_the_row(tmp_path):
    # STYLE.md section 5: the message says where the value came from (file, row), as every
    # other cell error of the runs CSV does.
    p = _write_csv(tmp_path, [GOOD_ROW | dict(precision="bf61")])
    with _raises(f"{p}: row 2 (id r1)"):
        load_runs(p)
    with _raises("precision='bf61' is not allowed; did you mean 'bf16'?"):
        load_runs(p)


@pytest.mark.parametrize("value", ["2", "maybe"])
def test_runs_gated_mlp_must_be_0_or_1(tmp_path, value):
    # Schema (data/README.md): gated_mlp is 0/1. Any other cell must be refused, not
    # silently read as 0 (STYLE.md section 5: never silently fix a user's value).
    p = _write_csv(tmp_path, [GOOD_ROW | dict(gated_mlp=value)])
    with _raises(f"gated_mlp={value!r}"):
        load_runs(p)


def test_runs_file_missing(tmp_path):
    p = tmp_path / "none.csv"
    with _raises(f"{p}: cannot read (No such file or directory)"):
        load_runs(p)


# ============================================================================================
# Error audit (issue 8): one test per message that no test above triggers; the whole message
# is quoted, so tests/test_error_audit.py can check that every message in diffperf/ has one.
# ============================================================================================

# --------------------------------------------------------------------------------------------
# Audit: numbers, text encodings and nesting in the YAML, JSON and CSV loaders
# --------------------------------------------------------------------------------------------

def test_model_size_out_of_range(tmp_path):
    p = _write_yaml(tmp_path, _model_dict(num_layers=3_000_000_000), "m.yaml")
    with _raises(f"{p}.num_layers=3e+09 is out of range (at most 2.14748e+09)"):
        load_model(p)


def test_number_too_large_for_a_float(tmp_path):
    p = _write_yaml(tmp_path, _model_dict(num_layers=10**400), "m.yaml")
    with _raises(f"{p}.num_layers is too large (at most 1e+18)"):
        load_model(p)


def test_non_ascii_digits_are_not_a_number(tmp_path):
    p = _write_yaml(tmp_path, _system_dict() | {"matmul_TFLOPs": "\uff13\uff11\uff12"})
    with _raises(f"{p}.matmul_TFLOPs='\uff13\uff11\uff12' must be a number"):
        load_system(p)


def test_positive_value_below_float32_resolution(tmp_path):
    p = _write_yaml(tmp_path, _system_dict() | {"hbm_bandwidth_GBps": 1e-13})
    with _raises(f"{p}.hbm_bandwidth_GBps=1e-13 must be > 0 and at least 1e-12"):
        load_system(p)


@pytest.mark.parametrize("key,value,rule", [
    ("mm_exponent", 25, "=25.0 must be in (0, 20]"),
    ("floor_pnorm", 0.5, "=0.5 must be in [1, 100] (a p-norm)"),
    ("mm_align_exponent", 9e15, "=9e+15 must be in [0, 20] (GEMM efficiency x (alignment / "
                                "16 B)^mm_align_exponent; 0: alignment costs nothing)"),
])
def test_system_efficiency_exponent_and_pnorm_ranges(tmp_path, key, value, rule):
    p = _write_yaml(tmp_path, _system_dict() | {"efficiency": {key: value}})
    with _raises(f"{p}.efficiency.{key}{rule}"):
        load_system(p)


def test_yaml_not_utf8(tmp_path):
    p = tmp_path / "m.yaml"
    p.write_bytes(b"name: \xff\xfe\n")
    with _raises(f"{p}: not a UTF-8 text file"):
        load_model(p)


def test_yaml_nested_too_deeply(tmp_path):
    import sys

    depth = sys.getrecursionlimit() // 2 + 100  # >= 2 parser frames per level: always too deep
    p = tmp_path / "deep.yaml"
    p.write_text("num_layers: " + "[" * depth + "]" * depth + "\n")
    with _raises(f"{p}: malformed YAML: nested too deeply"):
        load_model(p)


def test_yaml_duplicate_key(tmp_path):
    p = tmp_path / "m.yaml"
    p.write_text("num_layers: 4\nnum_layers: 8\n")
    with _raises(f"{p}: malformed YAML: duplicate key 'num_layers'"):
        load_model(p)


def test_hf_malformed_json_names_the_line(tmp_path):
    p = tmp_path / "config.json"
    p.write_text('{"hidden_size": 4096,\n')
    with _raises(f"{p}: malformed JSON: Expecting property name enclosed in double quotes "
                 "at line 2"):
        load_model(p)


def test_hf_json_nested_too_deeply(tmp_path):
    p = tmp_path / "config.json"
    p.write_text("[" * 100_000 + "]" * 100_000)
    with _raises(f"{p}: malformed JSON: nested too deeply"):
        load_model(p)


def test_unknown_names_list_the_shipped_configs():
    from diffperf.load import model_names, system_names

    with _raises(f"unknown model 'gpt3-175'; did you mean 'gpt3-175b'? (shipped: "
                 f"{', '.join(model_names())}; or give a path to a .yaml file or a Hugging "
                 f"Face config.json (or its folder))"):
        load_model("gpt3-175")
    with _raises(f"unknown system 'h100-sxm'; did you mean 'h100-sxm-80gb'? (shipped: "
                 f"{', '.join(system_names())}; or give a path to a .yaml file)"):
        load_system("h100-sxm")


def test_hf_snapshot_folder_reads_its_config_json(tmp_path, monkeypatch):
    """transformers' from_pretrained takes the model's folder; `--model FOLDER` was looked up
    as a shipped name ("unknown model 'FOLDER' ... give a path to a .yaml file")."""
    from diffperf.load import default_global_batch, model_notes

    folder = tmp_path / "snapshot"
    folder.mkdir()
    _write_json(folder, LLAMA3_8B_HF)
    m = load_model(str(folder))
    assert float(m.n_layers) == 32 and float(m.ffn_hidden) == 14336
    assert (model_notes(str(folder))[0]
            == f"read {folder / 'config.json'} (the folder's config.json)")
    assert default_global_batch(str(folder))[0] == 1024  # 2^22 / 4096
    with _raises(f"{tmp_path}: a folder without config.json (allowed: a shipped model name, a "
                 "model .yaml, a Hugging Face config.json or the folder holding it)"):
        load_model(str(tmp_path))
    with _raises(f"{tmp_path / 'none'}/: no such file or folder (allowed: a shipped model "
                 "name, a model .yaml, a Hugging Face config.json or the folder holding it)"):
        load_model(f"{tmp_path / 'none'}/")
    # a shipped name stays the shipped model beside a folder of that name (a snapshot
    # downloaded as ./llama3-8b replaced it, in a shipped dataset's rows too); ./NAME is the
    # folder
    (tmp_path / "llama3-8b").mkdir()
    _write_json(tmp_path / "llama3-8b", LLAMA3_8B_HF | {"num_hidden_layers": 4})
    monkeypatch.chdir(tmp_path)
    assert float(load_model("llama3-8b").n_layers) == 32
    assert float(load_model("./llama3-8b").n_layers) == 4
    # a file that exists under another suffix was said to be "no such file or folder"
    (tmp_path / "config").write_text((folder / "config.json").read_text())
    with _raises(f"{tmp_path / 'config'}: the file's name has no suffix (a model file is read "
                 "by its suffix: .yaml or .yml a model YAML, .json a Hugging Face config.json; "
                 "allowed: a shipped model name, a model .yaml, a Hugging Face config.json or "
                 "the folder holding it)"):
        load_model(str(tmp_path / "config"))
    with _raises(f"{tmp_path / 'm.txt'}: the file's suffix is '.txt' (a model file is read "):
        (tmp_path / "m.txt").write_text("num_layers: 2\n")
        load_model(str(tmp_path / "m.txt"))


@pytest.mark.parametrize("load,given,message", [
    ("system", "configs/models/llama3-8b.yaml",
     "a model file (it has num_layers, num_heads), not a system file: give it to --model"),
    ("model", "configs/systems/h100-sxm-80gb.yaml",
     "a system file (it has tiers, matmul_TFLOPs), not a model file: give it to --system"),
    ("system", "calibration/fitted/torch-h100.yaml",
     "a calibration overlay file (it has fitted_on, created_by, heldout), not a system file: "
     "give it to --calibration"),
    ("calibration", "configs/systems/h100-sxm-80gb.yaml",
     "a system file (it has tiers, matmul_TFLOPs), not a calibration overlay file: give it "
     "to --system"),
    ("system", "tests/data/hf/qwen3-8b.json",
     "a Hugging Face model config file (it has num_hidden_layers, num_attention_heads), not a "
     "system file: give it to --model"),
])
def test_a_file_of_another_kind_is_named_as_such(load, given, message):
    """A model, system or overlay file given where another kind goes was refused as
    "unknown key 'num_layers' (allowed: <the other kind's keys>)"."""
    from pathlib import Path

    path = str(Path(__file__).resolve().parents[1] / given)
    with _raises(f"{path}: {message}"):
        if load == "calibration":
            load_system("h100-sxm-80gb", calibration=path)
        else:
            (load_system if load == "system" else load_model)(path)


def test_a_hugging_face_config_in_a_yaml_file_says_how_it_is_read(tmp_path):
    """A config.json's fields in a .yaml given to --model were refused as "a Hugging Face
    model config file ..., not a model file: give it to --model" (the option used)."""
    p = tmp_path / "hf.yaml"
    p.write_text(json.dumps(LLAMA3_8B_HF))
    with _raises(f"{p}: Hugging Face config.json fields (it has num_hidden_layers, "
                 "num_attention_heads), not diffperf model keys: a Hugging Face config is read "
                 "from a .json file or the folder holding config.json (allowed: that, or the "
                 "model keys of configs/README.md)"):
        load_model(str(p))
    # the other way round: diffperf model keys, or a system, in a .json given to --model
    # ("not a recognised Hugging Face config.json ... missing num_hidden_layers, ...")
    p = tmp_path / "model.json"
    p.write_text(json.dumps({"num_layers": 2, "hidden": 256, "num_heads": 4, "vocab": 1000,
                             "seq_len": 128}))
    with _raises(f"{p}: diffperf model keys (it has num_layers, num_heads) in a .json file, "
                 "which is read as a Hugging Face config.json (allowed: the model keys in a "
                 ".yaml or .yml file, JSON being YAML too, or a Hugging Face config.json)"):
        load_model(str(p))
    p.write_text(json.dumps(_system_dict()))
    with _raises(f"{p}: a system file (it has tiers, matmul_TFLOPs), not a Hugging Face model "
                 "config file: give it to --system"):
        load_model(str(p))


def test_runs_not_utf8(tmp_path):
    p = tmp_path / "runs.csv"
    p.write_bytes(",".join(RUN_COLUMNS).encode() + b"\n\xff\xfe\n")
    with _raises(f"{p}: not a UTF-8 text file"):
        load_runs(p)


def test_runs_malformed_csv(tmp_path):
    limit = csv.field_size_limit()
    p = tmp_path / "runs.csv"
    p.write_text("id,notes\nr1," + "x" * (limit + 1) + "\n")
    with _raises(f"{p}: malformed CSV (field larger than field limit ({limit}))"):
        load_runs(p)


def test_runs_duplicate_column_is_refused(tmp_path):
    """csv.DictReader keeps the last of two same-named columns: a sheet with two `tp`
    columns was read from the second without a word."""
    p = tmp_path / "runs.csv"
    p.write_text(",".join(RUN_COLUMNS + ["tp"]) + "\n"
                 + ",".join(GOOD_ROW[c] for c in RUN_COLUMNS) + ",1\n")
    with _raises(f"{p}: column 'tp' appears 2 times in the header (allowed: each column "
                 "once)"):
        load_runs(p)


@pytest.mark.parametrize("cells,message", [
    # an unquoted comma in a cell shifts the rest of the row right
    (lambda r: r + ["pytorch 2.4, cuda 12"], "row 2 has 20 cells, the header 18 (2 cell(s) "
     "past the last column: an unquoted comma inside a cell? quote it)"),
    (lambda r: r[:-2], "row 2 has 16 cells, the header 18 (no cell for status, step_time_s: "
     "write an empty cell as ,,)"),
])
def test_runs_ragged_row_is_refused(tmp_path, cells, message):
    p = tmp_path / "runs.csv"
    p.write_text(",".join(RUN_COLUMNS) + "\n"
                 + ",".join(cells([GOOD_ROW[c] for c in RUN_COLUMNS])) + "\n")
    with _raises(f"{p}: {message}"):
        load_runs(p)


def test_runs_trailing_empty_columns_are_read(tmp_path):
    """A spreadsheet export writes a sheet's formatted but empty columns as trailing commas
    on every line (`...,step_time_s,,` / `...,0.1,,`): the two unnamed columns were refused
    as "column '' appears 2 times in the header" (session 14's duplicate-column rule). Blank
    unnamed columns hold nothing and are dropped; a CRLF file with a BOM and a blank last
    line reads the same."""
    line = ",".join(GOOD_ROW[c] for c in RUN_COLUMNS)
    p = tmp_path / "runs.csv"
    p.write_bytes(("\ufeff" + ",".join(RUN_COLUMNS) + ",,\r\n" + line + ",,\r\n"
                   + line.replace("r1", "r2", 1) + ",,\r\n\r\n").encode())
    runs = load_runs(p)
    assert runs.ids == ["r1", "r2"] and float(runs.step_time_s[1]) == pytest.approx(0.1)
    # trailing commas on the rows only: refused (an unquoted comma in the last-but-one cell
    # leaves the same empty spill), the message names both causes
    p.write_text(",".join(RUN_COLUMNS) + "\n" + line + ",\n")
    with _raises(f"{p}: row 2 has 19 cells, the header 18 (1 empty cell(s) past the last "
                 "column: trailing commas, or an unquoted comma inside a cell? quote it)"):
        load_runs(p)


def test_runs_csv_errors_name_the_row_a_spreadsheet_shows(tmp_path):
    """A runs CSV error names the row as a spreadsheet numbers it (header row 1, a blank line
    a row), and the file's line too where a quoted line break inside a cell makes them
    differ: for a bad value, a layout rule, a duplicate id (with its first row), a ragged
    row and a kernel table's cell. Was: "row N" counted the records (blank lines skipped,
    a two-line cell one), so after a blank line it named the wrong row."""
    row = lambda **o: ",".join((GOOD_ROW | o)[c] for c in RUN_COLUMNS)  # noqa: E731
    head = ",".join(RUN_COLUMNS) + ",notes\n"
    bad = row(id="r2", step_time_s="-1") + ",x\n"
    p = tmp_path / "runs.csv"
    p.write_text(head + row() + ",x\n\n\n" + bad)
    with _raises(f"{p}: row 5 (id r2).step_time_s=-1 must be > 0"):
        load_runs(p)
    p.write_text(head + row() + ',"two\nlines"\n' + bad)
    with _raises(f"{p}: row 3 (id r2; line 4 of the file).step_time_s=-1 must be > 0"):
        load_runs(p)
    p.write_text(head + row() + ",x\n\n" + row() + ",x\n")
    with _raises(f"{p}: row 4 (id r1): duplicate id 'r1' (first at row 2; allowed: each id "
                 "once)"):
        load_runs(p)
    p.write_text(head + row() + ",x\n\n" + row(id="r2") + "\n")
    with _raises(f"{p}: row 4 has 18 cells, the header 19 (no cell for notes"):
        load_runs(p)
    p.write_text(head + row() + ",x\n\n" + row(id="r2", tp="3") + ",x\n")
    with _raises(f"{p}: row 4 (id r2): tp=3 must divide model.num_heads=4"):
        load_runs(p)
    from diffperf.load import load_table
    p.write_text("m,n\n1,2\n\n3,x\n")
    with _raises(f"{p}: row 4.n='x' must be a number"):
        load_table(p, ("m", "n"))


def test_runs_command_set_hint_only_where_the_row_decides(tmp_path):
    """A runs CSV row refused for the command's --set value says the --set applies to every
    row only where the row decides (a layout rule: tp=3 against the row's heads), not for a
    value wrong on any row (a range rule, SpecError.anywhere)."""
    p = _write_csv(tmp_path, [GOOD_ROW])
    with _raises(f"{p}: row 2 (id r1): tp_overlap=2 must be in [0, 1]") as err:
        load_runs(p, overrides=["tp_overlap=2"])
    assert str(err.value).endswith("in [0, 1]") and err.value.anywhere
    with _raises(f"{p}: row 2 (id r1): tp=3 must divide model.num_heads=4; allowed tp: 1, 2, "
                 "4 (the command's --set tp=3 applies to every row; give a fact that holds "
                 "for some rows only in their 'set' cell)") as err:
        load_runs(p, overrides=["tp=3"])
    assert (err.value.field, err.value.value) == ("tp", 3.0)


def test_typed_files_refuse_quoted_numbers_and_read_yaml_1_2_exponents(tmp_path):
    """Session 15 (fuzz): a system YAML's quoted number (`matmul_TFLOPs: '312'`, a tier's
    `bandwidth_GBps: '300'`, an overlay's efficiency) was read silently, as the model's were;
    refused like them. PyYAML (YAML 1.1) read an unquoted `1e3` or `1.5e3` as a string, which
    the check would have refused as quoted: the loader reads YAML 1.2's exponent floats as
    numbers, a quoted one stays a string."""
    with _raises(".matmul_TFLOPs='312' is a string (type str), not a number; allowed: a "
                 "number, written without quotes") as err:
        load_system(_write_yaml(tmp_path, _system_dict() | {"matmul_TFLOPs": "312"}))
    assert (err.value.field, err.value.value) == ("matmul_TFLOPs", "312")
    d = _system_dict()
    d["tiers"][0]["bandwidth_GBps"] = "300"
    with _raises(".tiers[0].bandwidth_GBps='300' is a string (type str), not a number"):
        load_system(_write_yaml(tmp_path, d))
    with _raises(".fp8_non_tn_gemm='1' is a string (type str), not true / false"):
        load_system(_write_yaml(tmp_path, _system_dict() | {"fp8_non_tn_gemm": "1"}))
    with _raises(".efficiency.mm_max='0.8' is a string (type str), not a number"):
        load_system(_write_yaml(tmp_path, _system_dict() | {"efficiency": {"mm_max": "0.8"}}))
    from diffperf.design import cost_model_from_dict
    with _raises("cost.tiers[0].bandwidth_per_GBps='2' is a string (type str), not a number"):
        cost_model_from_dict({"unit": "USD", "base": 1, "tiers": [{"bandwidth_per_GBps": "2"}]})
    p = tmp_path / "m.yaml"
    p.write_text("name: m\nnum_layers: 4\nhidden: 2.56e2\nnum_heads: 4\nvocab: 1e3\n"
                 "seq_len: 128\n")
    m = load_model(p)
    assert (float(m.hidden), float(m.vocab)) == (256.0, 1000.0)
    p.write_text("name: m\nnum_layers: 4\nhidden: 256\nnum_heads: 4\nvocab: '1e3'\n"
                 "seq_len: 128\n")
    with _raises(f"{p}.vocab='1e3' is a string (type str), not a number"):
        load_model(p)


def test_yaml_diffperf_writes_reads_back_as_written(tmp_path):
    """Review of session 15: the loader reads an unquoted `1e3` as a number, but PyYAML's own
    dumper (YAML 1.1) writes the string '1e3' unquoted, so an overlay diffperf wrote could read
    back changed ('2716e35', a short commit hash, as 2.716e38; '1e400' as inf). `dump_yaml`
    quotes such strings; numbers stay numbers."""
    from diffperf.load import dump_yaml, read_yaml, write_overlay

    data = {"ids": ["1e3", "2716e35", "1e400", "-2E-5", ".5e3", "e3", "1e3x"],
            "numbers": [1e-5, 1e20, 3.0, 7], "name": "x"}
    assert 'ids:\n- \'1e3\'\n- \'2716e35\'\n- \'1e400\'' in dump_yaml(data)
    p = tmp_path / "d.yaml"
    p.write_text(dump_yaml(data))
    assert read_yaml(p) == data
    p.write_text(yaml.safe_dump(data))  # what was written before: read back changed
    assert read_yaml(p)["ids"][:2] == [1000.0, 2.716e38]
    q = tmp_path / "o.yaml"
    write_overlay(q, {"mm_max": 0.5}, fitted_on={"runs": "1e3", "set": []})
    assert read_yaml(q)["fitted_on"]["runs"] == "1e3"


def test_names_and_files_of_the_wrong_kind_say_so(tmp_path, capsys):
    """Session 15 (fuzz): an empty --model / --system (was: ".: a folder without
    config.json", "unknown system ''"), a folder or a CSV given to --system (was: "unknown
    system '<path>'"), a YAML given as a runs CSV (was: "missing column 'id' (have: # <its
    first line>)")."""
    assert _cli_error(capsys, "predict", "--model", "") == (
        "model name '' is empty (allowed: a shipped model name, a model .yaml, a Hugging Face "
        "config.json or the folder holding it)")
    assert _cli_error(capsys, "predict", "--system", " ").startswith(
        "system name ' ' is empty (allowed: a shipped system name (a100-4nic, ")
    assert _cli_error(capsys, "predict", "--system", tmp_path).startswith(
        f"{tmp_path}: a folder, not a system file (allowed: a shipped system name (")
    csv_path = _write_csv(tmp_path, [GOOD_ROW])
    assert _cli_error(capsys, "predict", "--system", csv_path).startswith(
        f"{csv_path}: a file whose suffix is '.csv', not a system file (allowed: ")
    y = _write_yaml(tmp_path, _model_dict(), "m.yaml")
    assert _cli_error(capsys, "validate", y) == (
        f"{y}: a YAML file, not a CSV table (allowed: a .csv file with the columns id, "
        f"num_gpus, num_layers, hidden, num_heads, vocab, seq_len, tp, pp, dp, global_batch, "
        f"micro_batch, step_time_s, or a shipped dataset name)")


def test_sweep_grids_are_bounded():
    """Session 15 (fuzz): `search --sweep matmul_TFLOPs=100:200:1000000000` built a 1e9-value
    grid and a System per value: killed for memory (exit 137). At most MAX_SWEEP_VALUES values
    per field and MAX_SWEEP_POINTS hardware points; `design --grid` alike."""
    from diffperf.load import MAX_SWEEP_POINTS, MAX_SWEEP_VALUES, sweep_axes

    system = load_system("a100-sxm-80gb")
    with _raises(f"--grid matmul_TFLOPs=100:200:1000000000: N=1,000,000,000 values (allowed: "
                 f"1 to {MAX_SWEEP_VALUES:,} per field)"):
        sweep_axes(system, ["matmul_TFLOPs=100:200:1000000000"], flag="--grid")
    with _raises(f"--sweep matmul_TFLOPs lists {MAX_SWEEP_VALUES + 1:,} values (allowed: at "
                 f"most {MAX_SWEEP_VALUES:,} per field)"):
        sweep_axes(system, ["matmul_TFLOPs=" + ",".join(["1"] * (MAX_SWEEP_VALUES + 1))])
    assert MAX_SWEEP_POINTS < 2000 * 1000
    with _raises("--sweep: 2000 x 1000 = 2,000,000 hardware points (allowed: at most "
                 f"{MAX_SWEEP_POINTS:,}, each predicted against every layout)"):
        sweep_axes(system, ["matmul_TFLOPs=100:200:2000", "hbm_bandwidth_GBps=1000:2000:1000"])
    # the point count is refused before a System is built per value (10,000 a field): a value
    # no system file allows is not reached
    with _raises("--sweep: 2000 x 1000 = 2,000,000 hardware points"):
        sweep_axes(system, ["matmul_TFLOPs=-200:-100:2000", "hbm_bandwidth_GBps=1000:2000:1000"])
    with _raises("--sweep.matmul_TFLOPs=-200 must be > 0"):
        sweep_axes(system, ["matmul_TFLOPs=-200:-100:2000"])


def test_calibrate_without_held_out_rows_says_so_not_nan(capsys, tmp_path):
    """Session 15 (fuzz): `calibrate` on a CSV too small for its --holdout-frac (2 rows at
    0.2) printed 'nan' as the held-out MAPE and coverage, and `--json` refused to print
    after the fit; now '-' / null with a note. A split that holds out every row, and a
    negative --seed (numpy's ValueError, a traceback), are refused before fitting. No fit
    runs here (the pure helpers and the refusals)."""
    from types import SimpleNamespace

    from diffperf.cli.calibrate_cmd import _splits, _undefined_to_none

    report = dict(fitted=dict(n=2, mape_pct=5.0, median_pct=5.0, max_pct=6.0),
                  heldout=dict(n=0, mape_pct=float("nan"), median_pct=float("nan"),
                               max_pct=float("nan")),
                  heldout_interval_coverage=float("nan"), folds=1)
    assert _undefined_to_none(report) == ["heldout"]
    assert report["heldout"] == dict(n=0, mape_pct=None, median_pct=None, max_pct=None)
    assert report["heldout_interval_coverage"] is None and report["fitted"]["mape_pct"] == 5.0
    cand = np.ones(2, bool)
    args = SimpleNamespace(holdout_frac=0.99, seed=0, folds=0)
    with _raises("--holdout-frac=0.99 held out all 2 fittable rows (--seed 0): none left to "
                 "fit; allowed: a smaller --holdout-frac, another --seed or more rows"):
        list(_splits(cand, args))
    fit, held = next(_splits(cand, SimpleNamespace(holdout_frac=0.2, seed=0, folds=0)))
    assert fit.all() and not held.any()  # the case the note is for
    # interval coverage over the held-out runs with a measured step time only: an OOM row
    # (NaN) is neither covered nor uncovered (it counted as uncovered: 17 of 19 printed 89.5 %
    # where 17 of 17 ran), and nothing held out is undefined (it printed 0.0 %)
    from diffperf.cli.calibrate_cmd import _coverage

    measured = np.array([1.0, 2.0, np.nan, 4.0])
    covered = np.array([True, False, False, True])
    held_pred = np.array([1.1, 2.5, 3.0, np.nan])  # row 3 fitted, not held out
    assert _coverage(covered, measured, held_pred) == 0.5
    assert np.isnan(_coverage(covered, measured, np.full(4, np.nan)))
    p = _write_csv(tmp_path, [GOOD_ROW])
    assert _cli_error(capsys, "calibrate", p, "--seed", "-1") == (
        "--seed=-1 must be a whole number >= 0")


def test_runs_empty_file_says_so(tmp_path):
    p = tmp_path / "runs.csv"
    p.write_text("")
    with _raises(f"{p}: empty file (no header row; needs the columns id, num_gpus, "
                 "num_layers, hidden, num_heads, vocab, seq_len, tp, pp, dp, global_batch, "
                 "micro_batch, step_time_s)"):
        load_runs(p)


def test_runs_semicolon_separated_file_says_so(tmp_path):
    p = tmp_path / "runs.csv"
    p.write_text(";".join(RUN_COLUMNS) + "\n" + ";".join(GOOD_ROW[c] for c in RUN_COLUMNS)
                 + "\n")
    with _raises(f"{p}: missing column 'id' (have: {';'.join(RUN_COLUMNS)}; the header is one "
                 "cell holding ';': diffperf reads comma-separated files)"):
        load_runs(p)


def test_runs_model_config_path_is_found_beside_the_csv(tmp_path, monkeypatch):
    """A row's model_config naming a config.json beside the CSV ('configs/llama.json') was
    looked up from the working folder only: `validate path/to/runs.csv` run from elsewhere
    said 'no such file'. Now the CSV's folder is tried when the working folder has none."""
    (tmp_path / "data" / "configs").mkdir(parents=True)
    _write_json(tmp_path / "data" / "configs", LLAMA3_8B_HF, "llama.json")
    row = GOOD_ROW | dict(model_config="configs/llama.json", num_layers="32", hidden="4096",
                          num_heads="32", vocab="128256")
    p = _write_csv(tmp_path / "data", [row], RUN_COLUMNS + ["model_config"])
    monkeypatch.chdir(tmp_path)
    runs = load_runs(p)
    assert float(runs.models[0].ffn_hidden) == 14336 and float(runs.models[0].seq_len) == 128


def test_runs_gated_mlp_message_names_the_allowed_values(tmp_path):
    p = _write_csv(tmp_path, [GOOD_ROW | dict(gated_mlp="2")])
    with _raises(f"{p}: row 2 (id r1).gated_mlp='2' is not allowed (allowed: 0, 1)"):
        load_runs(p)


def test_runs_near_miss_column_suggests(tmp_path):
    p = _write_csv(tmp_path, [GOOD_ROW | dict(sequence_paralel="1")],
                   RUN_COLUMNS + ["sequence_paralel"])
    with _raises(f"{p}: unknown column 'sequence_paralel'; did you mean 'sequence_parallel'? "
                 "(extra columns are allowed only when they are not near-misses of a known "
                 "column)"):
        load_runs(p)


def test_runs_oom_with_a_step_time(tmp_path):
    p = _write_csv(tmp_path, [GOOD_ROW | dict(status="oom")])
    with _raises(f"{p}: row 2 (id r1).step_time_s='0.1': a run with status oom has no step "
                 "time; leave the cell blank"):
        load_runs(p)


def test_runs_set_overrides(tmp_path):
    p = _write_csv(tmp_path, [GOOD_ROW])
    with _raises("--set 'dp_overlap' must look like FIELD=VALUE"):
        load_runs(p, overrides=["dp_overlap"])
    with _raises("--set: unknown field 'dp_overlp'; did you mean 'dp_overlap'? (allowed: tp, "):
        load_runs(p, overrides=["dp_overlp=0"])


def test_kernel_table_without_rows(tmp_path):
    from diffperf.load import load_table

    p = tmp_path / "gemm.csv"
    p.write_text("m,n,k,time_s\n")
    with _raises(f"{p}: no rows (the CSV has a header but no rows)"):
        load_table(p, ("m", "n", "k", "time_s"))


# --------------------------------------------------------------------------------------------
# Audit: layout rules of the AxoNN grid, placement, and the library entry points
# --------------------------------------------------------------------------------------------

AXONN_RULES = [
    (dict(gx=2, tp=2, dp=1), "tp=2 must be 1 with the AxoNN grid gx x gy x gz=2 x 1 x 1 "
                             "(allowed tp: 1)"),
    (dict(gy=5), "gy=5 must divide model.num_heads=24; allowed gy: 1, 2, 3, 4, 6, 8, 12, 24"),
    (dict(gy=3), "gy=3 and model.num_kv_heads=8: one must divide the other"),
    (dict(gz=5), "gz=5 must divide the attention output weight shard (n_out k_in)/(gx gy)="
                 "589824 elements"),
    (dict(gz=2, global_batch=3), "global_batch=3 must be a multiple of micro_batch x dp x gz="
                                 "1 x 1 x 2"),
]


@pytest.mark.parametrize("fields,message", AXONN_RULES,
                         ids=[m.split(" ")[0] for _, m in AXONN_RULES])
def test_axonn_grid_rules(fields, message):
    with _raises(f"parallel: {message}"):
        check_layout(_small(), Parallel(**fields))


def test_axonn_grid_needs_a_dense_model():
    moe = diffperf.load_model("mixtral-8x7b")
    with _raises("parallel: the AxoNN grid gx x gy x gz=2 x 1 x 1 needs a dense model, got "
                 "model.moe_experts=8; allowed: gx = gy = gz = 1 for MoE models"):
        check_layout(moe, Parallel(gx=2))


def test_no_axonn_grid_fits():
    from diffperf.search.axonn import axonn_grids

    # 7 devices: 7 divides neither hidden=768, num_heads=24, the weight shards nor the batch.
    with _raises("no AxoNN grid of n_gpus=7 shards model 'm' evenly with global_batch=1, "
                 "micro_batch=1"):
        axonn_grids(_small(name="m"), 7, 1)


def test_predict_temperature_message_is_whole():
    m, s = diffperf.load_model("llama3-8b"), diffperf.load_system("h100-sxm-80gb")
    with _raises("temperature=-1.0 must be >= 0 (or None for the exact model)"):
        diffperf.predict(m, Parallel(), s, temperature=-1.0)


def test_sensitivity_inputs_are_checked_before_tracing():
    from diffperf.search import COLUMNS
    from diffperf.sensitivity import (elasticities_at_optimum, scale_leaf,
                                      step_time_and_elasticities)

    s = diffperf.load_system("h100-sxm-80gb")
    with _raises("temperature=-1 must be >= 0 (or None for the exact model)"):
        step_time_and_elasticities(_small(), Parallel(), s, None, -1)
    with _raises("temperature=0 must be > 0 for the soft-min over layouts"):
        elasticities_at_optimum(_small(), s, None, [[1] * len(COLUMNS)], 0)
    with _raises("unknown System leaf 'hbm_bandwith_Bps'; did you mean 'hbm_bandwidth_Bps'? "
                 "(allowed: matmul_flops_per_s, "):
        scale_leaf(s, "hbm_bandwith_Bps", 1.1)
    with _raises("unknown System leaf 'zz' (allowed: matmul_flops_per_s, "):
        scale_leaf(s, "zz", 1.1)
    with _raises("System leaf 'fp8_non_tn_gemm' is a switch (allowed: 0 or 1), not a parameter "
                 "to scale (x 1.1): compare predictions at 0 and 1"):
        scale_leaf(s, "fp8_non_tn_gemm", 1.1)


def test_switches_are_every_system_flag():
    """specs.system.SWITCHES (the leaves sensitivity gives no elasticity) holds every System
    key the loader reads as a flag: each key of a system YAML, of a tier, of the efficiency
    and reliability mappings at 0.5; the ones refused with "must be true or false" are the
    switches."""
    from diffperf.load import (RELIABILITY_UNITS, SYSTEM_UNITS, TIER_UNITS, EFFICIENCY_KEYS,
                               system_from_dict)
    from diffperf.specs.system import SWITCHES

    flags = set()
    cases = [(dict(_system_dict(), **{k: 0.5}), leaf) for k, (leaf, _) in SYSTEM_UNITS.items()]
    for k, (leaf, _) in TIER_UNITS.items():
        d = _system_dict()
        d["tiers"] = [dict(d["tiers"][0], **{k: 0.5}), d["tiers"][1]]
        cases.append((d, f"tiers[0].{leaf}"))
    cases += [(dict(_system_dict(), efficiency={k: 0.5}), f"eff.{k}") for k in EFFICIENCY_KEYS]
    cases += [(dict(_system_dict(), reliability={k: 0.5}), f"reliability.{leaf}")
              for k, (leaf, _) in RELIABILITY_UNITS.items()]
    for d, leaf in cases:
        try:
            system_from_dict(d, "s")
        except SpecError as e:
            if "must be true or false" in str(e):
                flags.add(leaf)
    assert flags == set(SWITCHES) == {"fp8_non_tn_gemm"}


def test_search_inputs_are_checked_before_tracing():
    import numpy as np

    from diffperf.search import COLUMNS, enumerate_layouts, search, soft_best

    m, s = _small(), diffperf.load_system("h100-sxm-80gb")
    with _raises("search needs a layout table (see enumerate_layouts)"):
        search(m, s)
    with _raises(f"layouts must be a non-empty table [n, {len(COLUMNS)}] with columns "
                 f"{', '.join(COLUMNS)}, got shape (0, {len(COLUMNS)})"):
        search(m, s, None, np.zeros((0, len(COLUMNS)), dtype=np.int64))
    bad = enumerate_layouts(m, 2, 4)[:1].copy()
    bad[0, -1] = 2  # placement index 2 of the two default placements
    with _raises("layouts[0].placement=2 must index placements (allowed: 0..1)"):
        search(m, s, None, bad)
    with _raises("temperature=0.0 must be > 0 for the soft search"):
        soft_best(m, s, None, bad, 0.0)


def test_enumerate_layouts_arguments():
    from diffperf.search import enumerate_layouts

    m = _small()
    with _raises("n_devices=0 must be a whole number >= 1"):
        enumerate_layouts(m, 0, 8)
    with _raises("zero_stages=(4,) must be a non-empty subset of 0..3"):
        enumerate_layouts(m, 8, 8, zero_stages=(4,))
    with _raises("fixed: unknown layout column 'tpp' (allowed: tp, pp, dp, cp, ep, vp, "
                 "micro_batch, gx, gy, gz, zero_stage, recompute, sequence_parallel)"):
        enumerate_layouts(m, 8, 8, fixed={"tpp": 2})
    with _raises("fixed tp=(1.5,) must be whole numbers >= 0, at least one"):
        enumerate_layouts(m, 8, 8, fixed={"tp": 1.5})
    with _raises("fixed tp=() must be whole numbers >= 0, at least one"):
        enumerate_layouts(m, 8, 8, fixed={"tp": []})
    with _raises("no valid layout of n_devices=13 with global_batch=8: tp x pp x cp x dp must "
                 "equal n_devices with tp dividing num_heads=24, pp at most num_layers=12, cp "
                 "dividing seq_len=2048 and micro_batch x dp dividing global_batch"):
        enumerate_layouts(m, 13, 8)


# --------------------------------------------------------------------------------------------
# Audit: hardware co-design (cost models and optimize_design's arguments, before tracing)
# --------------------------------------------------------------------------------------------

def test_cost_model_file_rules():
    from diffperf.design import cost_model_from_dict

    with _raises("cost.unit='EUR' is not allowed (allowed: USD, W)"):
        cost_model_from_dict({"unit": "EUR", "base": 1})
    with _raises("cost.tiers must be a list, innermost tier first (got dict {'nvlink': 1})"):
        cost_model_from_dict({"unit": "USD", "base": 1, "tiers": {"nvlink": 1}})


def _design_error(cost=None, objective="cost_per_token", **kwargs):
    import numpy as np

    from diffperf.design import CostModel, optimize_design
    from diffperf.search import COLUMNS

    cost = cost or CostModel(unit="USD", base=1.0, matmul_per_TFLOPs=1.0, name="c")
    layouts = np.ones((1, len(COLUMNS)), dtype=np.int64)
    optimize_design(_small(), diffperf.load_system("a100-sxm-80gb"), None, layouts, cost,
                    objective, **kwargs)


@pytest.mark.parametrize("kwargs,message", [
    (dict(objective="time_to_trian"), "objective='time_to_trian' is not allowed; did you mean "
                                      "'time_to_train'? (allowed: time_to_train, "
                                      "cost_per_token)"),
    (dict(objective="time_to_train"), "objective=time_to_train requires a budget (per device, "
                                      "in the cost model's unit): more hardware is always "
                                      "faster; give --budget or budget: in the cost model"),
    (dict(learning_rate=0), "learning_rate=0 must be > 0"),
    (dict(steps=1.5), "steps=1.5 must be a whole number >= 0"),
    (dict(refresh=0), "refresh=0 must be a whole number >= 1"),
    (dict(budget=0.5), "budget=0.5 must exceed the cost model's base=1 (the fixed part of "
                       "every device)"),
])
def test_design_arguments(kwargs, message):
    with _raises(message):
        _design_error(**kwargs)


def test_design_cost_model_against_the_system():
    from diffperf.design import CostModel

    with _raises("c.tiers has 1 entries; system a100-sxm-80gb has 2 tiers (nvlink, infiniband)"):
        _design_error(CostModel(unit="W", base=1.0, tier_bandwidth_per_GBps=(1.0,),
                                tier_domain_per_device=(0.0,), name="c"))
    with _raises("c.tiers[1].domain_size_per_device=5 must be 0: the last tier spans the whole "
                 "cluster, its domain is not a design choice"):
        _design_error(CostModel(unit="W", base=1.0, tier_bandwidth_per_GBps=(1.0, 1.0),
                                tier_domain_per_device=(0.0, 5.0), name="c"))
    with _raises("cost: prices nothing, so there is nothing to design (give matmul_per_TFLOPs, "
                 "hbm_*_per_*, or tiers[i] prices)"):
        _design_error(CostModel(unit="USD", base=1.0, budget=2.0))


# --------------------------------------------------------------------------------------------
# Audit: the command line (exit code 2, one `error:` line on stderr, no traceback; nothing
# here runs a prediction: each error comes before the library is called)
# --------------------------------------------------------------------------------------------

def _cli_error(capsys, *argv) -> str:
    """The one stderr line of `diffperf ARGV`, after checking the exit code 2."""
    from diffperf.cli.main import main

    code = main([str(a) for a in argv])
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, (code, err)
    assert lines[0].startswith("error: "), err
    return lines[0][len("error: "):]


def _runs_csv(tmp_path, n=1, **cells):
    rows = [GOOD_ROW | dict(id=f"r{i + 1}") | cells for i in range(n)]
    return _write_csv(tmp_path, rows, RUN_COLUMNS + ["source"])


@pytest.mark.parametrize("argv,message", [
    (("--steps", "0"), "--steps=0 must be >= 1"),
    (("--fit-only", "source"), "--fit-only='source' must look like COLUMN=VALUE"),
    (("--fit-only", "sourcee=x"), "--fit-only: no column 'sourcee' in the runs CSV"),
    (("--fit-only", "system=tpu"), "--fit-only: no row with system='tpu' and a measurement"),
    (("--holdout-frac", "1"), "--holdout-frac=1.0 must be in [0, 1)"),
    (("--folds", "3"), "--folds=3 must be in 2..2 (fittable rows)"),
])
def test_cli_calibrate_options(capsys, tmp_path, argv, message):
    assert _cli_error(capsys, "calibrate", _runs_csv(tmp_path, 2), *argv) == message


def test_cli_validate_needs_a_system(capsys, tmp_path):
    assert _cli_error(capsys, "validate", _runs_csv(tmp_path, 2, system="")) == (
        "2 run(s) of the runs CSV have a blank 'system' cell (first: id r1); pass --system "
        "(allowed: a name under configs/systems or a YAML file)")


@pytest.mark.parametrize("argv,message", [
    (("--gpus", "0"), "--gpus=0 must be >= 1"),
    (("--chunk", "0"), "--chunk=0 must be >= 1"),
    (("--seq-len", "0"), "--seq-len=0 must be > 0"),
    (("--placements", ","), "--placements=',' must list rank orders like tp-cp-dp-pp"),
])
def test_cli_search_options(capsys, argv, message):
    assert _cli_error(capsys, "search", *argv) == message


@pytest.mark.parametrize("argv,message", [
    (("--optimum", "--temperature", "0"), "--temperature=0.0 must be > 0"),
    (("--max-candidates", "0"), "--max-candidates=0 must be >= 1"),
    (("--top", "0"), "--top=0 must be >= 1"),
    (("--smooth", "-1"), "--smooth=-1.0 must be >= 0"),
    (("--goodput", "--optimum"), "--goodput gives the elasticities at one layout; drop "
     "--optimum (the optimum is searched by step time, and failures cost every layout of a "
     "job alike)"),
])
def test_cli_sensitivity_options(capsys, argv, message):
    assert _cli_error(capsys, "sensitivity", *argv) == message


def test_cli_design_options(capsys):
    from diffperf.load import _configs_dir

    names = ", ".join(sorted(p.stem for p in (_configs_dir() / "design").glob("*.yaml")))
    assert _cli_error(capsys, "design", "--cost", "zzz") == (
        f"unknown cost model 'zzz' (shipped: {names}; or give a path to a .yaml file)")
    assert _cli_error(capsys, "design", "--cost", "illustrative-usd", "--steps", "-1") == (
        "--steps=-1 must be >= 0")
    assert _cli_error(capsys, "design", "--cost", "illustrative-usd", "--seq-len", "0") == (
        "--seq-len=0 must be > 0")


def test_cli_study_options(capsys, tmp_path):
    from diffperf.studies import STUDIES

    assert _cli_error(capsys, "study", "zzz") == (
        f"unknown study 'zzz' (studies: {', '.join(STUDIES)})")
    assert _cli_error(capsys, "study") == (
        f"study: give a study name (one of: {', '.join(STUDIES)}) or --list")
    assert _cli_error(capsys, "study", "1", "--formats", "gif", "--out", tmp_path) == (
        "--formats='gif' must list png, svg or pdf")
    (tmp_path / "file").write_text("x\n")
    assert _cli_error(capsys, "study", "1", "--out", tmp_path / "file") == (
        f"--out {tmp_path / 'file'} is a file; give a folder")


def test_cli_plot_figure_format(capsys, tmp_path):
    out = tmp_path / "x.gif"
    assert _cli_error(capsys, "plot", "predict", "--out", out) == (
        f"--out {out}: figure format must be .png, .svg or .pdf")


def test_cli_plot_search_when_nothing_fits(capsys, tmp_path, monkeypatch):
    # The search itself is tests/test_plot.py's; here a result in which no layout fits (as
    # GPT-3 175B on one device gives), without compiling the batched kernel.
    import types

    import numpy as np

    import diffperf.search

    monkeypatch.setattr(diffperf.search, "search", lambda model, system, train, layouts, **kw:
                        types.SimpleNamespace(fits=np.zeros(len(layouts), dtype=bool)))
    assert _cli_error(capsys, "plot", "search", "--gpus", "1", "--global-batch", "1",
                      "--no-cache", "--out", tmp_path / "s.png") == (
        "no layout of gpt3-175b on 1 x a100-sxm-80gb fits in memory: nothing to plot")


PRED_HEADER = "id,step_time_s,predicted_step_time_s\n"


@pytest.mark.parametrize("pred,runs,message", [
    ("id,step_time_s\na,1\n", None,
     "{pred}: missing column 'predicted_step_time_s' (have: id, step_time_s)"),
    (PRED_HEADER + "a,fast,1\n", None, "{pred}: step_time_s='fast' of run 'a' must be a number"),
    (PRED_HEADER + "a,1,0\n", None, "{pred}: predicted_step_time_s='0' of run 'a' must be > 0"),
    (PRED_HEADER + "a,1,1\n", "id\nb\n", "{pred}: run id 'a' is not in {runs}"),
    (PRED_HEADER + "c,,3\n", None, "{pred}: no run with a measured step_time_s to plot"),
])
def test_cli_plot_validation_inputs(capsys, tmp_path, pred, runs, message):
    paths = {"pred": tmp_path / "pred.csv", "runs": tmp_path / "runs.csv"}
    paths["pred"].write_text(pred)
    argv = ["plot", "validation", paths["pred"]]
    if runs is not None:
        paths["runs"].write_text(runs)
        argv.append(paths["runs"])
    assert _cli_error(capsys, *argv, "--out", tmp_path / "v.png") == message.format(**paths)


# --------------------------------------------------------------------------------------------
# Audit: output files (cli/output.py, cli/figures.py)
# --------------------------------------------------------------------------------------------

def test_output_destination_checks(tmp_path):
    from diffperf.cli.output import check_writable

    with _raises(f"{tmp_path} is a folder; give a file name"):
        check_writable(tmp_path, force=True)
    target = tmp_path / "no" / "pred.csv"
    with _raises(f"{target}: folder {target.parent} does not exist"):
        check_writable(target, force=False)


def _disk_full(*args, **kwargs):
    raise OSError(28, "No space left on device")


@pytest.mark.parametrize("step", ["mkstemp", "open"])
def test_write_atomic_os_errors(tmp_path, monkeypatch, step):
    from diffperf.cli import output

    monkeypatch.setattr(output.tempfile if step == "mkstemp" else output, step, _disk_full,
                        raising=False)
    target = tmp_path / "pred.csv"
    with _raises(f"{target}: cannot write (No space left on device)"):
        output.write_atomic(target, "a\n", force=False)


def test_figure_save_checks_format_and_os_errors(tmp_path):
    import types

    from diffperf.cli.figures import save

    # plot and study check the suffix first (tests above); save() checks again for callers
    # of the library function.
    with _raises(f"{tmp_path / 'f.gif'}: figure format must be .png, .svg or .pdf"):
        save(None, [tmp_path / "f.gif"], force=False)
    fig = types.SimpleNamespace(savefig=_disk_full)
    with _raises(f"{tmp_path / 'f.png'}: cannot write (No space left on device)"):
        save(fig, [tmp_path / "f.png"], force=False)
    assert list(tmp_path.iterdir()) == []  # the temporary file is gone


# --------------------------------------------------------------------------------------------
# Audit: rank placement (specs/parallel.py ORDERS, workload/groups.py)
# --------------------------------------------------------------------------------------------

def test_placement_rules():
    from diffperf.specs.parallel import ORDERS, placement_index

    with _raises("placement='tp-dp-cp' must order each of tp, cp, dp, pp once, innermost "
                 "first (e.g. tp-cp-dp-pp, Megatron-LM's)"):
        placement_index("tp-dp-cp")
    with _raises(f"parallel: placement={len(ORDERS)} is not allowed (allowed: "
                 f"0..{len(ORDERS) - 1}, an index into specs.parallel.ORDERS; 0 is "
                 "tp-cp-dp-pp)"):
        check_layout(_small(), Parallel(placement=len(ORDERS)))


def test_stride_of_an_unplaced_dimension_is_a_bug():
    # Internal invariant (callers pass tp, cp, ep, dp or pp): a ValueError, not a SpecError.
    from diffperf.workload.groups import stride

    with pytest.raises(ValueError, match=re.escape("dimension 'vp' is not placed (placed: tp, "
                                                   "cp, dp, pp)")):
        stride(Parallel(), "vp")


def test_fused_softmax_max_seq_must_not_be_negative():
    from diffperf.load import training

    with _raises("training.fused_softmax_max_seq=-1 must be >= 0 (2048: Megatron-DeepSpeed's "
                 "fused softmax; 0: no constraint)"):
        training("bf16", fused_softmax_max_seq=-1)


def test_vocab_pad_to_must_be_a_whole_number():
    from diffperf.load import training

    with _raises("training.vocab_pad_to=1.5 must be a whole number >= 0 (128: Megatron-LM's "
                 "padding; 0: no padding)"):
        training("bf16", vocab_pad_to=1.5)
    with _raises("training.vocab_pad_to=inf must be a whole number >= 0"):  # not OverflowError
        training("bf16", vocab_pad_to=float("inf"))
    with _raises("training.fused_softmax_max_seq=-1 must be >= 0") as err:
        training("bf16", fused_softmax_max_seq=-1)
    assert (err.value.field, err.value.value, err.value.anywhere) == (
        "fused_softmax_max_seq", -1, True)


def test_runs_row_training_fact_names_its_row(tmp_path):
    """Review of session 15: a row's `set` cell xla_compiled=2 (a rule of training_from_name)
    was refused without the row ('training.xla_compiled=2.0 must be 0 or 1 ...'); it names
    the row and keeps the field, like the layout rules' refusals."""
    p = _write_csv(tmp_path, [GOOD_ROW, dict(GOOD_ROW, id="r2", set="xla_compiled=2")],
                   RUN_COLUMNS + ["set"])
    with _raises(f"{p}: row 3 (id r2).set (the row's framework facts): training.xla_compiled="
                 f"2.0 must be 0 or 1") as err:
        load_runs(p)
    assert (err.value.field, err.value.value, err.value.anywhere) == ("xla_compiled", 2.0, True)


def test_xla_compiled_must_be_zero_or_one():
    from diffperf.load import training

    with _raises("training.xla_compiled=0.5 must be 0 or 1 (1: the step is one XLA program, "
                 "JAX jit; 0: an eager or Megatron framework)") as err:
        training("amp-bf16", xla_compiled=0.5)
    assert (err.value.field, err.value.value, err.value.anywhere) == ("xla_compiled", 0.5, True)
    assert float(training("amp-bf16", xla_compiled=1).xla_compiled) == 1.0


def test_predict_set_refuses_fields_with_their_own_option(capsys):
    assert _cli_error(capsys, "predict", "--set", "tp=4") == (
        "--set tp: the layout has its own option --tp; give it there")
    assert _cli_error(capsys, "predict", "--set", "micro_batch=2") == (
        "--set micro_batch: the layout has its own option --micro-batch; give it there")
    assert _cli_error(capsys, "predict", "--set", "flash_attention=x") == (
        "--set.flash_attention='x' must be a number")


# --------------------------------------------------------------------------------------------
# Trust: the system's GPU generation, a run's own facts, efficiency sets (docs/trust.md)
# --------------------------------------------------------------------------------------------

def test_system_gpu_generation_not_allowed(tmp_path):
    p = _write_yaml(tmp_path, _system_dict() | {"gpu": "h10"})
    with _raises(f"{p}.gpu='h10' is not allowed; did you mean 'h100'? (allowed: a100, h100, "
                 f"h200, b200, b300, mi300x, tpu-v5p)"):
        load_system(p)


def test_runs_row_fact_out_of_range_names_its_row(tmp_path):
    """A row's fact outside its field's range is refused with the row's id (was: a bare
    'training: moe_expert_loop=2 ...' at predict time, or nothing for lowp_layer_frac)."""
    for fact, message in (("moe_expert_loop=2", "moe_expert_loop=2 is not allowed"),
                          ("lowp_layer_frac=3", "lowp_layer_frac=3 is not allowed")):
        p = _write_csv(tmp_path, [GOOD_ROW | {"set": fact}], RUN_COLUMNS + ["set"])
        with _raises(f"{p}: row 2 (id r1): {message}"):
            load_runs(p)
    # the command's own --set: named as such, not as the first row's fact
    p = _write_csv(tmp_path, [GOOD_ROW], RUN_COLUMNS)
    with _raises("--set: lowp_layer_frac=3 is not allowed"):
        load_runs(p, overrides=["lowp_layer_frac=3"])


def test_runs_row_facts_unknown_field(tmp_path):
    p = _write_csv(tmp_path, [GOOD_ROW | {"set": "grad_bytes=4;dp_overlapp=0"}],
                   RUN_COLUMNS + ["set"])
    with _raises(f"{p}: row 2 (id r1).set (the row's framework facts): --set: unknown field "
                 f"'dp_overlapp'"):
        load_runs(p)


@pytest.mark.parametrize("regimes,message", [
    ([{"name": "other", "q95_log": 0.1, "envelope": {}}],
     ": 'regimes' must start with the set's own regime 'fit'"),
    ([{"name": "fit", "q95_log": -1, "envelope": {}}],
     ": regime 'fit'.q95_log must be a number >= 0"),
    ([{"name": "fit", "q95_log": 0.1, "envelope": [1]}],
     ": regime 'fit'.envelope must be a mapping"),
])
def test_efficiency_set_regimes_checked(tmp_path, regimes, message):
    from diffperf.trust import overlay_set

    p = _write_yaml(tmp_path, {"efficiency": {"mm_max": 0.7}, "regimes": regimes}, "set.yaml")
    with _raises(f"{p}{message}"):
        overlay_set(p)


# --------------------------------------------------------------------------------------------
# Audit: the package's lazy attributes, overlays, shipped datasets, the search's framework
# facts, low-precision recipes against the tensor cores (all refused before tracing)
# --------------------------------------------------------------------------------------------

def test_unknown_package_attribute():
    # diffperf/__init__.py's __getattr__ imports the lazy submodules; any other name is
    # Python's AttributeError (so hasattr and getattr's default keep working).
    with pytest.raises(AttributeError, match=re.escape("module 'diffperf' has no attribute "
                                                       "'serach'")):
        diffperf.serach  # noqa: B018
    assert not hasattr(diffperf, "serach")
    assert diffperf.search.__name__ == "diffperf.search"


def test_write_overlay_checks(tmp_path):
    from diffperf import write_overlay

    with _raises("overlay.fitted_on must be a mapping, got list"):
        write_overlay(tmp_path / "o.yaml", {"mm_max": 0.7}, fitted_on=["vtrain_a100"])
    with _raises("overlay.fitted_on.set='grad_bytes=4' must be a list of FIELD=VALUE strings"):
        write_overlay(tmp_path / "o.yaml", {"mm_max": 0.7}, fitted_on={"set": "grad_bytes=4"})
    assert not (tmp_path / "o.yaml").exists()  # checked before writing
    write_overlay(tmp_path / "o.yaml", {"mm_max": 0.7})
    with _raises(f"{tmp_path / 'o.yaml'} exists; pass force=True to overwrite it"):
        write_overlay(tmp_path / "o.yaml", {"mm_max": 0.6})
    write_overlay(tmp_path / "o.yaml", {"mm_max": 0.6}, force=True)
    assert yaml.safe_load((tmp_path / "o.yaml").read_text())["efficiency"] == {"mm_max": 0.6}


@pytest.mark.parametrize("fitted_on,message", [
    (["vtrain_a100"], ".fitted_on must be a mapping, got list"),
    ({"set": [4]}, ".fitted_on.set=[4] must be a list of FIELD=VALUE strings"),
])
def test_cli_calibration_overlay_facts(capsys, tmp_path, fitted_on, message):
    p = _write_yaml(tmp_path, {"efficiency": {"mm_max": 0.7}, "fitted_on": fitted_on},
                    "overlay.yaml")
    assert _cli_error(capsys, "predict", "--calibration", p) == f"{p}{message}"


SOFTMAX_FA = ("fused_softmax_max_seq=2048 needs unfused attention (flash_attention=0; got 1): "
              "it is the longest key length Megatron's fused scale-mask-softmax kernel takes, "
              "and fused attention runs no separate softmax; allowed: 0 with flash_attention = 1")
OVERLAY_SOFTMAX = (" (--set fused_softmax_max_seq=2048 was applied from --calibration "
                   "vtrain-a100, which was fitted under it: give --set "
                   "fused_softmax_max_seq=VALUE to override it)")


def test_cli_fact_the_overlay_applied_says_so(capsys):
    """The shipped vtrain-a100 overlay applies its fitted_on.set (fused_softmax_max_seq=2048
    with flash_attention=0); a user's --set flash_attention=1 makes the overlay's fact one
    that cannot act, refused (check_facts_act): the message says the user did not give it,
    where it came from and how to override it (was: the rule alone, naming a fact the user
    never typed). Every path keeps SpecError.field: predict (given and default layouts),
    search (facts_inert_rows' check of the rules that hold for every row), validate (a runs
    row)."""
    a100 = ("--system", "a100-sxm-80gb", "--calibration", "vtrain-a100", "--set",
            "flash_attention=1")
    assert _cli_error(capsys, "predict", "--model", "gpt-small", "--dp", "1", *a100) == (
        f"training: {SOFTMAX_FA}{OVERLAY_SOFTMAX}")
    assert _cli_error(capsys, "predict", *a100) == f"training: {SOFTMAX_FA}{OVERLAY_SOFTMAX}"
    assert _cli_error(capsys, "search", "--model", "gpt-small", "--gpus", "1",
                      "--global-batch", "8", *a100) == (
        f"training: {SOFTMAX_FA}{OVERLAY_SOFTMAX}")
    # (h100_single_gpu: vtrain_a100's rows carry flash_attention=0 in their own 'set' cells,
    # applied after --set, so the command's flash_attention=1 does not act there)
    assert _cli_error(capsys, "validate", "h100_single_gpu", *a100[2:]).endswith(
        f"{SOFTMAX_FA} (the command's --set fused_softmax_max_seq=2048 applies to every row; "
        f"give a fact that holds for some rows only in their 'set' cell){OVERLAY_SOFTMAX}")
    # the user's own fact: the rule alone
    assert _cli_error(capsys, "predict", "--model", "gpt-small", "--dp", "1", *a100,
                      "--set", "fused_softmax_max_seq=2048") == f"training: {SOFTMAX_FA}"
    # a row's own fact refused for the fact the overlay applied, which its rule names: the
    # hint says where flash_attention=0 came from (published_longseq's attention_fa2=1 rows)
    assert _cli_error(capsys, "validate", "published_longseq", "--calibration",
                      "vtrain-a100").endswith(
        "attention_fa2=1 needs fused attention (flash_attention=1; got 0): it prices the fused "
        "attention kernel as FlashAttention-2, and unfused attention runs batched GEMMs and a "
        "separate softmax; allowed: 0 with flash_attention = 0 (--set flash_attention=0 was "
        "applied from --calibration vtrain-a100, which was fitted under it: give --set "
        "flash_attention=VALUE to override it)")


def test_unknown_dataset_suggests():
    from diffperf.resources import dataset_files

    shipped = ", ".join(dataset_files())
    assert "vtrain_a100" in shipped
    with _raises(f"unknown dataset 'vtrain_a10'; did you mean 'vtrain_a100'? (shipped: "
                 f"{shipped}; or give a path to a .csv file)"):
        load_runs("vtrain_a10")


@pytest.mark.parametrize("facts,message", [
    ({"pp_first_layers": 2}, "parallel: 'pp_first_layers' depends on pp, which the table "
                             "varies; the search balances the stages automatically (give it "
                             "to predict)"),
    ({"tp": 2}, "parallel: 'tp' is a column of the layout table; fix it in the table "
                "(enumerate_layouts' fixed)"),
    ({"dp_overlapp": 0}, "parallel: 'dp_overlapp' is not a Parallel field; did you mean "
                         "'dp_overlap'? (allowed: etp, dp_overlap, tp_overlap, "
                         "tp_userbuffers, ep_overlap, ep_dispatch, cp_ring, axonn_overlap, "
                         "zero_shard, zero3_prefetch_params, zero3_regather, "
                         "zero3_calls_per_layer, "
                         "zero3_copy_out, zero3_root_unit, recompute_layer_frac, "
                         "recompute_policy, "
                         "recompute_core_attn, recompute_mlp, recompute_moe_act, "
                         "recompute_layernorm, recompute_mla_up_proj, "
                         "recompute_shared_experts, pp_first_layers, pp_last_layers)"),
    ({"zz": 0}, "parallel: 'zz' is not a Parallel field (allowed: etp, dp_overlap, tp_overlap, "
                "tp_userbuffers, ep_overlap, ep_dispatch, cp_ring, axonn_overlap, zero_shard, "
                "zero3_prefetch_params, zero3_regather, zero3_calls_per_layer, "
                "zero3_copy_out, zero3_root_unit, recompute_layer_frac, recompute_policy, "
                "recompute_core_attn, "
                "recompute_mlp, recompute_moe_act, recompute_layernorm, "
                "recompute_mla_up_proj, recompute_shared_experts, pp_first_layers, "
                "pp_last_layers)"),
    # facts that would make every row of the table invalid: said before compiling
    ({"recompute_mla_up_proj": 1}, "parallel: recompute_mla_up_proj=1 needs multi-latent "
                                   "attention (model.kv_lora_rank > 0; got 0); allowed: 0"),
    ({"recompute_moe_act": 1}, "parallel: recompute_moe_act=1 acts only on MoE layers (the "
                               "routed experts' activation recompute); allowed: 0 for a dense "
                               "model (moe_experts = 0)"),
    ({"recompute_mlp": 2}, "parallel: recompute_mlp=2 is not allowed (allowed: 0, 1)"),
    # each fact's own range (these gave "0 fit", exit 0, before)
    ({"zero3_copy_out": 2}, "parallel: zero3_copy_out=2 is not allowed (allowed: 0 FSDP1 / "
                            "DeepSpeed flat buffers, 1 FSDP2 copy-out)"),
    ({"zero3_root_unit": 2}, "parallel: zero3_root_unit=2 is not allowed (allowed: 0 root "
                             "unit not priced, 1 FSDP's root unit gathered and "
                             "reduce-scattered exposed)"),
    ({"tp_overlap": 2}, "parallel: tp_overlap=2 must be in [0, 1]"),
    ({"zero_shard": 0.5}, "parallel: zero_shard=0.5 must be a whole number >= 0"),
    ({"cp_ring": 3}, "parallel: cp_ring=3 is not allowed (allowed: 0, 1)"),
    ({"tp_userbuffers": 3}, "parallel: tp_userbuffers=3 is not allowed (allowed: 0 the "
                            "tp_overlap form, 1 Transformer Engine userbuffers as "
                            "Megatron-Bridge's FP8 configurations run it, 2 as NeMo "
                            "Framework Launcher 24.07's H100 FP8 configuration runs it on TE "
                            "1.8: pipelined forward reduce-scatters)"),
])
def test_search_framework_facts(facts, message):
    from diffperf.search import enumerate_layouts, search

    m = _small()
    with _raises(message):
        search(m, diffperf.load_system("h100-sxm-80gb"), None, enumerate_layouts(m, 2, 4)[:1],
               parallel=facts)


@pytest.mark.parametrize("fitted_on,message", [
    (["vtrain_a100"], ".fitted_on must be a mapping, got list"),
    ({"set": [4]}, ".fitted_on.set=[4] must be a list of FIELD=VALUE strings"),
])
def test_apply_overlay_checks_fitted_on(tmp_path, fitted_on, message):
    """apply_overlay (load_system(..., calibration=)) checks an overlay's fitted_on as
    --calibration and write_overlay do: the same SpecError, naming the file."""
    d = {"efficiency": {"mm_max": 0.7}, "fitted_on": fitted_on}
    p = _write_yaml(tmp_path, d, "overlay.yaml")
    s = load_system("a100-sxm-80gb")
    with _raises(f"overlay{message}"):
        apply_overlay(s, d)
    with _raises(f"{p}{message}"):
        apply_overlay(s, p)
    with _raises(f"{p}{message}"):
        load_system("a100-sxm-80gb", calibration=p)
    with _raises("--set: unknown field 'dp_overlapp'; did you mean 'dp_overlap'?"):
        apply_overlay(s, dict(d, fitted_on={"set": ["dp_overlapp=0"]}))  # as --calibration
    ok = dict(d, fitted_on={"set": ["dp_overlap=0"], "precision": "bf16"})
    assert float(apply_overlay(s, ok).eff.mm_max) == 0.7


def test_validate_of_several_systems_checks_what_predict_batch_checks(tmp_path):
    """predict_runs' one-vmap path (a CSV of several systems of one structure) validates each
    system's rows through check_inputs as predict_batch does: a bad System is the same
    SpecError there as on the one-system path (before, only the layout and the precision
    were checked there, and a negative HBM bandwidth predicted an infinite step)."""
    from diffperf.validation import predict_runs

    head = ("id,system,num_gpus,num_layers,hidden,num_heads,vocab,seq_len,tp,pp,dp,"
            "global_batch,micro_batch,step_time_s\n")
    a = "a,a100-sxm-80gb,8,12,768,12,50257,1024,2,1,4,16,2,0.05\n"
    b = "b,h100-sxm-80gb,8,12,768,12,50257,1024,1,1,8,16,1,0.05\n"
    (tmp_path / "two.csv").write_text(head + a + b)
    (tmp_path / "one.csv").write_text(head + a)
    two, one = load_runs(tmp_path / "two.csv"), load_runs(tmp_path / "one.csv")
    a100, h100 = load_system("a100-sxm-80gb"), load_system("h100-sxm-80gb")
    bad = a100.replace(hbm_bandwidth_Bps=-1.0)
    assert np.isfinite(predict_runs(two, {"a100-sxm-80gb": a100, "h100-sxm-80gb": h100})[0]).all()
    message = "system: hbm_bandwidth_Bps=-1 is not allowed (allowed: > 0)"
    with _raises(message):  # several systems: one vmap
        predict_runs(two, {"a100-sxm-80gb": bad, "h100-sxm-80gb": h100})
    with _raises(message):  # one system: predict_batch
        predict_runs(one, {"a100-sxm-80gb": bad})


@pytest.mark.parametrize("case", ["layout", "job", "precision"])
def test_predict_batch_refuses_what_predict_refuses(case):
    """predict_batch validates through the one layer predict uses (check_inputs): a bad
    layout, a job larger than the cluster, a recipe without its tensor cores give the same
    SpecError from both (a batch's Trainings are anonymous: the entry stands for the name)."""
    m, system, train = _small(), diffperf.load_system("a100-sxm-80gb"), diffperf.training()
    parallel = Parallel()
    if case == "layout":
        parallel = Parallel(tp=3)
    elif case == "job":
        parallel = Parallel(dp=1 << 21, global_batch=1 << 21)  # the cluster: 2^20 GPUs
    else:
        train = diffperf.training("fp8-current")
    with pytest.raises(SpecError) as single:
        diffperf.predict(m, parallel, system, train)
    with pytest.raises(SpecError) as batch:
        diffperf.predict_batch(diffperf.stack([m]), diffperf.stack([parallel]), system,
                               diffperf.stack([train]))
    assert str(batch.value) == str(single.value).replace(
        "precision='fp8-current'", "precision of batch entry 0")


@pytest.mark.parametrize("precision,system,message", [
    ("fp8-delayed", "a100-sxm-80gb",
     "precision='fp8-delayed' runs GEMMs in FP8/FP4 but system 'a100-sxm-80gb' has no FP8 "
     "tensor cores (matmul_fp8_TFLOPs absent or 0); use bf16, fp16 or another 16-bit preset "
     "there (fp8-delayed, fp8-current (fp8), fp8-blockwise, mxfp8, nvfp4 need an FP8 GPU: "
     "H100, H200, B200, B300, GB200, GB300)"),
    ("mxfp8", "h100-sxm-80gb",
     "precision='mxfp8' needs block-scaled tensor cores (MXFP8 / NVFP4: Blackwell) but system "
     "'h100-sxm-80gb' has none (matmul_fp4_TFLOPs absent or 0); on Hopper use fp8-delayed, "
     "fp8-current or fp8-blockwise"),
    ("nvfp4", "h100-sxm-80gb",
     "precision='nvfp4' needs block-scaled tensor cores (MXFP8 / NVFP4: Blackwell) but system "
     "'h100-sxm-80gb' has none (matmul_fp4_TFLOPs absent or 0); on Hopper use fp8-delayed, "
     "fp8-current or fp8-blockwise"),
])
def test_low_precision_needs_its_tensor_cores(precision, system, message):
    with _raises(message):
        diffperf.predict(_small(), Parallel(), diffperf.load_system(system),
                         diffperf.training(precision))



UB_PRECISION = ("Transformer Engine's userbuffers all-gathers only 16-bit, per-tensor FP8 "
                "and MXFP8 tensors (\"Unsupported quantizer for Userbuffers\" otherwise; TE "
                "1.8, tp_userbuffers 2: delayed-scaling FP8 only, no current scaling or "
                "MXFP8); allowed: tp_userbuffers 0 with this precision, or bf16, fp16, "
                "fp8-delayed, fp8-current, mxfp8 (tp_userbuffers 1), bf16, fp16, fp8-delayed "
                "(tp_userbuffers 2)")


def test_tp_userbuffers_2_refuses_mxfp8():
    """tp_userbuffers = 2 is TE 1.8's userbuffers (NeMo Framework Launcher 24.07), whose one
    FP8 recipe is DelayedScaling: refused with mxfp8 (on a GPU that has it) and with
    fp8-current (Float8CurrentScaling first ships in TE 2.2), fp8-delayed passes."""
    m = _small()
    gb200 = diffperf.load_system("gb200-nvl72")
    h100 = diffperf.load_system("h100-sxm-80gb")
    ub = Parallel(tp=2, dp=1, sequence_parallel=1, tp_userbuffers=2)
    with _raises(f"precision='mxfp8' (lowp_block=32, lowp_fp4=0) with "
                 f"parallel.tp_userbuffers=2: {UB_PRECISION}"):
        check_inputs(m, ub, gb200, diffperf.training("mxfp8"))
    with _raises(f"precision='fp8-current' (lowp_block=0, lowp_fp4=0) with "
                 f"parallel.tp_userbuffers=2: {UB_PRECISION}"):
        check_inputs(m, ub, h100, diffperf.training("fp8-current"))
    check_inputs(m, ub, h100, diffperf.training("fp8-delayed"))
    check_inputs(m, ub.replace(tp_userbuffers=1), h100, diffperf.training("fp8-current"))


@pytest.mark.parametrize("precision", ["nvfp4", "fp8-blockwise"])
def test_tp_userbuffers_needs_a_precision_userbuffers_gathers(precision):
    """TE's userbuffers all-gathers 16-bit, per-tensor FP8 and MXFP8 tensors only
    (fill_userbuffers_buffer_for_all_gather: "Unsupported quantizer for Userbuffers"):
    predict (check_inputs) and search (its framework facts) refuse the others before tracing;
    fp8-current and mxfp8 pass."""
    from diffperf.search import enumerate_layouts, search

    m = _small()
    gb200 = diffperf.load_system("gb200-nvl72")
    ub = Parallel(tp=2, dp=1, sequence_parallel=1, tp_userbuffers=1)
    block, fp4 = {"nvfp4": (16, 1), "fp8-blockwise": (128, 0)}[precision]
    message = (f"precision={precision!r} (lowp_block={block}, lowp_fp4={fp4}) with "
               f"parallel.tp_userbuffers=1: {UB_PRECISION}")
    with _raises(message):
        diffperf.predict(m, ub, gb200, diffperf.training(precision))
    with _raises(message):
        search(m, gb200, diffperf.training(precision), enumerate_layouts(m, 2, 4)[:1],
               parallel={"tp_userbuffers": 1})
    for ok in ("fp8-current", "mxfp8"):
        check_inputs(m, ub, gb200, diffperf.training(ok))


def test_tp_userbuffers_2_needs_the_gpus_sm_count():
    """tp_userbuffers = 2 prices the GEMM beside the pipelined reduce-scatter on gpu_sms -
    num_sm SMs (schedule.overlap.ub_pipe_sm_margin): refused by predict and search before
    tracing on a system whose SM count is not given (System.gpu_sms = 0: gb200-nvl72), where
    it used to price it with H100's 132; a GPU with its count passes (H100, and B200's 148,
    which the old system.gpu == 'h100' rule refused), also as a hardware sweep's batched,
    anonymous systems (system.gpu blanked: the old rule refused even H100 there)."""
    from diffperf.search import enumerate_layouts, search
    from diffperf.specs.batch import anonymous
    from diffperf.specs.validate import check_tp_userbuffers_system

    m = _small()
    gb200 = diffperf.load_system("gb200-nvl72")
    ub = Parallel(tp=2, dp=1, sequence_parallel=1, tp_userbuffers=2)
    message = ("parallel.tp_userbuffers=2 with system.gpu_sms=0: the pipelined forward "
               "reduce-scatter runs its GEMM on the SMs its comm kernels leave (gpu_sms - "
               "num_sm, num_sm 24 / 16 as NeMo Framework Launcher 24.07's H100 FP8 "
               "configuration sets them), so the GPU's SM count must be known; allowed: "
               "tp_userbuffers 2 with system.gpu_sms > 24 (the system file's gpu_sms key), or "
               "tp_userbuffers 0 or 1")
    with _raises(message):
        diffperf.predict(m, ub, gb200, diffperf.training("fp8-delayed"))
    with _raises(message):
        search(m, gb200, diffperf.training("fp8-delayed"), enumerate_layouts(m, 2, 4)[:1],
               parallel={"tp_userbuffers": 2})
    check_inputs(m, ub.replace(tp_userbuffers=1), gb200, diffperf.training("fp8-delayed"))
    h100, b200 = load_system("h100-sxm-80gb"), load_system("dgx-b200")
    check_inputs(m, ub, b200, diffperf.training("fp8-delayed"))
    check_tp_userbuffers_system(ub, anonymous(h100))
    batch = stack([h100, gb200.replace(tiers=h100.tiers)])
    assert float(anonymous(h100).gpu_sms) == 132.0 and anonymous(h100).gpu == ""
    # the index on the batched one: the systems of a sweep (was: 'parallel[1]', a layout
    # that is not batched), the layouts of a runs CSV
    rest = message.split(": ", 1)[1]
    with _raises(f"parallel.tp_userbuffers=2 with system[1].gpu_sms=0: {rest}") as err:
        check_tp_userbuffers_system(ub, batch)
    assert (err.value.field, err.value.value) == ("tp_userbuffers", 2.0)
    with _raises(f"parallel[1].tp_userbuffers=2 with system.gpu_sms=0: {rest}"):
        check_tp_userbuffers_system(stack([ub.replace(tp_userbuffers=1), ub]), gb200)


def test_system_gpu_sms_is_a_count(tmp_path):
    """System key gpu_sms (the GPU's streaming multiprocessors; 0: unknown): >= 0."""
    assert float(load_system(_write_yaml(tmp_path, _system_dict() | {
        "gpu_sms": 108})).gpu_sms) == 108.0
    assert float(load_system(_write_yaml(tmp_path, _system_dict())).gpu_sms) == 0.0
    p = _write_yaml(tmp_path, _system_dict() | {"gpu_sms": -1}, "bad.yaml")
    with _raises(f"{p}.gpu_sms=-1 must be >= 0"):
        load_system(p)
    from diffperf.specs.validate import check_system

    with _raises("system: gpu_sms=-1 is not allowed (allowed: >= 0 (streaming "
                 "multiprocessors of the GPU; 0: unknown))"):
        check_system(load_system("h100-sxm-80gb").replace(gpu_sms=-1.0))


# --------------------------------------------------------------------------------------------
# Audit: predict's and search's layout options on the command line
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("argv,message", [
    (("--tp", "3-1"), "--tp='3-1' must be whole numbers >= 0: V, A-B (A <= B, at most 10^6 "
                      "apart) or V1,V2,..."),
    (("--pp", "x"), "--pp='x' must be whole numbers >= 0: V, A-B (A <= B, at most 10^6 apart) "
                    "or V1,V2,..."),
    (("--recompute", "sometimes"), "--recompute='sometimes' must be none, selective, full or "
                                   "whole numbers >= 0: V, A-B (A <= B, at most 10^6 apart) "
                                   "or V1,V2,..."),
    (("--sweep", "hbm_bandwidth_GBps=1000,2000", "--set", "tp_overlap=0"),
     "--sweep takes the layout values and the Training facts of --set, not yet --set FIELD of "
     "Parallel, --csv or --tokens"),
    (("--sweep", "hbm_bandwidth_GBps=1000,2000", "--tokens", "1e9"),
     "--sweep takes the layout values and the Training facts of --set, not yet --set FIELD of "
     "Parallel, --csv or --tokens"),
])
def test_cli_search_layout_values(capsys, argv, message):
    assert _cli_error(capsys, "search", *argv) == message


@pytest.mark.parametrize("argv,give", [
    ((), "--gpus N (predict then searches the fastest layout that fits) or a layout with --dp "
         "(--tp, --pp, --dp, ...)"),
    (("--tp", "2"), "--gpus N or --dp N beside the layout options given"),
])
def test_cli_predict_needs_gpus_or_a_layout(capsys, argv, give):
    assert _cli_error(capsys, "predict", "--model", "llama3-8b", *argv) == (
        f"--model llama3-8b: give {give}; the default of 1024 GPUs is GPT-3 175B's shipped job")


def test_cli_predict_when_no_layout_fits(capsys, monkeypatch):
    # GPT-3 175B on one A100 fits no layout (its smallest needs ~2610 GiB); the search itself
    # is tests/test_search.py's, so here a result of two layouts that do not fit, without
    # compiling the batched kernel: the message names the smaller of the two.
    import types

    import numpy as np

    import diffperf.search

    def no_fit(model, system, train, layouts, **kw):
        n = len(layouts)
        return types.SimpleNamespace(
            fits=np.zeros(n, dtype=bool), step_time_s=np.ones(n),
            memory=types.SimpleNamespace(total_bytes=np.linspace(3000, 2610, n) * 2**30,
                                         capacity_bytes=np.full(n, 76 * 2**30)))

    monkeypatch.setattr(diffperf.search, "search", no_fit)
    assert _cli_error(capsys, "predict", "--gpus", "1", "--global-batch", "1", "--no-cache") == (
        "no layout of gpt3-175b on --gpus=1 x a100-sxm-80gb with --global-batch=1 fits in memory "
        "(the smallest needs 2610 GiB per device, usable 76 GiB): give more --gpus")
    # a --set fact that cannot act on some layouts (cp_torch=1 at cp 1): every layout is
    # still searched (was: those left out, and said so in the message)
    assert _cli_error(capsys, "predict", "--gpus", "2", "--global-batch", "2", "--no-cache",
                      "--set", "cp_torch=1") == (
        "no layout of gpt3-175b on --gpus=2 x a100-sxm-80gb with --global-batch=2 fits in memory "
        "(the smallest needs 2610 GiB per device, usable 76 GiB): give more --gpus")


@pytest.mark.parametrize("fields,message", [
    (dict(ep=2, dp=2, global_batch=2, ep_dispatch=2),
     "ep_dispatch=2 is not allowed (allowed: 0 pairwise all-to-all, 1 DeepEP-style "
     "hierarchical dispatch)"),
    (dict(tp=2, etp=3, ep=2, dp=2, global_batch=2, sequence_parallel=1),
     "etp=3 is not allowed (allowed: 0 (= tp, experts inside dp), 1, or tp=2)"),
    (dict(tp=2, etp=1, ep=2, dp=2, global_batch=2, sequence_parallel=0),
     "etp=1 < tp=2 needs sequence_parallel=1 (Megatron-Core requires sequence parallelism for "
     "MoE with tp > 1)"),
])
def test_expert_tensor_parallel_rules(fields, message):
    """Megatron-Core's expert tensor parallelism (etp) and DeepEP dispatch (branch bridge)."""
    with _raises(f"parallel: {message}"):
        check_layout(diffperf.load_model("mixtral-8x7b"), Parallel(**fields))


def test_runs_row_model_config_must_agree(tmp_path):
    """A runs-CSV row that names its architecture (model_config) and repeats a column of it
    with another value is refused, not silently resolved."""
    row = GOOD_ROW | dict(model_config="mixtral-8x7b", num_layers="2", hidden="4096",
                          num_heads="32", vocab="32000")
    p = _write_csv(tmp_path, [row], RUN_COLUMNS + ["model_config"])
    with _raises(f"{p}: row 2 (id r1).num_layers=2 differs from model_config 'mixtral-8x7b' "
                 f"(num_layers=32); allowed: 32, or leave model_config blank"):
        load_runs(p)


@pytest.mark.parametrize("fields, message", [
    (dict(llama_eager_pointwise=2.0), "llama_eager_pointwise=2 is not allowed (allowed: 0, 1)"),
    (dict(norm_extra_bytes=-1.0), "norm_extra_bytes=-1 must be >= 0"),
    (dict(attention_fa2=0.5), "attention_fa2=0.5 is not allowed (allowed: 0, 1)"),
    (dict(moe_eager_clamp_bias=2.0),
     "moe_eager_clamp_bias=2 is not allowed (allowed: 0, 1)"),
    (dict(rope_kv_pass=0.5), "rope_kv_pass=0.5 is not allowed (allowed: 0, 1)"),
    (dict(moe_quant_pad=0.5), "moe_quant_pad=0.5 is not allowed (allowed: 0, 1)"),
    (dict(gemm_wave_split=0.5), "gemm_wave_split=0.5 is not allowed (allowed: 0, 1)"),
    (dict(cp_torch=2.0), "cp_torch=2 is not allowed (allowed: 0, 1)"),
    (dict(moe_expert_loop=0.5), "moe_expert_loop=0.5 is not allowed (allowed: 0, 1)"),
    (dict(lowp_te_quantizer=2.0), "lowp_te_quantizer=2 is not allowed (allowed: 0, 1)"),
    (dict(te_cudnn_norm=0.5), "te_cudnn_norm=0.5 is not allowed (allowed: 0, 1)"),
    # a fraction of the layers, whole block and tile sizes (silently accepted before)
    (dict(lowp_layer_frac=2.0), "lowp_layer_frac=2 is not allowed (allowed: 0 to 1, the "
                                "fraction of the transformer layers whose linears run in low "
                                "precision)"),
    (dict(lowp_block=0.5), "lowp_block=0.5 is not allowed (allowed: 0 or a whole number >= 1: "
                           "elements per scale factor; 0: one scale per tensor)"),
    (dict(attn_tile=0.5), "attn_tile=0.5 is not allowed (allowed: 0 or a whole number >= 1: "
                          "the B of the attention kernel's B x B score tiles; 0: no tiling)"),
    (dict(attn_tile=127.5), "attn_tile=127.5 is not allowed"),
])
def test_eager_pointwise_training_facts(fields, message):
    from diffperf.specs.validate import check_training

    with _raises(message):
        check_training(diffperf.Training(**fields))


# --------------------------------------------------------------------------------------------
# Facts whose term cannot act on the input (session 13, branch frontdoor2): refused by
# specs.validate.check_facts_act in check_inputs, per row of a runs CSV and in a search, never
# accepted and ignored (docs/reliability.md "Session 13")
# --------------------------------------------------------------------------------------------

DENSE_FACT = "allowed: 0 for a dense model (moe_experts = 0)"
ACT_RULES = [
    # (Parallel fields, Training fields, message after "parallel: " / "training: "); the
    # model is _small() (dense) unless the Parallel fields name ep
    ({}, dict(moe_expert_loop=1.0), "training: moe_expert_loop=1 acts only on MoE layers "
     f"(Transformer Engine's one GEMM per local expert); {DENSE_FACT}"),
    ({}, dict(moe_quant_pad=1.0), "training: moe_quant_pad=1 acts only on MoE layers (the "
     f"padding copies of the routed tokens); {DENSE_FACT}"),
    ({}, dict(moe_eager_clamp_bias=1.0), "training: moe_eager_clamp_bias=1 acts only on MoE "
     f"layers (the expert MLP's eager clamp and bias kernels); {DENSE_FACT}"),
    (dict(ep_overlap=0.5), {}, "parallel: ep_overlap=0.5 acts only on MoE layers (the merged "
     f"EP schedule that hides the expert all-to-alls); {DENSE_FACT}"),
    (dict(ep_dispatch=1), {}, "parallel: ep_dispatch=1 acts only on MoE layers (the expert "
     f"token dispatcher); {DENSE_FACT}"),
    (dict(etp=1), {}, "parallel: etp=1 acts only on MoE layers (the routed experts' "
     f"tensor-parallel degree); {DENSE_FACT}"),
    (dict(recompute=1, recompute_shared_experts=1), {}, "parallel: recompute_shared_experts=1 "
     f"acts only on MoE layers (the shared experts' recompute); {DENSE_FACT}"),
    ({}, dict(cp_torch=1.0), "training: cp_torch=1 needs context parallelism (cp > 1; got "
     "cp=1): PyTorch's context_parallel() exchanges K/V between the cp ranks; allowed: 0 "
     "with cp = 1"),
    (dict(tp_userbuffers=1), {}, "parallel: tp_userbuffers=1 needs tensor parallelism (tp > "
     "1; got tp=1): userbuffers overlaps the TP collectives; allowed: 0 with tp = 1"),
    # review14d: a layout rule of check_layout before (a search marked its ZeRO-0 rows
    # invalid); hybrid sharding does not act where nothing is sharded (workload.dp.zero_groups)
    (dict(zero_shard=1), {}, "parallel: zero_shard=1 needs zero_stage >= 1 (got zero_stage=0): "
     "nothing is sharded at ZeRO 0; allowed: 0 with zero_stage 0"),
    # review14d: a layout rule of check_layout before (a search marked those rows invalid);
    # Megatron-Bridge turns the overlap off without SP, so the fact is inert there
    (dict(tp=2, tp_userbuffers=2), {}, "parallel: tp_userbuffers=2 needs sequence parallelism "
     "(sequence_parallel=1; got sequence_parallel=0 at tp=2): userbuffers overlaps the "
     "sequence-parallel all-gathers / reduce-scatters, and Megatron-Bridge turns it off without "
     "sequence parallelism; allowed: 0 with sequence_parallel 0"),
    (dict(zero_stage=1, zero3_root_unit=1), {}, "parallel: zero3_root_unit=1 needs "
     "zero_stage=3 (got zero_stage=1): it prices FSDP's root unit gather and reduce-scatter; "
     "allowed: 0 with zero_stage 0 to 2"),
    (dict(zero_stage=1, zero3_copy_out=1), {}, "parallel: zero3_copy_out=1 needs zero_stage=3 "
     "(got zero_stage=1): FSDP2 copies out the parameters it all-gathers per layer; allowed: "
     "0 with zero_stage 0 to 2"),
    ({}, dict(lowp_te_quantizer=1.0), "training: lowp_te_quantizer=1 needs GEMMs in FP8 / "
     "FP4 (lowp_fprop, lowp_dgrad or lowp_wgrad = 1; precision 'bf16' has none): it counts "
     "Transformer Engine's quantize kernels; allowed: 0 with a 16-bit precision"),
    ({}, dict(te_cudnn_norm=1.0), "training: te_cudnn_norm=1 needs lowp_te_quantizer=1 with "
     "per-tensor FP8 current scaling (got lowp_te_quantizer=0, precision 'bf16'): it takes "
     "the amax of a LayerNormLinear's FP8 current-scaling quantize out of Transformer "
     "Engine's norm kernel; allowed: 0"),
    ({}, dict(rope_kv_pass=1.0, llama_eager_pointwise=1.0), "training: rope_kv_pass=1 with "
     "llama_eager_pointwise=1: the eager term already holds the rotary and K/V expansion "
     "passes (rope_kv_pass is their compiled form); allowed: one of the two"),
    # the older facts (session 14, branch frontdoor3): each was accepted and changed nothing
    (dict(cp_ring=0), {}, "parallel: cp_ring=0 needs context parallelism (cp > 1; got cp=1): "
     "it picks how the cp ranks exchange K/V (1 ring, 0 all-gather); allowed: 1 (the default) "
     "with cp = 1"),
    (dict(tp_overlap=0.5), {}, "parallel: tp_overlap=0.5 needs tensor parallelism (tp > 1; "
     "got tp=1): it is the fraction of the TP collectives hidden behind the GEMMs, and tp = 1 "
     "has none; allowed: 0 with tp = 1"),
    (dict(zero_stage=1, zero3_regather=0), {}, "parallel: zero3_regather=0 needs zero_stage=3 "
     "(got zero_stage=1): it sets whether full recompute gathers a layer's parameters again "
     "under ZeRO-3; allowed: 1 (the default) with zero_stage 0 to 2"),
    (dict(zero_stage=2, zero3_calls_per_layer=4), {}, "parallel: zero3_calls_per_layer=4 needs "
     "zero_stage=3 (got zero_stage=2): it sets the gather / reduce-scatter calls per layer "
     "pass under ZeRO-3; allowed: 1 (the default) with zero_stage 0 to 2"),
    (dict(zero3_prefetch_params=5e7), {}, "parallel: zero3_prefetch_params=5e+07 needs "
     "zero_stage=3 (got zero_stage=0): it sets how many parameters are gathered ahead of use "
     "under ZeRO-3; allowed: 0 (the default) with zero_stage 0 to 2"),
    (dict(axonn_overlap=0), {}, "parallel: axonn_overlap=0 needs an AxoNN grid (gx, gy or gz > "
     "1; got gx=1, gy=1, gz=1): it switches the grid's overlapped collectives; allowed: 1 "
     "(the default) without a grid"),
    ({}, dict(lowp_param_gather=1.0), "training: lowp_param_gather=1 needs GEMMs in FP8 / FP4 "
     "(lowp_fprop, lowp_dgrad or lowp_wgrad = 1; precision 'bf16' has none): it all-gathers "
     "and keeps the quantized weights (Megatron --fp8-param-gather); allowed: 0 with a 16-bit "
     "precision"),
    ({}, dict(lowp_layer_frac=0.5), "training: lowp_layer_frac=0.5 needs GEMMs in FP8 / FP4 "
     "(lowp_fprop, lowp_dgrad or lowp_wgrad = 1; precision 'bf16' has none): it sets the "
     "fraction of the layers whose linears run in low precision; allowed: 1 (the default) "
     "with a 16-bit precision"),
    ({}, dict(lowp_weight_cache=0.0), "training: lowp_weight_cache=0 needs GEMMs in FP8 / FP4 "
     "(lowp_fprop, lowp_dgrad or lowp_wgrad = 1; precision 'bf16' has none): it sets whether "
     "the quantized weights are cast once per step and kept; allowed: 1 (the default) with a "
     "16-bit precision"),
    ({}, dict(fused_softmax_max_seq=2048.0), "training: fused_softmax_max_seq=2048 needs "
     "unfused attention (flash_attention=0; got 1): it is the longest key length Megatron's "
     "fused scale-mask-softmax kernel takes, and fused attention runs no separate softmax; "
     "allowed: 0 with flash_attention = 1"),
    # review14a: FlashAttention-2's rate applies to the fused kernel only
    ({}, dict(attention_fa2=1.0, flash_attention=0.0), "training: attention_fa2=1 needs fused "
     "attention (flash_attention=1; got 0): it prices the fused attention kernel as "
     "FlashAttention-2, and unfused attention runs batched GEMMs and a separate softmax; "
     "allowed: 0 with flash_attention = 0"),
]
MOE_ACT_RULES = [
    # on Mixtral 8x7B (8 routed experts, no shared expert), 16 GPUs
    (dict(dp=16, global_batch=16, recompute=1, recompute_shared_experts=1), {},
     "parallel: recompute_shared_experts=1 needs shared experts (model.moe_shared_experts > "
     "0; got 0): there is no module to recompute; allowed: 0"),
    (dict(dp=16, global_batch=16, recompute=1, recompute_mlp=1), {},
     "parallel: recompute_mlp=1 needs dense MLP layers (model.moe_experts=8 with "
     "moe_dense_layers=0 has none): Megatron-Core's TransformerLayer recomputes the MLP only "
     "where it is not an MoELayer (the experts' activation is recompute_moe_act); allowed: 0"),
    (dict(dp=16, global_batch=16, ep_overlap=0.5), {}, "parallel: ep_overlap=0.5 needs expert "
     "parallelism (ep > 1; got ep=1): Megatron-Core overlaps the expert all-to-alls only "
     "between ep ranks (\"overlap_moe_expert_parallel_comm is only supported with expert "
     "model parallelism\"); allowed: 0 with ep = 1"),
    (dict(dp=16, ep=8, global_batch=16, ep_overlap=1, recompute=2), {}, "parallel: "
     "ep_overlap=1 with recompute=2 (full): Megatron-Core refuses the merged EP schedule under "
     "full recompute (\"disable full recomputation when enabling "
     "overlap_moe_expert_parallel_comm\"); allowed: 0 with full recompute"),
    (dict(dp=16, global_batch=16, ep_dispatch=1), {}, "parallel: ep_dispatch=1 needs expert "
     "parallelism (ep > 1; got ep=1): the flex dispatcher's exchange runs between the ep "
     "ranks; allowed: 0 with ep = 1"),
    (dict(dp=16, ep=8, global_batch=16), dict(moe_quant_pad=1.0), "training: moe_quant_pad=1 "
     "needs GEMMs in FP8 / FP4 (lowp_fprop, lowp_dgrad or lowp_wgrad = 1; precision 'bf16' "
     "has none): Megatron-Core's TEGroupedMLP pads the routed tokens only for quantized "
     "grouped GEMMs; allowed: 0 with a 16-bit precision"),
]


@pytest.mark.parametrize("par,tr,message", ACT_RULES + MOE_ACT_RULES,
                         ids=[r[2].split(":")[1].split("=")[0].strip() + str(i)
                              for i, r in enumerate(ACT_RULES + MOE_ACT_RULES)])
def test_facts_that_cannot_act_are_refused(par, tr, message):
    """Each fact was accepted and changed nothing (or, moe_quant_pad on 16-bit GEMMs, charged
    copies the run never made); refused by check_inputs before anything is traced, and the
    same layout without the fact passes."""
    from diffperf.load import training

    moe = ("dp" in par)
    model = diffperf.load_model("mixtral-8x7b") if moe else _small()
    system = load_system("h100-sxm-80gb")
    n = 16 if moe else None
    with _raises(message):
        check_inputs(model, Parallel(**par), system, training("bf16", **tr), n)
    defaults = Parallel()
    base = {k: v for k, v in par.items()
            if k in ("dp", "ep", "global_batch", "recompute", "zero_stage", "tp")}
    base = {k: v for k, v in base.items() if not (k == "recompute" and "ep_overlap" in par)}
    check_inputs(model, defaults.replace(**base), system, training("bf16"), n)


def test_te_cudnn_norm_needs_fp8_current_scaling():
    """te_cudnn_norm only moves FP8 current scaling's norm-fused amax: refused under MXFP8
    (whose cuDNN norm path is not modelled), accepted under FP8-CS with lowp_te_quantizer."""
    from diffperf.load import training

    system = load_system("dgx-b200")
    with _raises("training: te_cudnn_norm=1 needs lowp_te_quantizer=1 with per-tensor FP8 "
                 "current scaling (got lowp_te_quantizer=1, precision 'mxfp8'): it takes the "
                 "amax of a LayerNormLinear's FP8 current-scaling quantize out of Transformer "
                 "Engine's norm kernel; allowed: 0"):
        check_inputs(_small(), Parallel(), system,
                     training("mxfp8", lowp_te_quantizer=1.0, te_cudnn_norm=1.0))
    check_inputs(_small(), Parallel(), system,
                 training("fp8-current", lowp_te_quantizer=1.0, te_cudnn_norm=1.0))


def test_older_facts_refused_where_they_cannot_act_carry_their_field():
    """lowp_param_gather below a sharded optimizer (Megatron-LM's validate_args refuses
    --fp8-param-gather without the distributed optimizer or FSDP), tp_overlap beside the
    userbuffers overlap (which does not read it); the SpecError carries the refused field and
    its value (SpecError.field / .value), which load's runs rows use."""
    from diffperf.load import training

    system = load_system("h100-sxm-80gb")
    with _raises("training: lowp_param_gather=1 needs a sharded optimizer (zero_stage >= 1; "
                 "got zero_stage=0): Megatron-LM refuses --fp8-param-gather without the "
                 "distributed optimizer or FSDP (\"--fp8-param-gather only supported with "
                 "distributed optimizer, torch fsdp2, megatron fsdp, or inference mode\"); "
                 "allowed: 0 with zero_stage 0"):
        check_inputs(_small(), Parallel(), system, training("fp8-current",
                                                            lowp_param_gather=1.0))
    check_inputs(_small(), Parallel(zero_stage=1), system,
                 training("fp8-current", lowp_param_gather=1.0))
    ub = Parallel(tp=2, sequence_parallel=1, tp_userbuffers=1, tp_overlap=0.5)
    with _raises("parallel: tp_overlap=0.5 with tp_userbuffers=1: the userbuffers overlap "
                 "prices which TP communication hides itself and does not read tp_overlap; "
                 "allowed: tp_overlap 0 with tp_userbuffers 1 or 2") as err:
        check_inputs(_small(), ub, system, training("bf16"))
    assert (err.value.field, err.value.value) == ("tp_overlap", 0.5)
    check_inputs(_small(), ub.replace(tp_overlap=0.0), system, training("bf16"))
    batch = stack([Parallel(zero_stage=3), Parallel(zero3_regather=0)])
    with _raises("parallel[1]: zero3_regather=0 needs zero_stage=3") as err:
        check_inputs(_small(), batch, system, training("bf16"), 1)
    assert (err.value.field, err.value.value) == ("zero3_regather", 0.0)


def test_cli_predict_refuses_a_fact_that_cannot_act(capsys):
    """Through the command line (exit 2, one line, before any tracing)."""
    assert _cli_error(capsys, "predict", "--set", "moe_expert_loop=1") == (
        "training: moe_expert_loop=1 acts only on MoE layers (Transformer Engine's one GEMM "
        f"per local expert); {DENSE_FACT}")
    assert _cli_error(capsys, "predict", "--model", "gpt-small", "--dp", "1", "--set",
                      "cp_torch=1") == (
        "training: cp_torch=1 needs context parallelism (cp > 1; got cp=1): PyTorch's "
        "context_parallel() exchanges K/V between the cp ranks; allowed: 0 with cp = 1")
    assert _cli_error(capsys, "predict", "--model", "gpt-small", "--dp", "1", "--set",
                      "tp_overlap=0.5") == (
        "layout: tp_overlap=0.5 needs tensor parallelism (tp > 1; got tp=1): it is the "
        "fraction of the TP collectives hidden behind the GEMMs, and tp = 1 has none; "
        "allowed: 0 with tp = 1")
    # on a layout the user did not give, the message says whose it is
    assert _cli_error(capsys, "predict", "--set", "cp_torch=1") == (
        "training: cp_torch=1 needs context parallelism (cp > 1; got cp=1): PyTorch's "
        "context_parallel() exchanges K/V between the cp ranks; allowed: 0 with cp = 1 (the "
        "layout is GPT-3 175B's shipped default: give the layout options, --tp, --cp, --ep, "
        "--pp, --dp, ..., for one where this holds)")


def test_runs_row_fact_that_cannot_act_names_its_row(tmp_path):
    """A runs CSV: the row's own `set` fact, and the command's --set (applied to every row),
    refused with the row's id; the --set message says where a fact of some rows belongs."""
    p = _write_csv(tmp_path, [GOOD_ROW | {"set": "moe_quant_pad=1"}], RUN_COLUMNS + ["set"])
    with _raises(f"{p}: row 2 (id r1): moe_quant_pad=1 acts only on MoE layers (the padding "
                 f"copies of the routed tokens); {DENSE_FACT}"):
        load_runs(p)
    p = _write_csv(tmp_path, [GOOD_ROW], RUN_COLUMNS)
    with _raises(f"{p}: row 2 (id r1): cp_torch=1 needs context parallelism (cp > 1; got "
                 f"cp=1): PyTorch's context_parallel() exchanges K/V between the cp ranks; "
                 f"allowed: 0 with cp = 1 (the command's --set cp_torch=1 applies to every "
                 f"row; give a fact that holds for some rows only in their 'set' cell)"):
        load_runs(p, overrides=["cp_torch=1"])
    # the field comes from the error (SpecError.field), not from parsing its message
    with _raises(f"{p}: row 2 (id r1): tp_overlap=0.5 needs tensor parallelism (tp > 1; got "
                 f"tp=1): it is the fraction of the TP collectives hidden behind the GEMMs, "
                 f"and tp = 1 has none; allowed: 0 with tp = 1 (the command's --set "
                 f"tp_overlap=0.5 applies to every row; give a fact that holds for some rows "
                 f"only in their 'set' cell)") as err:
        load_runs(p, overrides=["tp_overlap=0.5"])
    assert (err.value.field, err.value.value) == ("tp_overlap", 0.5)
    # a recompute fact of the command's --set, refused by the layout's own rules (check_layout:
    # one layout's recompute mode), says the same (was: the plain rule, no word of the --set)
    with _raises(f"{p}: row 2 (id r1): recompute_policy=1 needs selective recompute "
                 f"(recompute=1; got recompute=0): it picks the ops selective recompute re-runs "
                 f"(1, 2: TorchTitan's per-op SAC); allowed: 0 with recompute 0 or 2 (the "
                 f"command's --set recompute_policy=1 applies to every row; give a fact that "
                 f"holds for some rows only in their 'set' cell)") as err:
        load_runs(p, overrides=["recompute_policy=1"])
    assert (err.value.field, err.value.value) == ("recompute_policy", 1.0)
    # so do check_layout's other rules that read the row's layout (recompute modules, ZeRO
    # sharding, userbuffers' sequence parallelism): each carries its field
    for fact, rule in (
            ("recompute_mlp=1", "recompute_mlp=1 needs Megatron's selective recompute "
             "(recompute=1, recompute_policy=0; got recompute=0, recompute_policy=0): "
             f"{MODULES_WHY}; allowed: 0 with another recompute mode"),
            ("zero_shard=1", "zero_shard=1 needs zero_stage >= 1 (got zero_stage=0): nothing "
             "is sharded at ZeRO 0; allowed: 0 with zero_stage 0")):
        with _raises(f"{p}: row 2 (id r1): {rule} (the command's --set {fact} applies to "
                     f"every row; give a fact that holds for some rows only in their 'set' "
                     f"cell)") as err:
            load_runs(p, overrides=[fact])
        assert err.value.field == fact.split("=")[0]
    # and the model-dependent one: recompute_mla_up_proj under Megatron's selective recompute
    # on a row without multi-latent attention (was: the plain rule, no field)
    q = _write_csv(tmp_path, [GOOD_ROW | {"recompute": "selective"}], RUN_COLUMNS)
    with _raises(f"{q}: row 2 (id r1): recompute_mla_up_proj=1 needs multi-latent attention "
                 f"(model.kv_lora_rank > 0; got 0); allowed: 0 (the command's --set "
                 f"recompute_mla_up_proj=1 applies to every row; give a fact that holds for "
                 f"some rows only in their 'set' cell)") as err:
        load_runs(q, overrides=["recompute_mla_up_proj=1"])
    assert (err.value.field, err.value.value) == ("recompute_mla_up_proj", 1.0)
    # the row's own cell: the plain rule
    p = _write_csv(tmp_path, [GOOD_ROW | {"set": "recompute_policy=1"}], RUN_COLUMNS + ["set"])
    with _raises(f"{p}: row 2 (id r1): recompute_policy=1 needs selective recompute "
                 f"(recompute=1; got recompute=0): it picks the ops selective recompute re-runs "
                 f"(1, 2: TorchTitan's per-op SAC); allowed: 0 with recompute 0 or 2") as err:
        load_runs(p)
    assert str(err.value).endswith("allowed: 0 with recompute 0 or 2")
    # a FactRule (session 16): field, value, allowed and the fact it needs, not only text
    rule = err.value.rule
    assert (rule.field, rule.value, rule.allowed, rule.needs) == (
        "recompute_policy", 1.0, "0 with recompute 0 or 2", ("recompute",))


@pytest.mark.parametrize("facts,tr,message", [
    ({"ep_overlap": 0.5}, {}, "parallel: ep_overlap=0.5 acts only on MoE layers (the merged "
     f"EP schedule that hides the expert all-to-alls); {DENSE_FACT}"),
    (None, dict(moe_expert_loop=1.0), "training: moe_expert_loop=1 acts only on MoE layers "
     f"(Transformer Engine's one GEMM per local expert); {DENSE_FACT}"),
])
def test_search_refuses_facts_that_cannot_act_on_the_model(facts, tr, message):
    """A search on a dense model: an MoE fact would act on no row (was: accepted, every row
    predicted without it). Facts tied to a row's tp / cp / ep act on their own rows."""
    from diffperf.load import training
    from diffperf.search import enumerate_layouts, search

    m = _small()
    with _raises(message):
        search(m, load_system("h100-sxm-80gb"), training("bf16", **tr),
               enumerate_layouts(m, 8, 64), parallel=facts)


def test_cli_searches_evaluate_every_layout_with_a_fact_that_cannot_act_on_some(
        monkeypatch, tmp_path, capsys):
    """predict (no layout), search and plot search hand the batched search every row, those
    where --set cp_torch=1 cannot act (cp 1) too: the framework runs them without it (its
    term is zero there: tests/test_search.py::test_a_fact_changes_nothing_on_a_layout_where_
    it_cannot_act). Was (sessions 13-14): only the cp > 1 rows, so `search --set cp_ring=0`
    answered 12.32 s at cp 2 for Llama 3 8B on 8 H100 where cp 1 runs 12.28 s. search says
    how many rows the fact does not act on. A spy in place of search.search sees the table,
    then stops the command before anything compiles."""
    import diffperf.search
    from diffperf.cli.main import main
    from diffperf.search import COLUMNS, enumerate_layouts

    class Seen(Exception):
        pass

    tables = []

    def spy(model, system, train, layouts, **kw):
        tables.append(np.asarray(layouts))
        raise Seen

    monkeypatch.setattr(diffperf.search, "search", spy)
    job = ["--model", "llama3-8b", "--system", "h100-sxm-80gb", "--gpus", "8",
           "--global-batch", "128", "--no-cache", "--set", "cp_torch=1"]
    for command in (["predict"], ["search"], ["plot", "search", "--out", tmp_path / "s.png"]):
        with pytest.raises(Seen):
            main([str(a) for a in [*command, *job]])
    full = enumerate_layouts(diffperf.load_model("llama3-8b"), 8, 128)
    cp = full[:, COLUMNS.index("cp")]
    assert len(tables) == 3 and all(np.array_equal(t, full) for t in tables)
    assert "note: cp_torch=1 does not act on {:,} of the {:,} layouts (cp_torch=1 needs " \
           "context parallelism (cp > 1)): they are evaluated and ranked as the framework " \
           "runs them, without it".format(int((cp == 1).sum()), len(full)) in " ".join(
               capsys.readouterr().err.split())


def test_cli_predict_without_a_layout_predicts_the_one_its_search_chose(monkeypatch):
    """predict without a layout, a --set fact that cannot act on the layout its search chose
    (cp_torch=1, the best row at cp 1): predicted without the fact (the same numbers: its term
    is zero there), with a note, not refused (was: refused its own search's choice, exit 2;
    then, sessions 13-14, a search of the cp > 1 rows only). Stand-ins for the search (the
    first cp 1 row fastest) and for predict (which records its inputs): nothing compiles."""
    import types

    import diffperf.search
    from diffperf.cli import predict_cmd
    from diffperf.cli.main import main
    from diffperf.search import COLUMNS, enumerate_layouts

    table = enumerate_layouts(diffperf.load_model("llama3-8b"), 8, 128)
    cp, n = table[:, COLUMNS.index("cp")], len(table)
    step = np.where(np.arange(n) == np.flatnonzero(cp == 1)[0], 1.0, 2.0)
    monkeypatch.setattr(diffperf.search, "search", lambda *a, **k: types.SimpleNamespace(
        fits=np.ones(n, bool), step_time_s=step))

    class Seen(Exception):
        pass

    seen = []

    def predict(model, parallel, system, train, **kw):
        seen.append((parallel, train))
        raise Seen

    monkeypatch.setattr(diffperf, "predict", predict)
    built = []

    def build(args):  # the real one; its notes are printed after the prediction
        built.append(args)
        return real_build(args)

    real_build = predict_cmd.build
    monkeypatch.setattr(predict_cmd, "build", build)
    with pytest.raises(Seen):
        main(["predict", "--model", "llama3-8b", "--system", "h100-sxm-80gb", "--gpus", "8",
              "--global-batch", "128", "--no-cache", "--set", "cp_torch=1"])
    (parallel, train), = seen
    assert float(parallel.cp) == 1 and float(train.cp_torch) == 0
    assert float(built[0].training_given.cp_torch) == 1  # what sensitivity --optimum searches
    assert built[0].notes[-1] == (
        "cp_torch=1 does not act on the layout predict's search chose (cp_torch=1 needs "
        "context parallelism (cp > 1)): predicted as the framework runs it, without it (a "
        "layout option given with it is refused)")


def test_predict_under_a_system_gradient_refuses_a_fact_that_cannot_act():
    """diffperf.predict with a traced System (jax.grad over the hardware) skipped
    check_inputs, so an MoE fact on a dense model was ignored there (review13a); the model,
    layout and training are concrete, so check_facts_act runs before anything is traced."""
    import jax

    from diffperf.load import training

    system = load_system("h100-sxm-80gb")
    with _raises("training: moe_expert_loop=1 acts only on MoE layers (Transformer Engine's "
                 f"one GEMM per local expert); {DENSE_FACT}"):
        jax.grad(lambda s: diffperf.predict(_small(), Parallel(), s, training(
            "bf16", moe_expert_loop=1.0)).step_time_s)(system)


def test_search_names_the_rows_its_facts_cannot_act_on():
    """search.facts_inert_rows: for each framework fact, the rows of a table on which a
    per-layout rule of check_facts_act says it cannot act (cp_torch at cp 1, zero3_* below
    ZeRO-3, tp_overlap at tp 1, lowp_param_gather at ZeRO 0, axonn_overlap without a grid,
    ep_overlap at ep 1 or under full recompute), with the rule's message: what the CLI's
    note counts. Such rows are searched (the fact inert there); a fact that no layout can meet
    (a rule of the model or the precision) is refused with its own message, as before. No
    compile here (host-side numpy on the table)."""
    from diffperf.load import training
    from diffperf.search import COLUMNS, enumerate_layouts, facts_inert_rows

    col = {c: i for i, c in enumerate(COLUMNS)}
    llama = diffperf.load_model("llama3-8b")
    table = enumerate_layouts(llama, 8, 128, axonn=True)
    c = lambda name: table[:, col[name]]  # noqa: E731
    assert facts_inert_rows(llama, training("bf16"), table) == {}  # no fact
    for tr, facts, field, inert in (
            (dict(cp_torch=1.0), None, "cp_torch", c("cp") == 1),
            ({}, {"cp_ring": 0}, "cp_ring", c("cp") == 1),
            ({}, {"zero3_copy_out": 1}, "zero3_copy_out", c("zero_stage") < 3),
            ({}, {"zero3_regather": 0}, "zero3_regather", c("zero_stage") < 3),
            ({}, {"tp_overlap": 0.5}, "tp_overlap", c("tp") == 1),
            ({}, {"axonn_overlap": 0}, "axonn_overlap", c("gx") * c("gy") * c("gz") == 1),
            ({}, {"zero_shard": 2}, "zero_shard", c("zero_stage") == 0)):
        got = facts_inert_rows(llama, training("bf16", **tr), table, facts)
        assert list(got) == [field] and np.array_equal(got[field][0], inert), field
        # the note's rule head (FactRule.head: the rule without the row's values) keeps
        # balanced parentheses and leads the refusal's message
        rule = got[field][1][0]
        head = rule.head
        assert head.startswith(f"{field}=") and head.count("(") == head.count(")"), head
        assert rule.field == field and " got " not in head and "got " in rule.message, head
        assert rule.message.startswith(head.rstrip(")")), (head, rule.message)
        assert 0 < inert.sum() < len(table)
    got = facts_inert_rows(llama, training("fp8-current", lowp_param_gather=1.0), table)
    assert np.array_equal(got["lowp_param_gather"][0], c("zero_stage") == 0)
    assert [str(r) for r in got["lowp_param_gather"][1]] == [
        "lowp_param_gather=1 needs a sharded optimizer (zero_stage >= 1; got zero_stage=0): "
        "Megatron-LM refuses --fp8-param-gather without the distributed optimizer or FSDP "
        "(\"--fp8-param-gather only supported with distributed optimizer, torch fsdp2, "
        "megatron fsdp, or inference mode\"); allowed: 0 with zero_stage 0"]
    # review14d: tp_userbuffers at tp > 1 without SP (Megatron-Bridge turns it off) is inert
    # too (was: check_layout's rule, so a search marked those rows invalid, with no note)
    mask, texts = facts_inert_rows(llama, training("fp8-current"), table,
                                   {"tp_userbuffers": 1})["tp_userbuffers"]
    assert np.array_equal(mask, (c("tp") == 1) | (c("sequence_parallel") == 0))
    assert [r.head for r in texts] == [
        "tp_userbuffers=1 needs tensor parallelism (tp > 1)",
        "tp_userbuffers=1 needs sequence parallelism (sequence_parallel=1)"]
    mixtral = diffperf.load_model("mixtral-8x7b")
    moe = enumerate_layouts(mixtral, 16, 16)
    mask, texts = facts_inert_rows(mixtral, training("bf16"), moe, {"ep_overlap": 1})["ep_overlap"]
    assert np.array_equal(mask, (moe[:, col["ep"]] == 1) | (moe[:, col["recompute"]] == 2))
    assert [r.message.split(":")[0] for r in texts] == [
        "ep_overlap=1 needs expert parallelism (ep > 1; got ep=1)",
        "ep_overlap=1 with recompute=2 (full)"]
    # the refusal of a given layout is made from the same FactRule (SpecError.rule): its
    # message leads with the note's head plus the layout's values
    from diffperf.specs.validate import check_facts_act
    with _raises("parallel: ep_overlap=1 needs expert parallelism (ep > 1; got ep=1): ") as err:
        check_facts_act(mixtral, Parallel(dp=16, recompute=2, ep_overlap=1.0), training("bf16"))
    assert (err.value.rule.head, err.value.field, err.value.value) == (
        texts[0].head, "ep_overlap", 1.0)
    assert str(err.value) == f"parallel: {err.value.rule.message}"
    # a table where the fact acts on no row (one GPU: cp 1 only) is searched too, every row
    # named (was: refused, "(and so on every one of the N layouts of the table: ...)")
    one = enumerate_layouts(llama, 1, 128)
    assert facts_inert_rows(llama, training("bf16", cp_torch=1.0), one)["cp_torch"][0].all()
    # a rule no layout meets: its own message
    with _raises("training: lowp_layer_frac=0.5 needs GEMMs in FP8 / FP4 (lowp_fprop, "
                 "lowp_dgrad or lowp_wgrad = 1; precision 'bf16' has none): it sets the "
                 "fraction of the layers whose linears run in low precision; allowed: 1 (the "
                 "default) with a 16-bit precision") as err:
        facts_inert_rows(llama, training("bf16", lowp_layer_frac=0.5), one)
    assert str(err.value).endswith("with a 16-bit precision")
    with _raises(f"parallel: ep_overlap=0.5 acts only on MoE layers (the merged EP schedule "
                 f"that hides the expert all-to-alls); {DENSE_FACT}") as err:
        facts_inert_rows(llama, training("bf16"), one, {"ep_overlap": 0.5})
    assert str(err.value).endswith(DENSE_FACT)


def test_search_api_ranks_the_rows_its_facts_cannot_act_on(monkeypatch):
    """diffperf.search.search (the Python API) returns what the kernel predicts for every row,
    those on which a fact cannot act (cp_torch=1 at cp 1) too, and `ranked` offers them: the
    framework runs such a layout without the fact (was, session 14: invalid, step inf, never
    ranked). sensitivity's and design's candidates keep them. The kernel is replaced by a
    stand-in (nothing compiles): what is checked is that nothing masks what it returns."""
    import diffperf.search.evaluate as ev
    from diffperf.load import training
    from diffperf.result import Result
    from diffperf.search import COLUMNS, enumerate_layouts, ranked, search
    from diffperf.sensitivity import candidates

    llama, system = diffperf.load_model("llama3-8b"), load_system("h100-sxm-80gb")
    table = enumerate_layouts(llama, 8, 128)
    n, cp = len(table), table[:, COLUMNS.index("cp")]
    ones = np.ones(n)
    monkeypatch.setattr(ev, "_evaluate", lambda *a, **k: None)
    monkeypatch.setattr(ev, "_gather", lambda cell, outs: Result(
        step_time_s=np.arange(1.0, n + 1), breakdown=None, memory=None,
        fits=np.ones(n, bool), fit_margin_frac=0.5 * ones, mfu=0.4 * ones,
        tokens_per_s=ones, model_flops=ones, hardware_flops=ones, n_devices=8 * ones,
        goodput=None, valid=True))
    plain = search(llama, system, training("bf16"), table)
    assert plain.valid is True and np.all(plain.fits)
    r = search(llama, system, training("bf16", cp_torch=1.0), table)
    assert r.valid is True and np.all(r.fits) and (cp == 1).any()
    assert (r.step_time_s == np.arange(1.0, n + 1)).all()
    assert list(ranked(r)) == list(range(n))
    c = candidates(llama, system, training("bf16", cp_torch=1.0), table, 0.05,
                   max_candidates=1 << 20)
    assert sorted(c.index) == list(range(n))


def test_soft_best_weighs_the_rows_its_facts_cannot_act_on(monkeypatch):
    """soft_best weighs every row, those on which a fact cannot act (cp_torch=1 at cp 1) too,
    as `search` ranks them (was, session 14: weight 0; review13g then fixed a NaN d J / d tau
    that the masking made), and d J / d tau is finite. The kernel is a stand-in (nothing
    compiles): scores ln(1 + cell index)."""
    import jax
    import jax.numpy as jnp

    import diffperf.search.soft as soft
    from diffperf.load import training
    from diffperf.search import COLUMNS, INNER_GRID, enumerate_layouts, soft_best

    llama, system = diffperf.load_model("llama3-8b"), load_system("h100-sxm-80gb")
    table = enumerate_layouts(llama, 8, 128)
    cp = table[:, COLUMNS.index("cp")]
    assert (cp == 1).any() and (cp > 1).any()

    def stand_in(model, keys, system, training, tau, **kw):
        shape = (*keys.shape[:2], len(INNER_GRID))
        return jnp.log1p(jnp.arange(np.prod(shape), dtype=keys.dtype)).reshape(shape)

    monkeypatch.setattr(soft, "_soft_scores", stand_in)
    monkeypatch.setattr(soft, "_soft_scores_cpu", stand_in)
    facts = training("bf16", cp_torch=1.0)
    best = soft_best(llama, system, facts, table, 0.1)
    assert np.asarray(best.weights)[cp == 1].max() > 0.5  # the stand-in's best cells: cp 1
    plain = soft_best(llama, system, training("bf16"), table, 0.1)
    assert np.array_equal(np.asarray(best.weights), np.asarray(plain.weights))
    assert abs(float(np.sum(best.weights)) - 1) < 1e-5
    d_tau = jax.grad(lambda t: soft_best(llama, system, facts, table, t).step_time_s)(0.1)
    assert np.isfinite(d_tau), d_tau
    # the soft-min is below its smallest score and above it by at most tau ln n
    # (J = -tau lse(-s / tau) <= min s): d J / d tau = -(entropy of the weights) <= 0
    assert float(d_tau) <= 0


def test_capacity_factor_is_at_most_experts_over_topk(tmp_path):
    """moe_capacity_factor: each expert holds T k C_f / E tokens (Megatron-Core
    get_capacity) and never receives more than T, so C_f <= E / k (8 experts, top-2: 4)."""
    from diffperf.load import model_from_dict
    from diffperf.specs.validate import CAPACITY_WHY, check_model

    moe = _model_dict(moe_experts=8, moe_topk=2, moe_ffn_hidden=512)
    assert float(model_from_dict(moe | {"moe_capacity_factor": 4}).capacity_factor) == 4.0
    with _raises(f"model.moe_capacity_factor=4.5 is above moe_experts / moe_topk=8 / 2: "
                 f"{CAPACITY_WHY}; allowed: > 0 and at most 4"):
        model_from_dict(moe | {"moe_capacity_factor": 4.5})
    m = model_from_dict(moe)
    with _raises(f"model: capacity_factor=5 is above n_experts / moe_topk=8 / 2: {CAPACITY_WHY}; "
                 f"allowed: > 0 and at most 4"):
        check_model(m.replace(capacity_factor=5.0))
    with _raises("model: capacity_factor=-1 must be > 0 for an MoE model"):
        check_model(m.replace(capacity_factor=-1.0))
    with _raises("model: moe_topk=0 must be >= 1 for an MoE model (n_experts=8): every token "
                 "goes to its top-k experts"):
        check_model(m.replace(moe_topk=0.0))
    assert "no expert can receive more than T" in CAPACITY_WHY


@pytest.mark.parametrize("key,value,neutral", [
    ("moe_topk", 2, 0), ("moe_ffn_hidden", 512, 0), ("moe_shared_experts", 1, 0),
    ("moe_shared_ffn_hidden", 512, 0), ("moe_capacity_factor", 1.25, 1)])
def test_moe_keys_on_a_dense_model_file_are_refused(key, value, neutral):
    """A dense model file (moe_experts 0) with an MoE key: read by nothing before."""
    from diffperf.load import model_from_dict

    with _raises(f"model.{key}={value:g} describes MoE layers, but moe_experts=0 (a dense "
                 f"model); allowed: {neutral} or leave it out"):
        model_from_dict(_model_dict(**{key: value}))
    model_from_dict(_model_dict(**{key: neutral}))  # the neutral value, as the shipped files


def test_hf_missing_mlp_width_and_top_k_are_named(tmp_path):
    """A config.json without intermediate_size read the MLP as 4 x hidden (Llama's class
    default is 11008 at hidden 4096, not 16384), and one with experts but no
    num_experts_per_tok said 'moe_topk=0' (diffperf's key), and a Qwen3-MoE / DeepSeek config
    without moe_intermediate_size read its experts as intermediate_size wide: each names the
    file's key now."""
    from diffperf.hf import hf_to_dict

    base = {"model_type": "llama", "num_hidden_layers": 4, "hidden_size": 64,
            "num_attention_heads": 4, "vocab_size": 100}
    with _raises("x.json: missing intermediate_size (the MLP width) for model_type='llama': "
                 "transformers would take its config class's default, which diffperf does not "
                 "copy (allowed: a whole number >= 1 in the file; absent only for gpt2, "
                 "falcon, RefinedWeb, RefinedWebModel, whose models use 4 x hidden_size)"):
        hf_to_dict(base, "x.json")
    d, notes = hf_to_dict(base | {"model_type": "gpt2"}, "x.json")
    assert "ffn_hidden" not in d and any(
        "MLP width absent: 4 x hidden_size = 256, the rule of transformers' gpt2 model when "
        "n_inner / ffn_hidden_size is null" in n for n in notes)
    with _raises("x.json: missing moe_intermediate_size (the width of each expert) for "
                 "model_type='qwen3_moe', whose experts are narrower than intermediate_size "
                 "(the dense MLP's); allowed: a whole number >= 1 in the file"):
        hf_to_dict(base | {"model_type": "qwen3_moe", "intermediate_size": 256,
                           "num_experts": 8, "num_experts_per_tok": 2}, "x.json")
    with _raises("x.json: missing num_experts_per_tok (the experts each token is routed to, "
                 "a whole number in 1..8) beside num_local_experts=8"):
        hf_to_dict(base | {"model_type": "mixtral", "intermediate_size": 256,
                           "num_local_experts": 8}, "x.json")
