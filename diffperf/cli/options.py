"""Command-line options shared by the commands that build one job (model on a system)."""

from __future__ import annotations

from diffperf.errors import SpecError


def add_model_system(p, system_help="name under configs/systems or a YAML") -> None:
    """--model, --system, --calibration, --seq-len and --precision, with the shipped defaults."""
    p.add_argument("--model", default="gpt3-175b", help="name under configs/models, a YAML, "
                   "or a Hugging Face config.json (default: gpt3-175b)")
    p.add_argument("--system", default="a100-sxm-80gb",
                   help=f"{system_help} (default: a100-sxm-80gb)")
    p.add_argument("--calibration", help="efficiency overlay YAML (from diffperf calibrate)")
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


def add_placements(p) -> None:
    """--placements: the rank orders a layout table enumerates (`placements_of`)."""
    p.add_argument("--placements", default=None, help="comma-separated rank orders, "
                   "innermost first (default: tp-cp-dp-pp,tp-cp-pp-dp)")


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
