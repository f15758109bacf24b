"""Errors raised on bad user input, before anything is traced (STYLE.md section 5)."""

from __future__ import annotations

import difflib


class SpecError(ValueError):
    """A model, layout, system, training or runs file that is not valid.

    The message names the field (by its path), the value, the rule and the allowed values.
    The CLI prints it on one line and exits with code 2.
    """


def closest(word: str, choices) -> str:
    """'; did you mean X?' for the closest of `choices`, or '' when nothing is close."""
    hit = difflib.get_close_matches(str(word), [str(c) for c in choices], n=1, cutoff=0.6)
    return f"; did you mean '{hit[0]}'?" if hit else ""
