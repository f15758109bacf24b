"""Hugging Face config.json -> diffperf model (the YAML schema of configs/README.md), with notes.

Reads the families of docs/models.md: Llama, Mistral / Mixtral, Qwen2 / 2.5 / 3, Qwen2-MoE,
Qwen3-MoE, Gemma 2 / 3 (Gemma 3's nested `text_config`), DeepSeek V2 / V2-Lite / V3 (MLA,
`first_k_dense_replace`, MTP), GPT-NeoX, Falcon (7B `multi_query`, 40B
`new_decoder_architecture`), GPT-OSS (alternating sliding-window layers, attention sinks),
GPT-2. Every choice the file does not state (the training sequence above all: config.json
gives the context length `max_position_embeddings`, never the sequence a run trains on) is
a note; so is every field read but not modeled, and every field not read.

No jax here: pure Python on the parsed JSON (load.py validates the result).
"""

from __future__ import annotations

import math

from diffperf.errors import SpecError, printable

# The training sequence a Hugging Face config does not give: 4096, the pre-training sequence
# of DeepSeek-V2/V3 (4K), Qwen3 (S1/S2 stages), Llama 2 and GPT-OSS's native context
# (initial_context_length). Reported as a note; --seq-len (or seq_len=) overrides it. A model
# whose context length (max_position_embeddings, n_positions) is shorter gets that length
# instead, also noted: GPT-NeoX-20B (max_position_embeddings 2048; EleutherAI/gpt-neox
# configs/20B.yml, "the configuration file for the GPT-NeoX-20B model as it was trained":
# "seq-length": 2048) and Falcon (2048; transformers' FalconConfig docstring: "Pretrained Falcon
# models with RoPE support up to 2048 tokens") are not trained on 4096-token sequences.
DEFAULT_SEQ_LEN = 4096

# transformers' config-class defaults for fields a published config.json omits (it writes only
# what differs from them). Gemma3TextConfig (transformers/models/gemma3/configuration_gemma3.py).
# FalconConfig (transformers/models/falcon/configuration_falcon.py, 4.33 onward):
# max_position_embeddings=2048; the published Falcon files omit it, in the falcon form and in
# the RefinedWeb form it was converted from (transformers' falcon/convert_custom_code_checkpoint.py
# renames the type and n_head / n_layer / n_head_kv, drops auto_map, adds
# new_decoder_architecture; no field with a length).
_FALCON_DEFAULTS = dict(max_position_embeddings=2048)
_TYPE_DEFAULTS = {
    "gemma3_text": dict(vocab_size=262208, hidden_size=2304, intermediate_size=9216,
                        num_hidden_layers=26, num_attention_heads=8, num_key_value_heads=4,
                        head_dim=256, hidden_activation="gelu_pytorch_tanh",
                        rms_norm_eps=1e-6, sliding_window=4096, sliding_window_pattern=6,
                        tie_word_embeddings=True),
    "falcon": _FALCON_DEFAULTS, "RefinedWeb": _FALCON_DEFAULTS,
    "RefinedWebModel": _FALCON_DEFAULTS,
}
# Defaults of the language-model classes that multimodal wrappers nest, applied inside a
# text_config only. A wrapper's saved text_config leaves out the fields equal to its class's
# defaults (PretrainedConfig.to_diff_dict diffs nested configs against
# `config_obj.__class__()`): llava-hf/llava-1.5-7b-hf's text_config (model_type llama, a
# Vicuna-7B = Llama 2 7B) gives only vocab_size, max_position_embeddings and rms_norm_eps, and
# transformers builds LlamaConfig's 4096 / 11008 / 32 layers / 32 heads / silu from the rest.
# A top-level config.json writes every field of its class, so its missing keys stay refused.
# LlamaConfig (transformers/models/llama/configuration_llama.py: vocab_size 32000,
# hidden_size 4096, intermediate_size 11008, num_hidden_layers 32, num_attention_heads 32,
# num_key_value_heads None -> num_attention_heads, hidden_act "silu",
# max_position_embeddings 2048, rms_norm_eps 1e-6, tie_word_embeddings False); MistralConfig
# (mistral/configuration_mistral.py: the same but intermediate_size 14336,
# num_key_value_heads 8, max_position_embeddings 4096 * 32, sliding_window 4096).
_TEXT_CONFIG_DEFAULTS = {
    "llama": dict(vocab_size=32000, hidden_size=4096, intermediate_size=11008,
                  num_hidden_layers=32, num_attention_heads=32, hidden_act="silu",
                  max_position_embeddings=2048, rms_norm_eps=1e-6,
                  tie_word_embeddings=False),
    "mistral": dict(vocab_size=32000, hidden_size=4096, intermediate_size=14336,
                    num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                    hidden_act="silu", max_position_embeddings=4096 * 32, rms_norm_eps=1e-6,
                    sliding_window=4096, tie_word_embeddings=False),
}
# The text_config types whose kept defaults give the sizes (layers, hidden, heads).
_SIZED_DEFAULTS = tuple(sorted(
    t for t, d in (_TYPE_DEFAULTS | _TEXT_CONFIG_DEFAULTS).items()
    if {"num_hidden_layers", "hidden_size", "num_attention_heads"} <= set(d)))
# The transformers class whose defaults _TYPE_DEFAULTS / _TEXT_CONFIG_DEFAULTS copy (named
# in the note).
_DEFAULTS_CLASS = {"gemma3_text": "Gemma3TextConfig", "falcon": "FalconConfig",
                   "RefinedWeb": "FalconConfig", "RefinedWebModel": "FalconConfig",
                   "llama": "LlamaConfig", "mistral": "MistralConfig"}
# Whether the MLP is gated (GLU: gate x up, 3 matrices) is the family's module, not the
# activation's name: transformers' LlamaMLP computes down_proj(act_fn(gate_proj(x)) *
# up_proj(x)) whatever hidden_act is (transformers/models/llama/modeling_llama.py), as do
# MistralMLP, Qwen2MLP, Qwen3MLP, Qwen2MoeMLP / Qwen3MoeMLP, MixtralBlockSparseTop2MLP
# (w2(act(w1 x) * w3 x)), DeepseekV2MLP / DeepseekV3MLP, Phi3MLP (gate_up_proj, chunked),
# GemmaMLP (GeGLU, gelu_pytorch_tanh gate x up) and GptOssExperts (clamped SwiGLU); GPT2MLP
# (c_fc, act, c_proj), GPTNeoXMLP (dense_h_to_4h, act, dense_4h_to_h) and FalconMLP (the same)
# have no gate whatever their activation. A Llama config with hidden_act "gelu" read by the
# activation's name lost its gate matrix (8.03 -> 6.15 B for Llama 3 8B's shape). Only a
# config without model_type (read as a Llama-style decoder) falls back to the name.
_GATED_TYPES = ("llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe",
                "gemma", "gemma2", "gemma3", "gemma3_text", "deepseek_v2", "deepseek_v3",
                "gpt_oss", "phi3", "olmo2")
_UNGATED_TYPES = ("gpt2", "gpt_neox", "falcon", "RefinedWeb", "RefinedWebModel")
_GATED_ACTS = ("silu", "swiglu", "swish")
# PretrainedConfig's tie_word_embeddings defaults to True; these families keep it (Gemma,
# GPT-2, Falcon's FalconForCausalLM ties lm_head to the word embeddings); the others'
# config classes set False.
_TIED_BY_DEFAULT = ("gpt2", "falcon", "RefinedWeb", "RefinedWebModel", "gemma", "gemma2",
                    "gemma3_text")
# Families whose MLP is 4 x hidden when the width is null: GPT2MLP (n_inner None -> 4
# n_embd, transformers/models/gpt2/modeling_gpt2.py) and FalconConfig (ffn_hidden_size None ->
# 4 hidden_size, configuration_falcon.py).
_FFN_4H_TYPES = ("gpt2", "falcon", "RefinedWeb", "RefinedWebModel")
# MoE families whose expert width is a key of its own (moe_intermediate_size), not the dense
# intermediate_size (Mixtral's and GPT-OSS's experts are intermediate_size wide).
_OWN_EXPERT_WIDTH = ("qwen2_moe", "qwen3_moe", "deepseek_v2", "deepseek_v3")
# Families with a QK-norm and its form (Model.qk_norm, specs.model.QK_NORM_FORMS):
# transformers' Qwen3Attention / Qwen3MoeAttention / Gemma3Attention norm each head (q_norm,
# k_norm of head_dim); Olmo2Attention the whole q / k projection. Gemma 2 has none.
_QK_NORM_TYPES = {"qwen3": "head", "qwen3_moe": "head", "gemma3_text": "head",
                  "olmo2": "projection"}
# Qwen2Config-style windows: use_sliding_window (default false) and max_window_layers.
_QWEN_WINDOW_TYPES = ("qwen2", "qwen2_moe", "qwen3", "qwen3_moe")
# Fields whose architecture diffperf does not represent: refused by name when set (Mllama's
# cross-attention layers; GPT2Config.add_cross_attention, which adds a cross-attention block
# to every layer of a GPT-2 decoder, transformers gpt2/modeling_gpt2.py GPT2Block; an
# encoder-decoder's is_encoder_decoder).
_REFUSED = ("cross_attention_layers", "add_cross_attention", "is_encoder_decoder")
# model_type values whose config.json this reader is known to read right: the families above,
# each checked against a published parameter count (tests/test_models.py on tests/data/hf
# and Phi-3-mini's config). Any other type is refused by name: a config of another
# architecture often has the same field names (BERT: num_hidden_layers, hidden_size,
# num_attention_heads) while its model is not a causal decoder of attention and MLP layers
# (Jamba's and Falcon-H1's Mamba layers, Qwen3-Next's linear attention, Llama 4's
# interleaved MoE with a shared expert and chunked attention, DeepSeek-V3.2's sparse
# attention indexer): read anyway, its count and costs would be silently wrong (Jamba:
# 92.1 B read against 52 B published; Llama 4 Scout: 101.7 B against 109 B).
SUPPORTED_TYPES = ("llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe",
                   "gemma", "gemma2", "gemma3_text", "deepseek_v2", "deepseek_v3",
                   "gpt_neox", "falcon", "RefinedWeb", "RefinedWebModel", "gpt_oss", "gpt2",
                   "phi3", "olmo2")
# Model types that name a supported architecture under another name, read as that type when
# the config's `architectures` names its class (with a note): Moonshot AI's Kimi K2
# (moonshotai/Kimi-K2-Instruct config.json: model_type "kimi_k2", architectures
# ["DeepseekV3ForCausalLM"], auto_map AutoConfig configuration_deepseek.DeepseekV3Config; the
# model card: "Kimi K2 ... DeepSeek-V3 architecture", MLA, 61 layers, 1 dense, 384 experts top
# 8 + 1 shared). Kimi K2.5's wrapper (kimi_k25) nests the same text_config.
_TYPE_ALIASES = {"kimi_k2": ("deepseek_v3", "DeepseekV3ForCausalLM")}
# Multimodal wrappers checked against a published count (Gemma 3). Any wrapper (a config with
# a text_config: llava, mistral3, ...) is read from its text_config when that names one of
# SUPPORTED_TYPES, said in a note; another text_config type is refused by name (Llama 4's
# llama4_text, Mllama's mllama_text_model).
WRAPPER_TYPES = ("gemma3",)
# The text model type a wrapper's config class assumes for a text_config dict without
# `model_type` (transformers, each class's __init__: `text_config.get("model_type", T)`, then
# CONFIG_MAPPING[T]): LlavaConfig, LlavaNextConfig, LlavaNextVideoConfig, VipLlavaConfig
# "llama"; Mistral3Config "mistral"; LlavaOnevisionConfig "qwen2"; PaliGemmaConfig "gemma";
# Gemma3Config builds Gemma3TextConfig(**text_config) whatever the dict says. Only these are
# assumed (with a note); another wrapper's text_config without a type stays refused.
_WRAPPER_TEXT_TYPE = {"llava": ("llama", "LlavaConfig"),
                      "llava_next": ("llama", "LlavaNextConfig"),
                      "llava_next_video": ("llama", "LlavaNextVideoConfig"),
                      "vipllava": ("llama", "VipLlavaConfig"),
                      "mistral3": ("mistral", "Mistral3Config"),
                      "llava_onevision": ("qwen2", "LlavaOnevisionConfig"),
                      "paligemma": ("gemma", "PaliGemmaConfig"),
                      "gemma3": ("gemma3_text", "Gemma3Config")}
# Read, but with no effect on the cost model (positions, numerics, routing policy, ids).
_NO_COST = ("rope_theta", "rope_scaling", "rope_local_base_freq", "rotary_pct",
            "rotary_emb_base", "rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon",
            "initializer_range", "torch_dtype", "dtype", "bos_token_id", "eos_token_id",
            "pad_token_id", "use_cache", "transformers_version", "architectures",
            "attention_dropout", "hidden_dropout", "max_position_embeddings", "n_positions")


def _first(cfg, *keys):
    """(key, value) of the first of `keys` present and not None in cfg, else (None, None)."""
    for k in keys:
        if cfg.get(k) is not None:
            return k, cfg[k]
    return None, None


def _whole(v, key, where, minimum=0):
    """v as an int, checked: a JSON number, finite, whole, in [minimum, 2^31]."""
    ok = (not isinstance(v, bool) and isinstance(v, (int, float))
          and (isinstance(v, int) or math.isfinite(v)))
    if ok:
        ok = minimum <= v <= 2**31 and float(v) == int(v)
    if not ok:
        raise SpecError(f"{where}: {key}={v!r} must be a whole number in {minimum}..2^31")
    return int(v)


def _is_whole(v) -> bool:
    """v is a JSON number (not a bool), finite and whole."""
    return (not isinstance(v, bool) and isinstance(v, (int, float))
            and (isinstance(v, int) or (math.isfinite(v) and float(v) == int(v))))


# The config.json fields this reader takes as numbers / as true or false: a JSON string there
# ("hidden_size": "768", "use_sliding_window": "false") is refused, naming the field, the
# value and its type. transformers' config classes are huggingface_hub `@strict` dataclasses
# since PR #41250 ("Validate config attributes"), which raise on a str where an int or bool
# is declared; before it the string was stored and failed later, in the model's layers.
# Read as is, a string misleads here: "0" experts is true, "false" a window in use.
_HF_NUMBERS = (
    "num_hidden_layers", "n_layer", "num_layers", "hidden_size", "n_embd", "d_model",
    "num_attention_heads", "n_head", "num_key_value_heads", "n_head_kv", "num_kv_heads",
    "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "q_lora_rank",
    "head_dim", "intermediate_size", "n_inner", "ffn_hidden_size", "vocab_size",
    "max_position_embeddings", "n_positions", "seq_length", "num_local_experts",
    "n_routed_experts", "num_experts", "num_experts_per_tok", "experts_per_token",
    "moe_topk", "moe_intermediate_size", "n_shared_experts",
    "shared_expert_intermediate_size", "first_k_dense_replace", "moe_layer_freq",
    "decoder_sparse_step", "num_nextn_predict_layers", "sliding_window", "max_window_layers",
    "sliding_window_pattern")
_HF_FLAGS = ("tie_word_embeddings", "attention_bias", "mlp_bias", "new_decoder_architecture",
             "multi_query", "alibi", "bias", "use_sliding_window")


def _typed(cfg, where) -> None:
    """Refuse a JSON string in a field read as a number or true / false (_HF_NUMBERS,
    _HF_FLAGS), and a number that is not finite (Python's json reads NaN, Infinity and 1e400),
    naming the config.json field (the model checks after this one name diffperf's keys); the
    SpecError carries the field and the value."""
    from diffperf.load import typed_values

    typed_values(cfg, _HF_NUMBERS, _HF_FLAGS, where, ": ")
    for key in _HF_NUMBERS:
        v = cfg.get(key)
        if isinstance(v, float) and not math.isfinite(v):
            raise SpecError(f"{where}: {key}={v!r} must be a finite number", field=key,
                            value=v, anywhere=True)


def _check_type(mt, outer, where, notes) -> None:
    """Refuse a model_type this reader does not know (SUPPORTED_TYPES), naming the type found;
    `outer` is the type of a wrapper around a text_config (None without one): its language
    model is read when the text_config's type is supported, said in a note (only the
    WRAPPER_TYPES were checked against a published count). A config without model_type is
    read as a Llama-style decoder, said in a note; a text_config without one is refused (its
    architecture cannot be told) unless its wrapper's transformers class assumes a type
    (_WRAPPER_TEXT_TYPE: `hf_to_dict` has then filled it in, with a note)."""
    yaml = "write a diffperf model YAML (configs/README.md)"
    allowed = ", ".join(SUPPORTED_TYPES)
    wrapper = f"{printable(str(outer or '?'))!r}"
    if outer is not None and not mt:
        raise SpecError(f"{where}: the text_config of a model_type={wrapper} config names no "
                        f"model_type, so its architecture cannot be told (allowed text_config "
                        f"model_type: {allowed}; assumed only for the wrappers whose "
                        f"transformers class assumes one: {', '.join(_WRAPPER_TEXT_TYPE)}); "
                        f"{yaml} for its language model")
    if not mt:
        notes.append("model_type absent: read as a Llama-style decoder (attention and MLP "
                     "layers)")
        return
    if mt not in SUPPORTED_TYPES:
        found = (f"model_type={printable(mt)!r}" if outer is None else
                 f"model_type={printable(mt)!r} (the text_config of a model_type={wrapper} "
                 f"config)")
        raise SpecError(f"{where}: {found} is not an architecture diffperf reads (allowed: "
                        f"{allowed}): its layers may not be the attention and MLP/MoE layers "
                        f"diffperf models (Mamba or linear-attention layers, an encoder); if "
                        f"they are, {yaml}")
    if outer is not None and outer not in WRAPPER_TYPES:
        notes.append(f"the {wrapper} wrapper's language model is read as a {mt} config (only "
                     f"{', '.join(WRAPPER_TYPES)} wrappers are checked against a published "
                     f"parameter count)")


def hf_to_dict(cfg: dict, where: str, seq_len=None) -> tuple[dict, list]:
    """(diffperf model mapping, notes) of a parsed Hugging Face config.json.

    seq_len: the training sequence (None: DEFAULT_SEQ_LEN, noted; never
    max_position_embeddings). Raises SpecError for a config that is not a decoder LM or
    that names an architecture diffperf does not model.
    """
    notes = []
    used = set()
    top = cfg
    if isinstance(cfg.get("text_config"), dict):
        text = dict(cfg["text_config"])
        outer_mt = cfg.get("model_type")
        # only where the key is absent, as transformers (`text_config.get("model_type", T)`:
        # an empty or null type reaches CONFIG_MAPPING there); a wrapper type that is no
        # string (a list) is refused by _check_type, not looked up (unhashable)
        if ("model_type" not in text and isinstance(outer_mt, str)
                and outer_mt in _WRAPPER_TEXT_TYPE):
            text["model_type"], cls = _WRAPPER_TEXT_TYPE[outer_mt]
            notes.append(f"text_config names no model_type: read as {text['model_type']}, the "
                         f"type transformers' {cls} assumes for it")
        mt = text.get("model_type", "")
        defaults = (_TYPE_DEFAULTS.get(mt) or _TEXT_CONFIG_DEFAULTS.get(mt, {})
                    if isinstance(mt, str) else {})
        filled = sorted(k for k in defaults if k not in text)
        cfg = {**defaults, **text}
        notes.append(f"read the language model in text_config (model_type {mt or '?'}) of a "
                     f"{top.get('model_type', '?')} config"
                     + ("; vision_config ignored (the vision tower is not modeled)"
                        if "vision_config" in top else ""))
        if filled:
            notes.append(f"fields absent from text_config take the defaults of transformers' "
                         f"{_DEFAULTS_CLASS.get(mt, mt)}: "
                         + ", ".join(f"{k}={defaults[k]}" for k in filled))
        top_ignored = sorted(set(top) - {"text_config", "vision_config"})
        if top_ignored:
            notes.append("ignored top-level fields: " + ", ".join(top_ignored))
    else:
        mt = cfg.get("model_type", "")
        defaults = _TYPE_DEFAULTS.get(mt, {}) if isinstance(mt, str) else {}
        filled = sorted(k for k in defaults if k not in cfg)
        cfg = {**defaults, **cfg}
        if filled:
            notes.append(f"fields absent from config.json take the defaults of transformers' "
                         f"{_DEFAULTS_CLASS.get(mt, mt)}: "
                         + ", ".join(f"{k}={defaults[k]}" for k in filled))
    mt = cfg.get("model_type", "")
    if not isinstance(mt, str):
        raise SpecError(f"{where}: model_type={mt!r} must be a string")
    archs = cfg.get("architectures")
    if mt in _TYPE_ALIASES and isinstance(archs, list) and _TYPE_ALIASES[mt][1] in archs:
        alias, cls = _TYPE_ALIASES[mt]
        notes.append(f"model_type={mt!r} with architectures [{cls!r}]: read as a {alias} "
                     f"config (the architecture its config class and model class are)")
        cfg = {**cfg, "model_type": alias}
        mt = alias
    outer = top.get("model_type", "") if isinstance(top.get("text_config"), dict) else None

    def take_item(*keys):
        """(key, value) of the first of `keys` set (`_first`); every one of them is read."""
        used.update(k for k in keys if k in cfg)  # read, even when null
        return _first(cfg, *keys)

    def take(*keys):
        return take_item(*keys)[1]

    _check_type(mt, outer, where, notes)
    _typed(cfg, where)
    bad = [k for k in _REFUSED if cfg.get(k) not in (None, 0, [])]
    if bad:
        raise SpecError(f"{where}: Hugging Face fields not supported by diffperf's model: "
                        f"{', '.join(bad)} (write a diffperf model YAML instead)")

    d = {}
    d["num_layers"] = take("num_hidden_layers", "n_layer", "num_layers")
    d["hidden"] = take("hidden_size", "n_embd", "d_model")
    d["num_heads"] = take("num_attention_heads", "n_head")
    missing = [theirs for k, theirs in (("num_layers", "num_hidden_layers"),
                                        ("hidden", "hidden_size"),
                                        ("num_heads", "num_attention_heads")) if d[k] is None]
    if missing:
        inside = ("" if outer is None else
                  f" in the text_config of a model_type={printable(str(outer or '?'))!r} "
                  f"config (transformers fills absent fields from its config class's "
                  f"defaults, which diffperf keeps only for {', '.join(_SIZED_DEFAULTS)}: "
                  f"write them into text_config)")
        raise SpecError(f"{where}: not a recognised Hugging Face config.json (needs "
                        f"num_hidden_layers, hidden_size, num_attention_heads; missing "
                        f"{', '.join(missing)}{inside})")
    for k, theirs in (("num_layers", "num_hidden_layers"), ("hidden", "hidden_size"),
                      ("num_heads", "num_attention_heads")):
        d[k] = _whole(d[k], theirs, where, minimum=1)
    # K/V heads: GQA field; Falcon-40B n_head_kv / num_kv_heads under
    # new_decoder_architecture; Falcon-7B multi_query (one K/V head).
    kv = take("num_key_value_heads", "n_head_kv", "num_kv_heads")
    if mt in ("falcon", "RefinedWeb", "RefinedWebModel"):
        new_arch = bool(take("new_decoder_architecture"))
        multi_query = bool(take("multi_query"))
        if not new_arch:
            kv = 1 if multi_query else d["num_heads"]
        notes.append("Falcon: " + ("new_decoder_architecture (grouped K/V heads, two "
                                   "LayerNorms)" if new_arch else
                                   f"multi_query={multi_query} ({kv} K/V head"
                                   f"{'s' if kv != 1 else ''})")
                     + "; parallel attention and MLP (parallel_attn) cost the same FLOPs "
                     "as the sequential block and are modeled as such")
        used.update(("parallel_attn", "alibi", "bias"))
        if cfg.get("alibi"):
            notes.append("Falcon alibi=true: ALiBi positions are not modeled (no cost)")
    if kv is not None:
        d["num_kv_heads"] = kv
    # MLA (DeepSeek-V2/V3): head_dim is the query/key width (no-RoPE + RoPE parts).
    kv_lora = take("kv_lora_rank")
    if kv_lora:
        nope = take("qk_nope_head_dim")
        rope = take("qk_rope_head_dim")
        if nope is None or rope is None:
            raise SpecError(f"{where}: kv_lora_rank={kv_lora} (multi-head latent attention) "
                            f"needs qk_nope_head_dim and qk_rope_head_dim")
        nope = _whole(nope, "qk_nope_head_dim", where, minimum=1)
        rope = _whole(rope, "qk_rope_head_dim", where)
        v_dim = take("v_head_dim")
        d.update(kv_lora_rank=kv_lora, qk_rope_head_dim=rope, head_dim=nope + rope,
                 q_lora_rank=take("q_lora_rank") or 0,
                 v_head_dim=nope if v_dim is None else v_dim)
        used.add("q_lora_rank")
        notes.append(f"multi-head latent attention: q_lora_rank={d['q_lora_rank'] or 'none'}, "
                     f"kv_lora_rank={kv_lora}, head_dim {nope}+{rope}, "
                     f"v_head_dim={d['v_head_dim']}")
    else:
        hd = take("head_dim")
        if hd is not None:
            d["head_dim"] = hd
    ffn = take("intermediate_size", "n_inner", "ffn_hidden_size")
    if ffn is not None:
        d["ffn_hidden"] = ffn
    elif mt in _FFN_4H_TYPES:
        notes.append(f"MLP width absent: 4 x hidden_size = {4 * d['hidden']}, the rule of "
                     f"transformers' {mt} model when n_inner / ffn_hidden_size is null")
    else:  # diffperf's own default (4 h) is not what the config class would use
        raise SpecError(f"{where}: missing intermediate_size (the MLP width) for "
                        f"model_type={printable(str(mt or '?'))!r}: transformers would take "
                        f"its config class's default, which diffperf does not copy (allowed: "
                        f"a whole number >= 1 in the file; absent only for "
                        f"{', '.join(_FFN_4H_TYPES)}, whose models use 4 x hidden_size)")
    d["vocab"] = take("vocab_size")
    if d["vocab"] is None:
        raise SpecError(f"{where}: missing vocab_size (the tokenizer's vocabulary size, a "
                        f"whole number >= 1)")

    # Training sequence: never max_position_embeddings (the context length) when it is longer
    # than the default; the context length when it is shorter (a model is not trained beyond
    # its positions as published), said in the note either way.
    ctx_key, ctx = take_item("max_position_embeddings", "n_positions", "seq_length")
    learned = mt == "gpt2"
    if learned and ctx is not None:
        ctx = _whole(ctx, ctx_key, where, minimum=1)  # the position table: a hard limit
    if seq_len is not None:
        d["seq_len"] = seq_len
    elif _is_whole(ctx) and 1 <= ctx < DEFAULT_SEQ_LEN:
        d["seq_len"] = int(ctx)
        notes.append(f"seq_len={d['seq_len']}: the model's context length {ctx_key}={ctx}, "
                     f"below diffperf's default {DEFAULT_SEQ_LEN} for a Hugging Face config "
                     f"(which gives no training sequence); give --seq-len")
    else:
        d["seq_len"] = DEFAULT_SEQ_LEN
        notes.append(f"seq_len={d['seq_len']}: diffperf's default for a Hugging Face config, "
                     f"which gives no training sequence"
                     + (f" ({ctx_key}={ctx} is the context length, not used)"
                        if ctx is not None else "") + "; give --seq-len")

    act = take("hidden_act", "hidden_activation", "activation_function", "activation")
    act = str(act if act is not None else "gelu")
    if mt in _GATED_TYPES or mt in _UNGATED_TYPES:
        d["gated_mlp"] = mt in _GATED_TYPES
    else:  # no model_type: a Llama-style decoder, gated when its activation is a SiLU
        d["gated_mlp"] = act in _GATED_ACTS
        kind = ("gated (gate x up, 3 matrices)" if d["gated_mlp"] else
                "not gated (2 matrices)")
        notes.append(f"MLP {kind}: hidden_act={act!r} (no model_type names the MLP module)")
    if mt in ("gemma", "gemma2", "gemma3_text"):
        notes.append(f"{mt}: GeGLU MLP ({act} gate x up, 3 matrices)")
    if "swiglu_limit" in cfg:
        used.add("swiglu_limit")
        notes.append(f"SwiGLU clamp swiglu_limit={cfg['swiglu_limit']}: elementwise, not "
                     f"modeled")
    rms = "rms_norm_eps" in cfg or mt.startswith("gemma")
    d["norm"] = "rmsnorm" if rms else "layernorm"
    tied = take("tie_word_embeddings")
    if tied is None:
        tied = mt in _TIED_BY_DEFAULT
        cls = _DEFAULTS_CLASS.get(mt, f"{mt or 'PretrainedConfig'} config")
        notes.append(f"tie_word_embeddings absent: {str(tied).lower()}, the default of "
                     f"transformers' {cls}")
    d["tied_embeddings"] = tied  # checked by load._flag (true or false)
    # LlamaConfig (and the configs copied from it: Mistral, Qwen3, Phi-3, ...): attention_bias
    # puts biases on q/k/v/o, mlp_bias on gate/up/down (transformers' LlamaAttention /
    # LlamaMLP `bias=config.mlp_bias`). A model with MLP biases only was read without any
    # bias before (mlp_bias was not read).
    attn_bias, mlp_bias = bool(take("attention_bias")), bool(take("mlp_bias"))
    bias = attn_bias or mlp_bias or mt in ("gpt2", "gpt_neox", "gpt_oss") or bool(
        cfg.get("bias") and mt in ("falcon", "RefinedWeb", "RefinedWebModel"))
    d["biases"] = bias
    if attn_bias != mlp_bias and "mlp_bias" in cfg:
        extra = ("the attention's ((a + 2 a_kv) d_h + h per layer)" if mlp_bias else
                 "the MLP's ((1 + gated) f + h per layer)")
        notes.append(f"attention_bias={str(attn_bias).lower()}, mlp_bias="
                     f"{str(mlp_bias).lower()}: diffperf's one `biases` switch puts biases on "
                     f"every linear layer, so {extra} are counted too (< 0.01 % of the "
                     f"parameters, no FLOPs of note)")
    if mt in ("qwen2", "qwen2_moe") and not bias:
        notes.append("Qwen2: the q/k/v projections' biases ((a + 2 a_kv) d_h per layer, "
                     "< 0.01 % of the parameters) are not counted")
    if mt == "gpt_neox":
        used.update(("use_parallel_residual", "rotary_pct"))
        notes.append("GPT-NeoX: parallel residual (use_parallel_residual) costs the same "
                     "FLOPs as the sequential block; partial rotary (rotary_pct) has no cost")
    d["learned_positions"] = learned
    # QK-norm (docs/models.md): an RMSNorm on the queries and keys, over each head's d_h in
    # transformers' Qwen3Attention, Qwen3MoeAttention and Gemma3Attention (q_norm / k_norm
    # of head_dim), over the whole projection in Olmo2Attention (q_norm of a d_h, k_norm of
    # a_kv d_h). Its weights, traffic, kernels and saved inputs are priced (Model.qk_norm).
    if mt in _QK_NORM_TYPES:
        d["qk_norm"] = _QK_NORM_TYPES[mt]
    # OLMo 2 (transformers docs model_doc/olmo2.md: RMSNorm, a norm on the queries and keys,
    # the norms after attention / feed-forward instead of before): Olmo2Attention and
    # Olmo2MLP are Llama's (q/k/v/o, gate/up/down); the weights of allenai/OLMo-2-1124-13B
    # (model.safetensors.index.json) are exactly those plus post_attention_layernorm,
    # post_feedforward_layernorm, q_norm (a d_h) and k_norm (a_kv d_h) per layer.
    if mt == "olmo2":
        notes.append("olmo2: norms after attention and MLP (post-norm) cost as pre-norms; "
                     "QK-norm over the whole q / k projection ((a + a_kv) d_h weights per "
                     "layer)")

    # MoE: experts, top-k, widths, dense layers, shared experts.
    experts_key, experts = take_item("num_local_experts", "n_routed_experts", "num_experts")
    if experts:
        d["moe_experts"] = experts
        d["moe_topk"] = take("num_experts_per_tok", "experts_per_token", "moe_topk")
        if d["moe_topk"] is None:
            raise SpecError(f"{where}: missing num_experts_per_tok (the experts each token is "
                            f"routed to, a whole number in 1..{experts}) beside "
                            f"{experts_key}={experts}")
        used.update(("num_experts_per_tok", "experts_per_token"))
        fe = take("moe_intermediate_size")
        if fe is None and mt in _OWN_EXPERT_WIDTH:
            raise SpecError(f"{where}: missing moe_intermediate_size (the width of each "
                            f"expert) for model_type={mt!r}, whose experts are narrower than "
                            f"intermediate_size (the dense MLP's); allowed: a whole number >= "
                            f"1 in the file")
        d["moe_ffn_hidden"] = fe if fe is not None else d.get("ffn_hidden")
        shared = take("n_shared_experts")
        shared_w = take("shared_expert_intermediate_size")
        if shared_w:  # Qwen2-MoE: one shared expert of its own width (with a sigmoid gate)
            d["moe_shared_experts"] = 1
            d["moe_shared_ffn_hidden"] = shared_w
            notes.append(f"one shared expert of width shared_expert_intermediate_size="
                         f"{shared_w} (its 1 x h gate is not counted)")
        elif shared:
            d["moe_shared_experts"] = shared
        L = d["num_layers"]
        dense = 0
        if take("first_k_dense_replace"):
            dense = min(_whole(cfg["first_k_dense_replace"], "first_k_dense_replace", where), L)
            freq = _whole(take("moe_layer_freq") or 1, "moe_layer_freq", where, minimum=1)
            if freq != 1:
                sparse = sum(1 for i in range(dense, L) if i % freq == 0)
                dense = L - sparse
        step = take("decoder_sparse_step")
        if step is not None:  # transformers: (i + 1) % step, so 0 divides by zero there
            step = _whole(step, "decoder_sparse_step", where, minimum=1)
        only = take("mlp_only_layers") or []
        if not isinstance(only, list):
            raise SpecError(f"{where}: mlp_only_layers={only!r} must be a list of layer indices")
        only = {_whole(i, "mlp_only_layers[]", where) for i in only}
        if step or only:
            step = _whole(step or 1, "decoder_sparse_step", where, minimum=1)
            sparse = sum(1 for i in range(L) if i not in only and (i + 1) % step == 0)
            dense = L - sparse
        if dense:
            d["moe_dense_layers"] = dense
            notes.append(f"{dense} of {L} layers have a dense MLP of intermediate_size="
                         f"{d.get('ffn_hidden')} (costs are the mean layer)")
        used.update(("moe_layer_freq", "mlp_only_layers", "decoder_sparse_step"))
        for k in ("capacity_factor", "router_aux_loss_coef", "norm_topk_prob", "scoring_func",
                  "topk_method", "n_group", "topk_group", "routed_scaling_factor",
                  "output_router_logits", "router_jitter_noise", "aux_loss_alpha",
                  "seq_aux", "ep_size"):
            used.add(k)
        notes.append("MoE routing as dropless, balanced top-k (routing policy fields not "
                     "modeled)")
    mtp = take("num_nextn_predict_layers")
    if mtp is not None:
        mtp = _whole(mtp, "num_nextn_predict_layers", where)
    if mtp:
        d["mtp_layers"] = mtp
        notes.append(f"multi-token prediction: {mtp} module(s) trained on the last stage "
                     f"(num_nextn_predict_layers); their parameters are reported apart; "
                     f"use a model YAML with mtp_layers: 0 to leave them out")

    # Sliding windows: layer_types (GPT-OSS, newer transformers), Gemma 2 (every other layer),
    # Gemma 3 (sliding_window_pattern), Mistral (every layer), Qwen2 / 2.5 / 3 and their MoE:
    # transformers' Qwen2Config (configuration_qwen2.py; Qwen3, Qwen2-MoE, Qwen3-MoE alike)
    # keeps the window only when use_sliding_window (default false), and then on layers
    # i >= max_window_layers (default 28): L - max_window_layers sliding layers.
    window = take("sliding_window")
    qwen = mt in _QWEN_WINDOW_TYPES
    use = cfg.get("use_sliding_window")
    use = (not qwen) if use is None else use
    used.update(("use_sliding_window", "max_window_layers", "sliding_window_pattern",
                 "layer_types"))
    L = d["num_layers"]
    if window is not None:
        window = _whole(window, "sliding_window", where)
    if window and use is not False:
        types = cfg.get("layer_types")
        why = "layer_types has no sliding_attention layer"
        if isinstance(types, list) and types:
            n_sw = min(sum(1 for t in types if t == "sliding_attention"), L)
        elif mt == "gemma2":
            n_sw = (L + 1) // 2  # even layers (0, 2, ...) slide (Gemma2DecoderLayer)
        elif mt == "gemma3_text":
            pattern = _whole(cfg.get("sliding_window_pattern") or 6, "sliding_window_pattern",
                             where, minimum=1)
            n_sw = L - L // pattern  # every pattern-th layer is global
        elif qwen:
            first = cfg.get("max_window_layers")
            first = 28 if first is None else _whole(first, "max_window_layers", where)
            n_sw = max(0, L - first)  # layers max_window_layers .. L-1 slide
            why = f"max_window_layers={first} >= num_hidden_layers={L}"
        else:
            n_sw = L
        if n_sw:
            d["sliding_window"] = window
            d["sliding_window_layers"] = n_sw
            notes.append(f"sliding-window attention: window {window} on {n_sw} of {L} layers"
                         + (f" (no effect at seq_len {d['seq_len']} <= window)"
                            if window >= d["seq_len"] else ""))
        else:
            notes.append(f"sliding_window={window} on no layer: {why}")
    elif window:
        notes.append(f"sliding_window={window} ignored: use_sliding_window is "
                     + ("false" if cfg.get("use_sliding_window") is not None else
                        f"absent (false, the default of transformers' {mt} config)"))
    if mt == "gpt_oss":
        d["attention_sinks"] = True
        notes.append("attention sinks: one learned logit per head (parameters counted, "
                     "FLOPs negligible)")

    if isinstance(cfg.get("quantization_config"), dict):
        used.add("quantization_config")
        q = cfg["quantization_config"].get("quant_method", "?")
        notes.append(f"quantization_config ({q}) is the checkpoint's storage format; the "
                     f"training precision is --precision")
    d["name"] = str(top.get("_name_or_path") or top.get("model_type") or where)
    used.update(("_name_or_path", "model_type", "text_config", "vision_config"))
    ignored = sorted(k for k in cfg if k not in used and k not in _NO_COST)
    if ignored:
        notes.append("config.json fields not read: " + ", ".join(ignored))
    return d, notes
