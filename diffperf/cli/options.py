"""Command-line options shared by the commands that build one job (model on a system)."""

from __future__ import annotations

from diffperf.errors import SpecError


def add_model_system(p, system_help="name under configs/systems or a YAML") -> None:
    """--model, --system, --calibration, --seq-len and --precision, with the shipped defaults."""
    p.add_argument("--model", default="gpt3-175b", help="name under configs/models, a YAML, "
                   "or a Hugging Face config.json (default: gpt3-175b)")
    p.add_argument("--system", default="a100-sxm-80gb",
                   help=f"{system_help} (default: a100-sxm-80gb)")
    p.add_argument("--calibration", help="efficiency overlay: a shipped name (diffperf list "
                   "calibrations, e.g. vtrain-a100) or a YAML path (from diffperf calibrate)")
    p.add_argument("--seq-len", type=int, help="override the model's sequence length")
    p.add_argument("--precision", default="bf16",
                   help="bf16, fp16, amp-bf16, xla-amp-bf16, bf16-pure, fp32; low precision "
                        "(docs/precision.md): fp8-delayed, fp8-current (fp8), fp8-blockwise, "
                        "mxfp8, nvfp4")


def model_and_system(args):
    """(model, system) from the options of `add_model_system`: the model with --seq-len
    applied (checked), the system with the --calibration overlay."""
    from diffperf import load_model, load_system

    if args.seq_len is not None and args.seq_len <= 0:
        raise SpecError(f"--seq-len={args.seq_len} must be > 0")
    model = load_model(args.model, seq_len=args.seq_len)
    return model, load_system(args.system, calibration=args.calibration)


def add_job(p) -> None:
    """--gpus and --global-batch: the job whose layouts a search or a design enumerates, with
    the shipped defaults (GPT-3 175B's 1024 devices and global batch 1536)."""
    p.add_argument("--gpus", type=int, default=1024, help="number of devices (default 1024)")
    p.add_argument("--global-batch", dest="global_batch", type=int, default=1536,
                   help="sequences per optimizer step (default 1536)")


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
    if not getattr(args, "calibration", None):
        return given, []
    facts, precision = overlay_facts(args.calibration)
    mine = {item.split("=", 1)[0].strip() for item in given}
    applied = [f for f in facts if f.split("=", 1)[0].strip() not in mine]
    notes = []
    if applied:
        notes.append(f"--calibration {args.calibration} was fitted under --set "
                     f"{' --set '.join(applied)}: applied (give --set FIELD=VALUE to "
                     f"override)")
    used = getattr(args, "precision", precision)
    if precision and precision != used:
        notes.append(f"--calibration {args.calibration} was fitted under --precision "
                     f"{precision}; this run uses " + (f"--precision {used}" if used else
                                                       "each row's precision column"))
    return applied + given, notes


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
        try:
            lo, hi = (int(bounds[0]), int(bounds[-1])) if len(bounds) <= 2 else (None, None)
        except ValueError:
            lo = hi = None
        if lo is None or lo < 0 or hi < lo or hi - lo > 1_000_000:
            allowed = f"names {', '.join(names)} or " if names else ""
            raise SpecError(f"--{option}={text!r} must be {allowed}whole numbers >= 0: V, "
                            f"A-B (A <= B, at most 10^6 apart) or V1,V2,...")
        out.update(range(lo, hi + 1))
    return tuple(sorted(out))
