"""Argument parsing that refuses in one line (issue 20): the option, the value (shortened)
and what is allowed, exit code 2; no usage block, no traceback.

`Parser` is the ArgumentParser of every command (subparsers inherit it); `bound_types`
gives every integer option a bounded whole-number type and every float option a finite
one after the commands have added their options, so that no command has to repeat it.
"""

from __future__ import annotations

import argparse
import math

from diffperf.errors import number_spelling
from diffperf.specs.validate import INT_MAX

# Least value of integer options by destination (the rest: 0). The field's full rule (tp
# divides the heads, ...) is checked by specs.validate once the layout is built.
_LEAST = {"tp": 1, "pp": 1, "cp": 1, "ep": 1, "vp": 1, "gx": 1, "gy": 1, "gz": 1, "dp": 1,
          "gpus": 1, "micro_batch": 1, "global_batch": 1, "seq_len": 1, "steps": 1,
          "folds": 2, "chunk": 1, "top": 1, "k": 1, "points": 1, "seed": 0}
_SHOWN = 40  # characters of a refused value echoed back


def shown(value) -> str:
    """A value for an error message: repr, at most _SHOWN characters."""
    text = repr(value)
    return text if len(text) <= _SHOWN else f"{text[:_SHOWN]}... ({len(str(value))} chars)"


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose refusals are one line: 'PROG: error: MESSAGE'."""

    def error(self, message):
        message = " ".join(str(message).split())
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    def _get_values(self, action, arg_strings):
        # '--opt=--' reaches here as ['--'], which argparse drops and then returns [] (a
        # list where an option takes one value).
        if action.option_strings and action.nargs is None and arg_strings == ["--"]:
            self.error(f"argument {'/'.join(action.option_strings)}: expected one value, "
                       f"got '--'")
        return super()._get_values(action, arg_strings)


def grouped(text) -> None:
    """Refuse a value that Python's int() / float() would read but no other input of diffperf
    does ('1_024': errors.number_spelling), naming it and its plain spelling."""
    said = number_spelling(text)
    if said:
        raise argparse.ArgumentTypeError(f"{shown(text)} is written {said[0]}; allowed: "
                                         f"{said[1]}")


def whole(least: int, most: int = INT_MAX):
    """argparse type: a whole number of magnitude at most `most`; the message of a refusal
    names [least, most]. A value below `least` passes here and is refused by the command's
    own check of the field (a SpecError that says its rule, e.g. '--gpus=0 must be >= 1')."""
    def parse(text):
        grouped(text)
        try:
            value = int(str(text).strip())
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{shown(text)} is not a whole number (allowed: {least} to {most})") from None
        if abs(value) > most:
            raise argparse.ArgumentTypeError(
                f"{shown(text)} is out of range (allowed: {least} to {most})")
        return value

    parse.__name__ = "whole number"
    return parse


def finite(text):
    """argparse type: a finite number."""
    grouped(text)
    try:
        value = float(str(text).strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{shown(text)} is not a number") from None
    if not math.isfinite(value) or abs(value) > 1e30:
        raise argparse.ArgumentTypeError(
            f"{shown(text)} is out of range (allowed: finite numbers, magnitude at most 1e30)")
    return value


finite.__name__ = "number"


def bound_types(parser) -> None:
    """Every `type=int` option of the parser and its subcommands gets `whole(least)`, every
    `type=float` option `finite` (recursively, through subparsers)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in set(action.choices.values()):
                bound_types(sub)
        elif action.type is int:
            least = _LEAST.get(action.dest, 0)
            if action.choices is None:
                action.type = whole(least)
        elif action.type is float:
            action.type = finite
