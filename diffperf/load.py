"""Load and validate specs from YAML, Hugging Face config.json and runs CSV files.

The one place (with cli/) that reads files, and the one place that converts human units
(GB/s, us, TFLOPs) to SI. Every check runs on concrete values before anything is traced and
raises SpecError naming the field, the value and what is allowed (STYLE.md section 5).
"""

from __future__ import annotations

import csv
import json
import math
import re
from pathlib import Path

import numpy as np
import yaml

from diffperf import resources
from diffperf.errors import SpecError, closest, number_spelling, printable
from diffperf.specs.model import QK_NORM_FORMS, Model
from diffperf.specs.system import Efficiency, Reliability, System, Tier
from diffperf.specs.training import PRECISIONS, Training
from diffperf.specs.validate import CAPACITY_WHY, divisors



def _configs_dir():
    """The shipped configs/ folder, package data read through importlib.resources
    (diffperf.resources): the same files in a wheel, an editable install and a checkout."""
    return resources.configs_dir()


def _check_keys(d, allowed, where):
    if not isinstance(d, dict):
        raise SpecError(f"{where}: expected a mapping of keys to values, got {type(d).__name__}")
    for key in d:
        if key not in allowed:
            raise SpecError(f"{where}: unknown key {str(key)!r}{closest(key, allowed)} "
                            f"(allowed: {', '.join(sorted(allowed))})")


# Keys only one kind of file has. A model, system or overlay file given where another kind
# goes (--system my-model.yaml) was refused as "unknown key 'num_layers' (allowed: <the
# other kind's keys>)"; it is named as the kind it is, with the option it belongs to.
_KIND_MARKS = {"model": ("num_layers", "num_heads"),
               "Hugging Face model config": ("num_hidden_layers", "num_attention_heads"),
               "system": ("tiers", "matmul_TFLOPs"),
               "calibration overlay": ("fitted_on", "created_by", "heldout")}
_KIND_OPTION = {"model": "--model", "Hugging Face model config": "--model",
                "system": "--system", "calibration overlay": "--calibration"}


def _check_kind(d, expected: str, where: str) -> None:
    """Refuse a mapping that has the marks of another kind of file and none of `expected`'s,
    naming the kind found and its option."""
    if not isinstance(d, dict) or any(k in d for k in _KIND_MARKS[expected]):
        return
    for kind, marks in _KIND_MARKS.items():
        found = [k for k in marks if k in d]
        if kind == "Hugging Face model config" and expected == "model" and found:
            # a config.json's fields in a .yaml (or a mapping): --model is the right option,
            # the file's name is not (a Hugging Face config is read from a .json or its folder)
            raise SpecError(f"{where}: Hugging Face config.json fields (it has "
                            f"{', '.join(found)}), not diffperf model keys: a Hugging Face "
                            f"config is read from a .json file or the folder holding "
                            f"config.json (allowed: that, or the model keys of configs/README.md)")
        if kind != expected and found:
            raise SpecError(f"{where}: a {kind} file (it has {', '.join(found)}), not a "
                            f"{expected} file: give it to {_KIND_OPTION[kind]}")


# Every number must be representable in float32 after the unit conversion (x 1e12 for TFLOPs):
# a magnitude over 1e18 or a positive value under 1e-12 (in the file's units) is refused.
_MAX_MAGNITUDE = 1e18
_MIN_POSITIVE = 1e-12
_MAX_INTEGER = 2**31  # sizes (layers, heads, vocab, degrees, batch): far above any real one


def _number(d, key, where, *, integer=False, minimum=None, positive=False, default=None):
    """A finite number from d[key], checked; `default` when absent (None = required)."""
    if key not in d or d[key] is None:
        if default is None:
            raise SpecError(f"{where}: missing required key '{key}'")
        return default
    v = d[key]
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        text = str(v).strip()
        if not text.isascii():
            raise SpecError(f"{where}.{key}={d[key]!r} must be a number")
        said = number_spelling(text, yaml11=isinstance(v, Yaml11Number))
        if said:  # '1_000', '0x1F' (a YAML file's Yaml11Number, a CSV cell, --set)
            raise SpecError(f"{where}.{key}={text} is written {said[0]}; allowed: {said[1]}",
                            field=key, value=text)
        try:
            v = float(text.replace("_", "x"))  # refuse Python's '1_000' digit grouping
        except (ValueError, OverflowError):
            raise SpecError(f"{where}.{key}={d[key]!r} must be a number") from None
    try:
        v = float(v)
    except OverflowError:
        raise SpecError(f"{where}.{key} is too large (at most {_MAX_MAGNITUDE:g})") from None
    if not math.isfinite(v):
        raise SpecError(f"{where}.{key}={v} must be a finite number")
    if abs(v) > _MAX_MAGNITUDE or (integer and v > _MAX_INTEGER):
        limit = _MAX_INTEGER if integer else _MAX_MAGNITUDE
        raise SpecError(f"{where}.{key}={v:g} is out of range (at most {limit:g})")
    if integer and v != int(v):
        raise SpecError(f"{where}.{key}={v:g} must be a whole number")
    if positive and v < (1 if integer else _MIN_POSITIVE):
        raise SpecError(f"{where}.{key}={v:g} must be > 0" + (
            "" if v <= 0 else f" and at least {_MIN_POSITIVE:g}"))
    if minimum is not None and v < minimum:
        raise SpecError(f"{where}.{key}={v:g} must be >= {minimum:g}")
    return int(v) if integer else float(v)


_FLAG_WORDS = ("true", "false", "0", "1", "yes", "no")  # a CSV cell's spellings of a flag


def _flag(d, key, where, default):
    v = d.get(key, default)
    if isinstance(v, bool) or v in (0, 1):
        return float(bool(v))
    if isinstance(v, str) and v.strip().lower() in _FLAG_WORDS:
        return float(v.strip().lower() in ("true", "1", "yes"))
    raise SpecError(f"{where}.{key}={v!r} must be true or false")


def _choice(d, key, where, choices, default):
    v = d.get(key, default)
    if v not in choices:
        raise SpecError(f"{where}.{key}={v!r} is not allowed{closest(v, choices)} "
                        f"(allowed: {', '.join(choices)})")
    return v


def read_text(path) -> str:
    """A file's UTF-8 text, with a clear error for a missing, unreadable or binary file."""
    path = Path(path)
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise SpecError(f"{path}: not a UTF-8 text file") from None
    except OSError as err:
        raise SpecError(f"{path}: cannot read ({err.strerror or err})") from None


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping (YAML keeps the last) and
    any alias (*name): a chain of aliases expands a 1 KB file into gigabytes (issue 20)."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(
                None, None, f"YAML aliases are not allowed (*{str(event.anchor)[:40]}; write "
                "the value out)", event.start_mark)
        return super().compose_node(parent, index)

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {str(key)!r}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


# YAML 1.2's floats with an exponent ("1e3", "1.5e3", "-2E-5"): PyYAML implements YAML 1.1,
# whose float needs a dot and a signed exponent, and reads `budget: 1e6` or `1.5e3` as a
# string. A string where a number goes is refused (`typed_values`), so the unquoted form is
# read as the number YAML 1.2 (and a reader of the file) takes it for; a quoted "1e6" stays a
# string.
_YAML12_EXPONENT = re.compile(r"^[-+]?(\.[0-9]+|[0-9][0-9_]*(\.[0-9_]*)?)[eE][-+]?[0-9]+$")
_UniqueKeyLoader.add_implicit_resolver("tag:yaml.org,2002:float", _YAML12_EXPONENT,
                                       list("-+.0123456789"))


class Yaml11Number(str):
    """A YAML number that only YAML 1.1 (PyYAML) reads so: `1_000` ('_' digit grouping),
    `010` (octal 8 there, decimal 10 in YAML 1.2), `0x1F`, `0b101`, `1:30` (base 60),
    kept as its text, which `_number` refuses, naming the field, the value and the plain
    spelling (errors.number_spelling). YAML 1.2's core schema, JSON (RFC 8259), a runs CSV
    cell and --set read these otherwise or not at all, so one spelling is refused everywhere
    rather than read differently by file type and reader."""


def _ungrouped(construct):
    """A YAML int / float constructor that keeps a Yaml11Number as its text (any value
    written with '_', or with a spelling `number_spelling` names)."""
    def constructor(loader, node):
        if "_" in str(node.value) or number_spelling(node.value, yaml11=True):
            return Yaml11Number(node.value)
        return construct(loader, node)
    return constructor


for _tag, _construct in (("int", yaml.constructor.SafeConstructor.construct_yaml_int),
                         ("float", yaml.constructor.SafeConstructor.construct_yaml_float)):
    _UniqueKeyLoader.add_constructor(f"tag:yaml.org,2002:{_tag}", _ungrouped(_construct))


class _Dumper(yaml.SafeDumper):
    """SafeDumper that knows the loader's exponent floats: PyYAML's own writes the string
    '1e3' (a run id, a file name, a short commit hash such as '2716e35') unquoted, which
    `read_yaml` reads back as the number 1000.0 (and '1e400' as inf); this one quotes it."""


_Dumper.add_implicit_resolver("tag:yaml.org,2002:float", _YAML12_EXPONENT,
                              list("-+.0123456789"))


def dump_yaml(data) -> str:
    """YAML text of `data` (yaml.safe_dump's, keys in their order) that `read_yaml` reads
    back as the same values: a string that reads as an exponent float is quoted."""
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False)


def read_yaml(path) -> dict:
    """Parse a YAML file into a mapping, with a clear error for malformed files."""
    path = Path(path)
    text = read_text(path)
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 (a SafeLoader)
    except yaml.YAMLError as err:
        raise SpecError(f"{path}: malformed YAML: {' '.join(str(err).split())}") from None
    except RecursionError:
        raise SpecError(f"{path}: malformed YAML: nested too deeply") from None
    if not isinstance(data, dict):
        raise SpecError(f"{path}: expected a YAML mapping at the top level, got "
                        f"{type(data).__name__}")
    return data


MODEL_KEYS = ("name", "description", "sources", "num_layers", "hidden", "ffn_hidden",
              "num_heads", "num_kv_heads", "head_dim", "vocab", "seq_len", "gated_mlp",
              "attention", "norm", "tied_embeddings", "biases", "learned_positions",
              "moe_experts", "moe_topk", "moe_ffn_hidden", "moe_shared_experts",
              "moe_capacity_factor", "moe_dense_layers", "moe_shared_ffn_hidden",
              "v_head_dim", "kv_lora_rank", "q_lora_rank", "qk_rope_head_dim",
              "sliding_window", "sliding_window_layers", "attention_sinks", "mtp_layers",
              "qk_norm", "global_batch")


MODEL_FLAGS = ("gated_mlp", "tied_embeddings", "biases", "learned_positions",
               "attention_sinks")
MODEL_TEXT_KEYS = ("name", "description", "sources", "attention", "norm", "qk_norm")


def typed_values(d: dict, keys, flags, where: str, joiner: str = ".") -> None:
    """Refuse a string that reads as a value where a typed file (YAML, JSON, a Python mapping)
    must give a number (`keys`) or true / false (`flags`): `hidden: "768"` or `gated_mlp:
    "yes"` is a quoted value, most often a template filled in or a column pasted from a
    spreadsheet, which `_number` / `_flag` would read silently (any other string gets their
    own "must be a number" / "must be true or false"), and
    Hugging Face transformers' config classes refuse it too (PreTrainedConfig is a
    huggingface_hub `@strict` dataclass since transformers PR #41250). A runs CSV's cells
    are text by nature and are not checked here."""
    def reads(v, flag):  # a string the readers (_number, _flag) would take as a value
        text = v.strip().lower()
        if flag:
            return text in _FLAG_WORDS
        try:
            float(text.replace("_", "x"))
        except (ValueError, OverflowError):
            return False
        return text.isascii()

    for key in (*keys, *flags):
        v = d.get(key) if isinstance(d, dict) else None
        if isinstance(v, str) and not isinstance(v, Yaml11Number) and reads(v, key in flags):
            want = ("true or false, unquoted" if key in flags else
                    "a number, written without quotes")
            raise SpecError(f"{where}{joiner}{key}={v!r} is a string (type str), not "
                            f"{'true / false' if key in flags else 'a number'}; allowed: "
                            f"{want}", field=key, value=v)


def model_from_dict(d: dict, where: str = "model", cells: bool = False) -> Model:
    """A validated Model from the YAML schema of configs/README.md (keys as the runs CSV).
    `global_batch` (the model's published training batch, `default_global_batch`) is checked
    here but belongs to the job, not to the Model. `cells`: the values are a runs CSV row's
    text cells; otherwise (a YAML or JSON file, a mapping) a number or flag given as a string
    is refused (`typed_values`)."""
    _check_kind(d, "model", where)
    _check_keys(d, MODEL_KEYS, where)
    if not cells:
        typed_values(d, [k for k in MODEL_KEYS if k not in MODEL_TEXT_KEYS + MODEL_FLAGS],
                     MODEL_FLAGS, where)
    _number(d, "global_batch", where, integer=True, positive=True, default=1)
    n = lambda k, **kw: _number(d, k, where, **kw)  # noqa: E731
    heads = n("num_heads", integer=True, positive=True)
    hidden = n("hidden", integer=True, positive=True)
    kv = n("num_kv_heads", integer=True, positive=True, default=heads)
    if heads % kv:
        raise SpecError(f"{where}: num_kv_heads={kv} must divide num_heads={heads}; allowed "
                        f"num_kv_heads: {', '.join(str(x) for x in divisors(heads))}")
    if "head_dim" not in d and hidden % heads:
        raise SpecError(f"{where}: hidden={hidden} is not a multiple of num_heads={heads}; "
                        f"give head_dim explicitly")
    experts = n("moe_experts", integer=True, minimum=0, default=0)
    topk = n("moe_topk", integer=True, minimum=0, default=0)
    if experts and not 1 <= topk <= experts:
        raise SpecError(f"{where}: moe_topk={topk} must be in 1..moe_experts={experts}")
    if experts and not d.get("moe_ffn_hidden"):
        raise SpecError(f"{where}: moe_ffn_hidden must be > 0 when moe_experts={experts}")
    capacity = n("moe_capacity_factor", positive=True, default=1.0)
    if experts and capacity > experts / topk:
        raise SpecError(
            f"{where}.moe_capacity_factor={capacity:g} is above moe_experts / moe_topk={experts}"
            f" / {topk}: {CAPACITY_WHY}; allowed: > 0 and at most {experts / topk:g}")
    if not experts:  # MoE keys on a dense model would be read by nothing
        for key, neutral in (("moe_topk", 0), ("moe_ffn_hidden", 0), ("moe_shared_experts", 0),
                             ("moe_shared_ffn_hidden", 0), ("moe_capacity_factor", 1)):
            v = n(key, minimum=0, default=neutral)
            if v != neutral:
                raise SpecError(f"{where}.{key}={v:g} describes MoE layers, but moe_experts=0 "
                                f"(a dense model); allowed: {neutral} or leave it out")
    attention = _choice(d, "attention", where, ("causal", "full"), "causal")
    norm = _choice(d, "norm", where, ("layernorm", "rmsnorm"), "layernorm")
    arch = _architecture_features(d, where, n, experts)
    return Model(
        n_layers=float(n("num_layers", integer=True, positive=True)), hidden=float(hidden),
        ffn_hidden=float(n("ffn_hidden", integer=True, positive=True, default=4 * hidden)),
        n_heads=float(heads), n_kv_heads=float(kv),
        head_dim=float(n("head_dim", integer=True, positive=True, default=hidden // heads)),
        vocab=float(n("vocab", integer=True, positive=True)),
        seq_len=float(n("seq_len", integer=True, positive=True)),
        gated_mlp=_flag(d, "gated_mlp", where, False), causal=float(attention == "causal"),
        rms_norm=float(norm == "rmsnorm"),
        tied_embeddings=_flag(d, "tied_embeddings", where, False),
        biases=_flag(d, "biases", where, False),
        learned_positions=_flag(d, "learned_positions", where, False),
        n_experts=float(experts), moe_topk=float(topk),
        moe_ffn_hidden=float(n("moe_ffn_hidden", integer=True, minimum=0, default=0)),
        n_shared_experts=float(n("moe_shared_experts", integer=True, minimum=0, default=0)),
        capacity_factor=capacity,
        **arch, name=printable(d.get("name", where)))


def _architecture_features(d, where, n, experts) -> dict:
    """The Model leaves of MLA, dense layers of an MoE model, shared-expert width, sliding
    windows, attention sinks and MTP (docs/models.md), checked."""
    layers = n("num_layers", integer=True, positive=True)
    kv_lora = n("kv_lora_rank", integer=True, minimum=0, default=0)
    rope = n("qk_rope_head_dim", integer=True, minimum=0, default=0)
    q_lora = n("q_lora_rank", integer=True, minimum=0, default=0)
    if not kv_lora and (rope or q_lora):
        raise SpecError(f"{where}: qk_rope_head_dim / q_lora_rank describe multi-head latent "
                        f"attention and need kv_lora_rank > 0 (got kv_lora_rank=0)")
    if kv_lora:
        dh = n("head_dim", integer=True, positive=True)
        if rope >= dh:
            raise SpecError(f"{where}: qk_rope_head_dim={rope} must be < head_dim={dh} "
                            f"(head_dim = qk_nope_head_dim + qk_rope_head_dim under MLA)")
    dense = n("moe_dense_layers", integer=True, minimum=0, default=0)
    if dense and not experts:
        raise SpecError(f"{where}: moe_dense_layers={dense} needs moe_experts > 0")
    if dense >= layers:
        raise SpecError(f"{where}: moe_dense_layers={dense} must be < num_layers={layers} "
                        f"(for a dense model set moe_experts: 0)")
    window = n("sliding_window", integer=True, minimum=0, default=0)
    sliding = n("sliding_window_layers", integer=True, minimum=0,
                default=layers if window else 0)
    if sliding > layers:
        raise SpecError(f"{where}: sliding_window_layers={sliding} must be <= "
                        f"num_layers={layers}")
    if sliding and not window:
        raise SpecError(f"{where}: sliding_window_layers={sliding} needs sliding_window > 0")
    sinks = _flag(d, "attention_sinks", where, False)
    qk = _choice(d, "qk_norm", where, QK_NORM_FORMS, "none")
    if qk != "none" and kv_lora:
        raise SpecError(f"{where}.qk_norm={qk!r} with kv_lora_rank={kv_lora}: multi-head latent "
                        f"attention norms its latents (counted with kv_lora_rank), not its "
                        f"queries and keys; allowed: none", field="qk_norm", value=qk)
    return dict(
        v_head_dim=float(n("v_head_dim", integer=True, minimum=0, default=0)),
        kv_lora_rank=float(kv_lora), q_lora_rank=float(q_lora), qk_rope_head_dim=float(rope),
        moe_dense_layers=float(dense),
        shared_expert_ffn_hidden=float(n("moe_shared_ffn_hidden", integer=True, minimum=0,
                                         default=0)),
        sliding_window=float(window), sliding_layers=float(sliding), attention_sinks=sinks,
        mtp_layers=float(n("mtp_layers", integer=True, minimum=0, default=0)),
        qk_norm=float(QK_NORM_FORMS.index(qk)))


# Hugging Face fields refused by name (diffperf.hf; re-exported for the fuzz tests).
from diffperf.hf import _REFUSED as _HF_UNSUPPORTED  # noqa: E402


def model_from_hf(cfg: dict, where: str, seq_len=None) -> Model:
    """A Model from a parsed Hugging Face config.json (`diffperf.hf.hf_to_dict`: the families,
    defaults and notes of docs/models.md). The training sequence is `seq_len`, else
    hf.DEFAULT_SEQ_LEN (never max_position_embeddings)."""
    from diffperf.hf import hf_to_dict

    if isinstance(cfg, dict) and not isinstance(cfg.get("text_config"), dict):
        found = [k for k in _KIND_MARKS["model"] if k in cfg]
        if found and not any(k in cfg for k in _KIND_MARKS["Hugging Face model config"]):
            raise SpecError(f"{where}: diffperf model keys (it has {', '.join(found)}) in a "
                            f".json file, which is read as a Hugging Face config.json "
                            f"(allowed: the model keys in a .yaml or .yml file, JSON being "
                            f"YAML too, or a Hugging Face config.json)")
        _check_kind(cfg, "Hugging Face model config", where)  # a system / overlay .json
    return model_from_dict(hf_to_dict(cfg, where, seq_len)[0], where)


def _read_json(path: Path) -> dict:
    text = read_text(path)
    try:
        cfg = json.loads(text)
    except json.JSONDecodeError as err:
        raise SpecError(f"{path}: malformed JSON: {err.msg} at line {err.lineno}") from None
    except RecursionError:
        raise SpecError(f"{path}: malformed JSON: nested too deeply") from None
    if not isinstance(cfg, dict):
        raise SpecError(f"{path}: expected a JSON object at the top level")
    return cfg


def load_model(name_or_path, seq_len=None) -> Model:
    """A model by name (configs/models/NAME.yaml), YAML path, Hugging Face config.json, or a
    mapping of the YAML schema's keys (configs/README.md), validated. `seq_len` (tokens)
    replaces the file's training sequence (a config.json has none: hf.DEFAULT_SEQ_LEN)."""
    if isinstance(name_or_path, dict):
        model = model_from_dict(name_or_path, where="model")
    else:
        path = _model_file(name_or_path)
        if path.suffix == ".json":
            return model_from_hf(_read_json(path), str(path), seq_len)
        model = model_from_dict(read_yaml(path), str(path))
    if seq_len is None:
        return model
    # The same check as a config.json's seq_len (hf_to_dict -> model_from_dict): a whole
    # number of tokens >= 1, else a SpecError naming the value.
    where = "model" if isinstance(name_or_path, dict) else str(path)
    seq = _number({"seq_len": seq_len}, "seq_len", where, integer=True, positive=True)
    return model.replace(seq_len=float(seq))


# The rule for a model whose file states no training batch: about 4M tokens per step, the
# batch of every Llama 2 size (Touvron et al. 2023, arXiv:2307.09288, Section 2.2: "global
# batch-size of 4M tokens") and of Llama 3's first stage (Llama 3 paper, arXiv:2407.21783,
# Section 3.4.1: 4M tokens at 4096), near GPT-3 175B's 3.2M (Brown et al. 2020, Table 2.1).
# In sequences: 2^22 / seq_len rounded to the nearest power of two (so that the usual power-of-
# two data-parallel degrees divide it).
DEFAULT_BATCH_TOKENS = 2 ** 22


def default_global_batch(name_or_path, seq_len=None) -> tuple[int, str | None]:
    """(sequences per optimizer step, note) when --global-batch is not given. A model YAML's
    `global_batch` (its published batch, cited in its sources) at the file's seq_len: note
    None; with another `seq_len` the same tokens per step (rounded, >= 1), noted. A model with
    none (a Hugging Face config.json, most YAMLs): DEFAULT_BATCH_TOKENS / seq_len rounded to
    the nearest power of two, noted with the rule."""
    if isinstance(name_or_path, dict):
        d, where = name_or_path, "model"
    else:
        path = _model_file(name_or_path)
        d = {} if path.suffix == ".json" else read_yaml(path)
        where = str(path)
    model = load_model(name_or_path, seq_len)
    seq = int(model.seq_len)
    stated = d.get("global_batch")
    if stated is not None:
        stated = int(_number(d, "global_batch", where, integer=True, positive=True))
        file_seq = int(_number(d, "seq_len", where, integer=True, positive=True))
        if seq == file_seq:
            return stated, None
        batch = max(1, round(stated * file_seq / seq))
        return batch, (f"global batch {batch} sequences of {seq} tokens: {model.name}'s "
                       f"published {stated} x {file_seq} tokens at --seq-len {seq} "
                       f"(give --global-batch to choose)")
    batch = 2 ** max(0, round(math.log2(DEFAULT_BATCH_TOKENS / seq)))
    return batch, (f"global batch {batch} sequences of {seq} tokens ({batch * seq / 1e6:.2f}M "
                   f"tokens per step): {model.name} states no training batch, so diffperf "
                   f"takes ~4M tokens (Llama 2's, 2^22) / seq_len rounded to a power of two; "
                   f"give --global-batch to choose")


def model_notes(name_or_path, seq_len=None) -> list[str]:
    """What loading the model chose or left out, for `predict` to print: for a Hugging Face
    config.json the notes of `diffperf.hf.hf_to_dict` (training sequence, defaults, fields
    read but not modeled, fields not read); for a YAML or name, where seq_len came from."""
    path = None if isinstance(name_or_path, dict) else _model_file(name_or_path)
    if path is not None and path.suffix == ".json":
        from diffperf.hf import hf_to_dict

        notes = hf_to_dict(_read_json(path), str(path), seq_len)[1]
        if path != Path(name_or_path):
            notes.insert(0, f"read {path} (the folder's config.json)")
        return notes
    if seq_len is not None:
        return [f"seq_len={seq_len} from --seq-len"]
    return []


def _model_file(name_or_path) -> Path:
    """The file a model argument names: a Hugging Face config.json (any .json), a YAML (.yaml,
    .yml), a folder holding a config.json (a Hugging Face snapshot folder, as transformers'
    from_pretrained takes it), or a shipped name (configs/models/NAME.yaml). A path that does
    not exist, or a folder without config.json, is said as such rather than looked up as a
    shipped name. A shipped name is the shipped model even where the working folder has a
    folder of that name (a snapshot downloaded as ./llama3-8b would otherwise replace the
    shipped YAML, in a shipped dataset's rows too, without a word): give ./NAME for the
    folder."""
    path = Path(name_or_path)
    if not str(name_or_path).strip():  # Path('') is the working folder
        raise SpecError(f"model name {str(name_or_path)!r} is empty (allowed: a shipped model "
                        f"name, a model .yaml, a Hugging Face config.json or the folder "
                        f"holding it)")
    if path.suffix in (".json", ".yaml", ".yml"):
        return path
    if str(name_or_path) in resources.config_files("models"):
        return _named(name_or_path, "models")
    try:
        is_dir, is_file = path.is_dir(), path.is_file()
    except (OSError, ValueError):  # a name too long for the file system, or with a NUL
        is_dir = is_file = False
    allowed = ("allowed: a shipped model name, a model .yaml, a Hugging Face config.json or "
               "the folder holding it")
    if is_dir and (path / "config.json").is_file():
        return path / "config.json"
    if is_dir:
        raise SpecError(f"{path}: a folder without config.json ({allowed})")
    if is_file:  # was "no such file or folder" (a file that exists)
        kind = f"suffix is {path.suffix!r}" if path.suffix else "name has no suffix"
        raise SpecError(f"{name_or_path}: the file's {kind} (a model file is read by its "
                        f"suffix: .yaml or .yml a model YAML, .json a Hugging Face "
                        f"config.json; {allowed})")
    if "/" in str(name_or_path) or "\\" in str(name_or_path):
        raise SpecError(f"{name_or_path}: no such file or folder ({allowed})")
    return _named(name_or_path, "models")


def _named(name, kind):
    """configs/KIND/NAME.yaml of the shipped configs (kind: models, systems, design)."""
    shipped = resources.config_files(kind)
    if str(name) not in shipped:
        singular = {"models": "model", "systems": "system", "design": "cost model"}[kind]
        if not str(name).strip():
            raise SpecError(f"{singular} name {str(name)!r} is empty (allowed: a shipped "
                            f"{singular} name ({', '.join(shipped)}) or a path to a .yaml "
                            f"file)")
        try:
            is_dir, is_file = Path(name).is_dir(), Path(name).is_file()
        except (OSError, ValueError):
            is_dir = is_file = False
        if kind != "models" and (is_dir or is_file):  # a path, not a name (was: "unknown")
            what = "a folder" if is_dir else (f"a file whose suffix is {Path(name).suffix!r}"
                                              if Path(name).suffix else
                                              "a file whose name has no suffix")
            raise SpecError(f"{name}: {what}, not a {singular} file (allowed: a shipped "
                            f"{singular} name ({', '.join(shipped)}) or a path to a .yaml "
                            f"file)")
        path_kinds = ("a .yaml file or a Hugging Face config.json (or its folder)"
                      if kind == "models" else "a .yaml file")
        raise SpecError(f"unknown {singular} '{name}'{closest(name, shipped)} "
                        f"(shipped: {', '.join(shipped)}; or give a path to {path_kinds})")
    return shipped[str(name)]


def model_names() -> list[str]:
    return list(resources.config_files("models"))


def system_names() -> list[str]:
    return list(resources.config_files("systems"))


SYSTEM_KEYS = ("name", "gpu", "description", "sources", "matmul_TFLOPs", "matmul_fp32_TFLOPs",
               "matmul_fp8_TFLOPs", "matmul_fp4_TFLOPs", "matmul_sustained_frac",
               "matmul_fp8_sustained_frac", "matmul_fp4_sustained_frac", "attn_fa2_fwd_frac",
               "attn_fa2_bwd_frac", "attn_fa2_half_GFLOP", "attn_fa2_exponent", "sfu_Texp_per_s",
               "attn_sink_bwd_row_ns", "gpu_sms", "fp8_non_tn_gemm", "vector_TFLOPs",
               "hbm_bandwidth_GBps", "hbm_capacity_GiB", "power_W", "tiers",
               "efficiency", "reliability")
TIER_KEYS = ("name", "domain_size", "bandwidth_GBps", "latency_us", "oversubscription")
_SYSTEM_NOT_NUMBERS = ("name", "gpu", "description", "sources", "tiers", "efficiency",
                       "reliability", "fp8_non_tn_gemm")
RELIABILITY_KEYS = ("failure_rate_per_device_hour", "storage_write_GBps", "restart_s")
# Keys of a system YAML (human units) and the System leaf each one sets, with its SI factor.
SYSTEM_UNITS = {"matmul_TFLOPs": ("matmul_flops_per_s", 1e12),
                "matmul_fp32_TFLOPs": ("matmul_fp32_flops_per_s", 1e12),
                "matmul_fp8_TFLOPs": ("matmul_fp8_flops_per_s", 1e12),
                "matmul_fp4_TFLOPs": ("matmul_fp4_flops_per_s", 1e12),
                "matmul_sustained_frac": ("matmul_sustained_frac", 1.0),
                "matmul_fp8_sustained_frac": ("matmul_fp8_sustained_frac", 1.0),
                "matmul_fp4_sustained_frac": ("matmul_fp4_sustained_frac", 1.0),
                "attn_fa2_fwd_frac": ("attn_fa2_fwd_frac", 1.0),
                "attn_fa2_bwd_frac": ("attn_fa2_bwd_frac", 1.0),
                "attn_fa2_half_GFLOP": ("attn_fa2_half_flop", 1e9),
                "attn_fa2_exponent": ("attn_fa2_exponent", 1.0),
                "sfu_Texp_per_s": ("sfu_exp_per_s", 1e12),
                "attn_sink_bwd_row_ns": ("attn_sink_bwd_row_s", 1e-9),
                "gpu_sms": ("gpu_sms", 1.0),
                "fp8_non_tn_gemm": ("fp8_non_tn_gemm", 1.0),
                "vector_TFLOPs": ("vector_flops_per_s", 1e12),
                "hbm_bandwidth_GBps": ("hbm_bandwidth_Bps", 1e9),
                "hbm_capacity_GiB": ("hbm_capacity_bytes", 2.0**30), "power_W": ("power_W", 1.0)}
TIER_UNITS = {"domain_size": ("domain_size", 1.0), "bandwidth_GBps": ("bandwidth_Bps", 1e9),
              "latency_us": ("latency_s", 1e-6), "oversubscription": ("oversubscription", 1.0)}
RELIABILITY_UNITS = {"failure_rate_per_device_hour": ("failure_rate_per_s", 1.0 / 3600.0),
                     "storage_write_GBps": ("storage_write_Bps", 1e9),
                     "restart_s": ("restart_s", 1.0)}


def _to_si(units: dict, human: dict) -> dict:
    """{leaf: value in SI} of a {YAML key: value in the key's unit} mapping (`*_UNITS`)."""
    return {units[k][0]: v * units[k][1] for k, v in human.items()}


def _to_human(units: dict, spec) -> dict:
    """{YAML key: value in the key's unit} of the leaves `units` names on a spec."""
    return {k: float(getattr(spec, leaf)) / f for k, (leaf, f) in units.items()}

EFFICIENCY_KEYS = tuple(Efficiency.__dataclass_fields__)
# Efficiencies that are fractions: must lie in (0, 1].
# Efficiencies that must be strictly positive (scales and exponents).
_POSITIVE = ("mm_half_dim", "mm_exponent", "attn_half_work", "attn_exponent",
             "attn_half_head_dim", "floor_pnorm", "act_mem_factor")
_EXPONENTS = ("mm_exponent", "attn_exponent")
_FRACTIONS = ("mm_max", "attn_max", "mem_eff", "coll_eff_intra", "coll_eff_inter",
              "mem_usable_frac")


def efficiency_from_dict(d: dict, where: str, base: Efficiency | None = None) -> Efficiency:
    """Efficiency parameters (overlay keys = field names of `Efficiency`), checked."""
    _check_keys(d, EFFICIENCY_KEYS, where)
    typed_values(d, EFFICIENCY_KEYS, (), where)
    base = base or Efficiency()
    values = {}
    for key in d:
        v = _number(d, key, where, minimum=0.0)
        if key in _FRACTIONS and not 1e-3 <= v <= 1:
            raise SpecError(f"{where}.{key}={v:g} must be in [0.001, 1]")
        if key in _POSITIVE and v <= 0:
            raise SpecError(f"{where}.{key}={v:g} must be > 0")
        if key in _EXPONENTS and not 0 < v <= 20:
            raise SpecError(f"{where}.{key}={v} must be in (0, 20]")
        if key == "mm_align_exponent" and not v <= 20:
            raise SpecError(f"{where}.{key}={v:g} must be in [0, 20] (GEMM efficiency x "
                            f"(alignment / 16 B)^{key}; 0: alignment costs nothing)")
        if key == "floor_pnorm" and not 1 <= v <= 100:
            raise SpecError(f"{where}.{key}={v} must be in [1, 100] (a p-norm)")
        values[key] = v
    return base.replace(**values)


def reliability_from_dict(d: dict, where: str) -> Reliability:
    """Failure rate, checkpoint storage and restart time (configs/README.md, "Reliability"),
    human units -> SI; an absent key keeps its default (`specs.system.Reliability`)."""
    _check_keys(d, RELIABILITY_KEYS, where)
    typed_values(d, RELIABILITY_KEYS, (), where)
    base = _to_human(RELIABILITY_UNITS, Reliability())
    n = lambda k, **kw: _number(d, k, where, default=base[k], **kw)  # noqa: E731
    # A zero rate (M = infinity) or bandwidth has no optimal checkpoint interval: refused.
    return Reliability(**_to_si(RELIABILITY_UNITS, {
        "failure_rate_per_device_hour": n("failure_rate_per_device_hour", positive=True),
        "storage_write_GBps": n("storage_write_GBps", positive=True),
        "restart_s": n("restart_s", minimum=0.0)}))


def system_from_dict(d: dict, where: str = "system") -> System:
    """A validated System from the YAML schema of configs/README.md (human units -> SI)."""
    _check_kind(d, "system", where)
    _check_keys(d, SYSTEM_KEYS, where)
    typed_values(d, [k for k in SYSTEM_KEYS if k not in _SYSTEM_NOT_NUMBERS],
                 ("fp8_non_tn_gemm",), where)
    tiers_in = d.get("tiers")
    if not isinstance(tiers_in, list) or not tiers_in:
        raise SpecError(f"{where}.tiers must be a non-empty list of network tiers "
                        f"(keys: {', '.join(TIER_KEYS)})")
    tiers = []
    for i, t in enumerate(tiers_in):
        tw = f"{where}.tiers[{i}]"
        _check_keys(t, TIER_KEYS, tw)
        typed_values(t, TIER_KEYS[1:], (), tw)
        tiers.append(Tier(**_to_si(TIER_UNITS, {
            "domain_size": _number(t, "domain_size", tw, positive=True),
            "bandwidth_GBps": _number(t, "bandwidth_GBps", tw, positive=True),
            "latency_us": _number(t, "latency_us", tw, minimum=0.0),
            "oversubscription": _number(t, "oversubscription", tw, minimum=1.0, default=1.0)}),
            name=printable(t.get("name", f"tier{i}"))))
    for i in range(1, len(tiers)):
        if tiers[i].domain_size < tiers[i - 1].domain_size:
            raise SpecError(f"{where}.tiers[{i}].domain_size={tiers[i].domain_size:g} must be "
                            f">= tiers[{i - 1}].domain_size={tiers[i - 1].domain_size:g} "
                            f"(tiers are nested, innermost first)")
    n = lambda k, **kw: _number(d, k, where, positive=True, **kw)  # noqa: E731
    matmul = n("matmul_TFLOPs")
    return System(
        **_to_si(SYSTEM_UNITS, {
            "matmul_TFLOPs": matmul,
            "matmul_fp32_TFLOPs": n("matmul_fp32_TFLOPs", default=matmul / 2),
            # absent: the device has no FP8 / FP4 tensor cores (0; low precision is refused)
            "matmul_fp8_TFLOPs": _number(d, "matmul_fp8_TFLOPs", where, minimum=0.0,
                                         default=0.0),
            "matmul_fp4_TFLOPs": _number(d, "matmul_fp4_TFLOPs", where, minimum=0.0,
                                         default=0.0),
            # absent: no published GEMM measurement of this GPU (0: the reference fraction)
            **{k: _fraction(d, k, where) for k in ("matmul_sustained_frac",
                                                   "matmul_fp8_sustained_frac",
                                                   "matmul_fp4_sustained_frac")},
            # absent: no published FlashAttention-2 rate of this GPU (0: no change)
            **{k: _fraction(d, k, where) for k in ("attn_fa2_fwd_frac", "attn_fa2_bwd_frac")},
            # absent: FA2 keeps the set's fall-off with work (0: no change)
            "attn_fa2_half_GFLOP": _number(d, "attn_fa2_half_GFLOP", where, minimum=0.0,
                                           default=0.0),
            "attn_fa2_exponent": _number(d, "attn_fa2_exponent", where, positive=True,
                                         default=1.0),
            # absent: no published exponential rate of this GPU (0: no floor, no change)
            "sfu_Texp_per_s": _number(d, "sfu_Texp_per_s", where, minimum=0.0, default=0.0),
            # absent: the sink gradient's backward cost not measured on this GPU (0: no change)
            "attn_sink_bwd_row_ns": _number(d, "attn_sink_bwd_row_ns", where, minimum=0.0,
                                            default=0.0),
            # absent: the GPU's SM count not given (0: tp_userbuffers = 2 refused)
            "gpu_sms": _number(d, "gpu_sms", where, minimum=0.0, default=0.0),
            # absent: FP8 GEMMs take the TN layout only (Hopper): 0, no change
            "fp8_non_tn_gemm": _flag(d, "fp8_non_tn_gemm", where, 0),
            "vector_TFLOPs": n("vector_TFLOPs", default=matmul / 16),
            "hbm_bandwidth_GBps": n("hbm_bandwidth_GBps"),
            "hbm_capacity_GiB": n("hbm_capacity_GiB"),
            "power_W": n("power_W", default=700.0)}),
        tiers=tuple(tiers),
        eff=efficiency_from_dict(d.get("efficiency") or {}, f"{where}.efficiency"),
        reliability=reliability_from_dict(d.get("reliability") or {}, f"{where}.reliability"),
        name=printable(d.get("name", where)), gpu=_gpu(d, where))


def _fraction(d: dict, key: str, where: str) -> float:
    """A measured fraction of a peak in [0, 1] (0 when absent: not measured)."""
    v = _number(d, key, where, minimum=0.0, default=0.0)
    if v > 1.0:
        raise SpecError(f"{where}.{key}={v:g} must be at most 1 (a measured throughput over "
                        f"the datasheet peak; 0 = not measured)")
    return v


def _gpu(d: dict, where: str) -> str:
    """The system's GPU generation (`gpu:` key; '' when absent): which shipped default
    efficiency set (calibration/defaults, diffperf.trust) a prediction without an overlay
    uses. Allowed: diffperf.trust.GPU_GENERATIONS."""
    from diffperf.trust import GPU_GENERATIONS

    g = str(d.get("gpu") or "").strip()
    if g and g not in GPU_GENERATIONS:
        raise SpecError(f"{where}.gpu={g!r} is not allowed{closest(g, GPU_GENERATIONS)} "
                        f"(allowed: {', '.join(GPU_GENERATIONS)})")
    return g


def load_system(name_or_path, calibration=None) -> System:
    """A system by name (configs/systems/NAME.yaml) or YAML path, with an optional
    calibration overlay: a shipped name (`vtrain-a100`) or a YAML whose `efficiency:` mapping
    replaces efficiency fields."""
    path = Path(name_or_path)
    if path.suffix not in (".yaml", ".yml", ".json"):  # a JSON file is YAML too
        path = _named(name_or_path, "systems")
    system = system_from_dict(read_yaml(path), str(path))
    return apply_overlay(system, calibration) if calibration else system



def system_to_dict(system: System) -> dict:
    """The YAML mapping (human units) of a System: `system_from_dict` reads it back."""
    d = _to_human(SYSTEM_UNITS, system)
    d["tiers"] = [_to_human(TIER_UNITS, t) | {"name": t.name} for t in system.tiers]
    d["efficiency"] = {k: float(getattr(system.eff, k)) for k in EFFICIENCY_KEYS}
    d["reliability"] = _to_human(RELIABILITY_UNITS, system.reliability)
    return d | {"name": system.name} | ({"gpu": system.gpu} if system.gpu else {})


def sweep_fields(system: System) -> dict:
    """{YAML key: (System leaf path, SI per unit)} of every number a sweep can vary:
    'hbm_bandwidth_GBps', 'tiers[1].bandwidth_GBps', 'efficiency.mm_max', ..."""
    out = {k: v for k, v in SYSTEM_UNITS.items()}
    for i in range(len(system.tiers)):
        out |= {f"tiers[{i}].{k}": (f"tiers[{i}].{leaf}", f) for k, (leaf, f) in TIER_UNITS.items()}
    out |= {f"reliability.{k}": (f"reliability.{leaf}", f)
            for k, (leaf, f) in RELIABILITY_UNITS.items()}
    return out | {f"efficiency.{k}": (f"eff.{k}", 1.0) for k in EFFICIENCY_KEYS}


# Values of one swept field (`_sweep_values`) and hardware points of a whole sweep (their
# product, `sweep_axes`): each value is checked as a system file's (a System built per value),
# and the points are predicted against every layout; `--sweep F=1:2:1000000000` was killed for
# memory (a 1e9-value grid, then 1e9 Systems built to check it).
MAX_SWEEP_VALUES = 10_000
MAX_SWEEP_POINTS = 1_000_000


def _sweep_values(key: str, spec: str, flag: str = "--sweep") -> np.ndarray:
    """START:STOP:N (evenly spaced, ends included), START:STOP:N:log (geometric) or V1,V2,...;
    at most MAX_SWEEP_VALUES values."""
    where = flag
    parts = spec.split(":")
    if len(parts) == 1:
        items = spec.split(",")
        if len(items) > MAX_SWEEP_VALUES:
            raise SpecError(f"{flag} {key} lists {len(items):,} values (allowed: at most "
                            f"{MAX_SWEEP_VALUES:,} per field)")
        return np.array([_number({key: v}, key, where) for v in items])
    if len(parts) not in (3, 4):
        raise SpecError(f"{flag} {key}={spec!r} must be START:STOP:N, START:STOP:N:log or "
                        f"V1,V2,...")
    a, b = (_number({key: v}, key, where) for v in parts[:2])
    n = _number({f"{key} N": parts[2]}, f"{key} N", where, integer=True, positive=True)
    if n > MAX_SWEEP_VALUES:
        raise SpecError(f"{flag} {key}={spec}: N={n:,} values (allowed: 1 to "
                        f"{MAX_SWEEP_VALUES:,} per field)", field=key, value=n)
    spacing = parts[3] if len(parts) == 4 else "lin"
    if spacing not in ("lin", "log"):
        raise SpecError(f"{flag} {key}: spacing {spacing!r} is not allowed (allowed: lin, log)")
    if spacing == "log" and not (a > 0 and b > 0):
        raise SpecError(f"{flag} {key}={spec}: a log grid needs START > 0 and STOP > 0")
    return np.geomspace(a, b, n) if spacing == "log" else np.linspace(a, b, n)


def _set_field(d: dict, key: str, value: float) -> dict:
    """A copy of a system mapping with one (dotted, indexed) key set."""
    d = dict(d, tiers=[dict(t) for t in d["tiers"]], efficiency=dict(d["efficiency"]),
             reliability=dict(d["reliability"]))
    if key.startswith("tiers["):
        i, field = int(key[6:key.index("]")]), key.split(".", 1)[1]
        d["tiers"][i][field] = value
    elif "." in key:  # efficiency.X, reliability.X
        section, field = key.split(".", 1)
        d[section][field] = value
    else:
        d[key] = value
    return d


def _sweep_key(system: System, fields: dict, key: str,
               flag: str = "--sweep") -> tuple[str, float]:
    """(YAML key, SI per unit of the values given) of a --sweep field: a system YAML key in
    its units ('matmul_TFLOPs', 'tiers[1].bandwidth_GBps'), with a tier by name too
    ('tiers[infiniband].bandwidth_GBps'), or a System leaf path in SI, the names sensitivity
    and the Python API use ('matmul_flops_per_s', 'tiers[1].bandwidth_Bps', 'eff.mm_max');
    values given for a leaf path are in SI (1.0 for a YAML key)."""
    names = {t.name: i for i, t in enumerate(system.tiers)}
    if key.startswith("tiers[") and "]" in key and key[6:key.index("]")] in names:
        key = f"tiers[{names[key[6:key.index(']')]]}]" + key[key.index("]") + 1:]
    if key in fields:
        return key, 1.0
    by_leaf = {leaf: (k, f) for k, (leaf, f) in fields.items()}
    if key in by_leaf:
        return by_leaf[key]
    tiers = ", ".join(f"{i} or {t.name}" for i, t in enumerate(system.tiers))
    raise SpecError(f"{flag}: unknown field '{key}'{closest(key, [*fields, *by_leaf])} "
                    f"(allowed: {', '.join(fields)}; or a System leaf path in SI such as "
                    f"matmul_flops_per_s; tiers by index or name: {tiers})")


def sweep_axes(system: System, items, flag: str = "--sweep") -> list[tuple]:
    """`FIELD=VALUES` strings (a system YAML key in its units, or a System leaf path in SI:
    `_sweep_key`) -> [(YAML key, System leaf path, values in the YAML's units, values in
    SI)], each value checked by the rules of `system_from_dict` (a bandwidth > 0, an
    efficiency in range, ...). `flag`: the option the strings came from, named in errors
    (`design --grid` takes the same strings)."""
    fields = sweep_fields(system)
    base = system_to_dict(system)
    out, seen = [], set()
    for item in items or ():
        if "=" not in item:
            raise SpecError(f"{flag} {item!r} must look like FIELD=START:STOP:N, "
                            f"FIELD=START:STOP:N:log or FIELD=V1,V2,...")
        key, spec = (x.strip() for x in item.split("=", 1))
        key, per_si = _sweep_key(system, fields, key, flag)
        if key in seen:
            raise SpecError(f"{flag} {key} is given twice; give each field once")
        seen.add(key)
        values = _sweep_values(key, spec, flag) / per_si
        leaf, factor = fields[key]
        out.append((key, leaf, values, values * factor))
    points = math.prod(len(v) for _, _, v, _ in out)
    if points > MAX_SWEEP_POINTS:  # before a System is built per value (up to 10,000 a field)
        raise SpecError(f"{flag}: {' x '.join(str(len(v)) for _, _, v, _ in out)} = "
                        f"{points:,} hardware points (allowed: at most {MAX_SWEEP_POINTS:,}, "
                        f"each predicted against every layout)")
    for key, _, values, _ in out:
        for v in np.unique(values):
            system_from_dict(_set_field(base, key, float(v)), flag)
    return out


OVERLAY_KEYS = ("efficiency", "fitted_on", "heldout", "description", "created_by",
                # an efficiency set of configs/efficiency (diffperf.trust, docs/trust.md)
                "name", "gpu", "overlay", "regimes", "interval_coverage_published")


def apply_overlay(system: System, overlay) -> System:
    """The system with the efficiency fields of a calibration overlay: a shipped name
    ('vtrain-a100', `diffperf list calibrations`), a YAML path or a mapping.

    The overlay's `fitted_on` is checked as --calibration and `write_overlay` check it (a
    SpecError for a malformed one); its framework facts are Parallel and Training fields,
    not System ones, so they are the caller's to apply (`overlay_facts`; the commands apply
    them with a note)."""
    if not isinstance(overlay, dict):
        overlay = resources.overlay_path(overlay)  # a shipped name ('vtrain-a100') or a path
    where = str(overlay) if not isinstance(overlay, dict) else "overlay"
    d = overlay if isinstance(overlay, dict) else read_yaml(overlay)
    _check_kind(d, "calibration overlay", where)
    _check_keys(d, OVERLAY_KEYS, where)
    overlay_facts(d, where)
    eff = efficiency_from_dict(d.get("efficiency") or {}, f"{where}.efficiency", system.eff)
    return system.replace(eff=eff)


def write_overlay(path, efficiency, *, fitted_on=None, heldout=None, description=None,
                  created_by="diffperf.write_overlay", force=False) -> dict:
    """Write a calibration overlay YAML that `load_system(name, calibration=path)` and every
    command's --calibration read back, and return the mapping written.

    efficiency: an `Efficiency`, a `System` (its efficiencies) or a mapping of Efficiency
    fields (a subset: the others keep each system's own). fitted_on: what it was fitted on;
    its `set` (FIELD=VALUE framework facts) and `precision` are applied or noted by the
    commands that read the overlay. Checked before writing (the fields, the values, the
    facts); an existing file needs force=True.
    """
    if isinstance(efficiency, System):
        efficiency = efficiency.eff
    if isinstance(efficiency, Efficiency):
        efficiency = {k: float(getattr(efficiency, k)) for k in EFFICIENCY_KEYS}
    eff = {str(k): float(v) for k, v in dict(efficiency).items()}
    overlay = {k: v for k, v in dict(description=description, created_by=created_by,
                                     fitted_on=fitted_on, heldout=heldout,
                                     efficiency=eff).items() if v is not None}
    efficiency_from_dict(eff, "efficiency")
    overlay_facts(overlay)
    path = Path(path)
    if path.exists() and not force:
        raise SpecError(f"{path} exists; pass force=True to overwrite it")
    try:
        path.write_text(dump_yaml(overlay))
    except OSError as err:
        raise SpecError(f"{path}: cannot write ({err.strerror or err})") from None
    return overlay


def overlay_facts(overlay, where: str | None = None) -> tuple[list, object]:
    """(fitted_on.set, fitted_on.precision) of a calibration overlay (path or mapping): the
    framework facts (`FIELD=VALUE` strings, as `parse_overrides` reads them) and the
    precision its runs were fitted under; ([], None) where it records none. `where` names
    the overlay in errors (default: its path, or 'overlay' for a mapping)."""
    if where is None:
        where = str(overlay) if not isinstance(overlay, dict) else "overlay"
    if not isinstance(overlay, dict):
        overlay = resources.overlay_path(overlay)  # a shipped name ('vtrain-a100') or a path
    d = overlay if isinstance(overlay, dict) else read_yaml(overlay)
    fitted = d.get("fitted_on") or {}
    if not isinstance(fitted, dict):
        raise SpecError(f"{where}.fitted_on must be a mapping, got {type(fitted).__name__}")
    facts = fitted.get("set") or []
    if not isinstance(facts, list) or not all(isinstance(f, str) for f in facts):
        raise SpecError(f"{where}.fitted_on.set={facts!r} must be a list of FIELD=VALUE "
                        f"strings")
    parse_overrides(facts)  # checked like --set
    return list(facts), fitted.get("precision")


def training(precision: str = "bf16", **overrides) -> Training:
    """A `Training` for a named precision (specs.training.PRECISIONS), with field overrides."""
    return training_from_name(precision, **overrides)


def training_from_name(precision: str = "bf16", where: str = "precision",
                       **overrides) -> Training:
    """A Training for a named precision (specs.training.PRECISIONS), with field overrides."""
    overrides.pop("name", None)
    if precision not in PRECISIONS:
        raise SpecError(f"{where}={precision!r} is not allowed{closest(precision, PRECISIONS)}"
                        f" (allowed: {', '.join(PRECISIONS)})")
    fields = dict(PRECISIONS[precision]) | overrides
    unknown = [k for k in fields if k not in Training.__dataclass_fields__]
    if unknown:
        raise SpecError(f"training: unknown field '{unknown[0]}'"
                        f"{closest(unknown[0], Training.__dataclass_fields__)}")
    pad = fields.get("vocab_pad_to", 0.0)
    if not (math.isfinite(float(pad)) and float(pad) >= 0 and float(pad) == int(float(pad))):
        raise SpecError(f"training.vocab_pad_to={pad} must be a whole number >= 0 (128: "
                        f"Megatron-LM's padding; 0: no padding)", field="vocab_pad_to",
                        value=pad, anywhere=True)
    seq = fields.get("fused_softmax_max_seq", 0.0)
    if not float(seq) >= 0:
        raise SpecError(f"training.fused_softmax_max_seq={seq} must be >= 0 (2048: "
                        f"Megatron-DeepSpeed's fused softmax; 0: no constraint)",
                        field="fused_softmax_max_seq", value=seq, anywhere=True)
    xla = fields.get("xla_compiled", 0.0)
    if float(xla) not in (0.0, 1.0):
        raise SpecError(f"training.xla_compiled={xla} must be 0 or 1 (1: the step is one XLA "
                        f"program, JAX jit; 0: an eager or Megatron framework)",
                        field="xla_compiled", value=xla, anywhere=True)
    return Training(**{k: float(v) for k, v in fields.items()}, name=precision)


def check_columns_once(path, names) -> None:
    """SpecError naming the first column that appears more than once in `names` (a CSV
    header): csv.DictReader would keep the last of them silently. Used by `_read_csv` and by
    `plot validation`'s reader."""
    twice = next((c for c in names if names.count(c) > 1), None)
    if twice is not None:
        raise SpecError(f"{path}: column '{twice}' appears {names.count(twice)} times in the "
                        f"header (allowed: each column once)")


def _row_at(at, rid=None) -> str:
    """Where a CSV record is, as a spreadsheet shows it: 'row N' (the header is row 1, a blank
    line is a row; at = (N, line) from `_read_csv`), with the file's line where the record
    starts when the two differ (a cell holding a line break, quoted, before it: one row,
    several lines), and the row's id when given."""
    row, line = at
    said = ([f"id {rid or '?'}"] if rid is not None else []) + (
        [f"line {line} of the file"] if line != row else [])
    return f"row {row}" + (f" ({'; '.join(said)})" if said else "")


def _read_csv(path: Path, required) -> tuple[list, list, list]:
    """(header, rows as dicts, where each row is: (row, line) for `_row_at`) of a UTF-8 CSV
    with the `required` columns; clear errors for a missing, unreadable, binary or malformed file, a
    missing or repeated column and a row whose cells do not match the header. Columns without
    a name that are blank in every row (a spreadsheet's trailing empty columns: `a,b,,`) are
    dropped; blank lines are skipped (as csv.DictReader skips them) but counted, so that a
    row's number is the one a spreadsheet shows (was: the count of records, which a blank
    line or a line break inside a cell shifted)."""
    kind = {".yaml": "YAML", ".yml": "YAML", ".json": "JSON"}.get(path.suffix.lower())
    if kind:  # was: "missing column 'id' (have: # <the file's first line>)"
        raise SpecError(f"{path}: a {kind} file, not a CSV table (allowed: a .csv file with the "
                        f"columns {', '.join(required)}, or a shipped dataset name)")
    try:
        with path.open(newline="", encoding="utf-8-sig") as fh:  # a BOM is not a column
            reader = csv.reader(fh)
            header = next(reader, None) or []
            raw, at, sheet_row, line = [], [], 1, reader.line_num
            for r in reader:  # csv.reader gives [] for a blank line: a row of the sheet
                sheet_row += 1
                if r:  # a blank line is no record
                    raw.append(r)
                    at.append((sheet_row, line + 1))
                line = reader.line_num  # the last line the record took
    except OSError as err:
        raise SpecError(f"{path}: cannot read ({err.strerror or err})") from None
    except UnicodeDecodeError:
        raise SpecError(f"{path}: not a UTF-8 text file") from None
    except csv.Error as err:
        raise SpecError(f"{path}: malformed CSV ({err})") from None
    if not header and required:
        raise SpecError(f"{path}: empty file (no header row; needs the columns "
                        f"{', '.join(required)})")
    # unnamed columns blank in every row hold nothing: dropped (Excel and LibreOffice write
    # a sheet's formatted but empty columns as trailing commas on every line)
    unnamed = {j for j, c in enumerate(header) if not c.strip()
               and all(j >= len(r) or not r[j].strip() for r in raw)}
    keep = [j for j in range(len(header)) if j not in unnamed]
    named = [header[j] for j in keep]
    missing = [c for c in required if c not in named]
    if missing:
        sep = next((c for c in (";", "\t", "|") if len(named) == 1 and c in named[0]), None)
        hint = (f"; the header is one cell holding {sep!r}: diffperf reads comma-separated "
                f"files" if sep else "")
        raise SpecError(f"{path}: missing column '{missing[0]}'{closest(missing[0], named)} "
                        f"(have: {', '.join(named)}{hint})")
    # csv.DictReader keeps the last of two same-named columns and pads or spills a row whose
    # cell count differs from the header's: each would be a silent misread of the file.
    check_columns_once(path, named)
    rows = []
    for i, r in enumerate(raw):
        extra = r[len(header):]
        short = [header[j] for j in keep if j >= len(r)]
        if extra or short:
            cells = len(r) - sum(1 for j in unnamed if j < len(r))
            blank = " empty" if all(not c.strip() for c in extra) else ""
            why = (f"{len(extra)}{blank} cell(s) past the last column: "
                   + ("trailing commas, or " if blank else "")
                   + "an unquoted comma inside a cell? quote it" if extra else
                   f"no cell for {', '.join(short)}: write an empty cell as ,,")
            raise SpecError(f"{path}: {_row_at(at[i])} has {cells} cells, the header "
                            f"{len(named)} ({why})")
        rows.append({header[j]: r[j] for j in keep})
    return named, rows, at


RUN_REQUIRED = ("id", "num_gpus", "num_layers", "hidden", "num_heads", "vocab", "seq_len",
                "tp", "pp", "dp", "global_batch", "micro_batch", "step_time_s")
RUN_OPTIONAL_DEFAULTS = dict(system="", ffn_hidden="", num_kv_heads="", gated_mlp="0",
                             moe_experts="0", moe_topk="0", cp="1", ep="1", vp="1", etp="0",
                             ep_dispatch="0", sequence_parallel="0", zero_stage="0",
                             zero_shard="0", recompute="none",
                             precision="bf16", status="ok", peak_memory_GB="", model_config="")
RUN_INFORMATIONAL = ("source", "model", "gpus_per_node", "notes",
                     # data/megatron_bridge.csv: what the source page printed, as printed
                     "source_page", "system_page", "model_page", "precision_page", "container",
                     "fsdp", "grad_accum", "moe_token_drop", "mtp", "tokens_per_s_per_gpu",
                     "model_tflops_per_gpu")
# `set`: the row's own framework facts, FIELD=VALUE separated by ';' (as --set takes them,
# e.g. 'grad_bytes=4;zero3_regather=0'); they apply after the command's --set.
RUN_FACTS = "set"


def run_fact_items(row) -> list:
    """A runs row's own framework facts, its `set` cell split: 'a=1;b=2' -> ['a=1', 'b=2']."""
    return [f for f in (row.get(RUN_FACTS) or "").split(";") if f.strip()]


# Architecture columns a row may repeat next to `model_config`; they must equal the config's.
_CONFIG_CHECKED = dict(num_layers="n_layers", hidden="hidden", num_heads="n_heads",
                       num_kv_heads="n_kv_heads", vocab="vocab", moe_experts="n_experts",
                       moe_topk="moe_topk")
RECOMPUTE_NAMES = {"none": 0, "selective": 1, "full": 2}


class Runs:
    """Measured runs of a CSV as batched specs (one leading axis = one row)."""

    def __init__(self, ids, rows, models, parallels, trainings, systems, step_time_s,
                 peak_memory_GB, ran):
        self.ids, self.rows = ids, rows
        self.models, self.parallels, self.trainings = models, parallels, trainings
        self.systems, self.step_time_s = systems, step_time_s
        self.peak_memory_GB, self.ran = peak_memory_GB, ran

    def __len__(self):
        return len(self.ids)


def _config_model(row: dict, name: str, where: str) -> Model:
    """The model of a row that names its architecture (`model_config`: a name under
    configs/models/ or a YAML / config.json path), at the row's seq_len. The architecture
    columns the schema requires (num_layers, hidden, num_heads, vocab) and any of
    num_kv_heads, moe_experts, moe_topk the row gives must equal the config's: a row that
    says one model and names another is an error, not a silent choice."""
    m = load_model(name)
    seq = _number(row, "seq_len", where, integer=True, positive=True)
    for col, field in _CONFIG_CHECKED.items():
        cell = (row.get(col) or "").strip()
        if not cell:
            continue
        v = _number(row, col, where, integer=True, minimum=0)
        if v != float(getattr(m, field)):
            raise SpecError(f"{where}.{col}={cell} differs from model_config {name!r} "
                            f"({col}={float(getattr(m, field)):g}); allowed: "
                            f"{float(getattr(m, field)):g}, or leave model_config blank")
    return m.replace(seq_len=float(seq))


def _run_row(row: dict, where: str):
    """(model dict, parallel dict, precision) of one CSV row, validated. A row with a
    `model_config` takes its architecture from that config (`_config_model`: multi-head latent
    attention, dense first layers, shared experts, ... that the numeric columns cannot say)."""
    get = lambda k: (row.get(k) or "").strip() or RUN_OPTIONAL_DEFAULTS.get(k, "")  # noqa
    if get("model_config"):
        m = _config_model(row, get("model_config"), where)
    else:
        model = {k: get(k) for k in ("num_layers", "hidden", "ffn_hidden", "num_heads",
                                     "num_kv_heads", "vocab", "seq_len", "moe_experts",
                                     "moe_topk") if get(k) != ""}
        model["gated_mlp"] = get("gated_mlp")
        if model["gated_mlp"] not in ("0", "1"):
            raise SpecError(f"{where}.gated_mlp={model['gated_mlp']!r} is not allowed "
                            f"(allowed: 0, 1)")
        model["gated_mlp"] = model["gated_mlp"] == "1"
        if _number(model, "moe_experts", where, integer=True, minimum=0, default=0):
            model["moe_ffn_hidden"] = model.get("ffn_hidden", "0")
        m = model_from_dict(model, where, cells=True)
    rec = get("recompute")
    if rec not in RECOMPUTE_NAMES:
        raise SpecError(f"{where}.recompute={rec!r} is not allowed{closest(rec, RECOMPUTE_NAMES)}"
                        f" (allowed: {', '.join(RECOMPUTE_NAMES)})")
    par = {k: _number({k: get(k)}, k, where, integer=True, minimum=0)
           for k in ("tp", "pp", "dp", "cp", "ep", "etp", "ep_dispatch", "vp", "global_batch",
                     "micro_batch", "sequence_parallel", "zero_stage", "zero_shard",
                     "num_gpus")}
    par["recompute"] = RECOMPUTE_NAMES[rec]
    return m, par, get("precision")


def parse_overrides(items) -> tuple[dict, dict]:
    """`FIELD=VALUE` strings -> (Parallel overrides, Training overrides), checked: facts about
    the framework that a runs CSV does not record (e.g. dp_overlap=0, grad_bytes=4)."""
    from diffperf.specs.parallel import Parallel

    par, tr = {}, {}
    p_fields = list(Parallel.__dataclass_fields__)
    t_fields = [f for f in Training.__dataclass_fields__ if f != "name"]
    for item in items or ():
        if "=" not in item:
            raise SpecError(f"--set {item!r} must look like FIELD=VALUE")
        key, value = item.split("=", 1)
        key = key.strip()
        v = _number({key: value}, key, "--set", minimum=0.0)
        if key in p_fields:
            par[key] = v
        elif key in t_fields:
            tr[key] = v
        else:
            raise SpecError(f"--set: unknown field '{key}'{closest(key, p_fields + t_fields)} "
                            f"(allowed: {', '.join(p_fields + t_fields)})")
    return par, tr


def load_runs(path, precision: str | None = None, overrides=None) -> Runs:
    """Read a measured-runs CSV (schema: data/README.md), or a shipped dataset by name
    (`h100_single_gpu`; `diffperf list datasets`); extra columns are allowed.

    `precision` overrides the CSV's precision column with a named preset (PRECISIONS) on
    every row (e.g. 'amp-bf16' for a CSV whose column says bf16 of runs that kept fp32
    weights under autocast); a row's own `set` facts, by contrast, apply after `overrides`.

    Rows with status 'oom' may leave step_time_s blank; every other blank required cell, an
    unknown column name close to a required one, or a duplicate id is an error.
    """
    from diffperf.specs import Parallel
    from diffperf.specs.validate import check_layout, check_training

    path = resources.dataset_path(path)  # a shipped name ('h100_single_gpu') or a path
    par_over, tr_over = parse_overrides(overrides)
    precision_override = precision
    if precision is not None:
        training_from_name(precision, where="--precision")
    # the command's own --set facts, said as such (not as the first row's)
    check_training(training_from_name(precision or "bf16", where="--precision", **tr_over),
                   "--set")
    header, rows, at = _read_csv(path, RUN_REQUIRED)
    known = (*RUN_REQUIRED, *RUN_OPTIONAL_DEFAULTS, *RUN_INFORMATIONAL, RUN_FACTS)
    for col in header:
        hint = closest(col, known)
        if col not in known and hint:
            raise SpecError(f"{path}: unknown column '{col}'{hint} (extra columns are allowed "
                            f"only when they are not near-misses of a known column)")
    if not rows:
        raise SpecError(f"{path}: no runs (the CSV has a header but no rows)")
    ids, seen = [], {}
    models, pars, trainings, systems, times, mems, ran = [], [], [], [], [], [], []
    for i, row in enumerate(rows):
        rid = (row.get("id") or "").strip()
        where = f"{path}: {_row_at(at[i], rid)}"
        if not rid:
            raise SpecError(f"{where}: blank 'id'")
        if rid in seen:
            raise SpecError(f"{where}: duplicate id '{rid}' (first at {_row_at(at[seen[rid]])}; "
                            f"allowed: each id once)")
        seen[rid] = i
        for col in RUN_REQUIRED:
            if col != "step_time_s" and not (row.get(col) or "").strip():
                raise SpecError(f"{where}: blank cell in column '{col}'")
        status = (row.get("status") or "ok").strip() or "ok"
        if status not in ("ok", "oom"):
            raise SpecError(f"{where}.status={status!r} is not allowed (allowed: ok, oom)")
        step = (row.get("step_time_s") or "").strip()
        if status == "ok":
            t = (_number({"step_time_s": step}, "step_time_s", where, positive=True)
                 if step else None)
            if t is None:
                raise SpecError(f"{where}: blank cell in column 'step_time_s' (status ok)")
        else:
            t = float("nan")
        config = (row.get("model_config") or "").strip()
        if (config and not Path(config).is_absolute() and not Path(config).exists()
                and config not in resources.config_files("models")
                and (path.parent / config).exists()):
            # a model file beside the CSV, named relative to it (the CSV read from elsewhere)
            row = dict(row, model_config=str(path.parent / config))
        m, par, precision = _run_row(row, where)
        facts = run_fact_items(row)
        try:
            row_par, row_tr = parse_overrides(facts)
        except SpecError as err:
            raise SpecError(f"{where}.set (the row's framework facts): {err}") from None
        p = Parallel(**{k: float(v) for k, v in par.items() if k != "num_gpus"} | par_over
                     | row_par)
        try:
            check_layout(m, p, par["num_gpus"], where, devices_field="num_gpus")
        except SpecError as err:  # a recompute fact of the command's --set (one layout's rules)
            _command_fact_hint(err, par_over, row_par)
        mem = (row.get("peak_memory_GB") or "").strip()
        if status == "oom" and step:
            raise SpecError(f"{where}.step_time_s={step!r}: a run with status oom has no step "
                            f"time; leave the cell blank")
        ids.append(rid)
        models.append(m.replace(name="runs"))
        pars.append(p)
        try:
            trainings.append(training_from_name(precision_override or precision,
                                                where=f"{where}.precision",
                                                **(tr_over | row_tr)))
        except SpecError as err:  # a value rule of training_from_name (the command's own
            # --set values were checked before the rows): name the row (was: no row at all)
            if err.field not in row_tr:
                raise
            raise SpecError(f"{where}.set (the row's framework facts): {err}", field=err.field,
                            value=err.value, anywhere=err.anywhere, needs=err.needs) from None
        check_training(trainings[-1], where)  # a bad fact names its row
        _check_row_facts_act(m, p, trainings[-1], where, par_over | tr_over, row_par | row_tr)
        systems.append((row.get("system") or "").strip())
        times.append(t)
        mems.append(_number({"peak_memory_GB": mem}, "peak_memory_GB", where, positive=True)
                    if mem else float("nan"))
        ran.append(status == "ok")
    return Runs(ids, rows, models, pars, trainings, systems, np.array(times), np.array(mems),
                np.array(ran))


def _check_row_facts_act(model, parallel, training, where, command, row) -> None:
    """`specs.validate.check_facts_act` on one row of a runs CSV: a fact whose term cannot act
    on the row's model or layout is refused, naming the row; when the fact came from the
    command's --set (which applies to every row) rather than the row's `set` cell, the message
    says so and where to put a fact meant for some rows only."""
    from diffperf.specs.validate import check_facts_act

    try:
        check_facts_act(model, parallel, training, where, where)
    except SpecError as err:
        _command_fact_hint(err, command, row)


def _command_fact_hint(err, command, row):
    """Re-raise `err` (a SpecError on one row of a runs CSV); when the refused field
    (SpecError.field, set by the rule) came from the command's --set, which applies to every
    row, rather than the row's `set` cell, the message says so and where to put a fact meant
    for some rows only. A range rule (SpecError.anywhere: the value is wrong on any row) is
    re-raised as it is."""
    field = err.field
    if field in command and field not in row and not err.anywhere:
        raise SpecError(f"{err} (the command's --set {field}={command[field]:g} applies to "
                        f"every row; give a fact that holds for some rows only in their "
                        f"'{RUN_FACTS}' cell)", field=field, value=err.value,
                        rule=err.rule, needs=err.needs) from None
    raise err


def load_table(path, required) -> dict:
    """A numeric CSV (kernel microbenchmarks) as {column: numpy array} for the required
    columns; clear errors for a missing file, column or a non-numeric cell. `path` may name a
    shipped dataset ('h100_gemm')."""
    path = resources.dataset_path(path)
    header, rows, at = _read_csv(path, required)
    if not rows:
        raise SpecError(f"{path}: no rows (the CSV has a header but no rows)")
    out = {}
    for c in required:
        vals = []
        for i, r in enumerate(rows):
            vals.append(_number(r, c, f"{path}: {_row_at(at[i])}", minimum=0.0))
        out[c] = np.array(vals)
    return out
