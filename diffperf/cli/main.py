"""`diffperf` command line: predict, validate (and the commands of later issues).

Each command: parse, load (validate), call the library, render. A SpecError becomes one red
line and exit code 2; anything else is a bug (traceback, exit 1).
"""

from __future__ import annotations

import argparse
import functools
import os
import sys

from diffperf.errors import SpecError

DEFAULT_MODEL = "gpt3-175b"
DEFAULT_SYSTEM = "a100-sxm-80gb"


@functools.lru_cache(maxsize=1)
def _parser() -> argparse.ArgumentParser:
    """The command line's parser, built once a process (~20 ms; parsing does not change it,
    and each parse gets a fresh namespace)."""
    from diffperf.cli import calibrate_cmd, predict_cmd, validate_cmd

    from diffperf.cli.args import Parser, bound_types

    p = Parser(prog="diffperf", description=(
        "Differentiable performance model of distributed Transformer training."))
    import diffperf

    p.add_argument("--version", action="version", version=f"diffperf {diffperf.__version__}")
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
    from diffperf.cli import list_cmd
    list_cmd.add_parser(sub)
    bound_types(p)
    return p


def _run(argv) -> int:
    from diffperf.cli.output import err_console

    args = None
    try:
        try:
            args = _parser().parse_args(argv)
        except SystemExit as done:  # argparse: --help (0) or its one-line refusal (2)
            return done.code if isinstance(done.code, int) else 2
        return args.run(args) or 0
    except SpecError as err:
        from rich.markup import escape

        from diffperf.cli.options import overlay_fact_hint

        text = str(err) + overlay_fact_hint(err, args)  # a fact the overlay applied: say so
        message = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
        err_console.print(f"[red]error:[/red] {escape(message)}", highlight=False,
                          soft_wrap=True)
        return 2
    except KeyboardInterrupt:
        return 130


def main(argv=None) -> int:
    """Run a command; its exit code. Run as a program (argv None: the `diffperf` script,
    `python -m diffperf.cli.main`), a command that returns ends the process at once after
    flushing its output: the interpreter's own teardown (XLA's CPU client, the loaded
    executables, thread pools) takes ~0.3 s on 2 cores and nothing a finished command needs
    (every file is written and closed before its command returns). An in-process caller,
    such as a test, passes argv and gets the code back."""
    code = _run(argv)
    if argv is None:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


if __name__ == "__main__":
    sys.exit(main())
