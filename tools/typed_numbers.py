"""Numbers typed by hand: the rule that keeps measured and computed numbers out of the pages' own words.

A number that looks measured (a percentage, a size in MB, a ratio as ``x`` or ``times``, a duration, a rate, points,
a number with two or more decimals, a count with a thousands separator, a ± spread, a count ``N of M``, a difference
``N rows apart``, a table cell that is only numbers) must be one of:

- a quote of a committed file (``tools/quotes.py``), or a value inside a generated block (``tools/generated.py``);
- inside code: a fenced block, an inline span, an indented block of a docstring (commands and their arguments);
- a setting named in ``SETTINGS`` with the value it states, which is checked against its source (params.yaml or a
  module's constant), so that it cannot go stale either.

Versions (``2.13.0``, and ``3.11`` after the name of a package of requirements.lock or of ``VERSIONED``), identifiers
(``arXiv:1811.01088``, commits), years, GLUE task names, ports and small counts without a unit are not measurements
and are not matched.
"""

from __future__ import annotations

import re

from tools.generated import BLOCK
from tools.quotes import QUOTE, ROOT

NUM = r"(?<![\w.:/#=-])(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?"
MEASURED = re.compile(
    r"±\s?\d"                                                   # a spread
    r"|(?<![\w.:/#=-])\d*\.\d{3,}(?![\d.])"                     # a three- or four-decimal metric
    rf"|{NUM}\s?(?:%|MB|GB|KB|MiB|GiB|M\b|ms|µs|s\b|min\b|minutes|seconds|hours|points?\b|times\b|[A-Za-z]+/s\b)"
    rf"|{NUM}[x×](?!\w)"                                        # a ratio: 3.4x
    rf"|{NUM} (?:[a-z]+ ){{0,2}}(?:of|out of) (?:\d{{1,3}}(?:,\d{{3}})+|\d+)(?![\w.])"  # a count: 2 seeds of 3
    rf"|{NUM} (?:[a-z]+ )?apart\b"                             # a difference: 7 rows apart
    r"|(?<![\w.:/#=-])\d+\.\d\d(?![\d.])"                          # two decimals: 0.56, 2.68
    r"|(?<![\w.:/#=-])\d{1,3}(?:,\d{3})+(?!\d)")                    # a count: 5,053 pairs
# Names a version follows (CPython 3.11, transformers < 4.58): the locked packages and these.
VERSIONED = {"python", "cpython", "yaml", "cuda", "driver", "optimum-intel", "optimum-onnx", "openvino", "nncf"}
LOCKED = {m.lower() for m in re.findall(r"^([A-Za-z0-9][\w.-]*)==", (ROOT / "requirements.lock").read_text(), re.M)}
VERSION_BEFORE = re.compile(r"([\w.-]+)\s*(?:[<>=!~]=?\s*)?\(?$")
BARE_CELL = re.compile(r"[−+-]?\d[\d,]*(?:\.\d+)?\s?(?:%|x|MB|ms|s)?(?:\s?[/±,:]\s?[−+-]?\d[\d,]*(?:\.\d+)?\s?"
                       r"(?:%|x|MB|ms|s)?)*")
IDENTIFIERS = re.compile(r"arXiv:\d{4}\.\d{4,5}")
FENCE = re.compile(r"^\s*(```|~~~)")

# A setting a page or help text states in words, the value it states, and where that value is set.
# tests/test_doc_numbers.py checks each against its source, so a changed default fails the suite instead of leaving
# the words wrong.
SETTINGS = [
    # (file, the words, the source: "params.yaml:<key>" or "<module>:<expression>", the value the words state)
    ("benchmarks/serve.py", "0.3 points", "benchmarks.serve:PARITY_POINTS * 100", 0.3),
    ("benchmarks/serve.py", "99 %", "benchmarks.serve:PARITY_AGREEMENT * 100", 99),
    ("docs/serving.md", "0.3 points", "benchmarks.serve:PARITY_POINTS * 100", 0.3),
    ("docs/serving.md", "99 %", "benchmarks.serve:PARITY_AGREEMENT * 100", 99),
    ("docs/any-task.md", "95 %", "finetune.evaluate.collapse:ONE_CLASS * 100", 95),
]


def blank(match: re.Match) -> str:
    """The matched text with every character but line breaks blanked, so that line numbers stay."""
    return re.sub(r"[^\n]", " ", match.group(0))


def prose(text: str, indented_code: bool = False) -> list[str]:
    """``text``'s own words, line by line: fenced code, inline code spans (also over lines), quotes, generated blocks,
    HTML comments, link targets and identifiers blanked (and, with ``indented_code``, a docstring's indented
    blocks)."""
    text = BLOCK.sub(blank, text)
    text = re.sub(r"<!--.*?-->", blank, text, flags=re.S)
    lines, fenced, base = [], False, None
    for line in text.splitlines():
        indent = len(line) - len(line.lstrip())
        if line.strip() and base is None:
            base = indent
        if FENCE.match(line):
            fenced = not fenced
            lines.append("")
        elif fenced or (indented_code and line.strip() and indent >= (base or 0) + 4):
            lines.append("")
        else:
            lines.append(line)
    text = re.sub(r"``.*?``|`[^`]*`", blank, "\n".join(lines), flags=re.S)
    text = QUOTE.sub(blank, text)
    text = re.sub(r"\]\([^)\s]*(\s+\"[^\"]*\")?\)", blank, text)  # a link's target
    return IDENTIFIERS.sub(blank, re.sub(r"https?://\S+", blank, text)).splitlines()


def version(line: str, match: re.Match) -> bool:
    """Whether ``match`` is a version: a number after the name of a locked package or of ``VERSIONED``."""
    before = VERSION_BEFORE.search(line[:match.start()])
    return bool(before) and before.group(1).lower() in LOCKED | VERSIONED and re.fullmatch(r"[\d.]+", match.group(0))


def typed(text: str, path: str = "", indented_code: bool = False) -> list[tuple[int, str]]:
    """``(line, words)`` for every number of ``text`` that looks measured and is neither quoted, generated, code nor a
    setting of ``SETTINGS`` for ``path`` (its words may break over lines)."""
    for _, words, _, _ in (s for s in SETTINGS if s[0] == path):
        text = re.sub(r"\s+".join(map(re.escape, words.split())), blank, text)
    found = []
    for number, line in enumerate(prose(text, indented_code), 1):
        hits = [m.group(0).strip() for m in MEASURED.finditer(line) if not version(line, m)]
        if line.lstrip().startswith("|"):
            hits += [c.strip() for c in line.strip().strip("|").split("|")
                     if c.strip() and not set(c.strip()) <= set("-: ") and BARE_CELL.fullmatch(c.strip())]
        found += [(number, hit) for hit in dict.fromkeys(hits)]
    return found
