"""Compare the overlay-fact hints of two versions of diffperf (session 16, branch factneeds).

`cli.options.overlay_fact_hint` used to find the overlay fact that a refusing rule needs by a
regex over the error's text (a `FIELD=` other than the refused field); it now reads the
rule's structured `needs` (SpecError.needs, specs.validate.FactRule.needs). This script
records the refusals of a generated set of inputs (three models x 12 layouts x every
non-default Parallel / Training fact value x six precisions, through `check_inputs`) with
the code on PYTHONPATH, and compares two such records: the messages, and for every
(refusal, settable field) pair whether the old regex and the new `needs` name that field as
one the rule needs (the overlay hint appends it when the overlay applied the field):

    PYTHONPATH=<old checkout> python calibration/check_fact_needs.py dump old.jsonl
    PYTHONPATH=<new checkout> python calibration/check_fact_needs.py dump new.jsonl
    python calibration/check_fact_needs.py compare old.jsonl new.jsonl

The same records can come from a test run (`-p fact_needs_log` with calibration/ on
PYTHONPATH and FACT_NEEDS_LOG=FILE: every SpecError built while the tests run).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import re
import sys

MODELS = ("llama3-8b", "mixtral-8x7b", "deepseek-v2-lite")
LAYOUTS = (
    {}, dict(tp=2, sequence_parallel=1), dict(tp=2), dict(cp=2), dict(pp=2),
    dict(pp=2, vp=2, global_batch=4), dict(dp=2, zero_stage=1, global_batch=2),
    dict(dp=2, zero_stage=3, global_batch=2), dict(recompute=1), dict(recompute=2),
    dict(ep=2, dp=2, global_batch=2), dict(gx=2),
)
PRECISIONS = ("bf16", "fp8-delayed", "fp8-current", "fp8-blockwise", "mxfp8", "nvfp4")
VALUES = (0.0, 1.0, 2.0, 0.5)


def settable():
    """Every field a --set (and so an overlay's fitted_on.set) can give."""
    from diffperf.specs import Parallel, Training

    return [f.name for f in dataclasses.fields(Parallel)] + [
        f.name for f in dataclasses.fields(Training) if f.name != "name"]


def _cases():
    from diffperf.specs import Parallel, Training

    p_facts = [(f.name, v) for f in dataclasses.fields(Parallel)
               if f.name not in ("tp", "pp", "dp", "cp", "ep", "vp", "global_batch",
                                 "micro_batch", "gx", "gy", "gz")
               for v in VALUES if v != f.default]
    t_facts = [(f.name, v) for f in dataclasses.fields(Training)
               if f.name != "name" for v in VALUES if v != f.default]
    for model, layout, precision in itertools.product(MODELS, LAYOUTS, PRECISIONS):
        for kind, (field, value) in [("p", x) for x in p_facts] + [("t", x) for x in t_facts]:
            yield model, layout, precision, kind, field, value
        # the cross-field rules of unfused attention
        for field, value in (("attention_fa2", 1.0), ("fused_softmax_max_seq", 2048.0)):
            yield model, layout, precision, "t0", field, value


def dump(out) -> int:
    from diffperf.errors import SpecError
    from diffperf.load import load_model, load_system, training
    from diffperf.specs import Parallel
    from diffperf.specs.validate import check_inputs

    models = {m: load_model(m) for m in MODELS}
    system = load_system("b200-sxm-180gb")
    n = 0
    with open(out, "w") as fh:
        for model, layout, precision, kind, field, value in _cases():
            key = (f"{model}|{json.dumps(layout, sort_keys=True)}|{precision}|"
                   f"{kind}:{field}={value:g}")
            try:
                par = dict(layout)
                over = {}
                if kind == "p":
                    par[field] = value
                elif kind == "t":
                    over[field] = value
                else:
                    over = {"flash_attention": 0.0 if field == "attention_fa2" else 1.0,
                            field: value}
                check_inputs(models[model], Parallel(**par), system,
                             training(precision, **over))
                continue
            except SpecError as err:
                rec = dict(key=key, message=str(err), field=err.field,
                           needs=list(getattr(err, "needs", None) or ()))
            fh.write(json.dumps(rec) + "\n")
            n += 1
    print(f"{n} refusals written to {out}")
    return 0


def regex_named(message, field, fields) -> list:
    """The old overlay_fact_hint's reading (main at 8d01b14): each field other than the
    refused one that the message names as `FIELD=` (or `FIELD =`)."""
    return [f for f in fields if f != field and re.search(rf"\b{f}\s*=", message)]


def shipped_overlay_facts():
    """(name, [field, ...]) of each shipped overlay that applies framework facts."""
    from diffperf.load import overlay_facts
    from diffperf.resources import calibration_files

    out = []
    for name in calibration_files():
        facts, _ = overlay_facts(name)
        if facts:
            out.append((name, [f.split("=", 1)[0].strip() for f in facts]))
    return out


def _hint(field, named, applied) -> str:
    """Which applied fact the overlay hint names: the refused field where applied, else the
    first named (cli.options.overlay_fact_hint's choice), '' for none."""
    return field if field in applied else (named[0] if named else "")


def compare(old_path, new_path) -> int:
    fields = settable()
    read = lambda p: [json.loads(line) for line in open(p)]  # noqa: E731
    old, new = read(old_path), read(new_path)
    if [r["key"] for r in old] != [r["key"] for r in new]:
        print(f"the two records refuse different inputs ({len(old)} vs {len(new)})")
        return 1
    msg_diff, pairs, differ, by_rule = 0, 0, 0, {}
    for o, n in zip(old, new):
        if o["message"] != n["message"] or o["field"] != n["field"]:
            msg_diff += 1
            if msg_diff <= 5:
                print(f"message differs: {o['key']}\n  old: {o['message']}\n  new: "
                      f"{n['message']}")
        before = set(regex_named(o["message"], o["field"], fields))
        after = {f for f in n["needs"] if f != n["field"]}
        pairs += len(fields)
        for f in sorted(before ^ after):
            differ += 1
            rule = re.sub(r"=[-0-9.e+]+", "=V", n["message"].split(": ", 1)[-1])[:100]
            side = "regex only" if f in before else "needs only"
            by_rule.setdefault((side, f, rule), []).append(o["key"])
    print(f"{len(old)} refusals, {msg_diff} messages differ; {pairs:,} (refusal, settable "
          f"field) pairs compared, {differ:,} differ")
    for name, applied in shipped_overlay_facts():
        hints = [(_hint(o["field"], regex_named(o["message"], o["field"], applied), applied),
                  _hint(n["field"], [f for f in applied if f in n["needs"]], applied))
                 for o, n in zip(old, new)]
        print(f"hints under --calibration {name} (applies {', '.join(applied)}): "
              f"{sum(a != b for a, b in hints)} of {len(hints)} differ, "
              f"{sum(bool(a) for a, _ in hints)} hinted before, {sum(bool(b) for _, b in hints)} "
              f"after")
    for (side, f, rule), keys in sorted(by_rule.items(), key=lambda kv: -len(kv[1])):
        print(f"  {len(keys):5d}  {side:10s}  {f:22s}  {rule}")
    return 0


if __name__ == "__main__":
    cmd, *rest = sys.argv[1:] or ["help"]
    if cmd == "dump":
        sys.exit(dump(*rest))
    if cmd == "compare":
        sys.exit(compare(*rest))
    print(__doc__)
    sys.exit(2)
