"""Errors raised on bad user input, before anything is traced (STYLE.md section 5)."""

from __future__ import annotations

import difflib
import re


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


# YAML 1.1's number forms (YAML.org/type/int.html, float.html; PyYAML's resolver.py) that
# YAML 1.2's core schema (YAML.org/spec/1.2.2, 10.3.2) and the other inputs read otherwise
_HEX = re.compile(r"0x[0-9a-fA-F]+")
_BINARY = re.compile(r"0b[01]+")
_BASE60 = re.compile(r"[1-9][0-9]*(:[0-5]?[0-9])+|[0-9]+(:[0-5]?[0-9])+\.[0-9]*")
_OCTAL = re.compile(r"0[0-7]+")


def number_spelling(text, yaml11: bool = False):
    """(how, allowed) where `text` is a number only in a spelling that diffperf's inputs do not
    share, for the refusal 'FIELD=TEXT is written {how}; allowed: {allowed}'; None otherwise
    (a plain number, or a text that is no number in any spelling: the caller's own refusal).

    - '_' digit grouping ('1_000', '2_048.5'): PyYAML implements YAML 1.1, which reads it as
      a number (YAML.org/type/int.html and float.html: "_" may be used between digits), and
      so does Python's int() / float() (PEP 515), which the command line's options and --set
      would use; YAML 1.2's core schema (YAML.org/spec/1.2.2, 10.3.2), JSON (RFC 8259, 6)
      and a runs CSV cell do not.
    - hexadecimal ('0x1F': 31 in YAML 1.1 and 1.2), binary ('0b101': 5) and base 60 ('1:30':
      90, '1:30.5': 90.5; both YAML 1.1 only): JSON, a CSV cell and --set have none of them.
    - `yaml11` (a value PyYAML resolved as a number): a leading zero ('010'), which YAML 1.1
      reads as octal (8) and YAML 1.2, Python and the other inputs as decimal (10); only
      where the two readings differ ('07' and '0' are read alike). A text input reads it as
      the decimal number, as YAML 1.2 does.
    One spelling is refused in every input (load._number, the command line's argparse types,
    cli.options.parse_values, trust's envelopes), not read differently by each reader."""
    text = str(text).strip()
    sign = -1 if text.startswith("-") else 1
    digits = (text[1:] if text[:1] in "+-" else text).replace("_", "")
    said = lambda v: f"{sign * v:.15g}" if isinstance(v, float) else str(sign * v)  # noqa: E731
    for pattern, how, readers in (
            (_HEX, "in hexadecimal", "YAML reads as {} and JSON"),
            (_BINARY, "in binary", "YAML 1.1 (PyYAML) reads as {} and YAML 1.2, JSON"),
            (_BASE60, "in base 60", "YAML 1.1 (PyYAML) reads as {} and YAML 1.2, JSON")):
        if pattern.fullmatch(digits):
            v = (int(digits, 16) if pattern is _HEX else int(digits, 2) if pattern is _BINARY
                 else _base60(digits))
            return (f"{how}, which {readers.format(said(v))} and diffperf's other inputs do "
                    f"not read as a number", f"the decimal number, {said(v)}")
    if yaml11 and _OCTAL.fullmatch(digits) and int(digits, 8) != int(digits):
        octal, decimal = said(int(digits, 8)), said(int(digits))
        return (f"with a leading zero, which YAML 1.1 (PyYAML) reads as the octal number "
                f"{octal} and YAML 1.2 and diffperf's other inputs as {decimal}",
                f"the number meant, without the leading zero: {octal} or {decimal}")
    if "_" not in text or "__" in text:
        return None
    try:
        float(text)  # Python reads one '_' between digits
    except (ValueError, OverflowError):
        return None
    return ("with '_' digit grouping, which YAML 1.2, JSON and diffperf's other inputs do not "
            "read as a number (YAML 1.1 does)", f"the digits alone, {text.replace('_', '')}")


def _base60(digits: str):
    """A YAML 1.1 sexagesimal number's value: '1:30' = 1 x 60 + 30 = 90, '1:30.5' = 90.5
    (YAML.org/type/int.html, float.html)."""
    *whole, last = digits.split(":")
    v = 0
    for part in whole:
        v = 60 * v + int(part)
    return 60 * v + (float(last) if "." in last else int(last))


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
