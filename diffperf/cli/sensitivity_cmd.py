"""`diffperf sensitivity`: elasticities of the step time (or, with --goodput, of the effective
throughput under failures and checkpoints) to every hardware leaf, ranked."""

from __future__ import annotations

import contextlib
import math

from diffperf.cli.output import err_console, fmt, print_json, table
from diffperf.errors import SpecError
from diffperf.cli.options import add_model_system, add_placements, placements_of, print_notes

# Human units of a leaf, by the suffix of its name: (suffix, unit, SI value per unit).
_UNITS = (("_flops_per_s", "TFLOP/s", 1e12), ("_Bps", "GB/s", 1e9), ("_bytes", "GiB", 2.0**30),
          ("domain_size", "devices", 1.0), ("_W", "W", 1.0),
          ("failure_rate_per_s", "per device-hour", 1.0 / 3600.0))
_ZERO = 1e-7  # |elasticity| below this: listed as "no effect" under the table


def add_parser(sub):
    from diffperf.cli import predict_cmd
    from diffperf.specs.system import SWITCHES  # the single list of switches

    p = sub.add_parser("sensitivity", help="elasticities d ln T / d ln theta of every "
                       "hardware parameter, ranked", description=(
        "Elasticity of the step time to every System leaf (FLOP/s, HBM bandwidth and "
        "capacity, each tier's domain, bandwidth and latency, efficiencies) by jax.grad: "
        "'+10% NVLink bandwidth gives x% step time'. Layout options as for predict; with "
        "--optimum also at the best layout of --gpus and --global-batch, re-optimized "
        "(soft-min over layouts with a memory-feasibility penalty, and the exact best "
        "layout re-searched at +-10%). The 0/1 switches of a system "
        f"({', '.join(SWITCHES)}) are not differentiable parameters: listed apart, without an "
        "elasticity. With no options: GPT-3 175B on 1024 A100 80 GB."))
    add_model_system(p)
    predict_cmd.add_layout_options(p)
    p.add_argument("--smooth", type=float, default=None, help="the model's smooth temperature "
                   "(default: the exact model, subgradients at kinks)")
    p.add_argument("--optimum", action="store_true", help="also at the optimal layout of "
                   "--gpus devices and --global-batch, re-optimized")
    p.add_argument("--temperature", type=float, default=0.05, help="starting tau of the "
                   "soft-min over layouts, with --optimum, annealed until the soft-min step "
                   "time is within 2%% of the best layout's (default 0.05)")
    add_placements(p)
    p.add_argument("--max-candidates", type=int, default=1024, help="layouts per placement "
                   "order in the soft-min (lowest soft scores; default 1024)")
    p.add_argument("--reoptimize-all", action="store_true", help="with --optimum, re-search "
                   "the best layout at +-10 %% of every leaf, efficiencies included (default: "
                   "the hardware and memory leaves)")
    p.add_argument("--goodput", action="store_true", help="elasticities of the effective "
                   "throughput (tokens/s x goodput fraction, under failures, checkpoints and "
                   "restarts) instead of the step time: what a better MTBF, faster storage or "
                   "a faster restart is worth (System.reliability leaves); one layout")
    p.add_argument("--top", type=int, default=None, help="rows to list (default: every leaf "
                   "with an effect)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(run=run)
    return p


def human(path: str, value: float) -> tuple[float, str]:
    """(value in human units, unit) of a leaf from the suffix of its path."""
    for suffix, unit, si in _UNITS:
        if path.endswith(suffix):
            return value / si, unit
    if path.endswith("_s"):
        if abs(value) >= 1.0:
            return value, "s"
        return (value * 1e6, "us") if abs(value) < 1e-3 else (value * 1e3, "ms")
    return value, ""


def _value_cell(path, value) -> str:
    v, unit = human(path, value)
    return f"{fmt(v)} {unit}".strip()


def _pct(e) -> str:
    from diffperf.sensitivity import step_change_frac

    # (1 + 10 %)^e - 1: the relative change of the step time, or of the effective throughput
    return "-" if e is None or not math.isfinite(e) else f"{100 * float(step_change_frac(e)):+.3g}"


def _num(e) -> str:
    return "-" if e is None or not math.isfinite(e) else fmt(e, 3)


@contextlib.contextmanager
def status(enabled: bool, text: str):
    """A transient spinner on stderr while the library works (terminals only)."""
    if not enabled or not err_console.is_terminal:
        yield
        return
    with err_console.status(text):
        yield


def _check(args):
    if args.optimum and not args.temperature > 0:
        raise SpecError(f"--temperature={args.temperature} must be > 0")
    if args.max_candidates < 1:
        raise SpecError(f"--max-candidates={args.max_candidates} must be >= 1")
    if args.top is not None and args.top < 1:
        raise SpecError(f"--top={args.top} must be >= 1")
    if args.smooth is not None and not args.smooth >= 0:
        raise SpecError(f"--smooth={args.smooth} must be >= 0")
    if args.goodput and args.optimum:
        raise SpecError("--goodput gives the elasticities at one layout; drop --optimum (the "
                        "optimum is searched by step time, and failures cost every layout of "
                        "a job alike)")


def _finite(x):
    return None if x is None or not math.isfinite(x) else x


def _json(model, system, args, parallel, step, elast, values, opt, layouts, placements,
          switches):
    from diffperf.cli.predict_cmd import layout_json
    from diffperf.cli.search_cmd import layout_dict
    from diffperf.sensitivity import METHOD_RESEARCH, METHOD_SOFT, leaf_label, step_change_frac

    rows = []
    for path, e in elast.items():
        v, unit = human(path, values[path])
        change = "plus_10pct_effective_frac" if args.goodput else "plus_10pct_step_frac"
        row = dict(leaf=path, label=leaf_label(path, system), value=values[path],
                   value_human=v, unit=unit, elasticity=e, **{change: float(step_change_frac(e))})
        if opt is not None:
            row |= dict(optimum=_finite(opt.optimum[path]), optimum_method=opt.method[path],
                        optimum_soft=opt.soft[path], optimum_reoptimized=_finite(
                            opt.hard[path]), optimum_at_best_layout=opt.at_best[path])
        rows.append(row)
    out = dict(model=model.name, system=system.name, gpus=args.gpus,
               layout=layout_json(parallel, args.placement),
               layout_source=args.layout_source, notes=args.notes,
               objective="effective_tokens_per_s" if args.goodput else "step_time_s",
               elasticities=rows,
               # 0/1 switches (specs.system.SWITCHES): no derivative, no elasticity
               switches=switches)
    out["effective_tokens_per_s" if args.goodput else "step_time_s"] = step
    if opt is not None:
        out["optimum"] = dict(
            layout=layout_dict(layouts[opt.best_index], placements),
            step_time_s=opt.best_step_time_s, soft_step_time_s=opt.soft_step_time_s,
            soft_vs_best_frac=opt.soft_step_time_s / opt.best_step_time_s - 1.0,
            temperature=opt.temperature, temperature_start=opt.temperature_start,
            layouts=len(layouts), candidates=opt.n_candidates,
            dropped_weight=opt.dropped_weight,
            methods={METHOD_SOFT: "gradient of the soft-min over layouts (temperature "
                     "annealed until the soft-min is within 2 % of the best step time)",
                     METHOD_RESEARCH: "the leaf acts only through which layouts fit: "
                     "central difference of the exact best step time, the layouts searched "
                     "again at +-10 %"})
    print_json(out)


def _render(model, system, args, step, elast, values, opt, layouts, placements, switches):
    from diffperf.cli.search_cmd import _wide, layout_dict
    from diffperf.sensitivity import METHOD_RESEARCH, leaf_label

    key = ((lambda p: -abs(opt.optimum[p] or 0.0)) if opt is not None
           else (lambda p: -abs(elast[p])))
    ranked = sorted(values, key=key)
    big = lambda p: abs(elast[p]) >= _ZERO or (opt is not None and (  # noqa: E731
        abs(opt.optimum[p] or 0.0) >= _ZERO or abs(opt.hard[p] or 0.0) >= _ZERO))
    shown = [p for p in ranked if big(p)][:args.top]
    head = (f"{model.name} on {args.gpus} x {system.name}: tp {args.tp} pp {args.pp} "
            f"dp {args.dp} cp {args.cp} mb {args.micro_batch} gb {args.global_batch}")
    what = "effective tokens/s" if args.goodput else "step time"
    if opt is None:
        cols = ("leaf", "value", "elasticity", f"+10% gives {what} %")
        rows = [(leaf_label(p, system), _value_cell(p, values[p]), _num(elast[p]),
                 _pct(elast[p])) for p in shown]
    else:
        cols = ("leaf", "value", "at layout", "+10% at layout %", "optimum",
                "optimum (re-optimized)", "+10% at optimum %")
        mark = lambda p: " *" if opt.method[p] == METHOD_RESEARCH else ""  # noqa: E731
        rows = [(leaf_label(p, system), _value_cell(p, values[p]), _num(elast[p]),
                 _pct(elast[p]), _num(opt.optimum[p]) + mark(p), _num(opt.hard[p]),
                 _pct(opt.optimum[p])) for p in shown]
    out = _wide()
    quantity = ("d ln X / d ln theta (X = effective tokens/s under failures, checkpoints "
                "and restarts)" if args.goodput else "d ln T / d ln theta")
    out.print(table(f"elasticities {quantity}, {head}", cols, rows))
    none = [p for p in ranked if not big(p)]
    if none:
        out.print(f"no effect on the {what}: {', '.join(none)}", highlight=False)
    if switches:
        out.print(f"switches, no elasticity (0 or 1, not differentiable parameters; their "
                  f"worth: predict with the system file's key at 0 and at 1): "
                  f"{', '.join(f'{p} = {v:g}' for p, v in switches.items())}", highlight=False)
    out.print(f"effective tokens/s at the layout: {fmt(step)}" if args.goodput
              else f"step_time_s at the layout: {fmt(step)}")
    if opt is not None:
        lay = layout_dict(layouts[opt.best_index], placements)
        desc = " ".join(f"{k} {v}" for k, v in lay.items() if k != "global_batch")
        out.print(
            f"optimum of {len(layouts):,} layouts: {desc}; step_time_s {fmt(opt.best_step_time_s)}"
            f" (soft-min {fmt(opt.soft_step_time_s)}, "
            f"{100 * (opt.soft_step_time_s / opt.best_step_time_s - 1):+.2f} %, at tau "
            f"{opt.temperature:.3g} annealed from {opt.temperature_start:g}, over "
            f"{opt.n_candidates:,} candidates). optimum: gradient of the soft-min; * = "
            f"{METHOD_RESEARCH}: the leaf acts only through which layouts fit, so its worth "
            f"is the exact best step time re-searched at +-10 %. re-optimized: the same "
            f"re-search for every leaf.", highlight=False)


def run(args) -> int:
    from diffperf.cli.predict_cmd import build
    from diffperf.search import enumerate_layouts
    from diffperf.sensitivity import (MEMORY_LEAVES, elasticities_at_optimum,
                                      goodput_elasticities, parameter_values,
                                      step_time_and_elasticities, switch_values)

    _check(args)
    model, parallel, system, train = build(args)
    if not args.json:
        print_notes(args.notes)
    placements = placements_of(args.placements)
    layouts, opt = None, None
    with status(not args.json, "differentiating (compiling first)"):
        # `step`: the step time, or with --goodput the effective tokens/s, at the layout
        of_layout = goodput_elasticities if args.goodput else step_time_and_elasticities
        step, elast = of_layout(model, parallel, system, train, args.smooth)
        if args.optimum:
            layouts = enumerate_layouts(model, args.gpus, args.global_batch,
                                        placements=placements)
            hard = None if args.reoptimize_all else [
                p for p in parameter_values(system)
                if not p.startswith("eff.") or p in MEMORY_LEAVES]
            # the facts as given: those predict's search chose a layout without (cp_torch at
            # cp 1) act on other rows of this search
            given = args.training_given
            opt = elasticities_at_optimum(model, system, given, layouts, args.temperature,
                                          placements=placements, smooth=args.smooth,
                                          max_candidates=args.max_candidates, hard_leaves=hard)
    values, switches = parameter_values(system), switch_values(system)
    if args.json:
        _json(model, system, args, parallel, step, elast, values, opt, layouts, placements,
              switches)
    else:
        _render(model, system, args, step, elast, values, opt, layouts, placements, switches)
    return 0
