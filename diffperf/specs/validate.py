"""The one validation of diffperf's inputs: layout, model, system, training and the job, on
concrete values (CLI options, files and Python objects alike), before anything is traced.

Works on one configuration or a batch (leaves with a leading axis): the first invalid entry
is reported with its index, as a SpecError naming the field, the value and what is allowed.
Called by `predict`, `predict_batch`, `search` and the CLI before tracing.

The same rules run under jit / vmap, where values are traced and cannot raise: `valid_mask`
evaluates them with jax.numpy into a boolean (True where every rule holds), which
`predict_step` puts in `Result.valid` (invalid entries get step_time_s = +inf: never a
prediction). The rules are written once: each `_fail(mask, where, message)` raises on
concrete values, or, when `where` is a `_Collect`, ands `~mask` into its result.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from diffperf.errors import SpecError
from diffperf.specs.parallel import (DIMENSIONS, GRID, ORDERS, RECOMPUTE_MODULE_DEFAULTS,
                                     RECOMPUTE_MODULES, UB_PIPE_COMM_SMS)


INT_MAX = 2**31 - 1  # every count (degrees, batch, layers, heads, sequence): an int32
# the Training fields that put GEMMs in low precision (a rule that needs quantized GEMMs reads
# them: FactRule.needs)
LOWP_GEMMS = ("lowp_fprop", "lowp_dgrad", "lowp_wgrad")


class _Collect:
    """`where` of the rules in mask mode: `ok` is the and of every rule's ~mask (xp: the
    array module, jax.numpy under jit)."""

    def __init__(self, xp, by_field=False):
        self.xp, self.ok = xp, True
        # by_field: {field: (mask, [FactRule of each failing rule's first True entry])} of
        # check_facts_act's rules (`facts_inert`), numpy only
        self.by_field = {} if by_field else None


def _xp(where):
    return where.xp if isinstance(where, _Collect) else np


def _arr(x, where=None):
    if isinstance(where, _Collect):
        return where.xp.asarray(x)
    return np.atleast_1d(np.asarray(x, dtype=np.float64))


def divisors(x) -> list[int]:
    """The divisors of x, ascending, by trial division up to sqrt(x): O(sqrt(x)) time and
    memory (an arange to x took 16 GiB for a global batch of 2^31 - 1). The one helper of
    the messages below, load's and the layout enumeration (search.enumerate)."""
    x = int(x)
    small = [i for i in range(1, math.isqrt(x) + 1) if x % i == 0]
    return sorted(set(small + [x // i for i in small]))


def _divisors(x: float) -> str:
    """Divisors of x, listed for a message (`divisors`)."""
    return ", ".join(str(i) for i in divisors(x))


@dataclasses.dataclass(frozen=True)
class FactRule:
    """One refusal of `check_facts_act` for one entry, in parts, so that the error and a
    search's inert-fact note (cli.options.inert_notes) are built from the same rule rather
    than one parsed out of the other's text:

        message = "{field}={value:g} {condition} ({bound}; {got}): {reason}; allowed: {allowed}"
        head    = "{field}={value:g} {condition} ({bound})"   (no value of the failing row)

    e.g. field 'cp_ring', value 0, condition 'needs context parallelism', bound 'cp > 1', got
    'got cp=1'; an empty part is left out with its separator. `value` is the refused fact's
    value, `got` the failing entry's other values (its layout, precision or model). `needs`:
    the other settable fields (Parallel / Training: what --set and an overlay give) the rule
    reads, e.g. ('cp',) for cp_ring; () where only the model or the system decides (the
    overlay hint reads it, cli.options.overlay_fact_hint, not the message's words)."""

    field: str
    value: float
    condition: str
    bound: str = ""
    got: str = ""
    reason: str = ""
    allowed: str = ""
    needs: tuple = ()

    def _said(self, parts) -> str:
        inner = "; ".join(p for p in parts if p)
        return f"{self.field}={self.value:g} {self.condition}" + (f" ({inner})" if inner else "")

    @property
    def head(self) -> str:
        """The rule as it holds for every entry: without the failing entry's values."""
        return self._said((self.bound,))

    @property
    def message(self) -> str:
        return (self._said((self.bound, self.got)) + (f": {self.reason}" if self.reason else "")
                + (f"; allowed: {self.allowed}" if self.allowed else ""))

    def __str__(self) -> str:
        return self.message


def _fail(mask, where, message, field=None, value=None, anywhere=False, needs=()):
    """Raise SpecError for the first True entry of mask; message(i) formats it (a string, or
    a FactRule: then SpecError.rule is that rule). In mask mode (`where` a _Collect) record
    ~mask instead (and, for `facts_inert`, the FactRule of the first failing entry). `field`
    (the name the message leads with) and `value` (its leaf: the entry of the failing index
    is taken) go on the error as SpecError.field / .value; `anywhere`: a range rule, the
    value wrong whatever the rest of the input (SpecError.anywhere); `needs`: the other
    settable fields the rule reads (SpecError.needs; a FactRule's own needs win)."""
    if isinstance(where, _Collect):
        where.ok = where.ok & ~mask
        if where.by_field is not None and field is not None and np.any(mask):
            rule = message(int(np.argmax(np.atleast_1d(mask))))
            if isinstance(rule, FactRule):  # a fact's own range rule is not a place rule
                before, rules = where.by_field.get(field, (False, []))
                where.by_field[field] = (before | mask, rules + [rule])
        return
    mask = np.atleast_1d(mask)
    if mask.any():
        i = int(np.argmax(mask))
        at = f"[{i}]" if mask.size > 1 else ""
        if value is not None:
            v = np.ravel(np.asarray(value))
            value = float(v[min(i, v.size - 1)])
        said = message(i)
        rule = said if isinstance(said, FactRule) else None
        raise SpecError(f"{where}{at}: {said}", field=field, value=value, rule=rule,
                        anywhere=anywhere, needs=rule.needs if rule else needs)


def _act(mask, where, field, leaf, pick, condition, *, bound="", got="", reason="",
         allowed="", needs=()) -> None:
    """A `check_facts_act` rule: refuse `field` (its values `leaf`) where `mask`, said by a
    FactRule whose parts are strings or functions of the failing index i; `needs`: the other
    settable fields the mask reads (FactRule.needs)."""
    part = lambda x, i: x(i) if callable(x) else x  # noqa: E731
    _fail(mask, where, lambda i: FactRule(
        field, float(pick(leaf, i)), part(condition, i), part(bound, i), part(got, i),
        part(reason, i), part(allowed, i), tuple(needs)), field, leaf)


def _divides(a, b, xp=np):
    """a divides b exactly (whole numbers held as floats: exact up to 2^53)."""
    a, b = xp.round(a), xp.round(b)
    return xp.mod(b, xp.maximum(a, 1.0)) == 0.0


def _check_recompute_modules(P, M, where, pick, per_layout=None) -> None:
    """Megatron-Core's recompute_modules (Parallel.recompute_<module>, workload.recompute):
    each 0 or 1; other than the default (core_attn 1, the rest 0) only under Megatron's
    selective recompute (recompute 1, recompute_policy 0), where they are read, and
    recompute_layer_frac < 1 only under full recompute, recompute_policy > 0 only under
    selective recompute (workload.recompute multiplies its terms by recompute = 1) (all for
    one layout; not in a search's table, whose --set facts act only on their own mode);
    mla_up_proj needs multi-latent attention and moe_act an MoE model (Megatron-Core's
    TransformerConfig.__post_init__ raises for both). The rules that depend on the layout or
    the model are FactRules (`_act`: SpecError.field / .value / .rule, and .needs: recompute,
    recompute_policy; load's runs rows name a command's --set); the 0 / 1 range rule, wrong
    on every row, carries its field (SpecError.anywhere)."""
    megatron = (P["recompute"] == 1) & (P["recompute_policy"] == 0)
    # One layout (predict, validate, a runs CSV): a fact of another recompute mode is an
    # inconsistent input. A layout table (mask mode: search) is not checked for it: search
    # applies its --set facts to every row, and each acts only on its own mode (trust.
    # unnamed_recompute marks the rows it changes).
    one = not isinstance(where, _Collect) if per_layout is None else per_layout
    r, rec = P["recompute_layer_frac"], P["recompute"]
    got_rec = lambda i: f"got recompute={pick(rec, i):g}"  # noqa: E731
    if one:
        _act((r < 1) & (rec != 2), where, "recompute_layer_frac", r, pick,
             "needs full recompute", bound="recompute=2", got=got_rec,
             reason="only full recompute checkpoints a fraction of the layers",
             allowed="1 with recompute 0 or 1", needs=("recompute",))
        pol = P["recompute_policy"]
        _act((pol != 0) & (rec != 1), where, "recompute_policy", pol, pick,
             "needs selective recompute", bound="recompute=1", got=got_rec,
             reason="it picks the ops selective recompute re-runs (1, 2: TorchTitan's per-op "
                    "SAC)", allowed="0 with recompute 0 or 2", needs=("recompute",))
    for m in RECOMPUTE_MODULES:
        f = f"recompute_{m}"
        v = P[f]
        _fail((v != 0) & (v != 1), where, lambda i, f=f: (
            f"{f}={pick(P[f], i):g} is not allowed (allowed: 0, 1)"), f, v, anywhere=True)
        default = RECOMPUTE_MODULE_DEFAULTS[m]
        if one:
            _act((v != default) & ~megatron, where, f, v, pick,
                 "needs Megatron's selective recompute", bound="recompute=1, recompute_policy=0",
                 got=lambda i: f"{got_rec(i)}, recompute_policy="
                               f"{pick(P['recompute_policy'], i):g}",
                 reason="Megatron-Core's TransformerLayer reads recompute_modules only "
                        "under recompute_granularity 'selective'",
                 allowed=f"{default} with another recompute mode",
                 needs=("recompute", "recompute_policy"))
    _act((P["recompute_mla_up_proj"] == 1) & (M["kv_lora_rank"] == 0), where,
         "recompute_mla_up_proj", P["recompute_mla_up_proj"], pick,
         "needs multi-latent attention", bound="model.kv_lora_rank > 0", got="got 0",
         allowed="0")
    _dense_facts(M, where, pick, (("recompute_moe_act",
                                   "the routed experts' activation recompute"),), P)


def _check_tp_userbuffers(P, M, where, pick) -> None:
    """Parallel.tp_userbuffers 0, 1 or 2, and 1 / 2 only for dense models (the rules that hold
    for every layout; check_facts_act adds those tied to a layout's tp and sequence_parallel:
    the fact is inert there)."""
    u = P["tp_userbuffers"]
    _fail(~((u == 0) | (u == 1) | (u == 2)), where, lambda i: (
        f"tp_userbuffers={pick(u, i):g} is not allowed (allowed: 0 the tp_overlap form, 1 "
        f"Transformer Engine userbuffers as Megatron-Bridge's FP8 configurations run it, 2 "
        f"as NeMo Framework Launcher 24.07's H100 FP8 configuration runs it on TE 1.8: "
        f"pipelined forward reduce-scatters)"), "tp_userbuffers", u, anywhere=True)
    _act((u >= 1) & (M["n_experts"] > 0), where, "tp_userbuffers", u, pick,
         lambda i: f"with model.moe_experts={pick(M['n_experts'], i):g}",
         reason="the userbuffers TP overlap is modelled for dense models only (allowed: "
                "tp_userbuffers 0 for MoE models)")


# Framework facts that describe MoE layers (`check_facts_act`): each acts only where the model
# has routed experts, and changes nothing on a dense model (its term carries the MoE layer
# fraction phi = 0, or the expert all-to-all, 0 without experts). (field, what it describes).
MOE_TRAINING_FACTS = (
    ("moe_expert_loop", "Transformer Engine's one GEMM per local expert"),
    ("moe_quant_pad", "the padding copies of the routed tokens"),
    ("moe_eager_clamp_bias", "the expert MLP's eager clamp and bias kernels"),
    ("moe_host_sync", "the host sync before the token dispatch"),
)
MOE_PARALLEL_FACTS = (
    ("ep_overlap", "the merged EP schedule that hides the expert all-to-alls"),
    ("ep_dispatch", "the expert token dispatcher"),
    ("etp", "the routed experts' tensor-parallel degree"),
    ("recompute_shared_experts", "the shared experts' recompute"),
)


def _dense_facts(M, where, pick, facts, leaves) -> None:
    """A non-default MoE fact on a dense model (moe_experts = 0) is refused, the same words
    for every one (MOE_TRAINING_FACTS, MOE_PARALLEL_FACTS, recompute_moe_act)."""
    dense = M["n_experts"] == 0
    for f, what in facts:
        v = leaves[f]
        _act(dense & (v != 0), where, f, v, pick, "acts only on MoE layers", bound=what,
             allowed="0 for a dense model (moe_experts = 0)")


def check_facts_act(model, parallel, training, where_parallel: str = "parallel",
                    where_training: str = "training", layout: bool = True) -> None:
    """Refuse a framework fact (a Training / Parallel 0/1 or fraction field set from what a run
    did) on an input where its term cannot act, so that no setting is silently ignored.
    Concrete values only (nothing here runs under jit: `valid_mask` does not trace it).
    The SpecError carries the refused field and its value (SpecError.field / .value).

        any layout    MoE facts (MOE_TRAINING_FACTS, MOE_PARALLEL_FACTS) need moe_experts > 0;
                      recompute_shared_experts = 1 needs shared experts;
                      recompute_mlp = 1 on an MoE model needs dense layers (Megatron-Core's
                        TransformerLayer.__init__ sets recompute_mlp only where self.mlp is
                        not an MoELayer);
                      moe_quant_pad = 1 needs quantized GEMMs (lowp_fprop / dgrad / wgrad):
                        Megatron-Core's TEGroupedMLP pads only when the run quantizes
                        (workload.flops.moe_quant_pad_bytes);
                      lowp_te_quantizer = 1 needs quantized GEMMs too (it counts TE's
                        quantize kernels: workload.flops.te_quantize_rows);
                      lowp_param_gather = 1 needs quantized GEMMs (workload.dp.
                        gathered_weight_bytes multiplies it by them), and so do
                        lowp_layer_frac != 1 and lowp_weight_cache != 1 (their terms are
                        multiplied by the low-precision passes);
                      fused_softmax_max_seq > 0 needs flash_attention = 0
                        (workload.flops.softmax_fallback multiplies by 1 - flash_attention);
                      attention_fa2 = 1 needs flash_attention = 1 (costs.compute.
                        attention_time_s multiplies the fused kernel, the only one it
                        prices, by flash_attention);
                      te_cudnn_norm = 1 needs lowp_te_quantizer = 1 and per-tensor FP8
                        current scaling (it only moves that recipe's norm-fused amax);
                      rope_kv_pass = 1 needs llama_eager_pointwise = 0 (that term holds the
                        eager forms of the same passes);
                      tp_overlap > 0 needs tp_userbuffers = 0 (the userbuffers form does
                        not read it: predict._layer_parts replaces the tp_overlap form)
        layout=True   cp_torch = 1 and cp_ring = 0 need cp > 1; tp_userbuffers >= 1 needs
                        tp > 1, and sequence_parallel = 1 there (Megatron-Bridge
                        CommOverlapConfig._get_model_comm_overlap_cfgs: "Disabling tensor
                        parallel communication overlap due to sequence_parallel=False";
                        predict._layer_parts reads the userbuffers form only with SP);
        (one layout)  tp_overlap > 0 needs tp > 1 (it scales the TP collectives' hidden
                        part, 0 s at tp 1);
                      ep_overlap > 0 needs ep > 1 and no full recompute (Megatron-Core
                        TransformerConfig.__post_init__ asserts both for
                        overlap_moe_expert_parallel_comm); ep_dispatch = 1 needs ep > 1
                        (the flex form is priced only for an exchange between ep ranks);
                      zero3_copy_out = 1 needs zero_stage 3 (FSDP2 copies the parameters
                        it gathers per layer); zero3_root_unit = 1 needs zero_stage 3 (it
                        prices FSDP's root unit gather and reduce-scatter); zero3_regather
                        = 0, zero3_calls_per_layer != 1 and zero3_prefetch_params != 0 need
                        zero_stage 3 (predict._zero3_layer_parts and memory.device multiply
                        their terms by zero_stage = 3);
                      axonn_overlap = 0 needs an AxoNN grid (gx, gy or gz > 1: the grid's
                        collectives, 0 s without one);
                      zero_shard > 0 needs zero_stage >= 1 (workload.dp.zero_groups: the
                        whole group at ZeRO 0, nothing sharded);
                      lowp_param_gather = 1 needs zero_stage >= 1 (Megatron-LM
                        validate_args: "--fp8-param-gather only supported with distributed
                        optimizer, torch fsdp2, megatron fsdp, or inference mode")
    A search (layout=False, `parallel` None or its facts) varies tp, cp, ep, the AxoNN grid,
    zero_stage and recompute per row: it refuses only the rules above the layout ones, and
    ranks a row where a layout rule fails as the framework runs it, without the fact, whose
    term is zero there (`facts_inert`). Batched leaves: the first entry that fails, with its
    index. Each rule is a `FactRule` (`_act`): the error's message and its SpecError.rule,
    and the search's note on the rows where the fact is inert (`FactRule.head`), are made
    from the same parts.
    """
    pick = lambda a, i: a.ravel()[min(i, a.size - 1)]  # noqa: E731
    M = {f: _arr(getattr(model, f)) for f in ("n_experts", "n_shared_experts",
                                                "moe_dense_layers")}
    T = {f: _arr(getattr(training, f)) for f in (
        *(f for f, _ in MOE_TRAINING_FACTS), "lowp_fprop", "lowp_dgrad", "lowp_wgrad",
        "rope_kv_pass", "llama_eager_pointwise", "attention_fa2", "cp_torch",
        "lowp_te_quantizer", "te_cudnn_norm", "te_scale_swizzle", "lowp_amax_pass",
        "lowp_block", "lowp_fp4", "lowp_param_gather", "lowp_layer_frac", "lowp_weight_cache",
        "fused_softmax_max_seq", "flash_attention")}
    _dense_facts(M, where_training, pick, MOE_TRAINING_FACTS, T)
    lowp = np.maximum(np.maximum(T["lowp_fprop"], T["lowp_dgrad"]), T["lowp_wgrad"]) > 0
    name = getattr(training, "name", None)
    wt = where_training
    lowp_gemms = dict(bound="lowp_fprop, lowp_dgrad or lowp_wgrad = 1",
                      got=f"precision {name or '?'!r} has none", needs=LOWP_GEMMS)
    _act((T["moe_quant_pad"] == 1) & ~lowp, wt, "moe_quant_pad", T["moe_quant_pad"], pick,
         "needs GEMMs in FP8 / FP4", **lowp_gemms,
         reason="Megatron-Core's TEGroupedMLP pads the routed tokens only for quantized "
                "grouped GEMMs", allowed="0 with a 16-bit precision")
    _act((T["lowp_te_quantizer"] == 1) & ~lowp, wt, "lowp_te_quantizer",
         T["lowp_te_quantizer"], pick, "needs GEMMs in FP8 / FP4", **lowp_gemms,
         reason="it counts Transformer Engine's quantize kernels",
         allowed="0 with a 16-bit precision")
    gather = T["lowp_param_gather"]
    _act((gather > 0) & ~lowp, wt, "lowp_param_gather", gather, pick,
         "needs GEMMs in FP8 / FP4", **lowp_gemms,
         reason="it all-gathers and keeps the quantized weights (Megatron "
                "--fp8-param-gather)", allowed="0 with a 16-bit precision")
    for f, what in (("lowp_layer_frac", "the fraction of the layers whose linears run in low "
                                        "precision"),
                    ("lowp_weight_cache", "whether the quantized weights are cast once per step "
                                          "and kept")):
        _act((T[f] != 1) & ~lowp, wt, f, T[f], pick, "needs GEMMs in FP8 / FP4", **lowp_gemms,
             reason=f"it sets {what}", allowed="1 (the default) with a 16-bit precision")
    seq = T["fused_softmax_max_seq"]
    _act((seq > 0) & (T["flash_attention"] == 1), wt, "fused_softmax_max_seq", seq, pick,
         "needs unfused attention", bound="flash_attention=0", got="got 1",
         needs=("flash_attention",),
         reason="it is the longest key length Megatron's fused scale-mask-softmax kernel "
                "takes, and fused attention runs no separate softmax",
         allowed="0 with flash_attention = 1")
    fa2 = T["attention_fa2"]
    _act((fa2 > 0) & (T["flash_attention"] == 0), wt, "attention_fa2", fa2, pick,
         "needs fused attention", bound="flash_attention=1", got="got 0",
         needs=("flash_attention",),
         reason="it prices the fused attention kernel as FlashAttention-2, and unfused "
                "attention runs batched GEMMs and a separate softmax",
         allowed="0 with flash_attention = 0")
    current = (lowp & (T["lowp_amax_pass"] > 0) & (T["lowp_block"] == 0)
               & (T["lowp_fp4"] == 0))
    _act((T["te_cudnn_norm"] == 1) & ~((T["lowp_te_quantizer"] == 1) & current), wt,
         "te_cudnn_norm", T["te_cudnn_norm"], pick,
         "needs lowp_te_quantizer=1 with per-tensor FP8 current scaling",
         got=lambda i: f"got lowp_te_quantizer={pick(T['lowp_te_quantizer'], i):g}, "
                       f"precision {name or '?'!r}",
         reason="it takes the amax of a LayerNormLinear's FP8 current-scaling quantize out "
                "of Transformer Engine's norm kernel", allowed="0",
         needs=("lowp_te_quantizer", *LOWP_GEMMS, "lowp_amax_pass", "lowp_block", "lowp_fp4"))
    _fail(~np.isin(T["te_scale_swizzle"], (0, 1, 2)), where_training, lambda i: (
        f"te_scale_swizzle={pick(T['te_scale_swizzle'], i):g} is not allowed (allowed: 0 none, "
        f"1 Transformer Engine 2.7 / 2.9 every GEMM operand, 2 TE 2.12-2.16 weights and "
        f"sequence-parallel gathered tensors)"), "te_scale_swizzle", T["te_scale_swizzle"],
        anywhere=True)
    _act((T["te_scale_swizzle"] > 0) & ~((T["lowp_te_quantizer"] == 1) & (T["lowp_block"] > 0)),
         wt, "te_scale_swizzle", T["te_scale_swizzle"], pick,
         "needs lowp_te_quantizer=1 with a block-scaled (MXFP8) precision",
         got=f"precision {name or '?'!r}",
         reason="it counts Transformer Engine's MXFP8 scale swizzles", allowed="0",
         needs=("lowp_te_quantizer", "lowp_block"))
    _act((T["rope_kv_pass"] == 1) & (T["llama_eager_pointwise"] == 1), wt, "rope_kv_pass",
         T["rope_kv_pass"], pick, "with llama_eager_pointwise=1",
         reason="the eager term already holds the rotary and K/V expansion passes "
                "(rope_kv_pass is their compiled form)", allowed="one of the two",
         needs=("llama_eager_pointwise",))
    if parallel is None:
        return
    P = {f: _arr(getattr(parallel, f)) for f in (
        *(f for f, _ in MOE_PARALLEL_FACTS), "tp", "cp", "ep", "recompute", "zero_stage",
        "tp_userbuffers", "zero3_copy_out", "zero3_root_unit", "recompute_mlp", "tp_overlap",
        "zero3_regather", "zero3_calls_per_layer", "zero3_prefetch_params", "axonn_overlap",
        "cp_ring", "sequence_parallel", "zero_shard", *GRID)}
    _dense_facts(M, where_parallel, pick, MOE_PARALLEL_FACTS, P)
    moe = M["n_experts"] > 0
    wp = where_parallel
    _act(moe & (P["recompute_shared_experts"] == 1) & (M["n_shared_experts"] == 0), wp,
         "recompute_shared_experts", P["recompute_shared_experts"], pick,
         "needs shared experts", bound="model.moe_shared_experts > 0", got="got 0",
         reason="there is no module to recompute", allowed="0")
    _act(moe & (P["recompute_mlp"] == 1) & (M["moe_dense_layers"] == 0), wp, "recompute_mlp",
         P["recompute_mlp"], pick, "needs dense MLP layers",
         got=lambda i: f"model.moe_experts={pick(M['n_experts'], i):g} with "
                       f"moe_dense_layers=0 has none",
         reason="Megatron-Core's TransformerLayer recomputes the MLP only where it is not an "
                "MoELayer (the experts' activation is recompute_moe_act)", allowed="0")
    o, u = P["tp_overlap"], P["tp_userbuffers"]
    _act((o > 0) & (u >= 1), wp, "tp_overlap", o, pick,
         lambda i: f"with tp_userbuffers={pick(u, i):g}",
         reason="the userbuffers overlap prices which TP communication hides itself and does "
                "not read tp_overlap", allowed="tp_overlap 0 with tp_userbuffers 1 or 2",
         needs=("tp_userbuffers",))
    if not layout:
        return
    # the rules tied to a layout: a search ranks a row that fails one as the framework runs
    # it, without the fact (`facts_inert`; the note says FactRule.head)
    cp1 = dict(bound="cp > 1", got="got cp=1", needs=("cp",))
    _act((T["cp_torch"] == 1) & (P["cp"] == 1), wt, "cp_torch", T["cp_torch"], pick,
         "needs context parallelism", **cp1,
         reason="PyTorch's context_parallel() exchanges K/V between the cp ranks",
         allowed="0 with cp = 1")
    ring = P["cp_ring"]
    _act((ring != 1) & (P["cp"] == 1), wp, "cp_ring", ring, pick, "needs context parallelism",
         **cp1, reason="it picks how the cp ranks exchange K/V (1 ring, 0 all-gather)",
         allowed="1 (the default) with cp = 1")
    _act((u >= 1) & (P["tp"] == 1), wp, "tp_userbuffers", u, pick, "needs tensor parallelism",
         bound="tp > 1", got="got tp=1", reason="userbuffers overlaps the TP collectives",
         allowed="0 with tp = 1", needs=("tp",))
    _act((u >= 1) & (P["tp"] > 1) & (P["sequence_parallel"] == 0), wp, "tp_userbuffers", u,
         pick, "needs sequence parallelism", bound="sequence_parallel=1",
         got=lambda i: f"got sequence_parallel=0 at tp={pick(P['tp'], i):g}",
         reason="userbuffers overlaps the sequence-parallel all-gathers / reduce-scatters, and "
                "Megatron-Bridge turns it off without sequence parallelism",
         allowed="0 with sequence_parallel 0", needs=("tp", "sequence_parallel"))
    _act((o > 0) & (P["tp"] == 1), wp, "tp_overlap", o, pick, "needs tensor parallelism",
         bound="tp > 1", got="got tp=1",
         reason="it is the fraction of the TP collectives hidden behind the GEMMs, and tp = 1 "
                "has none", allowed="0 with tp = 1", needs=("tp",))
    v = P["ep_overlap"]
    ep1 = dict(bound="ep > 1", got="got ep=1", needs=("ep",))
    _act(moe & (v > 0) & (P["ep"] == 1), wp, "ep_overlap", v, pick,
         "needs expert parallelism", **ep1,
         reason="Megatron-Core overlaps the expert all-to-alls only between ep ranks "
                "(\"overlap_moe_expert_parallel_comm is only supported with expert model "
                "parallelism\")", allowed="0 with ep = 1")
    _act(moe & (v > 0) & (P["recompute"] == 2), wp, "ep_overlap", v, pick,
         "with recompute=2 (full)",
         reason="Megatron-Core refuses the merged EP schedule under full recompute (\"disable "
                "full recomputation when enabling overlap_moe_expert_parallel_comm\")",
         allowed="0 with full recompute", needs=("recompute",))
    _act(moe & (P["ep_dispatch"] == 1) & (P["ep"] == 1), wp, "ep_dispatch", P["ep_dispatch"],
         pick, "needs expert parallelism", **ep1,
         reason="the flex dispatcher's exchange runs between the ep ranks",
         allowed="0 with ep = 1")
    z = P["zero_stage"]
    got_z = lambda i: f"got zero_stage={pick(z, i):g}"  # noqa: E731
    zero = dict(got=got_z, needs=("zero_stage",))
    _act((P["zero3_copy_out"] == 1) & (z < 3), wp, "zero3_copy_out", P["zero3_copy_out"],
         pick, "needs zero_stage=3", **zero,
         reason="FSDP2 copies out the parameters it all-gathers per layer",
         allowed="0 with zero_stage 0 to 2")
    _act((P["zero3_root_unit"] == 1) & (z < 3), wp, "zero3_root_unit", P["zero3_root_unit"],
         pick, "needs zero_stage=3", **zero,
         reason="it prices FSDP's root unit gather and reduce-scatter",
         allowed="0 with zero_stage 0 to 2")
    for f, default, what in (
            ("zero3_regather", 1, "whether full recompute gathers a layer's parameters again"),
            ("zero3_calls_per_layer", 1, "the gather / reduce-scatter calls per layer pass"),
            ("zero3_prefetch_params", 0, "how many parameters are gathered ahead of use")):
        _act((P[f] != default) & (z < 3), wp, f, P[f], pick, "needs zero_stage=3", **zero,
             reason=f"it sets {what} under ZeRO-3",
             allowed=f"{default} (the default) with zero_stage 0 to 2")
    g = P["zero_shard"]
    _act((g > 0) & (z < 1), wp, "zero_shard", g, pick, "needs zero_stage >= 1", **zero,
         reason="nothing is sharded at ZeRO 0", allowed="0 with zero_stage 0")
    grid = (P["gx"] > 1) | (P["gy"] > 1) | (P["gz"] > 1)
    a = P["axonn_overlap"]
    _act((a != 1) & ~grid, wp, "axonn_overlap", a, pick, "needs an AxoNN grid",
         bound="gx, gy or gz > 1",
         got=lambda i: f"got gx={pick(P['gx'], i):g}, gy={pick(P['gy'], i):g}, "
                       f"gz={pick(P['gz'], i):g}",
         reason="it switches the grid's overlapped collectives",
         allowed="1 (the default) without a grid", needs=GRID)
    _act((gather > 0) & (z < 1), wt, "lowp_param_gather", gather, pick,
         "needs a sharded optimizer", bound="zero_stage >= 1", **zero,
         reason="Megatron-LM refuses --fp8-param-gather without the distributed optimizer or "
                "FSDP (\"--fp8-param-gather only supported with distributed optimizer, torch "
                "fsdp2, megatron fsdp, or inference mode\")", allowed="0 with zero_stage 0")


def facts_inert(model, parallel, training) -> dict:
    """The framework facts of `parallel` / `training` that cannot act on their layout, by
    `check_facts_act`'s per-layout rules (cp_torch / cp_ring=0 at cp 1, tp_overlap /
    tp_userbuffers at tp 1, tp_userbuffers without sequence parallelism, zero_shard at ZeRO 0,
    ep_overlap / ep_dispatch at ep 1, ep_overlap under full recompute, zero3_* below ZeRO-3,
    axonn_overlap=0 without a grid, lowp_param_gather at ZeRO 0): {field: (mask over the
    batched leaves, [each failing rule's FactRule, for its first entry])}; only the facts that
    fail somewhere. Concrete values (numpy); a search's table varies tp, cp, ep, the AxoNN grid
    (gx, gy, gz), ZeRO stage, recompute and sequence parallelism per row. The caller has
    checked the rules that hold whatever the layout (`check_facts_act(..., layout=False)`);
    those would be listed too.

    Such a fact describes the framework, not the layout: the framework runs that layout
    without the fact's effect, and the fact's term is multiplied by zero there (tp 1 has no
    TP collective, cp 1 no K/V exchange, ep 1 no all-to-all, ZeRO < 3 no per-layer gather,
    ...; tests/test_search.py checks each rule: a row predicted with and without its fact is
    identical). A search ranks those rows as they are (`neutral_facts` gives the same
    prediction without the facts), predict without a layout says which facts do not act on
    the layout it chose; a layout the user gave is refused (`check_facts_act`)."""
    where = _Collect(np, by_field=True)
    check_facts_act(model, parallel, training, where, where)
    return where.by_field


def neutral_facts(model, parallel, training):
    """(parallel, training, inert) for one concrete layout: each fact that cannot act on it
    (`facts_inert`) set to its dataclass default, the value at which every per-layout rule
    holds (cp_torch 0, cp_ring 1, tp_overlap 0, ..., axonn_overlap 1); inert: {field: (given
    value, [the rules' FactRules])}. The prediction does not change (the fact's term is zero on
    that layout), and `check_facts_act` then passes, so `predict` takes the layout that a
    search chose with a framework fact that does not act on it."""
    inert = facts_inert(model, parallel, training)
    given = {}
    for field, (_, texts) in inert.items():
        spec = parallel if hasattr(parallel, field) else training
        given[field] = (float(np.ravel(np.asarray(getattr(spec, field)))[0]), texts)
        default = {f.name: f.default for f in dataclasses.fields(spec)}[field]
        if spec is parallel:
            parallel = parallel.replace(**{field: default})
        else:
            training = training.replace(**{field: default})
    check_facts_act(model, parallel, training)
    return parallel, training, given


def check_search_facts(model, parallel, where: str = "parallel") -> None:
    """Raise SpecError where a framework fact that a search applies to every layout of its
    table (search.search's `parallel`) breaks a rule of `check_layout` that no column of the
    table takes part in: each fact's own range (`_check_fact_ranges`: zero3_copy_out=2,
    tp_overlap=2 gave "0 fit", exit 0); the recompute_<module> fields (0 or 1; mla_up_proj
    needs multi-latent attention, moe_act an MoE model: `_check_recompute_modules`, without the
    rules tied to one layout's recompute mode, which the table varies); tp_userbuffers 0, 1
    or 2, 1 / 2 only for dense models (`_check_tp_userbuffers`; its tp and sequence-parallelism
    rules are check_facts_act's, per row: the fact inert there). Otherwise such a fact would
    only make every row invalid (Result.valid False), the search finding no layout without
    saying why."""
    P = {f: _arr(getattr(parallel, f), where) for f in (
        "recompute", *FACT_FIELDS, "tp_userbuffers",
        *(f"recompute_{m}" for m in RECOMPUTE_MODULES))}
    M = {f: _arr(getattr(model, f), where) for f in ("n_experts", "kv_lora_rank")}
    pick = lambda a, i: a[i] if a.size > 1 else a[0]  # noqa: E731
    _check_fact_ranges(P, where, pick)
    _check_recompute_modules(P, M, where, pick, per_layout=False)
    _check_tp_userbuffers(P, M, where, pick)


def check_layout(model, parallel, n_devices=None, where: str = "parallel",
                 devices_field: str = "number of devices") -> None:
    """Raise SpecError unless the layout is structurally valid for the model.

    Rules: degrees are whole numbers >= 1; tp divides num_heads and ffn_hidden, and
    num_kv_heads or the reverse (KV heads replicated); every pipeline stage holds at least vp
    layers (`_check_stages`; pp need not divide num_layers); cp divides seq_len; ep divides dp
    (etp = 0) or ep x etp divides tp x cp x dp (etp in {1, tp}; etp < tp needs SP) and ep divides
    moe_experts (ep > 1 needs an MoE model); micro_batch x dp
    divides global_batch; interleaving needs pp > 1 and micro-batches a multiple of pp;
    zero_stage in 0..3; recompute in 0..2; recompute_policy in 0..2; recompute_layer_frac in
    (0, 1] (< 1 only with full recompute); the recompute_<module> fields
    (`_check_recompute_modules`); cp_ring and axonn_overlap in {0, 1}; placement
    indexes ORDERS; tp_overlap and ep_overlap in [0, 1]; tp_userbuffers 0, 1 or 2 (1 / 2 only
    for dense models; tp > 1 with sequence parallelism is check_facts_act's rule); the AxoNN
    grid rules (`_check_grid`); tp x cp x dp x pp x gx x gy x gz = n_devices when given;
    every degree, batch and count at most INT_MAX (and finite).
    """
    xp = _xp(where)
    P = {f: _arr(getattr(parallel, f), where) for f in (
        *DIMENSIONS, *GRID, "vp", "micro_batch", "global_batch", "zero_stage", "recompute",
        "sequence_parallel", "dp_overlap", "tp_overlap", "ep_overlap", "cp_ring",
        "axonn_overlap", "placement", "pp_first_layers", "pp_last_layers", "zero_shard",
        "zero3_prefetch_params", "zero3_regather", "zero3_calls_per_layer",
        "zero3_copy_out", "zero3_root_unit", "etp", "ep_dispatch", "recompute_layer_frac",
        "recompute_policy", "tp_userbuffers", *(f"recompute_{m}" for m in RECOMPUTE_MODULES))}
    M = {f: _arr(getattr(model, f), where) for f in (
        "n_heads", "n_kv_heads", "ffn_hidden", "n_layers", "seq_len", "n_experts", "hidden",
        "head_dim", "kv_lora_rank")}
    pick = lambda a, i: a[i] if a.size > 1 else a[0]  # noqa: E731
    for f in (*DIMENSIONS, *GRID, "vp", "micro_batch", "global_batch"):
        v = P[f]
        _fail(~(v >= 1) | (v != xp.round(v)) | (v > INT_MAX), where,
              lambda i, f=f: f"{f}={pick(P[f], i):g} must be a whole number >= 1 (at "
                             f"most {INT_MAX})", f, v, anywhere=True)
    for f, hi in (("zero_stage", 3), ("recompute", 2), ("sequence_parallel", 1)):
        _check_choice(P, f, hi, where, pick)
    _check_fact_ranges(P, where, pick)
    v = P["placement"]
    _fail((v < 0) | (v >= len(ORDERS)) | (v != xp.round(v)), where,
          lambda i: f"placement={pick(v, i):g} is not allowed (allowed: 0..{len(ORDERS) - 1}, "
                    f"an index into specs.parallel.ORDERS; 0 is tp-cp-dp-pp)", "placement", v,
          anywhere=True)
    _check_tp_userbuffers(P, M, where, pick)
    _check_recompute_modules(P, M, where, pick)
    _check_grid(P, M, where, pick)
    _check_zero(P, where, pick)
    tp, heads = P["tp"], M["n_heads"]
    _fail(~_divides(tp, heads, xp), where, lambda i: (
        f"tp={pick(tp, i):g} must divide model.num_heads={pick(heads, i):g}; "
        f"allowed tp: {_divisors(pick(heads, i))}"), "tp", tp)
    kv = M["n_kv_heads"]
    _fail(~(_divides(tp, kv, xp) | _divides(kv, tp, xp)), where, lambda i: (
        f"tp={pick(tp, i):g} and model.num_kv_heads={pick(kv, i):g}: one must divide the "
        f"other (KV heads are split, or replicated, across TP ranks)"), "tp", tp)
    _fail(~_divides(tp, M["ffn_hidden"], xp), where, lambda i: (
        f"tp={pick(tp, i):g} must divide model.ffn_hidden={pick(M['ffn_hidden'], i):g}"),
        "tp", tp)
    _check_stages(P, M, where, pick)
    _fail(~_divides(P["cp"], M["seq_len"], xp), where, lambda i: (
        f"cp={pick(P['cp'], i):g} must divide model.seq_len={pick(M['seq_len'], i):g}"),
        "cp", P["cp"])
    ep = P["ep"]
    _fail((ep > 1) & (M["n_experts"] == 0), where, lambda i: (
        f"ep={pick(ep, i):g} needs an MoE model (model.moe_experts=0); allowed ep: 1"), "ep", ep)
    etp = P["etp"]
    _fail(~((etp == 0) | (etp == 1)) & (etp != P["tp"]), where, lambda i: (
        f"etp={pick(etp, i):g} is not allowed (allowed: 0 (= tp, experts inside dp), 1, "
        f"or tp={pick(P['tp'], i):g})"), "etp", etp, needs=("tp",))
    _fail((etp == 0) & ~_divides(ep, P["dp"], xp), where, lambda i: (
        f"ep={pick(ep, i):g} must divide dp={pick(P['dp'], i):g} (or set etp=1: the expert "
        f"group then takes the tp x cp x dp ranks)"), "ep", ep, needs=("dp", "etp"))
    ranks = P["tp"] * P["cp"] * P["dp"]
    _fail((etp > 0) & ~_divides(ep * xp.maximum(etp, 1.0), ranks, xp), where, lambda i: (
        f"ep x etp={pick(ep, i):g} x {pick(etp, i):g} must divide tp x cp x dp="
        f"{pick(ranks, i):g}"), "ep", ep, needs=("etp", "tp", "cp", "dp"))
    _fail((etp > 0) & (etp < P["tp"]) & (P["sequence_parallel"] == 0), where, lambda i: (
        f"etp={pick(etp, i):g} < tp={pick(P['tp'], i):g} needs sequence_parallel=1 "
        f"(Megatron-Core requires sequence parallelism for MoE with tp > 1)"), "etp", etp,
        needs=("tp", "sequence_parallel"))
    _fail((M["n_experts"] > 0) & ~_divides(ep, xp.maximum(M["n_experts"], 1), xp), where,
          lambda i: f"ep={pick(ep, i):g} must divide model.moe_experts="
                    f"{pick(M['n_experts'], i):g}", "ep", ep)
    per_step = P["micro_batch"] * P["dp"]
    _fail(~_divides(per_step, P["global_batch"], xp), where, lambda i: (
        f"global_batch={pick(P['global_batch'], i):g} must be a multiple of micro_batch x dp="
        f"{pick(P['micro_batch'], i):g} x {pick(P['dp'], i):g}"), "global_batch",
        P["global_batch"], needs=("micro_batch", "dp"))
    m = P["global_batch"] / (per_step * P["gz"])
    inter = P["vp"] > 1
    _fail(inter & (P["pp"] < 2), where, lambda i: f"vp={pick(P['vp'], i):g} needs pp > 1", "vp",
          P["vp"], needs=("pp",))
    _fail(inter & ~_divides(P["pp"], m, xp), where, lambda i: (
        f"interleaved schedule (vp={pick(P['vp'], i):g}) needs micro-batches per step "
        f"m={pick(m, i):g} to be a multiple of pp={pick(P['pp'], i):g}"), "vp", P["vp"],
        needs=("pp", "global_batch", "micro_batch", "dp", "gz"))
    if n_devices is not None:
        grid = P["gx"] * P["gy"] * P["gz"]
        total = P["tp"] * P["cp"] * P["dp"] * P["pp"] * grid
        nd = _arr(n_devices, where)
        names = lambda i: "tp x cp x dp x pp" + (  # noqa: E731
            " x gx x gy x gz" if pick(grid, i) > 1 else "")
        _fail(total != nd, where, lambda i: (
            f"{names(i)} = {pick(total, i):g} must equal {devices_field}={pick(nd, i):g}"),
            devices_field if devices_field.isidentifier() else "n_devices", nd,
            needs=("tp", "cp", "dp", "pp", *GRID))


def _check_grid(P, M, where, pick) -> None:
    """AxoNN 3D tensor grid (PAPERS.md sections 4.1, 4.4), where G = gx x gy x gz > 1:
    tp = 1 (the grid replaces Megatron TP), cp = 1, a dense model (moe_experts = 0); every
    linear layer's weight (n_out x k_in) shards evenly: gx divides hidden, gy divides
    num_heads (and num_kv_heads, or the reverse) and ffn_hidden, gz divides each
    (n_out k_in)/(gx gy) shard; micro_batch x dp x gz divides global_batch (the batch is split
    over dp x gz)."""
    xp = _xp(where)
    gx, gy, gz = P["gx"], P["gy"], P["gz"]
    on = gx * gy * gz > 1
    grid = lambda i: f"the AxoNN grid gx x gy x gz={pick(gx, i):g} x {pick(gy, i):g} x " \
                     f"{pick(gz, i):g}"  # noqa: E731
    for f in ("tp", "cp"):
        _fail(on & (P[f] != 1), where, lambda i, f=f: (
            f"{f}={pick(P[f], i):g} must be 1 with {grid(i)} (allowed {f}: 1)"), f, P[f],
            needs=GRID)
    _fail(on & (M["n_experts"] > 0), where, lambda i: (
        f"{grid(i)} needs a dense model, got model.moe_experts={pick(M['n_experts'], i):g}; "
        f"allowed: gx = gy = gz = 1 for MoE models"), "gx", gx, needs=GRID)
    h, a, akv, f = M["hidden"], M["n_heads"], M["n_kv_heads"], M["ffn_hidden"]
    _fail(~_divides(gx, h, xp), where, lambda i: (
        f"gx={pick(gx, i):g} must divide model.hidden={pick(h, i):g}; allowed gx: "
        f"{_divisors(pick(h, i))}"), "gx", gx)
    for name, v in (("num_heads", a), ("ffn_hidden", f)):
        _fail(~_divides(gy, v, xp), where, lambda i, name=name, v=v: (
            f"gy={pick(gy, i):g} must divide model.{name}={pick(v, i):g}; allowed gy: "
            f"{_divisors(pick(v, i))}"), "gy", gy)
    _fail(~(_divides(gy, akv, xp) | _divides(akv, gy, xp)), where, lambda i: (
        f"gy={pick(gy, i):g} and model.num_kv_heads={pick(akv, i):g}: one must divide the "
        f"other"), "gy", gy)
    dh = M["head_dim"]
    for label, elems in (("attention output", h * a * dh), ("MLP", h * f)):
        shard = elems / xp.maximum(gx * gy, 1)
        _fail(~_divides(gz, shard, xp), where, lambda i, label=label, shard=shard: (
            f"gz={pick(gz, i):g} must divide the {label} weight shard (n_out k_in)/(gx gy)="
            f"{pick(shard, i):g} elements"), "gz", gz, needs=("gx", "gy"))
    per_step = P["micro_batch"] * P["dp"] * gz
    _fail((gz > 1) & ~_divides(per_step, P["global_batch"], xp), where, lambda i: (
        f"global_batch={pick(P['global_batch'], i):g} must be a multiple of micro_batch x dp "
        f"x gz={pick(P['micro_batch'], i):g} x {pick(P['dp'], i):g} x {pick(gz, i):g}"),
        "global_batch", P["global_batch"], needs=("micro_batch", "dp", "gz"))


# The tolerance of `workload.pp.stage_layers`'s roundings, ceil(x - 1e-6): a quotient within
# 1e-6 above a whole number counts as that number, so that the twins round alike.
_STAGE_ROUND_TOL = 1e-6


def stage_counts(P, M, xp=np):
    """(first, smallest middle, largest middle, last) layers per stage, the numpy twin of
    `workload.pp.stage_layers` (same rules and the same rounding tolerance; tested against it
    in tests/test_stage_counts.py):

        auto:   c = ceil(L / p),  D = p c - L,  n_last = c - [D >= 1],  n_first = c - [D >= 2]
        given:  n_first = pp_first_layers,  n_last = pp_last_layers
        middle: (L - n_first - n_last) / (p - 2), rounded down (smallest) and up (largest)
        p = 2:  no middle stage (both 0);  p = 1: the one stage holds all L (all four = L)
    """
    L, p = M["n_layers"], P["pp"]
    c = xp.ceil(L / xp.maximum(p, 1) - _STAGE_ROUND_TOL)
    D = p * c - L
    auto = (P["pp_first_layers"] <= 0) & (P["pp_last_layers"] <= 0)
    first = xp.where(auto, c - (D >= 2), P["pp_first_layers"])
    last = xp.where(auto, c - (D >= 1), P["pp_last_layers"])
    rest, middles = L - first - last, xp.maximum(p - 2, 1)
    has_mid = p > 2
    mid_min = xp.where(has_mid, xp.floor(rest / middles + _STAGE_ROUND_TOL), 0.0)
    mid_max = xp.where(has_mid, xp.ceil(rest / middles - _STAGE_ROUND_TOL), 0.0)
    single = p <= 1
    return tuple(xp.where(single, L, x) for x in (first, mid_min, mid_max, last))


def stages_hold(P, M, xp=np):
    """True where every middle stage holds at least vp layers and the first and the last at
    least max(vp - 1, 1): their first / last chunk may hold only the embedding / the output
    layer and the loss (Llama 3 405B, Dubey et al. 2024, 3.3.2)."""
    first, mid_min, _, last = stage_counts(P, M, xp)
    pp, vp = P["pp"], P["vp"]
    edge = xp.maximum(vp - 1, 1)
    short = xp.where(pp > 2, (xp.minimum(first, last) < edge) | (mid_min < vp),
                     xp.where(pp == 2, xp.minimum(first, last) < edge, M["n_layers"] < vp))
    return ~short


def _check_stages(P, M, where, pick) -> None:
    """Pipeline stages (workload.pp.stage_layers): pp_first_layers and pp_last_layers are
    whole numbers >= 0, both given (> 0) or both 0 (balanced automatically), given only when
    pp > 1; with pp = 2 they add up to num_layers; every middle stage holds at least vp
    layers (one per virtual chunk) and the first and last at least max(vp - 1, 1): their
    first / last chunk may hold only the embedding / the output layer (Llama 3 405B). Chunks
    of a stage need not hold equal layer counts."""
    xp = _xp(where)
    f, l, pp, vp, L = (P["pp_first_layers"], P["pp_last_layers"], P["pp"], P["vp"],
                       M["n_layers"])
    for name, v in (("pp_first_layers", f), ("pp_last_layers", l)):
        _fail((v < 0) | (v != xp.round(v)), where, lambda i, name=name, v=v: (
            f"{name}={pick(v, i):g} must be a whole number >= 0 (0: balanced automatically)"),
            name, v, anywhere=True)
    _fail((f > 0) != (l > 0), where, lambda i: (
        f"pp_first_layers={pick(f, i):g} and pp_last_layers={pick(l, i):g}: give both "
        f"(> 0) or neither (0: stages balanced automatically)"), "pp_first_layers", f,
        needs=("pp_last_layers",))
    _fail((f > 0) & (pp <= 1), where, lambda i: (
        f"pp_first_layers={pick(f, i):g} needs pp > 1 (one stage holds every layer)"),
        "pp_first_layers", f, needs=("pp",))
    _fail((f > 0) & (pp == 2) & (f + l != L), where, lambda i: (
        f"pp=2: pp_first_layers + pp_last_layers={pick(f + l, i):g} must equal "
        f"model.num_layers={pick(L, i):g}"), "pp_first_layers", f,
        needs=("pp", "pp_last_layers"))
    first, mid_min, mid_max, last = stage_counts(P, M, xp)
    _fail(~stages_hold(P, M, xp), where, lambda i: (
        f"pp={pick(pp, i):g}, vp={pick(vp, i):g}: every middle pipeline stage must hold at "
        f"least vp layers, the first and last at least max(vp - 1, 1); "
        f"model.num_layers={pick(L, i):g} gives the first, middle and last stages "
        f"{pick(first, i):g}, {pick(mid_min, i):g}-{pick(mid_max, i):g} and {pick(last, i):g}"),
        "pp", pp, needs=("vp", "pp_first_layers", "pp_last_layers"))


def _check_choice(P, f, hi, where, pick) -> None:
    xp = _xp(where)
    v = P[f]
    _fail((v < 0) | (v > hi) | (v != xp.round(v)), where,
          lambda i: f"{f}={pick(v, i):g} is not allowed (allowed: "
                    f"{', '.join(str(k) for k in range(hi + 1))})", f, v, anywhere=True)


# Parallel fields that are framework facts (--set), checked field by field whatever the
# layout (`_check_fact_ranges`): `check_layout` and `check_search_facts` alike.
FACT_FIELDS = ("dp_overlap", "cp_ring", "axonn_overlap", "zero3_regather", "recompute_policy",
               "tp_overlap", "ep_overlap", "recompute_layer_frac", "ep_dispatch", "zero_shard",
               "zero3_prefetch_params", "zero3_calls_per_layer", "zero3_copy_out",
               "zero3_root_unit")


def _check_fact_ranges(P, where, pick) -> None:
    """Each framework fact's own range (FACT_FIELDS): dp_overlap, cp_ring, axonn_overlap,
    zero3_regather, ep_dispatch, zero3_copy_out, zero3_root_unit 0 or 1; recompute_policy
    0..2; tp_overlap and ep_overlap in [0, 1]; recompute_layer_frac in (0, 1]; zero_shard a
    whole number >= 0; zero3_prefetch_params in [0, 1e18]; zero3_calls_per_layer a whole
    number in 1..INT_MAX."""
    xp = _xp(where)
    for f, hi in (("dp_overlap", 1), ("cp_ring", 1), ("axonn_overlap", 1), ("zero3_regather", 1),
                  ("recompute_policy", 2)):
        _check_choice(P, f, hi, where, pick)
    for f in ("tp_overlap", "ep_overlap"):
        _fail(~((P[f] >= 0) & (P[f] <= 1)), where,
              lambda i, f=f: f"{f}={pick(P[f], i):g} must be in [0, 1]", f, P[f], anywhere=True)
    r = P["recompute_layer_frac"]
    _fail(~((r > 0) & (r <= 1)), where, lambda i: (
        f"recompute_layer_frac={pick(r, i):g} must be in (0, 1] (the fraction of the layers "
        f"that full recompute checkpoints; 1: every layer)"), "recompute_layer_frac", r,
        anywhere=True)
    _fail(~((P["ep_dispatch"] == 0) | (P["ep_dispatch"] == 1)), where, lambda i: (
        f"ep_dispatch={pick(P['ep_dispatch'], i):g} is not allowed (allowed: 0 pairwise "
        f"all-to-all, 1 DeepEP-style hierarchical dispatch)"), "ep_dispatch", P["ep_dispatch"],
        anywhere=True)
    g = P["zero_shard"]
    _fail((g < 0) | (g != xp.round(g)), where, lambda i: (
        f"zero_shard={pick(g, i):g} must be a whole number >= 0 (0: shard over all dp x cp "
        f"ranks)"), "zero_shard", g, anywhere=True)
    w = P["zero3_prefetch_params"]
    _fail(~((w >= 0) & (w <= 1e18)), where, lambda i: (
        f"zero3_prefetch_params={pick(w, i):g} must be >= 0 (0: the next layer whole, as "
        f"PyTorch FSDP; DeepSpeed's stage3_prefetch_bucket_size is 5e7)"),
        "zero3_prefetch_params", w, anywhere=True)
    k = P["zero3_calls_per_layer"]
    _fail(~((k >= 1) & (k <= INT_MAX)) | (k != xp.round(k)), where, lambda i: (
        f"zero3_calls_per_layer={pick(k, i):g} must be a whole number >= 1 (at most "
        f"{INT_MAX})"), "zero3_calls_per_layer", k, anywhere=True)
    c = P["zero3_copy_out"]
    _fail((c != 0) & (c != 1), where, lambda i: (
        f"zero3_copy_out={pick(c, i):g} is not allowed (allowed: 0 FSDP1 / DeepSpeed flat "
        f"buffers, 1 FSDP2 copy-out)"), "zero3_copy_out", c, anywhere=True)
    r = P["zero3_root_unit"]
    _fail((r != 0) & (r != 1), where, lambda i: (
        f"zero3_root_unit={pick(r, i):g} is not allowed (allowed: 0 root unit not priced, "
        f"1 FSDP's root unit gathered and reduce-scattered exposed)"), "zero3_root_unit", r,
        anywhere=True)


def _check_zero(P, where, pick) -> None:
    """ZeRO implementation facts that depend on the layout: zero_shard dividing dp x cp (the
    ranks that hold the same weights; each field's own range: `_check_fact_ranges`; > 0 only
    with zero_stage >= 1 is `check_facts_act`'s rule: the fact is inert at ZeRO 0)."""
    xp = _xp(where)
    g, n = P["zero_shard"], P["dp"] * P["cp"]
    _fail((g > 0) & ~_divides(g, n, xp), where, lambda i: (
        f"zero_shard={pick(g, i):g} must divide dp x cp={pick(n, i):g} (the ranks that hold "
        f"the same weights); allowed: {_divisors(pick(n, i))}"), "zero_shard", g,
        needs=("dp", "cp"))


def _recipe(where: str, name, bad) -> str:
    """How a precision error names the recipe: "precision='fp8-current'", or, for the
    anonymous Trainings of a batch (specs.batch.stack blanks names), "precision of batch
    entry i" (the first that fails)."""
    if name:
        return f"{where}={name!r}"
    if np.ndim(bad) == 0:
        return f"{where} (an unnamed Training)"
    return f"{where} of batch entry {int(np.flatnonzero(np.ravel(bad))[0])}"


def check_precision(system, training, where: str = "precision") -> None:
    """Refuse a low-precision recipe on a device that lacks the tensor cores it needs:

        any GEMM in FP8 (training.lowp_fprop / dgrad / wgrad)    needs matmul_fp8_TFLOPs > 0
        FP4 GEMMs (lowp_fp4) or blocks of < 128 elements (MXFP8's 1 x 32, NVFP4's 1 x 16:
        block-scaled MMA, Blackwell's 5th-generation tensor cores)  need matmul_fp4_TFLOPs > 0
    DeepSeek-V3's 128-element blocks run on Hopper's FP8 tensor cores (the scales are applied
    outside the MMA, DeepSeek-V3 report Section 3.3.2), so fp8-blockwise needs only FP8.
    Batched training leaves are checked element-wise; traced ones are skipped.
    """
    leaves = (training.lowp_fprop, training.lowp_dgrad, training.lowp_wgrad,
              training.lowp_fp4, training.lowp_block, system.matmul_fp8_flops_per_s,
              system.matmul_fp4_flops_per_s)
    try:
        f, d, w, fp4, block, p8, p4 = (np.asarray(x, dtype=float) for x in leaves)
    except Exception:  # tracers: values unknown
        return
    lowp = np.maximum(np.maximum(f, d), w) > 0
    name = getattr(training, "name", "?")
    low_names = "fp8-delayed, fp8-current (fp8), fp8-blockwise, mxfp8, nvfp4"
    if np.any(lowp & ~(p8 > 0)):
        raise SpecError(f"{_recipe(where, name, lowp & ~(p8 > 0))} runs GEMMs in FP8/FP4 but "
                        f"system "
                        f"'{getattr(system, 'name', '?')}' has no FP8 tensor cores "
                        f"(matmul_fp8_TFLOPs absent or 0); use bf16, fp16 or another "
                        f"16-bit preset there ({low_names} need an FP8 GPU: H100, H200, "
                        f"B200, B300, GB200, GB300)", field="precision", value=name,
                        needs=LOWP_GEMMS)
    blocked = lowp & ((fp4 > 0) | ((block > 0) & (block < 128)))
    if np.any(blocked & ~(p4 > 0)):
        raise SpecError(f"{_recipe(where, name, blocked & ~(p4 > 0))} needs block-scaled "
                        f"tensor cores (MXFP8 / NVFP4: "
                        f"Blackwell) but system '{getattr(system, 'name', '?')}' has none "
                        f"(matmul_fp4_TFLOPs absent or 0); on Hopper use fp8-delayed, "
                        f"fp8-current or fp8-blockwise", field="precision", value=name,
                        needs=(*LOWP_GEMMS, "lowp_fp4", "lowp_block"))


def check_tp_userbuffers_precision(parallel, training, where: str = "precision") -> None:
    """Refuse Parallel.tp_userbuffers = 1 with a low-precision recipe whose tensors Transformer
    Engine's userbuffers cannot all-gather:

        allowed: 16-bit (no lowp pass), per-tensor FP8 (lowp_block 0), MXFP8 (lowp_block 32)
    Why: `fill_userbuffers_buffer_for_all_gather` (TE pytorch/module/base.py, v2.7 to v2.16)
    takes unquantized tensors, Float8Quantizer / Float8CurrentScalingQuantizer and
    MXFP8Quantizer ones, and raises "Unsupported quantizer for Userbuffers" for any other
    (fp8-blockwise's 128-element blocks, NVFP4's 1 x 16 FP4); Megatron-Bridge's NVFP4 Llama
    recipes turn the overlap off (`tp_comm_overlap = False if precision == "nvfp4"`).
    tp_userbuffers = 2 (TE 1.8, NeMo Framework Launcher 24.07): 16-bit or delayed-scaling FP8
    only (TE 1.8's one FP8 recipe is DelayedScaling, transformer_engine/common/recipe/
    __init__.py at tag v1.8: no MXFP8, and no current scaling, whose Float8CurrentScaling
    first ships in v2.2; fp8-current is told by its separate amax pass, lowp_amax_pass).
    Batched leaves are checked element-wise; traced ones are skipped.
    """
    leaves = (parallel.tp_userbuffers, training.lowp_fprop, training.lowp_dgrad,
              training.lowp_wgrad, training.lowp_fp4, training.lowp_block,
              training.lowp_amax_pass)
    try:
        u, f, d, w, fp4, block, amax = (np.asarray(x, dtype=float) for x in leaves)
    except Exception:  # tracers: values unknown
        return
    lowp = np.maximum(np.maximum(f, d), w) > 0
    bad = (((u == 1) & lowp & ((fp4 > 0) | ((block > 0) & (block != 32))))
           | ((u == 2) & lowp & ((fp4 > 0) | (block > 0) | (amax > 0))))
    if np.any(bad):
        bad_b, block_b, fp4_b, u_b = (np.ravel(x) for x in
                                      np.broadcast_arrays(bad, block, fp4, u))
        i = int(np.flatnonzero(bad_b)[0])
        raise SpecError(
            f"{_recipe(where, getattr(training, 'name', None), bad)} (lowp_block="
            f"{block_b[i]:g}, lowp_fp4={fp4_b[i]:g}) with parallel.tp_userbuffers="
            f"{u_b[i]:g}: Transformer Engine's userbuffers all-gathers only 16-bit, per-tensor "
            f"FP8 and MXFP8 tensors (\"Unsupported quantizer for Userbuffers\" otherwise; TE "
            f"1.8, tp_userbuffers 2: delayed-scaling FP8 only, no current scaling or "
            f"MXFP8); allowed: tp_userbuffers 0 with this precision, or bf16, fp16, "
            f"fp8-delayed, fp8-current, mxfp8 (tp_userbuffers 1), bf16, fp16, fp8-delayed "
            f"(tp_userbuffers 2)", field="tp_userbuffers", value=float(u_b[i]),
            needs=(*LOWP_GEMMS, "lowp_fp4", "lowp_block", "lowp_amax_pass"))


def check_tp_userbuffers_system(parallel, system, where: str = "parallel") -> None:
    """Refuse Parallel.tp_userbuffers = 2 on a system whose GPU's SM count is not known:

        allowed: tp_userbuffers 2 with system.gpu_sms > max(UB_PIPE_COMM_SMS) = 24
    Why: the pipelined reduce-scatter (`schedule.overlap.tp_pipeline_rs_s`, priced in
    predict._tp_userbuffers_parts) runs its GEMM chunks on the SMs the comm kernel leaves,
    gpu_sms - num_sm (TE 1.8 `_math_sms = prop.multiProcessorCount - num_comm_sm` with
    set_sm_margin; num_sm 24 / 16 as NeMo Framework Launcher 24.07's H100 FP8 configuration
    ub_cfg_h100_fp8_h8192_tp4_mbs1_seqlen8192.yaml sets them: UB_PIPE_COMM_SMS), so the GEMM
    slows by gpu_sms / (gpu_sms - num_sm): without the GPU's count (System.gpu_sms = 0) that
    margin has no value. Reads the System leaf, which batched systems keep (a hardware sweep's
    `specs.batch.anonymous` blanks system.gpu, not gpu_sms). Batched leaves: the first entry
    that fails, with its index. Traced leaves are skipped."""
    try:
        u = np.asarray(parallel.tp_userbuffers, dtype=np.float64)
        sms = np.asarray(system.gpu_sms, dtype=np.float64)
    except Exception:  # tracers: values unknown
        return
    need = max(UB_PIPE_COMM_SMS)
    # the index goes on the batched one: layouts (a runs CSV) or systems (a hardware sweep)
    u_at, s_at = u.size > 1, sms.size > 1
    u, sms = (np.ravel(x) for x in np.broadcast_arrays(u, sms))
    bad = (u == 2) & ~(sms > need)
    if np.any(bad):
        i = int(np.flatnonzero(bad)[0])
        at = lambda batched: f"[{i}]" if batched else ""  # noqa: E731
        raise SpecError(
            f"{where}{at(u_at)}.tp_userbuffers=2 with system{at(s_at)}.gpu_sms={sms[i]:g}: the "
            f"pipelined forward reduce-scatter runs its GEMM on the SMs its comm kernels leave "
            f"(gpu_sms - num_sm, num_sm 24 / 16 as NeMo Framework Launcher 24.07's H100 FP8 "
            f"configuration sets them), so the GPU's SM count must be known; allowed: "
            f"tp_userbuffers 2 with system.gpu_sms > {need:g} (the system file's gpu_sms key), "
            f"or tp_userbuffers 0 or 1", field="tp_userbuffers", value=2.0)


# ------------------------------------------------------------------- model, system, training

# The largest capacity factor: Megatron-Core gives each expert capacity ceil(T k C_f / E)
# tokens of a micro-batch's T (megatron/core/transformer/moe/moe_utils.py: get_capacity(
# num_tokens * topk, num_experts, capacity_factor), called by topk_routing_with_score_function
# and the token dispatchers' drop-and-pad paths); a token picks an expert at most once, so no
# expert ever receives more than T tokens: at C_f = E / k every expert already holds all of
# them, and a larger C_f only pads (the cost terms charge k C_f T routed rows).
CAPACITY_WHY = ("each expert's capacity is T x moe_topk x C_f / moe_experts tokens of a "
                "micro-batch's T (Megatron-Core moe_utils.get_capacity), and no expert can "
                "receive more than T: at C_f = moe_experts / moe_topk every expert already "
                "holds every token")

_MODEL_COUNTS = ("n_layers", "hidden", "ffn_hidden", "n_heads", "n_kv_heads", "head_dim",
                 "vocab", "seq_len")
_MODEL_SWITCHES = ("gated_mlp", "causal", "rms_norm", "tied_embeddings", "biases",
                   "learned_positions")
# Efficiency ranges (those of load.efficiency_from_dict, on the Python object).
EFF_FRACTIONS = ("mm_max", "attn_max", "mem_eff", "coll_eff_intra", "coll_eff_inter",
                 "mem_usable_frac")
EFF_POSITIVE = ("mm_half_dim", "mm_exponent", "attn_half_work", "attn_exponent",
                "attn_half_head_dim", "floor_pnorm", "act_mem_factor")
# Training: 0/1 switches, and byte counts that must be > 0 (the others: finite, >= 0).
TRAINING_SWITCHES = ("grad_buffers_persist", "matmul_fp32", "flash_attention", "dropout",
                     "xla_compiled", "lowp_fprop", "lowp_dgrad", "lowp_wgrad", "lowp_fp4",
                     "lowp_amax_pass", "lowp_weight_cache", "lowp_param_gather",
                     "llama_eager_pointwise", "attention_fa2",
                     "moe_eager_clamp_bias", "rope_kv_pass", "moe_quant_pad", "moe_expert_loop",
                     "moe_host_sync",
                     "lowp_te_quantizer", "te_cudnn_norm",
                     "gemm_wave_split", "cp_torch")
TRAINING_POSITIVE = ("weight_bytes", "grad_bytes", "activation_bytes", "residual_bytes")
# Network tiers: static structure, each tier adds its collectives' terms to the compiled
# program. Measured (gpt-small, 2-core CPU under load, 2026-11-26): first predict 22 s with
# 2 tiers, 26 s with 8, 46 s with 16 (a 40-tier system ran past 60 s, issue 20).
MAX_TIERS = 8
_TIERS_WHY = ("real fabrics have at most 4-5 nested levels (the deepest shipped, Meta's 24K "
              "H100 cluster: NVLink, rack, AI zone, data center); every tier adds its terms "
              "to the compiled program (16 tiers compile 2x slower than 8)")
_FINITE_MAX = 1e30  # any leaf: finite and below this (float32 holds 3.4e38)


def _finite(v, xp):
    return xp.isfinite(v) & (xp.abs(v) <= _FINITE_MAX)


def _fmt(v) -> str:
    return f"{float(v):g}"


def check_model(model, where: str = "model") -> None:
    """Counts (layers, widths, heads, head_dim, vocab, seq_len) whole numbers from 1 to
    INT_MAX; 0/1 switches; qk_norm 0, 1 or 2; MoE fields whole numbers >= 0 (top-k <=
    experts); every other leaf finite."""
    xp = _xp(where)
    pick = lambda a, i: a[i] if a.size > 1 else a[0]  # noqa: E731
    for f in _MODEL_COUNTS:
        v = _arr(getattr(model, f), where)
        _fail(~(v >= 1) | (v != xp.round(v)) | (v > INT_MAX), where, lambda i, f=f, v=v: (
            f"{f}={pick(v, i):g} must be a whole number >= 1 (at most {INT_MAX})"), f, v,
            anywhere=True)
    for f in _MODEL_SWITCHES:
        v = _arr(getattr(model, f), where)
        _fail(~((v == 0) | (v == 1)), where, lambda i, f=f, v=v: (
            f"{f}={pick(v, i):g} is not allowed (allowed: 0, 1)"), f, v, anywhere=True)
    qk = _arr(model.qk_norm, where)  # the index of specs.model.QK_NORM_FORMS
    _fail(~((qk == 0) | (qk == 1) | (qk == 2)), where, lambda i: (
        f"qk_norm={pick(qk, i):g} is not allowed (allowed: 0 none, 1 head, 2 projection)"),
        "qk_norm", qk, anywhere=True)
    for f in ("n_experts", "moe_topk", "moe_ffn_hidden", "n_shared_experts"):
        v = _arr(getattr(model, f), where)
        _fail(~(v >= 0) | (v != xp.round(v)) | (v > INT_MAX), where, lambda i, f=f, v=v: (
            f"{f}={pick(v, i):g} must be a whole number >= 0 (at most {INT_MAX})"), f, v,
            anywhere=True)
    k, e = _arr(model.moe_topk, where), _arr(model.n_experts, where)
    _fail((e > 0) & (k > e), where, lambda i: f"moe_topk={pick(k, i):g} must be <= "
                                              f"n_experts={pick(e, i):g}", "moe_topk", k)
    if not isinstance(where, _Collect):  # concrete values only (valid_mask does not trace it)
        c = _arr(model.capacity_factor, where)
        _fail((e > 0) & (k < 1), where, lambda i: (
            f"moe_topk={pick(k, i):g} must be >= 1 for an MoE model (n_experts="
            f"{pick(e, i):g}): every token goes to its top-k experts"), "moe_topk", k)
        _fail((e > 0) & ~(c > 0), where, lambda i: (
            f"capacity_factor={pick(c, i):g} must be > 0 for an MoE model"), "capacity_factor",
            c)
        _fail((e > 0) & (c > e / np.maximum(k, 1)), where, lambda i: (
            f"capacity_factor={pick(c, i):g} is above n_experts / moe_topk={pick(e, i):g} / "
            f"{pick(k, i):g}: {CAPACITY_WHY}; allowed: > 0 and at most "
            f"{pick(e / np.maximum(k, 1), i):g}"), "capacity_factor", c)
    _check_finite_leaves(model, "model", where)


def _check_finite_leaves(tree, name, where) -> None:
    import jax

    xp = _xp(where)
    for path, v in jax.tree_util.tree_flatten_with_path(tree)[0]:
        v = _arr(v, where)
        _fail(~_finite(v, xp), where, lambda i, path=path, v=v: (
            f"{jax.tree_util.keystr(path).lstrip('.')}={_fmt(v.ravel()[min(i, v.size - 1)])} must "
            f"be a finite number (magnitude at most {_FINITE_MAX:g})"),
            jax.tree_util.keystr(path).lstrip('.'), v, anywhere=True)


def check_system(system, where: str = "system") -> None:
    """A System built anywhere (a file, Python): peak FLOP/s, HBM bandwidth and capacity,
    power > 0; tiers: domain_size >= 1 and nested (non-decreasing), bandwidth > 0,
    latency >= 0, oversubscription >= 1; efficiency fractions in (0, 1] (a file: [0.001, 1];
    calibration's sigmoid may go below), shape
    parameters > 0, exponents <= 20, times and bytes >= 0; reliability: failure rate,
    storage bandwidth > 0, restart >= 0; every leaf finite."""
    xp = _xp(where)
    pick = lambda a, i: a.ravel()[min(i, a.size - 1)]  # noqa: E731

    def rule(v, ok, field, allowed, traced=True):
        """traced=False: a range whose edge is a common value (oversubscription 1, a
        fraction of 1, nested tiers a co-design may cross): concrete values only, so that
        finite differences and sweeps under jit may step across it."""
        if not traced and isinstance(where, _Collect):
            return
        v = _arr(v, where)
        _fail(~ok(v), where, lambda i: f"{field}={pick(v, i):g} is not allowed "
                                       f"(allowed: {allowed})", field, v)

    n_tiers = len(system.tiers)
    if not 1 <= n_tiers <= MAX_TIERS and not isinstance(where, _Collect):
        raise SpecError(f"{where}: tiers has {n_tiers} network tiers (allowed: 1 to "
                        f"{MAX_TIERS}): {_TIERS_WHY}", field="tiers", value=n_tiers,
                        anywhere=True)
    _check_finite_leaves(system, "system", where)
    for f in ("matmul_flops_per_s", "matmul_fp32_flops_per_s", "vector_flops_per_s",
              "hbm_bandwidth_Bps", "hbm_capacity_bytes", "power_W"):
        rule(getattr(system, f), lambda v: v > 0, f, "> 0")
    for f in ("matmul_sustained_frac", "matmul_fp8_sustained_frac", "matmul_fp4_sustained_frac"):
        rule(getattr(system, f), lambda v: (v >= 0) & (v <= 1), f,
             "0 to 1 (a published GEMM throughput over the datasheet peak; 0: not measured)")
    for f in ("attn_fa2_fwd_frac", "attn_fa2_bwd_frac"):
        rule(getattr(system, f), lambda v: (v >= 0) & (v <= 1), f,
             "0 to 1 (a published FlashAttention-2 throughput over the 16-bit peak; 0: not "
             "measured)")
    rule(system.attn_fa2_half_flop, lambda v: v >= 0, "attn_fa2_half_flop",
         ">= 0 (FlashAttention-2's half-work in forward FLOPs; 0: the set's fall-off)")
    rule(system.attn_fa2_exponent, lambda v: v > 0, "attn_fa2_exponent",
         "> 0 (steepness of FlashAttention-2's fall-off with work)")
    rule(system.sfu_exp_per_s, lambda v: v >= 0, "sfu_exp_per_s",
         ">= 0 (exponentials per second of the special-function units; 0: no floor)")
    rule(system.attn_sink_bwd_row_s, lambda v: v >= 0, "attn_sink_bwd_row_s",
         ">= 0 (seconds per query row the sink gradient adds to the attention backward; 0: "
         "not measured)")
    rule(system.gpu_sms, lambda v: v >= 0, "gpu_sms",
         ">= 0 (streaming multiprocessors of the GPU; 0: unknown)")
    rule(system.fp8_non_tn_gemm, lambda v: (v == 0) | (v == 1), "fp8_non_tn_gemm",
         "0 or 1 (1: FP8 GEMMs take non-TN layouts, Blackwell sm100 / sm103)",
         traced=False)
    prev = None
    for j, t in enumerate(system.tiers):
        rule(t.domain_size, lambda v: v >= 1, f"tiers[{j}].domain_size", ">= 1")
        rule(t.bandwidth_Bps, lambda v: v > 0, f"tiers[{j}].bandwidth_Bps", "> 0")
        rule(t.latency_s, lambda v: v >= 0, f"tiers[{j}].latency_s", ">= 0")
        rule(t.oversubscription, lambda v: v >= 1, f"tiers[{j}].oversubscription",
             ">= 1 (1: non-blocking)", traced=False)
        if prev is not None:
            p = _arr(prev, where)
            rule(t.domain_size, lambda v, p=p: v >= p, f"tiers[{j}].domain_size",
                 f">= tiers[{j - 1}].domain_size (tiers are nested, innermost first)",
                 traced=False)
        prev = t.domain_size
    eff = system.eff
    for f in type(eff).__dataclass_fields__:
        v = getattr(eff, f)
        if f in EFF_FRACTIONS:
            rule(v, lambda v: v > 0, f"eff.{f}", "(0, 1]")
            rule(v, lambda v: v <= 1, f"eff.{f}", "(0, 1]", traced=False)
        elif f in EFF_POSITIVE:  # > 0 in a file; 0 here: a tiny value underflows float32
            hi = 20 if f.endswith("exponent") else _FINITE_MAX
            rule(v, lambda v: v >= 0, f"eff.{f}", f"[0, {hi:g}]")
            rule(v, lambda v, hi=hi: v <= hi, f"eff.{f}", f"[0, {hi:g}]", traced=False)
        else:
            rule(v, lambda v: v >= 0, f"eff.{f}", ">= 0")
    rel = system.reliability
    rule(rel.failure_rate_per_s, lambda v: v > 0, "reliability.failure_rate_per_s",
         "> 0 (failures per device per second)")
    rule(rel.storage_write_Bps, lambda v: v > 0, "reliability.storage_write_Bps", "> 0")
    rule(rel.restart_s, lambda v: v >= 0, "reliability.restart_s", ">= 0")


def check_training(training, where: str = "training") -> None:
    """0/1 switches (TRAINING_SWITCHES) are 0 or 1; bytes of weights, gradients,
    activations and the residual > 0; every other leaf finite and >= 0; vocab_pad_to a
    whole number; on concrete values also lowp_layer_frac <= 1 and lowp_block, attn_tile
    0 or whole numbers >= 1."""
    xp = _xp(where)
    pick = lambda a, i: a.ravel()[min(i, a.size - 1)]  # noqa: E731
    _check_finite_leaves(training, "training", where)
    for f in (f.name for f in dataclasses.fields(training) if f.metadata.get("pytree_node", True)):
        v = _arr(getattr(training, f), where)
        if f in TRAINING_SWITCHES and not isinstance(where, _Collect):  # (valid_mask: >= 0)
            _fail(~((v == 0) | (v == 1)), where, lambda i, f=f, v=v: (
                f"{f}={pick(v, i):g} is not allowed (allowed: 0, 1)"), f, v, anywhere=True)
        elif f in TRAINING_POSITIVE:
            _fail(~(v > 0), where, lambda i, f=f, v=v: (
                f"{f}={pick(v, i):g} must be > 0"), f, v, anywhere=True)
        else:
            _fail(~(v >= 0), where, lambda i, f=f, v=v: (
                f"{f}={pick(v, i):g} must be >= 0"), f, v, anywhere=True)
    v = _arr(training.vocab_pad_to, where)
    _fail(v != xp.round(v), where, lambda i: (
        f"vocab_pad_to={pick(v, i):g} must be a whole number >= 0"), "vocab_pad_to", v,
        anywhere=True)
    if isinstance(where, _Collect):  # concrete values only, as the switches above
        return
    v = _arr(training.lowp_layer_frac, where)
    _fail(v > 1, where, lambda i: (
        f"lowp_layer_frac={pick(v, i):g} is not allowed (allowed: 0 to 1, the fraction of "
        f"the transformer layers whose linears run in low precision)"), "lowp_layer_frac", v,
        anywhere=True)
    for f, what in (("lowp_block", "elements per scale factor; 0: one scale per tensor"),
                    ("attn_tile", "the B of the attention kernel's B x B score tiles; 0: "
                                  "no tiling")):
        v = _arr(getattr(training, f), where)
        _fail(((v > 0) & (v < 1)) | (v != xp.round(v)), where, lambda i, f=f, v=v, w=what: (
            f"{f}={pick(v, i):g} is not allowed (allowed: 0 or a whole number >= 1: {w})"), f, v,
            anywhere=True)


def check_job(parallel, system, where: str = "layout") -> None:
    """The job fits the system: tp x cp x dp x pp x gx x gy x gz devices at most the last
    network tier's domain (the whole cluster)."""
    n = _arr(parallel.n_devices, where)
    last = _arr(system.tiers[-1].domain_size, where)
    pick = lambda a, i: a.ravel()[min(i, a.size - 1)]  # noqa: E731
    _fail(n > last, where, lambda i: (
        f"the job's {pick(n, i):g} devices exceed the system's last network tier "
        f"('{system.tiers[-1].name}', domain_size={pick(last, i):g}: the whole cluster); "
        f"allowed: at most {pick(last, i):g} devices"), "n_devices", n)


def check_inputs(model, parallel, system, training, n_devices=None, where: str = "parallel",
                 devices_field: str = "number of devices") -> None:
    """Every input of a prediction, before anything is traced (SpecError on the first
    failure): model, system, training, the layout against the model, the job against the
    system's tiers, the precision recipe against the device's tensor cores."""
    check_model(model)
    check_system(system)
    check_training(training)
    check_layout(model, parallel, n_devices, where, devices_field)
    check_job(parallel, system, where)
    check_precision(system, training)
    check_tp_userbuffers_precision(parallel, training)
    check_tp_userbuffers_system(parallel, system, where)
    check_facts_act(model, parallel, training, where, "training")


def valid_mask(model, parallel, system, training):
    """The rules of `check_inputs` under jit / vmap (jax.numpy, traced values): a boolean,
    True where every one holds (Result.valid). Left to concrete values: the ranges whose
    edge is a common value (oversubscription >= 1, efficiency fractions <= 1, exponents
    <= 20, nested tiers, training's 0/1 switches), which finite differences, sweeps and
    calibration step across smoothly; the tier count (static)."""
    import jax.numpy as jnp

    where = _Collect(jnp)
    check_model(model, where)
    check_system(system, where)
    check_training(training, where)
    check_layout(model, parallel, None, where)
    check_job(parallel, system, where)
    return computed_once(jnp.asarray(where.ok, dtype=bool))


def computed_once(tree):
    """`tree` with every array behind one exact division, so that XLA computes each once per
    program instead of copying the chain that produces it into every consumer fusion:

        floating x:  x / where(x == x, 1, 2)        (= x / 1; NaN stays NaN; d/dx = 1)
        boolean b:   1 / where(b, 1, 2) > 0.75      (1 > 0.75, 0.5 < 0.75: the same boolean)
    Python numbers and other arrays pass unchanged.

    Why (XLA:CPU, measured; benchmarks/README.md "Session 13: suite time" and "Session 13:
    the forward pass in the backward fusions"): XLA's loop fusion copies a cheap element-wise
    producer into each consumer fusion; it refuses to duplicate only "expensive" ops
    (InstructionFusion::IsExpensive: a floating-point divide, exp, log, ...).
    - The validity mask (`valid_mask`, ~2,300 compares / ands on the inputs) sits in
      `predict_step`'s selects, and the transpose of the step's select seeds the whole
      backward pass: each of the ~100 backward fusions got its own copy (469,174 optimized
      HLO lines against 215,851 without the mask; ~56 s of CPU against ~19 s to compile the
      value and System gradient with every feature). Behind the division: 219,714 lines, ~23 s;
      values and gradients bit-identical (float32 / float64, hard and smooth model).
    - The forward pass: the value-and-gradient program held ~10.9 HLO ops per original op,
      every backward fusion recomputing the forward chain it reads. The division on the
      outputs of predict's `_layer_parts`, `_head_parts` and `_dp_times` cut the hard compile
      from 26.6 to 7.1 s of CPU; the compiled float64 gradients move at the rounding level
      (<= 4.4e-16 relative on every check_grads case of tests/test_gradients.py, hard and
      smooth), once `costs.smooth.exposed` no longer cancels (before that fix the smooth
      gradient moved by up to 7.4e-4 with such a change of structure).
    Not instead: an optimization barrier (XLA:CPU removes barriers before fusion), jnp.all
    over the stacked rules (rewritten into the same chain of ands), stop_gradient (the same
    program before optimization). XLA:GPU counts an F32 / F16 divide as cheap
    (GpuInstructionFusion::IsExpensive), so there the copies may remain (not measured): only
    compile time is at stake, never a value."""
    import jax
    import jax.numpy as jnp

    def once(x):
        if not isinstance(x, jax.Array):
            return x
        if x.dtype == jnp.bool_:
            return 1.0 / jnp.where(x, 1.0, 2.0) > 0.75
        if not jnp.issubdtype(x.dtype, jnp.floating):
            return x
        return x / jnp.where(x == x, 1.0, 2.0).astype(x.dtype)

    return jax.tree.map(once, tree)


def check_finite_result(result, model, parallel, where: str = "prediction") -> None:
    """A SpecError when any number of a Result (one configuration) is not finite (NaN or
    infinite: float32 overflow of a job too large for the model's arithmetic), naming the
    quantity and the sizes that drive it; no non-finite number leaves diffperf."""
    import jax

    bad = [jax.tree_util.keystr(p) for p, v in jax.tree_util.tree_flatten_with_path(result)[0]
           if not np.all(np.isfinite(np.asarray(v, dtype=np.float64)))]
    if bad:
        tokens = float(np.max(np.asarray(parallel.global_batch, np.float64)
                              * np.asarray(model.seq_len, np.float64)))
        raise SpecError(
            f"{where}: {bad[0].lstrip('.')} is not a finite number (float32 overflow): the job "
            f"is too large to predict (seq_len={float(np.max(model.seq_len)):g}, "
            f"global_batch={float(np.max(parallel.global_batch)):g}, {tokens:g} tokens per "
            f"step); allowed: sizes whose step FLOPs stay below 3.4e38")
