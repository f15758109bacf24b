"""`diffperf plot`: figures of a prediction, a search and a validation.

    diffperf plot predict [predict options] --out pred.png     breakdown and memory bars
    diffperf plot search [search options] --out search.png     step time vs memory, Pareto front
    diffperf plot validation PRED.csv RUNS.csv --out val.png   predicted vs measured per source

`plot predict` and `plot search` take exactly the options of `diffperf predict` and
`diffperf search`; `plot validation` reads the CSV that `diffperf validate ... --out PRED.csv`
writes and the runs CSV it was given (for each run's `source`).
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from diffperf.cli.output import console, print_json
from diffperf.errors import SpecError


def add_parser(sub):
    from diffperf.cli import predict_cmd, search_cmd

    import argparse

    p = sub.add_parser("plot", help="figures of a prediction, a search or a validation",
                       description=__doc__.split("\n\n", 1)[1],
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    kinds = p.add_subparsers(dest="kind", required=True)
    for kind, module, run, default in (("predict", predict_cmd, _predict, "prediction.png"),
                                       ("search", search_cmd, _search, "search.png")):
        k = module.add_parser(kinds)
        _add_out(k, default)
        k.set_defaults(run=run)
    v = kinds.add_parser("validation", help="predicted vs measured step time, error per source",
                         description="Plot the output of `diffperf validate RUNS.csv --out "
                         "PRED.csv`: predicted vs measured (log-log) and the error per source.")
    v.add_argument("predictions", help="CSV written by `diffperf validate ... --out`")
    v.add_argument("runs", nargs="?", help="the runs CSV that was validated (its `source` "
                   "column colours the points; without it every run is one source)")
    v.add_argument("--json", action="store_true", help="machine-readable summary")
    _add_out(v, "validation.png")
    v.set_defaults(run=_validation)
    return p


def _add_out(p, default):
    p.add_argument("--out", default=default, help=f"figure file, .png, .svg or .pdf "
                   f"(default: {default})")
    if "--force" not in p._option_string_actions:  # search has one (its --csv)
        p.add_argument("--force", action="store_true", help="overwrite --out if it exists")


def _check_out(args):
    from diffperf.cli.output import check_writable

    if Path(args.out).suffix.lower() not in (".png", ".svg", ".pdf"):
        raise SpecError(f"--out {args.out}: figure format must be .png, .svg or .pdf")
    check_writable(args.out, args.force)


def _done(args, summary: dict) -> int:
    if args.json:
        print_json(dict(figure=str(args.out)) | summary)
    else:
        console.print(f"wrote {args.out}", highlight=False)
    return 0


def _predict(args) -> int:
    from diffperf import predict
    from diffperf.cli.figures import prediction_figure, save
    from diffperf.cli.options import print_notes
    from diffperf.cli.predict_cmd import build, result_dict

    _check_out(args)
    model, parallel, system, train = build(args)
    print_notes(args.notes)
    result = result_dict(predict(model, parallel, system, train))
    title = (f"{model.name} on {args.gpus} x {system.name}: tp {args.tp} pp {args.pp} "
             f"dp {args.dp} cp {args.cp} mb {args.micro_batch} gb {args.global_batch}")
    save(prediction_figure(result, title), [args.out], args.force)
    return _done(args, dict(result=result))


def _search(args) -> int:
    from diffperf.cli.figures import save, search_figure
    from diffperf.cli.search_cmd import _enable_cache, build, layout_dict
    from diffperf.search import DEFAULT_CHUNK, enumerate_layouts, pareto_front, ranked, search

    if args.sweep:
        raise SpecError("--sweep is for diffperf search (plot search draws the layouts of one "
                        "system)")
    _check_out(args)
    model, system, train, placements, steer = build(args)
    layouts = enumerate_layouts(model, args.gpus, args.global_batch, placements=placements,
                                axonn=args.axonn, fixed=steer["fixed"])
    if not args.no_cache:
        _enable_cache()
    result = search(model, system, train, layouts, placements=placements,
                    chunk=args.chunk or DEFAULT_CHUNK, validate=False,
                    parallel=steer["parallel"])
    fit = np.flatnonzero(result.fits)
    if not len(fit):
        raise SpecError(f"no layout of {model.name} on {args.gpus} x {system.name} fits in "
                        f"memory: nothing to plot")
    step = np.asarray(result.step_time_s)[fit]
    mem = np.asarray(result.memory.total_bytes)[fit] / 2**30
    front = pareto_front(step, mem)
    best = int(np.argmin(step))
    cap = float(result.memory.capacity_bytes[fit[0]]) / 2**30
    title = (f"{model.name} on {args.gpus} x {system.name}, global batch {args.global_batch}: "
             f"{len(layouts):,} layouts, {len(fit):,} fit")
    save(search_figure(step, mem, front, best, cap, title), [args.out], args.force)
    top = ranked(result, 1)[0]
    return _done(args, dict(evaluated=len(layouts), feasible=len(fit),
                            pareto_points=len(front), best_step_time_s=float(step[best]),
                            best_layout=layout_dict(layouts[top], placements)))


def _read_csv(path, required) -> list:
    from diffperf.load import check_columns_once, read_text

    text = read_text(path).removeprefix("\ufeff")  # a UTF-8 BOM is not part of a column
    reader = csv.DictReader(text.splitlines())
    try:
        missing = [c for c in required if c not in (reader.fieldnames or [])]
        if missing:
            raise SpecError(f"{path}: missing column '{missing[0]}' (have: "
                            f"{', '.join(reader.fieldnames or [])})")
        # csv.DictReader keeps the last of two same-named columns (load._read_csv's rule)
        check_columns_once(path, [c for c in reader.fieldnames if c.strip()])
        return list(reader)
    except csv.Error as err:
        raise SpecError(f"{path}: malformed CSV ({err})") from None


def _float(text, path, column, row_id):
    if text is None:  # a row shorter than the header
        raise SpecError(f"{path}: run '{row_id}' has no {column} cell (a short row)")
    try:
        v = float(text)
    except ValueError:
        raise SpecError(f"{path}: {column}={text!r} of run '{row_id}' must be a number") from None
    if not np.isfinite(v) or v <= 0:
        raise SpecError(f"{path}: {column}={text!r} of run '{row_id}' must be > 0")
    return v


def _validation(args) -> int:
    from diffperf.cli.figures import save, validation_figure

    _check_out(args)
    preds = _read_csv(args.predictions, ("id", "step_time_s", "predicted_step_time_s"))
    sources = {}
    if args.runs:
        from diffperf.resources import dataset_path

        # the runs CSV as `validate` took it: a path or a shipped dataset name
        runs = _read_csv(dataset_path(args.runs), ("id",))
        sources = {r["id"]: (r.get("source") or "all") for r in runs}
    meas, pred, src = [], [], []
    for r in preds:
        if r.get(None) is not None:
            raise SpecError(f"{args.predictions}: run '{r['id']}' has more cells than the "
                            f"header")
        if not (r["step_time_s"] or "").strip():  # a run that did not run (OOM): no time
            continue
        if args.runs and r["id"] not in sources:
            raise SpecError(f"{args.predictions}: run id '{r['id']}' is not in {args.runs}")
        meas.append(_float(r["step_time_s"], args.predictions, "step_time_s", r["id"]))
        pred.append(_float(r["predicted_step_time_s"], args.predictions,
                           "predicted_step_time_s", r["id"]))
        src.append(sources.get(r["id"], "all"))
    if not meas:
        raise SpecError(f"{args.predictions}: no run with a measured step_time_s to plot")
    meas, pred, src = np.asarray(meas), np.asarray(pred), np.asarray(src)
    err = 100 * np.abs(pred / meas - 1)
    title = f"{Path(args.predictions).name}: predicted vs measured step time ({len(meas)} runs)"
    save(validation_figure(meas, pred, src, title), [args.out], args.force)
    per = {s: dict(n=int(np.sum(src == s)), mape_pct=float(np.mean(err[src == s])))
           for s in dict.fromkeys(src)}
    return _done(args, dict(n=len(meas), mape_pct=float(np.mean(err)), per_source=per))
