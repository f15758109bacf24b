"""`diffperf list models|systems|calibrations|datasets`: what the package ships, by name.

Every name listed here is accepted where the CLI and the API take that kind of input:
`--model NAME`, `--system NAME`, `--calibration NAME`, `validate NAME` / `calibrate NAME`.
"""

from __future__ import annotations

from rich.table import Table

from diffperf.cli.output import console, print_json
from diffperf.errors import SpecError

KINDS = ("models", "systems", "calibrations", "datasets")


def add_parser(sub):
    p = sub.add_parser("list", help="shipped models, systems, calibrations and datasets")
    p.add_argument("kind", choices=KINDS, help="what to list")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(run=run)
    return p


def _description(path) -> str:
    """A YAML file's `description:` (one line), or why it cannot be read."""
    from diffperf.load import read_yaml

    try:
        return " ".join(str(read_yaml(path).get("description", "")).split())
    except SpecError as err:
        return f"(unreadable: {err})"


def _count_rows(path) -> int:
    """Data rows of a CSV (lines after the header; the shipped files have no quoted newlines)."""
    with path.open(newline="", encoding="utf-8") as fh:
        return max(sum(1 for line in fh if line.strip()) - 1, 0)


def entries(kind: str) -> list[dict]:
    """One mapping per shipped item of `kind`, sorted by name."""
    from diffperf import resources
    from diffperf.load import read_yaml

    if kind in ("models", "systems"):
        return [dict(name=n, description=_description(f))
                for n, f in resources.config_files(kind).items()]
    if kind == "calibrations":
        out = []
        for name, f in resources.calibration_files().items():
            try:
                d = read_yaml(f)
            except SpecError as err:
                out.append(dict(name=name, description=f"(unreadable: {err})"))
                continue
            fitted = d.get("fitted_on") or {}
            held = (d.get("heldout") or {}).get("heldout") or {}
            out.append(dict(name=name, runs=fitted.get("runs"),
                            precision=fitted.get("precision"), set=fitted.get("set") or [],
                            heldout_n=held.get("n"), heldout_mape_pct=held.get("mape_pct"),
                            description=" ".join(str(d.get("description", "")).split())))
        return out
    return [dict(name=name, kind=k, rows=_count_rows(f), file=f"data/{f.parent.name}/{f.name}"
                 if k == "kernels" else f"data/{f.name}")
            for name, (k, f) in resources.dataset_files().items()]


def run(args) -> int:
    rows = entries(args.kind)
    if args.json:
        print_json(rows)
        return 0
    if args.kind in ("models", "systems"):
        cols, body = ("name", "description"), [(r["name"], r["description"]) for r in rows]
    elif args.kind == "calibrations":
        cols = ("name", "fitted on", "held-out n", "held-out MAPE_%", "framework facts (--set)")
        body = [(r["name"], r.get("runs") or "", r.get("heldout_n") or "",
                 f"{r['heldout_mape_pct']:.3g}" if r.get("heldout_mape_pct") is not None else "",
                 " ".join(([f"--precision {r['precision']}"] if r.get("precision") else [])
                          + [f"--set {s}" for s in r.get("set") or []]))
                for r in rows]
    else:
        cols = ("name", "kind", "rows", "file")
        body = [(r["name"], r["kind"], r["rows"], r["file"]) for r in rows]
    t = Table(title=f"shipped {args.kind}", title_justify="left")
    for c in cols:
        t.add_column(c, justify="right" if c in ("rows", "held-out n", "held-out MAPE_%")
                     else "left", no_wrap=c in ("name", "fitted on", "file"))
    for r in body:
        t.add_row(*[str(v) for v in r])
    console.print(t)
    if args.kind == "datasets":
        console.print("provenance, schema and licences: data/README.md in the package "
                      "(diffperf/data/README.md)")
    return 0
