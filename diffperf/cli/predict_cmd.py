"""`diffperf predict`: one configuration's step time, breakdown and memory."""

from __future__ import annotations

import math

from diffperf.cli.output import console, fmt, print_json, table
from diffperf.cli.cache import kernel_store
from diffperf.errors import SpecError
from diffperf.cli.options import add_model_system, print_notes

# The layout options (name, GPT-3 175B's shipped value): the shipped job (SHIPPED_JOB) takes
# them all by default (DESIGN.md, README: tp 8, pp 8, dp 16, SP, selective recompute, ZeRO-1);
# another model takes NEUTRAL for the ones not given, and with none given the search's best.
_LAYOUT = (("tp", 8), ("pp", 8), ("cp", 1), ("ep", 1), ("vp", 1), ("micro_batch", 1),
           ("zero_stage", 1), ("cp_ring", 1), ("gx", 1), ("gy", 1), ("gz", 1),
           ("pp_first_layers", 0), ("pp_last_layers", 0))
SHIPPED = dict(_LAYOUT, sequence_parallel=1, recompute="selective", dp_overlap=1,
               placement="tp-cp-dp-pp")
NEUTRAL = SHIPPED | dict(tp=1, pp=1)
SHIPPED_JOB = ("gpt3-175b", 1024)  # (model, GPUs) whose layout SHIPPED is
LAYOUT_OPTIONS = ("dp", *SHIPPED)  # --global-batch belongs to the job, not the layout
# Parallel fields with an option of their own (not settable through --set).
_OWN_OPTIONS = set(LAYOUT_OPTIONS) | {"global_batch"}
# The layout in --json, in the order and the names of `diffperf search --json`, then the
# fields search does not vary.
JSON_LAYOUT = ("tp", "pp", "dp", "cp", "ep", "vp", "micro_batch", "global_batch", "gx", "gy",
               "gz", "zero_stage", "recompute", "sequence_parallel", "placement", "cp_ring",
               "dp_overlap", "pp_first_layers", "pp_last_layers")


def add_parser(sub):
    p = sub.add_parser("predict", help="step time, breakdown and memory of one layout",
                       description=(
        "Predict one configuration. With no options: GPT-3 175B on 1024 A100 80 GB "
        "(tp 8, pp 8, dp 16, sequence parallel, selective recompute, ZeRO-1). With a model "
        "and --gpus but no layout option: the fastest layout that fits, found by the "
        "search (and said so). Layout options not given take 1 (tp, pp, cp, ...), ZeRO-1, "
        "selective recompute, SP; GPT-3 175B's take its shipped layout."))
    add_model_system(p)
    add_layout_options(p, alias=True)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--no-cache", action="store_true", help="do not keep the compiled program "
                   "in ~/.cache/diffperf (a later run then compiles it again, ~3 s)")
    p.set_defaults(run=run, efficiency_defaults=True)
    return p


def add_layout_options(p, alias=False) -> None:
    """The options of one layout (predict, sensitivity): --gpus, --dp, the degrees, switches
    and the placement; `build` reads them. Each defaults to None (not given: `build`
    decides). `alias`: --placements is accepted for --placement (search's spelling)."""
    p.add_argument("--gpus", type=int, default=None,
                   help="devices; dp = gpus / (tp cp pp gx gy gz) (default: 1024 for "
                   "GPT-3 175B, else required unless --dp is given)")
    from diffperf.cli.options import GLOBAL_BATCH_HELP

    p.add_argument("--global-batch", dest="global_batch", type=int, default=None,
                   help=GLOBAL_BATCH_HELP)
    p.add_argument("--dp", type=int, help="data-parallel degree (default: from --gpus)")
    for name, default in _LAYOUT:
        p.add_argument(f"--{name.replace('_', '-')}", dest=name, type=int, default=None,
                       help=f"(default {NEUTRAL[name]}; GPT-3 175B: {default})"
                       if NEUTRAL[name] != default else f"(default {default})")
    p.add_argument("--sequence-parallel", type=int, choices=(0, 1), default=None,
                   help="(default 1)")
    p.add_argument("--recompute", choices=("none", "selective", "full"), default=None,
                   help="(default selective)")
    p.add_argument("--dp-overlap", type=int, choices=(0, 1), default=None, help="(default 1)")
    names = ("--placement", "--placements") if alias else ("--placement",)
    p.add_argument(*names, dest="placement", default=None,
                   help="rank order of the groups, innermost first (default: Megatron-LM's "
                   "tp-cp-dp-pp)")
    p.add_argument("--set", action="append", metavar="FIELD=VALUE", help=(
        "framework fact: any other Parallel or Training field (e.g. flash_attention=0, "
        "tp_overlap=0; checkpoint_interval_s=1800 for the goodput); repeatable. With "
        "--calibration, the overlay's fitted_on.set is applied first (a note says so)"))


def _search_layout(model, system, train, args, par_over) -> dict:
    """The fastest layout that fits of args.gpus devices (`diffperf search`'s best), as
    layout option values; a note says so. SpecError when none fits."""
    from diffperf.cli.cache import kernel_store
    from diffperf.search import (COLUMNS, PLACEMENTS, RANK_FIELDS, enumerate_layouts, ranked,
                                 search)

    # every layout, those on which a --set fact cannot act too: the framework runs them
    # without it (`build` then predicts the chosen one so and says which facts do not act)
    layouts = enumerate_layouts(model, args.gpus, args.global_batch)
    result = search(model, system, train, layouts, validate=False, store=kernel_store(args),
                    fields=RANK_FIELDS, parallel=par_over)
    best = ranked(result, 1)
    if not len(best):
        i = int(result.memory.total_bytes.argmin())
        raise SpecError(
            f"no layout of {model.name} on --gpus={args.gpus} x {system.name} with "
            f"--global-batch={args.global_batch} fits in memory (the smallest needs "
            f"{float(result.memory.total_bytes[i]) / 2**30:.4g} GiB per device, usable "
            f"{float(result.memory.capacity_bytes[i]) / 2**30:.4g} GiB): give more --gpus")
    row = layouts[best[0]]
    lay = {c: int(row[i]) for i, c in enumerate(COLUMNS[:-1]) if c != "global_batch"}
    lay["recompute"] = ("none", "selective", "full")[lay["recompute"]]
    lay["placement"] = "-".join(PLACEMENTS[int(row[-1])])
    n_fit = int(result.fits.sum())
    args.notes.append(
        f"layout chosen by search: tp {lay['tp']} pp {lay['pp']} dp {lay['dp']} cp "
        f"{lay['cp']} ep {lay['ep']} vp {lay['vp']} micro-batch {lay['micro_batch']} ZeRO "
        f"{lay['zero_stage']} recompute {lay['recompute']} sp {lay['sequence_parallel']} "
        f"placement {lay['placement']} (global batch {args.global_batch}): the fastest of "
        f"{n_fit:,} layouts that fit "
        f"({len(layouts):,} evaluated); `diffperf search` with the same options lists the "
        f"others, a layout option gives your own")
    return lay


def _resolve_layout(model, system, train, args, par_over) -> None:
    """Fill the layout options not given (None) in args, and args.gpus: the shipped layout
    for the shipped job, the search's best layout when no layout option is given, else
    NEUTRAL (GPT-3 175B: SHIPPED) for each one missing. args.layout_source says which."""
    given = [k for k in LAYOUT_OPTIONS if getattr(args, k) is not None]
    gpt3 = model.name == SHIPPED_JOB[0]
    if args.gpus is None and gpt3:
        args.gpus = SHIPPED_JOB[1]
    if args.gpus is None and args.dp is None:
        what = ("--gpus N or --dp N beside the layout options given" if given else
                "--gpus N (predict then searches the fastest layout that fits) or a layout "
                "with --dp (--tp, --pp, --dp, ...)")
        raise SpecError(f"--model {args.model}: give {what}; the default of "
                        f"{SHIPPED_JOB[1]} GPUs is GPT-3 175B's shipped job")
    if not given and (not gpt3 or args.gpus != SHIPPED_JOB[1]):
        args.layout_source = "search"
        chosen = _search_layout(model, system, train, args, par_over)
    else:
        args.layout_source = "shipped default" if not given else "given"
        chosen = {}
    defaults = SHIPPED if gpt3 else NEUTRAL
    for k in LAYOUT_OPTIONS:
        if getattr(args, k) is None and k != "dp":
            setattr(args, k, chosen.get(k, defaults[k]))
    if "dp" in chosen:
        args.dp = chosen["dp"]


def _fit_default_batch(args) -> None:
    """A default global batch (not given) that dp x micro_batch does not divide becomes the
    nearest multiple of dp x micro_batch at or above it (a note says so); a given one is
    left to check_layout's error."""
    step = args.dp * args.micro_batch
    if not getattr(args, "global_batch_default", False) or step <= 0 or \
            args.global_batch % step == 0:
        return
    batch = -(-args.global_batch // step) * step
    args.notes.append(f"global batch {batch}: the default {args.global_batch} rounded up to a "
                      f"multiple of dp x micro-batch = {args.dp} x {args.micro_batch}")
    args.global_batch = batch


def build(args):
    """(model, parallel, system, training) from parsed arguments, validated; args gains the
    layout values used, `layout_source` and `notes` (to print; `cli.options.print_notes`),
    and `training_given`: the training with every fact given (the returned one has, on a
    layout predict's search chose, the facts that cannot act there at their defaults: a
    later search, `sensitivity --optimum`'s, takes the given one)."""
    from diffperf import Parallel, training
    from diffperf.cli.options import (framework_facts, inert_notes, model_and_system,
                                      unmeasured_cost_notes)
    from diffperf.load import parse_overrides
    from diffperf.specs.parallel import Recompute, placement_index
    from diffperf.specs.validate import (check_facts_act, check_inputs, check_model,
                                         check_precision, check_system, check_training,
                                         neutral_facts)

    items, args.notes = framework_facts(args)
    par_over, tr_over = parse_overrides(items)  # the overlay's facts, then the user's --set
    # The fields the user gave: parse_overrides has checked every item, and framework_facts
    # keeps no fact for a field the user gave, so the names alone tell them apart.
    mine = {item.split("=", 1)[0].strip() for item in getattr(args, "set", None) or ()}
    for k in [k for k in par_over if k in _OWN_OPTIONS and k not in mine]:
        value = par_over.pop(k)  # an overlay's fact for a field with its own option: the
        if getattr(args, k, None) is None:  # option's value, unless the user gave it
            setattr(args, k, int(value) if float(value) == int(value) else value)
    own = [k for k in par_over if k in _OWN_OPTIONS]
    if own:
        raise SpecError(f"--set {own[0]}: the layout has its own option "
                        f"--{own[0].replace('_', '-')}; give it there")
    model, system = model_and_system(args)
    args.notes += args.batch_notes
    train = training(args.precision, **tr_over)
    args.notes += unmeasured_cost_notes(model, system, train)
    # what no layout changes, before a layout is chosen (and so before its search compiles)
    check_model(model)
    check_system(system)
    check_training(train)
    check_precision(system, train)
    check_facts_act(model, Parallel(**par_over), train, "layout", layout=False)
    _resolve_layout(model, system, train, args, par_over)
    inner = args.tp * args.cp * args.pp * args.gx * args.gy * args.gz
    if args.gpus is None and args.dp is not None:
        args.gpus = args.dp * inner
    if args.dp is None:
        if inner <= 0 or args.gpus % inner:
            names = "tp x cp x pp" + (" x gx x gy x gz" if inner > args.tp * args.cp * args.pp
                                      else "")
            raise SpecError(f"--gpus={args.gpus} must be a multiple of {names} = {inner}")
        args.dp = args.gpus // inner
    _fit_default_batch(args)
    layout = {k: float(getattr(args, k)) for k, _ in _LAYOUT}
    parallel = Parallel(**layout, dp=float(args.dp), global_batch=float(args.global_batch),
                        sequence_parallel=float(args.sequence_parallel),
                        recompute=float(Recompute[args.recompute.upper()]),
                        dp_overlap=float(args.dp_overlap),
                        placement=float(placement_index(args.placement)), **par_over)
    args.training_given = train
    if args.layout_source == "search":
        # a fact that cannot act on the layout the search chose (cp_torch at cp 1, ...): the
        # framework runs that layout without it, its term is zero there; predicted without
        # it (the same numbers) and said so, instead of refusing the search's own choice
        parallel, train, inert = neutral_facts(model, parallel, train)
        args.notes += inert_notes(inert)
    try:
        check_inputs(model, parallel, system, train, args.gpus, "layout")
    except SpecError as err:  # a rule of a layout the user did not give (the others were
        # checked above): say whose layout it is
        if args.layout_source == "given":
            raise
        whose = ("predict's search chose" if args.layout_source == "search" else
                 "is GPT-3 175B's shipped default")
        raise SpecError(f"{err} (the layout {whose}: give the layout options, --tp, --cp, "
                        f"--ep, --pp, --dp, ..., for one where this holds)", field=err.field,
                        value=err.value, rule=err.rule, anywhere=err.anywhere,
                        needs=err.needs) from None
    return model, parallel, system, train


def layout_json(parallel, placement: str) -> dict:
    """A Parallel's layout as `diffperf search --json` writes it: whole numbers as integers,
    recompute and placement by name (JSON_LAYOUT keys)."""
    from diffperf.cli.options import RECOMPUTE_NAMES

    out = {}
    for k in JSON_LAYOUT:
        if k == "placement":
            out[k] = placement
            continue
        v = float(getattr(parallel, k))
        out[k] = RECOMPUTE_NAMES[int(v)] if k == "recompute" else (int(v) if v == int(v)
                                                                    else v)
    return out


def result_dict(result) -> dict:
    """A Result as plain floats (breakdown and memory as nested dicts): `result.as_dict`."""
    from diffperf.result import as_dict

    return as_dict(result)


def _goodput_rows(result, given: bool) -> list:
    """(quantity, value) rows of Result.goodput, in human units; `given`: the checkpoint
    interval is the user's (Training.checkpoint_interval_s), not Daly's optimum."""
    g, T = result.goodput, float(result.step_time_s)
    tau = float(g.checkpoint_interval_s)
    rows = [("job_mtbf_h", fmt(float(g.mtbf_s) / 3600)),
            ("checkpoint_GB", fmt(float(g.checkpoint_bytes) / 1e9)),
            ("checkpoint_write_s", fmt(g.checkpoint_s)),
            ("checkpoint_interval_s (" + ("given" if given else "Daly optimum") + ")",
             f"{fmt(tau)} = {fmt(tau / T, 3)} steps"),
            ("restart_s", fmt(g.restart_s))]
    names = {"goodput_frac": "training kept %", "checkpoint_frac": "writing checkpoints %",
             "rework_frac": "redoing lost work %", "restart_frac": "restarting %"}
    rows += [(label, f"{100 * float(getattr(g, k)):.3g}") for k, label in names.items()]
    return rows + [("effective tokens/s", fmt(g.effective_tokens_per_s))]


def render(result, title, training=None) -> None:
    from diffperf.result import EXPOSED_PARTS, HIDDEN_PARTS, MEMORY_PARTS

    b, m, T = result.breakdown, result.memory, float(result.step_time_s)
    parts = sorted(EXPOSED_PARTS, key=lambda k: -float(getattr(b, k)))
    rows = [(k, fmt(getattr(b, k)), f"{100 * float(getattr(b, k)) / T:.1f}") for k in parts]
    rows += [(k + " (not in total)", fmt(getattr(b, k)), "") for k in HIDDEN_PARTS]
    rows.append(("step_time_s", fmt(T), "100.0"))
    console.print(table(title, ("part", "seconds", "% of step"), rows))
    mrows = [(k.replace("_bytes", ""), fmt(float(getattr(m, k)) / 2**30)) for k in MEMORY_PARTS]
    mrows += [("total", fmt(float(m.total_bytes) / 2**30)),
              ("usable capacity", fmt(float(m.capacity_bytes) / 2**30))]
    console.print(table("memory per device (largest stage)", ("part", "GiB"), mrows))
    given = training is not None and float(training.checkpoint_interval_s) > 0
    console.print(table("goodput: failures, checkpoints, restarts", ("quantity", "value"),
                        _goodput_rows(result, given)))
    console.print(f"fits: {bool(result.fits)}   MFU: {100 * float(result.mfu):.1f} %   "
                  f"tokens/s: {fmt(result.tokens_per_s)}   step_time_s: {fmt(T)}")


def model_parameters(model) -> dict:
    """{total, active, mtp} parameters of a model (workload.params; MTP apart from total)."""
    from diffperf.workload.params import active_params, mtp_params, total_params

    return dict(total=float(total_params(model)), active=float(active_params(model)),
                mtp=float(mtp_params(model)))


def print_parameters(params: dict, notes: list) -> None:
    """The parameter line and the model notes (HF config choices and ignored fields)."""
    mtp = f"   MTP (apart): {params['mtp'] / 1e9:.3f} B" if params["mtp"] else ""
    console.print(f"parameters: total {params['total'] / 1e9:.3f} B   active "
                  f"{params['active'] / 1e9:.3f} B{mtp}")
    for note in notes:
        console.print(f"note: {note}", markup=False, highlight=False)


def trust_of(args, parallel, system, train, step_time_s) -> dict:
    """The efficiency set used and where this layout lies against its envelope (JSON record;
    diffperf.trust, docs/trust.md)."""
    from diffperf import trust as tr

    tset = getattr(args, "efficiency_set", None) or tr.resolve(system, "none")[1]
    t = tr.trust(tr.layout_columns(parallel, gpus=args.gpus), tset, train.name, system.gpu)
    lo, hi = tr.interval(step_time_s, t["q"])
    return dict(efficiency_set=tr.describe(tset),
                trust=dict(inside_envelope=bool(t["inside"][0]),
                           envelope_score=float(t["score"][0]), regime=str(t["regime"][0]),
                           q95_log=float(t["q"][0]),
                           interval_95_s=[float(lo[0]), float(hi[0])]))


def render_trust(record) -> None:
    from diffperf.trust import describe_text

    t = record["trust"]
    console.print(describe_text(_set_for_text(record["efficiency_set"])))
    if t["inside_envelope"]:
        where = "inside its envelope"
    elif "heldout_q95_log" not in record["efficiency_set"]:
        # a set without regimes (the physics defaults, an overlay without an envelope): there
        # is no envelope to be outside of (was: "OUTSIDE its envelope (score 0.00 ...")
        where = (f"not checked (the set records no envelope): interval x/÷ "
                 f"{math.exp(t['q95_log']):.2f}, no error measured")
    elif t["regime"] == "unmeasured":
        # no measured regime outside the envelope: the set's error there is unknown
        where = (f"OUTSIDE its envelope (score {t['envelope_score']:.2f}; no error measured "
                 f"outside it: interval widened to x/÷ {math.exp(t['q95_log']):.2f})")
    else:
        where = (f"OUTSIDE its envelope (score {t['envelope_score']:.2f}; interval widened by "
                 f"the error of the nearest measured regime: {t['regime']})")
    lo, hi = t["interval_95_s"]
    console.print(f"layout {where}; 95 % interval of the step time: "
                  f"{fmt(lo)} - {fmt(hi)} s")


def _set_for_text(d: dict) -> dict:
    """A describe() record back in the shape describe_text reads."""
    out = dict(name=d["name"], gpu=d.get("gpu"), measured=d["measured"], path=d.get("path"),
               note=d.get("note"))
    if "heldout_q95_log" in d:
        out["regimes"] = [dict(mape_pct=d["heldout_mape_pct"], q95_log=d["heldout_q95_log"],
                               n=d["heldout_n"], runs=d["heldout_runs"])]
    elif d.get("heldout_mape_pct") is not None:
        out["heldout_mape_pct"] = d["heldout_mape_pct"]
    return out


def run(args) -> int:
    from diffperf import predict
    from diffperf.load import model_notes

    import numpy as np

    from diffperf.specs.validate import stage_counts

    model, parallel, system, train = build(args)
    result = predict(model, parallel, system, train, store=kernel_store(args))
    # first, largest middle, last (the numpy twin of workload.pp.stage_layers, with its p = 1
    # and p = 2 rules: no JAX ops to compile)
    P = {k: np.float64(getattr(parallel, k)) for k in ("pp", "pp_first_layers",
                                                          "pp_last_layers")}
    L = float(model.n_layers)
    first, _, mid, last = (float(x) for x in stage_counts(P, dict(n_layers=L)))
    stages = [first, mid, last]
    params, notes = model_parameters(model), model_notes(args.model, args.seq_len)
    trust = trust_of(args, parallel, system, train, float(result.step_time_s))
    if args.json:
        print_json(dict(model=model.name, system=system.name, gpus=args.gpus,
                        layout=layout_json(parallel, args.placement)
                        | {"stage_layers": [int(x) if x == int(x) else x for x in stages]},
                        layout_source=args.layout_source, notes=args.notes + notes,
                        parameters=params,
                        result=result_dict(result)) | trust)
        return 0
    print_notes(args.notes)
    title = (f"{model.name} on {args.gpus} x {system.name}: tp {args.tp} pp {args.pp} "
             f"dp {args.dp} cp {args.cp} mb {args.micro_batch} gb {args.global_batch}"
             + (f" grid {args.gx}x{args.gy}x{args.gz}" if args.gx * args.gy * args.gz > 1
                else "")
             + (f" placement {args.placement}" if args.placement != "tp-cp-dp-pp" else "")
             + (f" stages {stages[0]:g}/{stages[1]:g}/{stages[2]:g} layers"
                if args.pp > 2 and len(set(stages)) > 1 else "")
             + (" (layout chosen by search)" if args.layout_source == "search" else ""))
    render(result, title, train)
    print_parameters(params, notes)
    render_trust(trust)
    return 0
