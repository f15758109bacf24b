"""`diffperf predict`: one configuration's step time, breakdown and memory."""

from __future__ import annotations

import dataclasses

from diffperf.cli.output import console, fmt, print_json, table
from diffperf.cli.cache import kernel_store
from diffperf.errors import SpecError
from diffperf.cli.options import add_model_system

_LAYOUT = (("tp", 8), ("pp", 8), ("cp", 1), ("ep", 1), ("vp", 1), ("micro_batch", 1),
           ("global_batch", 1536), ("zero_stage", 1), ("cp_ring", 1), ("gx", 1), ("gy", 1),
           ("gz", 1), ("pp_first_layers", 0), ("pp_last_layers", 0))
# Parallel fields with an option of their own (not settable through --set).
_OWN_OPTIONS = {k for k, _ in _LAYOUT} | {"dp", "sequence_parallel", "recompute", "dp_overlap",
                                          "placement"}


def add_parser(sub):
    p = sub.add_parser("predict", help="step time, breakdown and memory of one layout", description=(
        "Predict one configuration. With no options: GPT-3 175B on 1024 A100 80 GB "
        "(tp 8, pp 8, dp 16, sequence parallel, selective recompute, ZeRO-1)."))
    add_model_system(p)
    add_layout_options(p)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--no-cache", action="store_true", help="do not keep the compiled program "
                   "in ~/.cache/diffperf (a later run then compiles it again, ~3 s)")
    p.set_defaults(run=run)
    return p


def add_layout_options(p) -> None:
    """The options of one layout (predict, sensitivity): --gpus, --dp, the degrees, switches
    and the placement; `build` reads them."""
    p.add_argument("--gpus", type=int, default=1024,
                   help="devices; dp = gpus / (tp cp pp gx gy gz)")
    p.add_argument("--dp", type=int, help="data-parallel degree (default: from --gpus)")
    for name, default in _LAYOUT:
        p.add_argument(f"--{name.replace('_', '-')}", dest=name, type=int, default=default)
    p.add_argument("--sequence-parallel", type=int, choices=(0, 1), default=1)
    p.add_argument("--recompute", choices=("none", "selective", "full"), default="selective")
    p.add_argument("--dp-overlap", type=int, choices=(0, 1), default=1)
    p.add_argument("--placement", default="tp-cp-dp-pp",
                   help="rank order of the groups, innermost first (default: Megatron-LM's)")
    p.add_argument("--set", action="append", metavar="FIELD=VALUE", help=(
        "framework fact: any other Parallel or Training field (e.g. flash_attention=0, "
        "tp_overlap=0; checkpoint_interval_s=1800 for the goodput); repeatable. A calibration overlay lists the ones it was fitted "
        "under in fitted_on.set"))


def build(args):
    """(model, parallel, system, training) from parsed arguments, validated."""
    from diffperf import Parallel, training
    from diffperf.cli.options import model_and_system
    from diffperf.load import parse_overrides
    from diffperf.specs.parallel import Recompute, placement_index
    from diffperf.specs.validate import check_layout

    par_over, tr_over = parse_overrides(args.set)
    own = [k for k in par_over if k in _OWN_OPTIONS]
    if own:
        raise SpecError(f"--set {own[0]}: the layout has its own option "
                        f"--{own[0].replace('_', '-')}; give it there")
    model, system = model_and_system(args)
    inner = args.tp * args.cp * args.pp * args.gx * args.gy * args.gz
    if args.dp is None:
        if inner <= 0 or args.gpus % inner:
            names = "tp x cp x pp" + (" x gx x gy x gz" if inner > args.tp * args.cp * args.pp
                                      else "")
            raise SpecError(f"--gpus={args.gpus} must be a multiple of {names} = {inner}")
        args.dp = args.gpus // inner
    layout = {k: float(getattr(args, k)) for k, _ in _LAYOUT}
    parallel = Parallel(**layout, dp=float(args.dp),
                        sequence_parallel=float(args.sequence_parallel),
                        recompute=float(Recompute[args.recompute.upper()]),
                        dp_overlap=float(args.dp_overlap),
                        placement=float(placement_index(args.placement)), **par_over)
    check_layout(model, parallel, args.gpus, "layout")
    return model, parallel, system, training(args.precision, **tr_over)


def result_dict(result) -> dict:
    """A Result as plain floats (breakdown and memory as nested dicts)."""
    out = {}
    for f in dataclasses.fields(result):
        v = getattr(result, f.name)
        out[f.name] = ({g.name: float(getattr(v, g.name)) for g in dataclasses.fields(v)}
                       if dataclasses.is_dataclass(v) else float(v))
    out["fits"] = bool(result.fits)
    return out


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
    if args.json:
        print_json(dict(model=model.name, system=system.name, gpus=args.gpus,
                        parameters=params, notes=notes,
                        layout={k: float(getattr(parallel, k)) for k in (
                            "tp", "pp", "dp", "cp", "ep", "vp", "micro_batch", "global_batch",
                            "sequence_parallel", "zero_stage", "recompute", "cp_ring", "gx",
                            "gy", "gz", "pp_first_layers", "pp_last_layers")}
                        | {"placement": args.placement, "stage_layers": stages},
                        result=result_dict(result)))
        return 0
    title = (f"{model.name} on {args.gpus} x {system.name}: tp {args.tp} pp {args.pp} "
             f"dp {args.dp} cp {args.cp} mb {args.micro_batch} gb {args.global_batch}"
             + (f" grid {args.gx}x{args.gy}x{args.gz}" if args.gx * args.gy * args.gz > 1
                else "")
             + (f" placement {args.placement}" if args.placement != "tp-cp-dp-pp" else "")
             + (f" stages {stages[0]:g}/{stages[1]:g}/{stages[2]:g} layers"
                if args.pp > 2 and len(set(stages)) > 1 else ""))
    render(result, title, train)
    print_parameters(params, notes)
    return 0
