"""Command-line options shared by the commands that build one job (model on a system)."""

from __future__ import annotations

from diffperf.errors import SpecError, number_spelling


def add_model_system(p, system_help="name under configs/systems or a YAML") -> None:
    """--model, --system, --calibration, --seq-len and --precision, with the shipped defaults."""
    p.add_argument("--model", default="gpt3-175b", help="name under configs/models, a YAML, "
                   "or a Hugging Face config.json (default: gpt3-175b)")
    p.add_argument("--system", default="a100-sxm-80gb",
                   help=f"{system_help} (default: a100-sxm-80gb)")
    p.add_argument("--calibration", help="efficiency overlay: a shipped name (diffperf list "
                   "calibrations, e.g. vtrain-a100) or a YAML path (from diffperf calibrate); "
                   "predict, search and validate default to the shipped set of the system's "
                   "GPU (configs/efficiency, docs/trust.md); 'none': the physics defaults")
    p.add_argument("--seq-len", type=int, help="override the model's sequence length")
    p.add_argument("--precision", default="bf16",
                   help="bf16, fp16, amp-bf16, xla-amp-bf16, bf16-pure, fp32; low precision "
                        "(docs/precision.md): fp8-delayed, fp8-current (fp8), fp8-blockwise, "
                        "mxfp8, nvfp4")


def model_and_system(args):
    """(model, system) from the options of `add_model_system`: the model with --seq-len
    applied (checked), the system with the --calibration overlay. A --global-batch not given
    (None) becomes the model's own (`load.default_global_batch`); args.batch_notes says how
    when it comes from the rule, args.global_batch_default that it was not given. Commands
    whose parser sets `efficiency_defaults` (predict, search, validate) take the shipped
    efficiency set of the system's GPU when no overlay is given (`diffperf.trust.resolve`)
    and leave the set's record in args.efficiency_set; the others keep the physics
    defaults."""
    from diffperf import load_model

    if args.seq_len is not None and args.seq_len <= 0:
        raise SpecError(f"--seq-len={args.seq_len} must be > 0")
    model = load_model(args.model, seq_len=args.seq_len)
    system = system_with_set(args, args.system)
    args.batch_notes = []
    if getattr(args, "global_batch", 0) is None:  # a command with --global-batch, not given
        from diffperf.load import default_global_batch

        args.global_batch, note = default_global_batch(args.model, args.seq_len)
        args.global_batch_default = True
        args.batch_notes = [note] if note else []
    return model, system


def system_with_set(args, name):
    """The system `name` with the efficiency set the command asks for (see
    `model_and_system`)."""
    from diffperf import load_system
    from diffperf.trust import resolve

    calibration = getattr(args, "calibration", None)
    if not getattr(args, "efficiency_defaults", False):
        if calibration in ("none", "physics"):
            calibration = None
        return load_system(name, calibration=calibration)
    system, tset = resolve(load_system(name), calibration)
    args.efficiency_set = tset
    return system


GLOBAL_BATCH_HELP = ("sequences per optimizer step (default: the model's published batch "
                     "where its YAML states one, e.g. GPT-3 175B's 1536; else ~4M tokens / "
                     "seq_len rounded to a power of two, and a note says so)")


def add_job(p) -> None:
    """--gpus and --global-batch: the job whose layouts a search or a design enumerates, with
    the shipped defaults (1024 devices; the model's global batch, `model_and_system`)."""
    p.add_argument("--gpus", type=int, default=1024, help="number of devices (default 1024)")
    p.add_argument("--global-batch", dest="global_batch", type=int, default=None,
                   help=GLOBAL_BATCH_HELP)


def add_placements(p, alias=False) -> None:
    """--placements: the rank orders a layout table enumerates (`placements_of`); with
    `alias`, --placement too (predict's spelling; the command has no layout placement)."""
    names = ("--placement", "--placements") if alias else ("--placements",)
    p.add_argument(*names, dest="placements", default=None, help="comma-separated rank "
                   "orders, innermost first (default: tp-cp-dp-pp,tp-cp-pp-dp)")


def placements_of(text) -> tuple:
    """The rank orders of --placements ('tp-cp-dp-pp,tp-cp-pp-dp' -> (('tp', 'cp', 'dp',
    'pp'), ...)); None: search.PLACEMENTS."""
    from diffperf.search import PLACEMENTS

    if text is None:
        return PLACEMENTS
    orders = tuple(tuple(p.strip().split("-")) for p in text.split(",") if p.strip())
    if not orders:
        raise SpecError(f"--placements={text!r} must list rank orders like tp-cp-dp-pp")
    return orders


def check_at_least(args, lows: dict) -> None:
    """A SpecError for the first option below its least value ({dest: least}); an option
    left unset (None) is not checked."""
    for name, low in lows.items():
        value = getattr(args, name)
        if value is not None and value < low:
            raise SpecError(f"--{name.replace('_', '-')}={value} must be >= {low}")


def framework_facts(args) -> tuple[list, list]:
    """(--set items, notes): the user's --set, after the framework facts the --calibration
    overlay was fitted under (its fitted_on.set; the user's value wins for a field given
    twice), and one note per fact applied from the overlay or precision that differs."""
    from diffperf.load import overlay_facts

    given = list(getattr(args, "set", None) or [])
    if getattr(args, "calibration", None) in (None, "", "none", "physics"):
        return given, []  # no overlay (the shipped default sets carry no framework facts)
    facts, precision = overlay_facts(args.calibration)
    mine = {item.split("=", 1)[0].strip() for item in given}
    applied = [f for f in facts if f.split("=", 1)[0].strip() not in mine]
    # {field: 'FIELD=VALUE'} of the facts the user did not type: a refusal of one of them
    # says where it came from (cli.main, `overlay_fact_hint`)
    args.overlay_applied = {f.split("=", 1)[0].strip(): f.strip() for f in applied}
    notes = []
    if applied:
        notes.append(f"--calibration {args.calibration} was fitted under --set "
                     f"{' --set '.join(applied)}: applied (give --set FIELD=VALUE to "
                     f"override)")
    used = getattr(args, "precision", precision)
    # validate without --precision reads each row's precision column: the command compares
    # it with the overlay's once the rows are read (`row_precision_note`)
    args.overlay_precision = precision
    if precision and used and precision != used:
        notes.append(f"--calibration {args.calibration} was fitted under --precision "
                     f"{precision}; this run uses --precision {used}")
    return applied + given, notes


def _fact_value(text):
    """A fact's value for comparing two spellings ('1' and '1.0' are one value): the number
    where the text is one, else the stripped text (a cell load_runs has not checked)."""
    try:
        return float(text)
    except ValueError:
        return text.strip()


def _cell_facts(row) -> dict:
    """{field: value text} of a runs row's own `set` cell ('a=1;b=2' -> {'a': '1', 'b':
    '2'})."""
    from diffperf.load import run_fact_items

    facts = [f.split("=", 1) for f in run_fact_items(row) if "=" in f]
    return {k.strip(): v.strip() for k, v in facts}


def row_fact_notes(items, rows, overlay=None) -> list:
    """Notes (one per command fact) for each `--set FIELD=VALUE` (or overlay fact) that some
    rows' own `set` cell gives another value: the row's fact is what that run ran and is
    applied after the command's (load.load_runs), so the command's value does not act there.
    Example: '--set flash_attention=1 does not act on 1549 of 1549 rows: their 'set' cell
    says flash_attention=0 (what those runs ran, applied after --set; edit the cells for a
    what-if)'. `rows`: the runs' raw CSV rows (Runs.rows); `overlay`: (name, {field:
    'FIELD=VALUE'}) of the facts applied from --calibration NAME (`framework_facts`'
    args.overlay_applied), which the note names as such."""
    cells = [_cell_facts(row) for row in rows]
    name, applied = overlay or (None, {})
    notes = []
    for item in items or ():
        key, value = (x.strip() for x in item.split("=", 1))
        other = [c[key] for c in cells
                 if key in c and _fact_value(c[key]) != _fact_value(value)]
        if other:
            said = ", ".join(f"{key}={v}" for v in sorted(set(other)))
            what = (f"--calibration {name}'s {key}={value}"
                    if applied.get(key, "").replace(" ", "") == item.replace(" ", "")
                    else f"--set {key}={value}")
            notes.append(f"{what} does not act on {len(other)} of {len(cells)} "
                         f"rows: their 'set' cell says {said} (what those runs ran, applied "
                         f"after --set; edit the cells for a what-if)")
    return notes


def _same_preset(a, b) -> bool:
    """Whether two precision names are one preset (an alias such as fp8 = fp8-current)."""
    from diffperf.specs.training import PRECISIONS

    return a == b or (a in PRECISIONS and PRECISIONS[a] is PRECISIONS.get(b))


def precision_override_notes(precision, rows) -> list:
    """The note (a list of 0 or 1 line) that --precision replaces the precision column of
    some rows that name another preset (load_runs applies --precision to every row, unlike
    --set, which a row's own `set` cell overrides). Rows with a blank or no precision cell
    say nothing. Example: '--precision amp-bf16 replaces the precision column of 25 of 25
    rows (their column says xla-amp-bf16)'."""
    if not precision:
        return []
    said = [(row.get("precision") or "").strip() for row in rows]
    other = [p for p in said if p and not _same_preset(p, precision)]
    if not other:
        return []
    return [f"--precision {precision} replaces the precision column of {len(other)} of "
            f"{len(rows)} rows (their column says {', '.join(sorted(set(other)))})"]


def fitted_under(precision, items, runs, mask=None) -> tuple:
    """(precision, facts) a calibration's fitted rows ran under, for its overlay's fitted_on
    (`mask`: the fitted rows, default all): --precision, else the rows' precision column
    where every row names the same preset (else None); each --set item that acted on some
    row (its own `set` cell does not replace it), or, where every row's cell replaces it with
    one value, that value; and each fact of a row's cell that every row has with one value
    (the command's first, in its order). On the same CSV, validate --calibration with the
    overlay then predicts what was fitted (row cells apply after the overlay's facts).
    Example: vtrain_a100 (every row 'dp_overlap=0;dropout=1;flash_attention=0;
    fused_softmax_max_seq=2048') without --set -> those four facts."""
    picked = [i for i in range(len(runs.rows)) if mask is None or mask[i]]
    rows = [runs.rows[i] for i in picked]
    if precision is None:
        names = {runs.trainings[i].name for i in picked}
        precision = names.pop() if len(names) == 1 else None
    # the last value of a field given twice wins, as in load.parse_overrides
    given = dict(tuple(x.strip() for x in f.split("=", 1)) for f in items or () if "=" in f)
    cells = [_cell_facts(row) for row in rows]
    facts = []
    for key, value in given.items():
        replaced = [c[key] for c in cells if key in c]
        if not cells or len(replaced) < len(cells):  # acted on the rows without their own value
            facts.append(f"{key}={value}")
        elif len({_fact_value(v) for v in replaced}) == 1:
            facts.append(f"{key}={replaced[0]}")
    for key in dict.fromkeys(k for c in cells for k in c):
        values = {_fact_value(c[key]) if key in c else None for c in cells}
        if key not in given and len(values) == 1 and None not in values:
            facts.append(f"{key}={cells[0][key]}")
    return precision, facts


def row_precision_note(args, row_precisions) -> list:
    """The note (a list of 0 or 1 line) that the --calibration overlay was fitted under a
    precision that some rows' precision column does not name (validate without --precision);
    none when every row says the overlay's precision (e.g. h100_jax_single_gpu's column
    xla-amp-bf16 under jax-h100) or the overlay records none. Example: 'jax-h100 was fitted
    under --precision xla-amp-bf16; 3 of 25 rows' precision column says amp-bf16'."""
    fitted = getattr(args, "overlay_precision", None)
    if not fitted or getattr(args, "precision", None):
        return []
    other = [p for p in row_precisions if not _same_preset(p, fitted)]
    if not other:
        return []
    names = ", ".join(sorted(set(other)))
    return [f"--calibration {args.calibration} was fitted under --precision {fitted}; "
            f"{len(other)} of {len(row_precisions)} rows' precision column says {names}"]


def overlay_fact_hint(err, args) -> str:
    """The text to append to a SpecError (`err`) that refuses a framework fact the user did not
    give but the --calibration overlay applied (`framework_facts`, its fitted_on.set: e.g.
    vtrain-a100's fused_softmax_max_seq=2048 under the user's --set flash_attention=1), or
    whose rule needs an applied fact (a runs row's attention_fa2=1 'needs fused attention
    (flash_attention=1; got 0)' under vtrain-a100's flash_attention=0: the rule's
    SpecError.needs, its FactRule.needs, names flash_attention); '' otherwise. Reads
    SpecError.field and .needs, not the message's words (was a regex over the text, which
    also took a field the message names in passing and missed one it does not spell as
    FIELD=: docs/reliability.md, Session 16)."""
    applied = getattr(args, "overlay_applied", None) or {}
    field = getattr(err, "field", None)
    if field not in applied:
        needs = getattr(err, "needs", ())
        named = [f for f in applied if f != field and f in needs]
        if not named:
            return ""
        field = named[0]
    return (f" (--set {applied[field]} was applied from --calibration {args.calibration}, "
            f"which was fitted under it: give --set {field}=VALUE to override it)")


def inert_notes(inert, n_layouts=None) -> list[str]:
    """Notes on the framework facts that cannot act on some layouts (`search.facts_inert_rows`
    of a table of n_layouts rows; n_layouts None: `specs.validate.neutral_facts`' facts of the
    one layout predict's search chose). The framework runs such a layout without the fact
    (its term is zero there), so it is evaluated and ranked as it is, not left out. Each rule
    is said by its `specs.validate.FactRule.head` (the rule, without the values of the row
    it was first found on), the text the refusal of a given layout leads with."""
    notes = []
    for field, (what, said) in inert.items():
        rules = "; ".join(dict.fromkeys(r.head for r in said))  # FactRule: no row's values
        fact = f"{field}={said[0].value:g}"
        if n_layouts is None:
            notes.append(f"{fact} does not act on the layout predict's search chose ({rules}): "
                         f"predicted as the framework runs it, without it (a layout option "
                         f"given with it is refused)")
        else:
            notes.append(f"{fact} does not act on {int(what.sum()):,} of the {n_layouts:,} "
                         f"layouts ({rules}): they are evaluated and ranked as the framework "
                         f"runs them, without it")
    return notes


def unmeasured_cost_notes(model, system, training) -> list[str]:
    """Notes on the kernel costs a System prices as free because nobody measured them on its
    GPU, for a model that pays them: the learned attention sinks' gradient in the fused
    attention backward (System.attn_sink_bwd_row_s, costs.compute.attention_sink_backward_s;
    read only with Model.attention_sinks and flash attention) is 0 on every system file but
    the H100's, which would price GPT-OSS's backward ~0.4 ms per layer cheaper (b 1, s 4096,
    64 heads) there without a word. The H100's figure is read from the shipped
    h100-sxm-80gb system file (`load_system`), so the note says what the H100 files price."""
    if (float(model.attention_sinks) > 0 and float(training.flash_attention) > 0
            and float(system.attn_sink_bwd_row_s) == 0):
        from diffperf import load_system

        row_s = float(load_system(SINK_MEASURED_SYSTEM).attn_sink_bwd_row_s)
        rows = 64 * 4096  # query rows x heads of one layer at b 1, s 4096, 64 heads
        return [f"{model.name} has learned attention sinks: the cost of their gradient in the "
                f"fused attention backward is not measured on {system.name} "
                f"(attn_sink_bwd_row_ns absent: priced as free); on an H100 (cuDNN 9.19, "
                f"{SINK_MEASURED_SYSTEM}) it is {row_s * 1e9:.3g} ns per query row x head, "
                f"~{rows * row_s * 1e3:.2g} ms per layer backward at b 1, s 4096, 64 heads "
                f"(docs/accuracy-gptoss.md, Session 15)"]
    return []


# the shipped system file whose attn_sink_bwd_row_ns was measured (`unmeasured_cost_notes`)
SINK_MEASURED_SYSTEM = "h100-sxm-80gb"


def print_notes(notes) -> None:
    """Each note on stderr (stdout keeps the table or the JSON)."""
    from rich.markup import escape

    from diffperf.cli.output import err_console

    for note in notes:
        err_console.print(f"[cyan]note:[/cyan] {escape(note)}", highlight=False,
                          soft_wrap=True)


RECOMPUTE_NAMES = ("none", "selective", "full")


def parse_values(option: str, text, names=None) -> tuple:
    """The values of a layout option: 'V' (one value), 'A-B' (every whole number from A to
    B), 'V1,V2,...' or a mix ('1,4-8'); with `names` (e.g. RECOMPUTE_NAMES) a value may be
    a name, its index in `names`. Sorted, without repeats; None stays None."""
    if text is None:
        return None
    out = set()
    for part in str(text).split(","):
        part = part.strip()
        if names is not None and part in names:
            out.add(names.index(part))
            continue
        bounds = part.split("-") if "-" in part[1:] else [part]
        for b in bounds:  # int() reads '1_6' as 16: refused as in every input
            said = number_spelling(b)
            if said:
                raise SpecError(f"--{option}={b.strip()} is written {said[0]}; allowed: "
                                f"{said[1]}", field=option, value=b.strip())
        try:
            lo, hi = (int(bounds[0]), int(bounds[-1])) if len(bounds) <= 2 else (None, None)
        except ValueError:
            lo = hi = None
        if lo is None or lo < 0 or hi < lo or hi - lo > 1_000_000:
            allowed = f"{', '.join(names)} or " if names else ""
            raise SpecError(f"--{option}={text!r} must be {allowed}whole numbers >= 0: V, "
                            f"A-B (A <= B, at most 10^6 apart) or V1,V2,...")
        out.update(range(lo, hi + 1))
    return tuple(sorted(out))
