"""`diffperf design`: hardware co-design by gradient under a cost or power model."""

from __future__ import annotations

from pathlib import Path

from diffperf.cli.output import fmt, print_json, table
from diffperf.cli.sensitivity_cmd import human, status
from diffperf.cli.options import (add_job, add_model_system, add_placements, check_at_least,
                                  model_and_system, placements_of)

_DAY_S = 86400.0


def add_parser(sub):
    p = sub.add_parser("design", help="hardware co-design: optimize FLOP/s, HBM, network "
                       "tiers under a cost or power model", description=(
        "Optimize the continuous hardware parameters that the cost model prices (FLOP/s, "
        "HBM bandwidth and capacity, tier bandwidths, the fast domain size as a real number) "
        "by gradient (optax Adam) through the soft-min over every layout of --gpus and "
        "--global-batch, with a soft memory-feasibility penalty; the budget holds at every "
        "step. Prints each parameter before and after, and the objective (soft and with the "
        "exact best layout)."))
    add_model_system(p, "starting system: name under configs/systems or a YAML")
    add_job(p)
    p.add_argument("--cost", required=True, help="cost or power model: name under "
                   "configs/design (illustrative-usd, illustrative-power) or a YAML")
    p.add_argument("--objective", default="time_to_train",
                   choices=("time_to_train", "cost_per_token"))
    p.add_argument("--budget", type=float, default=None, help="per device, in the cost "
                   "model's unit (default: its budget:)")
    p.add_argument("--tokens", type=float, default=300e9, help="training tokens for "
                   "time_to_train (default 300e9)")
    p.add_argument("--steps", type=int, default=200, help="optimizer steps (default 200)")
    p.add_argument("--learning-rate", type=float, default=0.05, help="Adam step in log space")
    p.add_argument("--temperature", type=float, default=0.05, help="tau of the soft-min "
                   "over layouts (default 0.05)")
    add_placements(p)
    p.add_argument("--max-candidates", type=int, default=1024, help="layouts per placement "
                   "order in the soft-min (default 1024)")
    p.add_argument("--grid", action="append", metavar="FIELD=VALUES", help="instead of the "
                   "gradient, evaluate every point of a grid of hardware values (as search "
                   "--sweep: FIELD=START:STOP:N, START:STOP:N:log or V1,V2,...; repeat for "
                   "more axes), price each, and print the best points within the budget")
    p.add_argument("--top", type=int, default=10, help="grid points to list with --grid "
                   "(default 10)")
    p.add_argument("--no-cache", action="store_true", help="with --grid, do not keep "
                   "compiled code on disk (~/.cache/diffperf)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(run=run)
    return p


def load_cost(name_or_path):
    """A CostModel from configs/design/NAME.yaml or a YAML path (validated)."""
    from diffperf.design import cost_model_from_dict
    from diffperf.load import _named, read_yaml

    path = Path(name_or_path)
    if path.suffix not in (".yaml", ".yml"):
        path = _named(name_or_path, "design")  # package data (diffperf.resources)
    return cost_model_from_dict(read_yaml(path), str(path))


def _objective_cell(objective, unit, value) -> str:
    if objective == "time_to_train":
        return f"{fmt(value / _DAY_S)} days"
    if unit == "USD":
        return f"{fmt(value * 1e6)} USD / 1M tokens"
    return f"{fmt(value)} J / token"


def _params(design) -> list[dict]:
    from diffperf.sensitivity import leaf_label, leaf_values

    a, b = leaf_values(design.start), leaf_values(design.system)
    rows = []
    for k in design.parameters:
        (va, unit), (vb, _) = human(k, a[k]), human(k, b[k])
        rows.append(dict(parameter=k, label=leaf_label(k, design.system), unit=unit,
                         before=va, after=vb, change_frac=vb / va - 1.0))
    return rows


def _render(model, system, args, cost, design, layouts, placements):
    from diffperf.cli.search_cmd import _wide, layout_dict

    rows = [(r["label"], r["unit"], fmt(r["before"]), fmt(r["after"]),
             f"{100 * r['change_frac']:+.3g}") for r in _params(design)]
    b, a = design.before, design.after
    obj = lambda v: _objective_cell(args.objective, cost.unit, v)  # noqa: E731
    rows += [("cost per device", cost.unit, fmt(b["cost"]), fmt(a["cost"]),
              f"{100 * (a['cost'] / b['cost'] - 1):+.3g}"),
             ("step_time_s (soft-min)", "s", fmt(b["step_time_s"]), fmt(a["step_time_s"]),
              f"{100 * (a['step_time_s'] / b['step_time_s'] - 1):+.3g}"),
             ("step_time_s (best layout)", "s", fmt(b["step_time_hard_s"]),
              fmt(a["step_time_hard_s"]),
              f"{100 * (a['step_time_hard_s'] / b['step_time_hard_s'] - 1):+.3g}"),
             (f"{args.objective} (best layout)", "", obj(b["objective_hard"]),
              obj(a["objective_hard"]),
              f"{100 * (a['objective_hard'] / b['objective_hard'] - 1):+.3g}")]
    budget = "no budget" if design.budget is None else f"budget {fmt(design.budget)} {cost.unit}"
    out = _wide()
    out.print(table(
        f"design: {model.name} on {args.gpus} x {system.name}, {args.objective}, cost model "
        f"{cost.name} ({budget}), {args.steps} steps", ("parameter", "unit", "before", "after",
                                                        "change %"), rows))
    if design.start_scale < 1:
        out.print(f"[yellow]note[/yellow]: {system.name} costs more than the budget; the "
                      f"start scaled every priced part by {design.start_scale:.3g}")
    for name, s in (("before", b), ("after", a)):
        if s["best_index"] >= 0:
            lay = layout_dict(layouts[s["best_index"]], placements)
            out.print(f"best layout {name}: " + " ".join(
                f"{k} {v}" for k, v in lay.items() if k != "global_batch"), highlight=False)


def _build(args):
    """(model, system, training) from parsed arguments, validated."""
    from diffperf import training

    check_at_least(args, dict(gpus=1, global_batch=1, steps=0, max_candidates=1, top=1))
    model, system = model_and_system(args)
    return model, system, training(args.precision)


def run(args) -> int:
    from diffperf.cli.search_cmd import layout_dict
    from diffperf.design import optimize_design
    from diffperf.search import enumerate_layouts

    model, system, train = _build(args)
    from diffperf.cli.options import print_notes

    print_notes(args.batch_notes)  # stderr: how the default global batch was chosen
    cost = load_cost(args.cost)
    placements = placements_of(args.placements)
    if args.grid:
        from diffperf.cli.design_grid_cmd import run_grid

        return run_grid(args, model, system, train, cost, placements)
    layouts = enumerate_layouts(model, args.gpus, args.global_batch, placements=placements)
    with status(not args.json, "optimizing the hardware (compiling first)"):
        design = optimize_design(model, system, train, layouts, cost, args.objective,
                                 budget=args.budget, steps=args.steps,
                                 temperature=args.temperature,
                                 learning_rate=args.learning_rate, tokens=args.tokens,
                                 placements=placements, max_candidates=args.max_candidates)
    if args.json:
        best = {k: (layout_dict(layouts[s["best_index"]], placements)
                    if s["best_index"] >= 0 else None)
                for k, s in (("before", design.before), ("after", design.after))}
        print_json(dict(model=model.name, system=system.name, gpus=args.gpus,
                        global_batch=args.global_batch, cost_model=cost.name, unit=cost.unit,
                        objective=args.objective, budget=design.budget, steps=args.steps,
                        temperature=args.temperature, start_scale=design.start_scale,
                        parameters=_params(design), before=design.before | {
                            "layout": best["before"]}, after=design.after | {
                            "layout": best["after"]}, history=[float(h) for h in
                                                               design.history]))
        return 0
    _render(model, system, args, cost, design, layouts, placements)
    return 0
