"""Per-row predicted vs measured tokens/s/GPU of the Megatron-Bridge MoE rows, with the
step-time breakdown (the diagnostic behind docs/accuracy-bridge.md, section "MoE physics").

    python calibration/bridge_moe_rows.py [--model gpt-oss-120b] [--json out.json]

Default efficiencies of each row's system (no fitting); one compilation for the rows chosen.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MOE = ("deepseek-v3", "gpt-oss-120b", "qwen3-235b-a22b", "qwen3-30b-a3b")
PARTS = ("compute_s", "ep_exposed_s", "tp_exposed_s", "pp_exposed_s", "dp_exposed_s",
         "bubble_s", "optimizer_s", "overhead_s", "overlap_slowdown_s", "ep_hidden_s")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=",".join(MOE))
    p.add_argument("--json")
    p.add_argument("--csv", help="another runs CSV of the same schema (default: the Bridge CSV)")
    p.add_argument("--mtp-column", action="store_true",
                   help="experiment: rows whose `mtp` column is 0 or 1 get that many MTP modules "
                        "(load_runs keeps the model config's; the column is informational)")
    p.add_argument("--set", default="", help="experiment: training fields f=v,... for the rows")
    p.add_argument("--pairs", action="store_true",
                   help="also print each alltoall row beside the rows of the same model, system "
                        "and layout (tp, pp, vp, ep, micro-batch) that differ in dispatcher or "
                        "token routing (drop-and-pad vs dropless): docs/accuracy-bridge.md, "
                        "section 'Session 10'")
    args = p.parse_args(argv)
    from diffperf import load_runs
    from diffperf.api import _as_float, _normalize
    from diffperf.cli.validate_cmd import load_systems
    from diffperf.predict import FEATURES
    from diffperf.specs.batch import stack
    from diffperf.validation import _predict_rows
    from calibration.bridge import CSV, _subset

    runs = load_runs(args.csv or CSV)
    want = set(args.model.split(","))
    idx = [i for i, r in enumerate(runs.rows) if r["model"] in want]
    runs = _subset(runs, idx)
    systems = load_systems(runs, None, None)
    if args.mtp_column:
        runs.models[:] = [m.replace(mtp_layers=float(r["mtp"])) if r.get("mtp", "") in ("0", "1")
                          else m for m, r in zip(runs.models, runs.rows)]
    if args.set:
        kv = dict(x.split("=") for x in args.set.split(","))
        runs.trainings[:] = [t.replace(**{k: float(v) for k, v in kv.items()})
                             for t in runs.trainings]
        # the experiment's facts pass the rules load_runs applies to a row's own facts (a
        # fact that cannot act on a row is refused, not silently predicted without effect)
        from diffperf.errors import SpecError
        from diffperf.specs.validate import check_facts_act, check_training

        for r, m, par, t in zip(runs.rows, runs.models, runs.parallels, runs.trainings):
            where = f"--set {args.set}: row {r['id']}"
            try:
                check_training(t, where)
                check_facts_act(m, par, t, where, where)
            except SpecError as err:
                sys.exit(f"error: {err}")
    t0 = time.time()
    a = _as_float((stack(runs.models), _normalize(stack(runs.parallels)),
                   stack([systems[s] for s in runs.systems]), stack(runs.trainings)))
    res = _predict_rows(*a, temperature=None, features=FEATURES)
    step = np.asarray(res.step_time_s)
    print(f"# {len(runs)} rows, {time.time() - t0:.0f} s", file=sys.stderr)
    rows = []
    for i, r in enumerate(runs.rows):
        err = 100.0 * (runs.step_time_s[i] / step[i] - 1.0)
        bd = {k: float(np.asarray(getattr(res.breakdown, k))[i]) for k in PARTS}
        rows.append(dict(id=r["id"], model=r["model"], err_pct=float(err),
                         pred_s=float(step[i]), meas_s=float(runs.step_time_s[i]), **bd))
    for m in sorted(want):
        sel = [x for x in rows if x["model"] == m]
        e = np.array([x["err_pct"] for x in sel])
        print(f"== {m}: {len(sel)} rows, tokens/s MAPE {np.mean(np.abs(e)):.1f} %, "
              f"bias {np.mean(e):+.1f} %")
        print(f"{'id':58s} {'err%':>6s} {'meas':>7s} {'pred':>7s} "
              + " ".join(f"{k[:-2][:8]:>8s}" for k in PARTS))
        for x in sel:
            print(f"{x['id'][3:61]:58s} {x['err_pct']:+6.1f} {x['meas_s']:7.3f} "
                  f"{x['pred_s']:7.3f} " + " ".join(f"{x[k]:8.3f}" for k in PARTS))
    if args.pairs:
        _print_pairs(runs.rows, rows)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


def _print_pairs(csv_rows, pred_rows) -> None:
    """Rows of one model, system and layout that ran different token paths: dispatcher
    (ep_dispatch 0 alltoall / 1 flex) and routing (moe_token_drop 1: Megatron-Core's alltoall
    drop-and-pad, no device-to-host sync; 0: dropless), with the A2A overlap fact."""
    layout = ("model", "system", "tp", "pp", "vp", "ep", "micro_batch")
    groups: dict = {}
    for r, x in zip(csv_rows, pred_rows):
        groups.setdefault(tuple(r[k] for k in layout), []).append((r, x))
    print("== same model, system and layout (tp pp vp ep mbs); path = dispatcher/routing")
    for key, members in sorted(groups.items()):
        paths = {(r["ep_dispatch"], r["moe_token_drop"]) for r, _ in members}
        if len(paths) < 2 or not any(r["ep_dispatch"] == "0" for r, _ in members):
            continue
        print(f"-- {key[0]} {key[1]} tp {key[2]} pp {key[3]} vp {key[4]} ep {key[5]} "
              f"mbs {key[6]}")
        for r, x in sorted(members, key=lambda m: m[0]["container"]):
            path = ("flex" if r["ep_dispatch"] == "1" else "alltoall") + (
                "/drop-pad" if r["moe_token_drop"] == "1" else "/dropless")
            ov = " +a2a-overlap" if "ep_overlap=1" in r.get("set", "") else ""
            print(f"   {r['container']:9s} {r['precision']:12s} gbs {r['global_batch']:>5s} "
                  f"{path:18s}{ov:14s} "
                  f"meas {x['meas_s']:7.2f} s  pred {x['pred_s']:7.2f} s  {x['err_pct']:+6.1f} %")


if __name__ == "__main__":
    raise SystemExit(main())
