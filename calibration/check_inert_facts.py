"""Check, rule by rule, that a framework fact changes nothing on a layout where
`specs.validate.check_facts_act` says it cannot act (the premise of a search that ranks such
layouts as the framework runs them: docs/guide-search.md, "Framework facts").

For each per-layout rule (cp_torch / cp_ring=0 at cp 1, tp_overlap / tp_userbuffers at tp 1,
tp_userbuffers at tp > 1 without sequence parallelism, zero_shard at ZeRO 0,
the zero3_* facts below ZeRO-3, axonn_overlap=0 without a grid, lowp_param_gather at ZeRO 0,
ep_overlap at ep 1 or under full recompute, ep_dispatch at ep 1) the script searches ~300 rows
where the fact is inert (`search.facts_inert_rows`) and ~300 where it acts, with and without
the fact (Llama 3 8B on 8 H100, batch 32; Mixtral 8x7B on 16, batch 16), and prints how many
inert rows are identical in every Result leaf (must be all) and how many acting rows differ
(rows that do not fit are +inf either way). A leak prints the rows and leaves that differ.

    python calibration/check_inert_facts.py [FIELD ...]      # ~3 min of CPU, all rules

tests/test_search.py::test_a_fact_changes_nothing_on_a_layout_where_it_cannot_act checks the
same on three rows a rule, with one compiled program.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import jax  # noqa: E402

import diffperf  # noqa: E402
from diffperf.load import load_system, training  # noqa: E402
from diffperf.search import COLUMNS, enumerate_layouts, facts_inert_rows, search  # noqa: E402

# (label, model, precision, Training facts, Parallel facts)
CASES = (
    ("cp_torch=1", "llama3-8b", "bf16", dict(cp_torch=1.0), None),
    ("cp_ring=0", "llama3-8b", "bf16", {}, {"cp_ring": 0}),
    ("tp_overlap=0.5", "llama3-8b", "bf16", {}, {"tp_overlap": 0.5}),
    ("tp_userbuffers=1", "llama3-8b", "fp8-current", {}, {"tp_userbuffers": 1}),
    ("zero3_copy_out=1", "llama3-8b", "bf16", {}, {"zero3_copy_out": 1}),
    ("zero3_root_unit=1", "llama3-8b", "bf16", {}, {"zero3_root_unit": 1}),
    ("zero3_regather=0", "llama3-8b", "bf16", {}, {"zero3_regather": 0}),
    ("zero3_calls_per_layer=4", "llama3-8b", "bf16", {}, {"zero3_calls_per_layer": 4}),
    ("zero3_prefetch_params=1e8", "llama3-8b", "bf16", {}, {"zero3_prefetch_params": 1e8}),
    ("zero_shard=1", "llama3-8b", "bf16", {}, {"zero_shard": 1}),  # divides every dp x cp
    ("axonn_overlap=0", "llama3-8b", "bf16", {}, {"axonn_overlap": 0}),
    ("lowp_param_gather=1", "llama3-8b", "fp8-current", dict(lowp_param_gather=1.0), None),
    ("ep_overlap=1", "mixtral-8x7b", "bf16", {}, {"ep_overlap": 1}),
    ("ep_dispatch=1", "mixtral-8x7b", "bf16", {}, {"ep_dispatch": 1}),
)


def _sample(mask, n=300):
    return np.flatnonzero(mask)[::max(1, int(mask.sum()) // n)]


def main(only) -> int:
    system, store, leaks = load_system("h100-sxm-80gb"), {}, 0
    for label, name, precision, tr, par in CASES:
        field = label.split("=")[0]
        if only and field not in only:
            continue
        model = diffperf.load_model(name)
        n, batch = (8, 32) if name == "llama3-8b" else (16, 16)
        table = enumerate_layouts(model, n, batch, axonn=field == "axonn_overlap")
        facts = training(precision, **tr)
        inert = facts_inert_rows(model, facts, table, par)
        mask = inert[field][0] if field in inert else np.zeros(len(table), bool)
        rows = np.sort(np.concatenate([_sample(mask), _sample(~mask)]))
        t, m = table[rows], mask[rows]
        a = jax.tree.leaves(search(model, system, facts, t, parallel=par, validate=False,
                                   store=store))
        b = jax.tree.leaves(search(model, system, training(precision), t, validate=False,
                                   store=store))
        same = np.ones(len(t), bool)
        for x, y in zip(a, b):
            x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
            if x.shape and x.shape[0] == len(t):
                same &= np.all((x == y) | (np.isnan(x) & np.isnan(y)),
                               axis=tuple(range(1, x.ndim)))
        bad = np.flatnonzero(m & ~same)
        leaks += len(bad)
        print(f"{label:26s} inert rows identical {int((m & same).sum()):4d} of {int(m.sum()):4d}"
              f"   acting rows differing {int((~m & ~same).sum()):4d} of {int((~m).sum()):4d}",
              flush=True)
        if len(bad):
            print("   LEAK at", {c: t[bad[:5], COLUMNS.index(c)].tolist()
                                 for c in ("tp", "cp", "ep", "zero_stage", "recompute")})
    return 1 if leaks else 0


if __name__ == "__main__":
    sys.exit(main(set(sys.argv[1:])))
