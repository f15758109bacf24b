"""Every error message in diffperf/ has a test that triggers it (issue 8; STYLE.md section 5).

A static audit: no import of diffperf, nothing traced, well under a second. It walks the AST of
every module under diffperf/ for the places that make an error message, `raise E(<message>)`
for any exception E and the message lambdas that `specs/validate.py` hands to `_fail`, and
requires that some test quotes each message. A message is a template: its literal text, with
each `{field}` a wildcard. A test quotes it when a string literal of a test file (an f-string
counts, its `{...}` parts being wildcards too; a `match=` regex counts with its backslashes
removed) matches

- its head: the message from its first literal character, HEAD_LITERAL literal characters on
  to the end of the word ("{path}: a run with status oom has no step time; leave ..." ->
  ": a run with status oom has no step"), or
- its core: its longest literal piece with the literal before it, widened over neighbouring
  fields to CORE_LITERAL literal characters, so that a generic piece is pinned to the field it
  talks about ("--steps={} must be >= 1", not " must be >= 1").

Quoting the whole message, as tests/test_errors.py does with `_raises(...)`, always passes.
The triggering tests live in tests/test_errors.py (library, loaders, command line) and
tests/test_cli.py; this file's own text does not count. A site that no input can reach (an
internal invariant) goes in ALLOWED with its reason; keep that list short.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "diffperf"
TESTS = REPO / "tests"
HEAD_LITERAL = 32  # literal characters of a message's head (then to the end of the word)
CORE_LITERAL = 20  # literal characters of a message's core, at least

# (module, message template with "{}" for each field): why no test needs to trigger it.
ALLOWED = {
    ("diffperf/specs/validate.py", "{}{}: {}"):
        "_fail's wrapper ('where[i]: rule'); every rule's own message is audited as a _fail site",
    ("diffperf/specs/validate.py", "{}"):
        "_act's wrapper (a FactRule of the rule's parts); every _act rule's own message is "
        "audited as an _act site",
    ("diffperf/cli/cache.py", "{}"):
        "KernelStore.__getitem__'s KeyError(key) is the Mapping protocol (get() turns a missing "
        "entry into None), not a message to a user; KernelStore._read's PermissionError(path) "
        "and ValueError(path) become that KeyError",
}


# --------------------------------------------------------------------------------------------
# Message templates: a list of literal strings and None (a field), in order
# --------------------------------------------------------------------------------------------

def _pieces(node) -> list:
    if isinstance(node, ast.Constant):
        return [node.value] if isinstance(node.value, str) else [None]
    if isinstance(node, ast.JoinedStr):
        return [v.value if isinstance(v, ast.Constant) else None for v in node.values]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _pieces(node.left) + _pieces(node.right)
    return [None]


def _literal_len(pieces) -> int:
    return sum(len(p) for p in pieces if p)


def _template(pieces) -> str:
    return "".join("{}" if p is None else p for p in pieces)


def _merge(pieces) -> list:
    """Adjacent literals joined and adjacent fields collapsed: literal, field, literal, ..."""
    out = []
    for p in pieces:
        if p is None and not (out and out[-1] is None):
            out.append(None)
        elif p is not None and out and out[-1] is not None:
            out[-1] += p
        elif p is not None:
            out.append(p)
    return out


def _trim(pieces) -> list:
    """Without fields at the ends, nor whitespace at the ends of the outer literals."""
    m = _merge(pieces)
    while m and m[0] is None:
        m.pop(0)
    while m and m[-1] is None:
        m.pop()
    if m:
        m[0], m[-1] = m[0].lstrip(), m[-1].rstrip()
    return m


def head(pieces) -> list:
    """The message from its first literal character: HEAD_LITERAL literal characters, then on
    to the end of the word."""
    out, n = [], 0
    for p in _trim(pieces):
        if n >= HEAD_LITERAL:
            break
        if p is None:
            out.append(None)
            continue
        cut = HEAD_LITERAL - n
        if p[cut - 1:cut].isalnum():  # do not stop inside a word
            cut += len(re.match(r"\w*", p[cut:]).group())
        out.append(p[:cut])
        n += len(out[-1])
    return _trim(out)


def core(pieces) -> list:
    """The longest literal piece with the literal before it, widened over neighbouring fields
    until it holds CORE_LITERAL literal characters."""
    m = _merge(pieces)
    lits = [i for i, p in enumerate(m) if p is not None and p.strip()]
    if not lits:
        return []
    i = max(lits, key=lambda k: len(m[k].strip()))
    lo, hi = max(i - 2, 0), i  # m alternates literal, field: i - 2 is the literal before
    while _literal_len(m[lo:hi + 1]) < CORE_LITERAL and (lo > 0 or hi < len(m) - 1):
        lo, hi = (lo - 1, hi) if lo > 0 else (lo, hi + 1)
    return _trim(m[lo:hi + 1])


# --------------------------------------------------------------------------------------------
# The sites in diffperf/ and the strings of the tests
# --------------------------------------------------------------------------------------------

def _message(call: ast.Call) -> list:
    """The argument of an exception's constructor that carries the most literal text (the
    message is not always the first: yaml's ConstructorError(None, None, message, mark))."""
    args = [*call.args, *(k.value for k in call.keywords)]
    return max((_pieces(a) for a in args), key=_literal_len, default=[])


@functools.cache
def _sites() -> tuple:
    """((module, line, kind, pieces), ...) of every error message under diffperf/."""
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
                out.append((rel, node.lineno, ast.unparse(node.exc.func), _message(node.exc)))
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                  and node.func.id == "_fail"):
                out += [(rel, node.lineno, "_fail", _pieces(a.body)) for a in node.args
                        if isinstance(a, ast.Lambda)]
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                  and node.func.id == "_act"):
                out.append((rel, node.lineno, "_act", _act_pieces(node)))
    return tuple(out)


def _act_pieces(call: ast.Call) -> list:
    """The message template of a `specs.validate._act` rule, as FactRule.message makes it
    from its parts: "{field}={value} {condition} ({bound}; {got}): {reason}; allowed:
    {allowed}" (a part given as a lambda: its body; parts spread from a mapping, `**d`: a
    field)."""
    part = lambda n: _pieces(n.body if isinstance(n, ast.Lambda) else n)  # noqa: E731
    kw = {k.arg: k.value for k in call.keywords}
    pieces = part(call.args[2]) + ["=", None, " "] + part(call.args[5])
    inner = [part(kw[k]) for k in ("bound", "got") if k in kw]
    if None in kw:  # **mapping of bound / got
        inner = [[None]]
    if inner:
        pieces += [" ("] + [x for j, p in enumerate(inner) for x in (["; "] if j else []) + p]
        pieces += [")"]
    if "reason" in kw:
        pieces += [": "] + part(kw["reason"])
    if "allowed" in kw:
        pieces += ["; allowed: "] + part(kw["allowed"])
    return pieces


@functools.cache
def _test_strings() -> tuple:
    """Every string literal of tests/*.py but this file (f-string fields as "{}"), plus each
    one that has backslashes without them (a regex of `match=`)."""
    out = []
    for path in sorted(TESTS.glob("*.py")):
        if path.name == Path(__file__).name:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                s = node.value
            elif isinstance(node, ast.JoinedStr):
                s = _template([v.value if isinstance(v, ast.Constant) else None
                               for v in node.values])
            else:
                continue
            out.append(s)
            if "\\" in s:
                out.append(re.sub(r"\\(.)", r"\1", s))
    return tuple(out)


def _quoted(fragment, strings) -> bool:
    if not fragment:
        return False
    anchor = max((p for p in fragment if p), key=len)  # a cheap filter before the regex
    pattern = re.compile("".join(".*?" if p is None else re.escape(p) for p in fragment),
                         re.DOTALL)
    return any(anchor in s and pattern.search(s) for s in strings)


def _unquoted(sites, strings) -> list:
    """[(site, head, core)] of the sites (not in ALLOWED) that no string quotes."""
    out = []
    for site in sites:
        rel, _, _, pieces = site
        if (rel, _template(pieces)) in ALLOWED:
            continue
        h, c = head(pieces), core(pieces)
        if not (_quoted(h, strings) or _quoted(c, strings)):
            out.append((site, h, c))
    return out


# --------------------------------------------------------------------------------------------
# Tests
# --------------------------------------------------------------------------------------------

def test_every_error_message_is_triggered_by_a_test():
    sites = _sites()
    assert len(sites) > 100, f"the AST walk found only {len(sites)} error sites: is it broken?"
    missing = _unquoted(sites, _test_strings())
    lines = [f"  {rel}:{line} {kind}: {_template(p)!r}; quote e.g. {_template(c or h)!r}"
             for (rel, line, kind, p), h, c in missing]
    if missing:
        pytest.fail("error messages that no test quotes: add a test that triggers each one "
                    "and matches its whole message (tests/test_errors.py), or, for an internal "
                    "invariant no input can reach, an ALLOWED entry with the reason "
                    "(tests/test_error_audit.py):\n" + "\n".join(lines), pytrace=False)


def test_allowed_entries_name_existing_sites():
    templates = {(rel, _template(p)) for rel, _, _, p in _sites()}
    stale = [k for k in ALLOWED if k not in templates]
    assert not stale, f"ALLOWED entries that match no error site any more: {stale}"


def test_every_message_has_literal_text():
    """A message made only of fields ('{}: {}') states no rule: reword it or allow-list it."""
    bare = [f"{rel}:{line} {_template(p)!r}" for rel, line, _, p in _sites()
            if (rel, _template(p)) not in ALLOWED and _literal_len(core(p)) < 8]
    assert not bare, bare


@pytest.mark.parametrize("pieces,expected_head,expected_core", [
    (["--steps=", None, " must be >= 1"], "--steps={} must be >= 1", "--steps={} must be >= 1"),
    ([None, ": unknown key ", None, None, " (allowed: ", None, ")"],
     ": unknown key {} (allowed: {})", ": unknown key {} (allowed:"),
    (["temperature=", None, " must be > 0 for the soft search"],
     "temperature={} must be > 0 for the", "temperature={} must be > 0 for the soft search"),
    ([None, ".", None, "=", None, " must be > 0"], ".{}={} must be > 0", ".{}={} must be > 0"),
    ([None, ": a run with status oom has no step time"], ": a run with status oom has no step",
     ": a run with status oom has no step time"),
])
def test_head_and_core_of_a_message(pieces, expected_head, expected_core):
    assert _template(head(pieces)) == expected_head
    assert _template(core(pieces)) == expected_core


def test_the_audit_fails_on_an_unquoted_message():
    strings = ("tp=5 must divide model.num_heads=24; allowed tp: 1, 2",
               "{}: row 2 (id r1).step_time_s=-1 must be > 0")
    quoted = [("m.py", 1, "SpecError", ["tp=", None, " must divide model.num_heads=", None]),
              ("m.py", 2, "SpecError", [None, ".", None, "=", None, " must be > 0"])]
    generic = [("m.py", 3, "SpecError", ["--top=", None, " must divide model.num_heads=", None])]
    fake = [("m.py", 4, "SpecError", ["zz_audit=", None, " must be a prime greater than ",
                                      None])]
    assert _unquoted(quoted, strings) == []
    assert [s for s, _, _ in _unquoted(quoted + generic + fake, strings)] == generic + fake
    assert [s for s, _, _ in _unquoted(fake, _test_strings())] == fake
