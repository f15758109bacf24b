"""`diffperf study NAME`: one of the four papers' studies, as a CSV and a figure.

Loads the study's models and systems, runs it (diffperf.studies, pure functions), writes
NAME.csv (the numbers behind the figure), NAME.png and NAME.svg into --out, and prints the
headline numbers.
"""

from __future__ import annotations

import csv
import io
import time
from pathlib import Path

import numpy as np

from diffperf.cli.output import console, print_json, table, write_atomic
from diffperf.errors import SpecError, closest


def add_parser(sub):
    from diffperf.studies import ALIASES, STUDIES

    lines = "; ".join(f"{name}: {mod.TITLE}" for name, mod in STUDIES.items())
    p = sub.add_parser("study", help="run a study of the papers (CSV + figures)", description=(
        f"Run one study and write NAME.csv, NAME.png and NAME.svg into --out. Studies: {lines}. "
        f"Also accepted: {', '.join(ALIASES)}."))
    p.add_argument("name", nargs="?", help="study name (or its number 1-4, or the paper's "
                   "first author); see --list")
    p.add_argument("--list", action="store_true", help="list the studies and exit")
    p.add_argument("--out", default="studies", help="output folder, created if missing "
                   "(default: ./studies)")
    p.add_argument("--quick", action="store_true", help="a reduced version (fewer models, "
                   "systems or GPU counts; one placement order): for tests")
    p.add_argument("--calibration", help="efficiency overlay (a shipped name or a YAML path) "
                   "applied to every system")
    p.add_argument("--formats", default="png,svg", help="figure formats (default png,svg)")
    p.add_argument("--force", action="store_true", help="overwrite existing output files")
    p.add_argument("--no-cache", action="store_true", help="do not keep compiled code in "
                   "the persistent cache (~/.cache/diffperf/jax)")
    p.add_argument("--json", action="store_true", help="machine-readable summary")
    p.set_defaults(run=run)
    return p


def resolve(name: str):
    """The study module for a name or alias."""
    from diffperf.studies import ALIASES, STUDIES

    key = ALIASES.get(name.lower(), name.lower())
    if key not in STUDIES:
        raise SpecError(f"unknown study {name!r}{closest(name, [*STUDIES, *ALIASES])} "
                        f"(studies: {', '.join(STUDIES)})")
    return STUDIES[key]


def csv_text(columns: dict) -> str:
    """A study table as CSV text (floats with 6 significant digits, nan as blank)."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(list(columns))
    n = len(next(iter(columns.values())))

    def cell(v):
        if isinstance(v, (float, np.floating)):
            return "" if np.isnan(v) else f"{float(v):.6g}"
        if isinstance(v, (np.integer, int)):
            return str(int(v))
        return str(v)

    for i in range(n):
        w.writerow([cell(col[i]) for col in columns.values()])
    return buf.getvalue()


def _outputs(out: Path, name: str, formats: str, force: bool) -> list:
    from diffperf.cli.output import check_writable

    exts = [f.strip().lower().lstrip(".") for f in formats.split(",") if f.strip()]
    bad = [e for e in exts if e not in ("png", "svg", "pdf")]
    if bad or not exts:
        raise SpecError(f"--formats={formats!r} must list png, svg or pdf")
    if out.exists() and not out.is_dir():
        raise SpecError(f"--out {out} is a file; give a folder")
    paths = [out / f"{name}.csv"] + [out / f"{name}.{e}" for e in exts]
    if out.is_dir():
        for p in paths:
            check_writable(p, force)
    return paths


def studies_table() -> list[dict]:
    """One entry per study: name, the other names it answers to, and its title."""
    from diffperf.studies import ALIASES, STUDIES

    return [dict(name=name, aliases=[a for a, k in ALIASES.items() if k == name],
                 title=mod.TITLE) for name, mod in STUDIES.items()]


def _list(args) -> int:
    entries = studies_table()
    if args.json:
        print_json(dict(studies=entries))
        return 0
    rows = [(e["name"], ", ".join(e["aliases"]), e["title"]) for e in entries]
    console.print(table("studies (diffperf study NAME)", ("name", "also", "question"), rows))
    return 0


def run(args) -> int:
    from diffperf import load_model, load_system
    from diffperf.cli.figures import STUDY_FIGURES, save

    if args.list:
        return _list(args)
    if args.name is None:
        names = ", ".join(e["name"] for e in studies_table())
        raise SpecError(f"study: give a study name (one of: {names}) or --list")
    study = resolve(args.name)
    out = Path(args.out)
    paths = _outputs(out, study.NAME, args.formats, args.force)
    names = study.inputs(args.quick)
    models = {m: load_model(m) for m in names["models"]}
    systems = {s: load_system(s, calibration=args.calibration) for s in names["systems"]}
    if not args.no_cache:
        from diffperf.cli.search_cmd import _enable_cache

        _enable_cache()
    start = time.perf_counter()
    result = study.run(models, systems, quick=args.quick)
    seconds = time.perf_counter() - start
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(paths[0], csv_text(result.table), args.force)
    save(STUDY_FIGURES[study.NAME](result), paths[1:], args.force)
    if args.json:
        print_json(dict(study=study.NAME, title=result.title, quick=args.quick,
                        seconds=seconds, files=[str(p) for p in paths],
                        summary=result.summary, notes=list(result.notes)))
        return 0
    rows = [(k, v) for k, v in result.summary.items()]
    console.print(table(result.title, ("quantity", "value"), rows))
    for note in result.notes:
        console.print(f"note: {note}", highlight=False)
    console.print(f"wrote {', '.join(str(p) for p in paths)} ({seconds:.1f} s)",
                  highlight=False)
    return 0
