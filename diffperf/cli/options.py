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
                   help="bf16, fp16, amp-bf16, xla-amp-bf16, bf16-pure, fp32")


def model_and_system(args):
    """(model, system) from the options of `add_model_system`: the model with --seq-len
    applied (checked), the system with the --calibration overlay."""
    from diffperf import load_model, load_system

    model = load_model(args.model)
    if args.seq_len is not None:
        if args.seq_len <= 0:
            raise SpecError(f"--seq-len={args.seq_len} must be > 0")
        model = model.replace(seq_len=float(args.seq_len))
    return model, load_system(args.system, calibration=args.calibration)
