"""Errors raised on bad user input, before anything is traced (STYLE.md section 5)."""

from __future__ import annotations

import difflib


class SpecError(ValueError):
    """A model, layout, system, training or runs file that is not valid.

    The message names the field (by its path), the value, the rule and the allowed values.
    The CLI prints it on one line and exits with code 2.

    `field` and `value`: the field's name (as the message names it, without its path: e.g.
    'zero3_regather') and its value, where the raiser knows them (specs.validate's rules that
    name one field); None otherwise. A caller that acts on which field failed (load's runs
    rows) reads them instead of parsing the message.

    `rule`: for a refusal of `specs.validate.check_facts_act` (a framework fact where its term
    cannot act), the `specs.validate.FactRule` the message was made from (its `head`: the rule
    without the failing entry's values); None otherwise. `anywhere`: True for a range rule
    (the value is wrong whatever the rest of the input: a runs CSV's --set value is then not
    said to apply to every row, `load._command_fact_hint`).

    `needs`: the other settable fields (Parallel / Training, what --set and an overlay's
    fitted_on.set give) whose values the refusing rule reads, e.g. ('flash_attention',) for
    'attention_fa2=1 needs fused attention'; the rule's FactRule.needs where it has one, ()
    where the rule reads no other such field (cli.options.overlay_fact_hint reads it).
    """

    def __init__(self, message="", *, field=None, value=None, rule=None, anywhere=False,
                 needs=None):
        super().__init__(message)
        self.field, self.value, self.rule = field, value, rule
        self.anywhere = anywhere
        if needs is None:
            needs = getattr(rule, "needs", ())
        self.needs = tuple(needs)


_CLOSEST_MAX = 64  # characters: difflib is quadratic, and a key is never longer


def closest(word: str, choices) -> str:
    """'; did you mean X?' for the closest of `choices`, or '' when nothing is close (or the
    word, or a choice, is longer than _CLOSEST_MAX characters: never a typo of a name)."""
    if not isinstance(word, (str, int, float)) or len(str(word)) > _CLOSEST_MAX:
        return ""
    names = [str(c) for c in choices if len(str(c)) <= _CLOSEST_MAX][:1000]
    hit = difflib.get_close_matches(str(word), names, n=1, cutoff=0.6)
    return f"; did you mean '{hit[0]}'?" if hit else ""


def number_spelling(text):
    """(how, allowed) where `text` is a number only in a spelling that diffperf's inputs do not
    share, for the refusal 'FIELD=TEXT is written {how}; allowed: {allowed}'; None otherwise
    (a plain number, or a text that is no number in any spelling: the caller's own refusal).

    '_' digit grouping ('1_000', '2_048.5'): PyYAML implements YAML 1.1, which reads it as a
    number (yaml.org/type/int.html and float.html: "_" may be used between digits), and so
    does Python's int() / float() (PEP 515), which the command line's options and --set
    would use; YAML 1.2's core schema (yaml.org/spec/1.2.2, 10.3.2), JSON (RFC 8259, 6) and
    a runs CSV cell do not. One spelling is refused in every input (load._number, the
    command line's argparse types, cli.options.parse_values), not read by some."""
    text = str(text).strip()
    if "_" not in text or "__" in text:
        return None
    try:
        float(text)  # Python reads one '_' between digits
    except (ValueError, OverflowError):
        return None
    return ("with '_' digit grouping, which YAML 1.2, JSON and diffperf's other inputs do not "
            "read as a number (YAML 1.1 does)", f"the digits alone, {text.replace('_', '')}")


_NAME_MAX = 120  # characters of a name shown in titles


def printable(text, limit: int = _NAME_MAX) -> str:
    """A name from a file (YAML `name`, config.json `_name_or_path`) safe for a terminal:
    control characters and escape sequences removed (C0, DEL, C1, and the rest of an ANSI
    sequence), at most `limit` characters. Rich markup is not interpreted by the CLI's
    stdout console (cli.output)."""
    import re
    import unicodedata

    text = str(text)[:4 * limit]
    text = re.sub(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(\x07|\x1b\\)?|\x1b.?", "", text)
    text = "".join(ch for ch in text if unicodedata.category(ch)[0] != "C")
    return text[:limit] if len(text) <= limit else text[:limit - 3] + "..."
