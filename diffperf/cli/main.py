"""`diffperf` command line: predict, validate (and the commands of later issues).

Each command: parse, load (validate), call the library, render. A SpecError becomes one red
line and exit code 2; anything else is a bug (traceback, exit 1).
"""

from __future__ import annotations

import argparse
import os
import sys

from diffperf.errors import SpecError

DEFAULT_MODEL = "gpt3-175b"
DEFAULT_SYSTEM = "a100-sxm-80gb"


def _parser() -> argparse.ArgumentParser:
    from diffperf.cli import calibrate_cmd, predict_cmd, validate_cmd

    p = argparse.ArgumentParser(prog="diffperf", description=(
        "Differentiable performance model of distributed Transformer training."))
    sub = p.add_subparsers(dest="command", required=True)
    predict_cmd.add_parser(sub)
    validate_cmd.add_parser(sub)
    calibrate_cmd.add_parser(sub)
    from diffperf.cli import search_cmd
    search_cmd.add_parser(sub)
    from diffperf.cli import plot_cmd, study_cmd
    study_cmd.add_parser(sub)
    plot_cmd.add_parser(sub)
    from diffperf.cli import design_cmd, sensitivity_cmd
    for cmd in (sensitivity_cmd, design_cmd): cmd.add_parser(sub)  # noqa: E701
    return p


def _one_device_per_core() -> None:
    """One XLA host device per CPU core, so that search and its sweeps, which split their work
    over every local device, use all the cores (benchmarks/README.md); an XLA_FLAGS that sets
    the count wins. It must be set before JAX creates its CPU backend, so only a program run
    (main() without arguments) sets it, never an in-process caller such as a test."""
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags and (os.cpu_count() or 1) > 1:
        os.environ["XLA_FLAGS"] = (f"{flags} --xla_force_host_platform_device_count="
                                   f"{os.cpu_count()}").strip()


def main(argv=None) -> int:
    from diffperf.cli.output import err_console

    if argv is None:
        _one_device_per_core()
    try:
        args = _parser().parse_args(argv)
        return args.run(args) or 0
    except SpecError as err:
        from rich.markup import escape

        err_console.print(f"[red]error:[/red] {escape(str(err))}", highlight=False,
                          soft_wrap=True)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
