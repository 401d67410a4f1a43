"""Quotes: a value of a page taken from a committed file. A quote is a Markdown link from the value to its file, whose
title says where in the file the value is:

- a JSON pointer (RFC 6901) into a JSON or YAML file: ``[0.8635](../metrics/eval.json "/validation/f1")``;
- a field of a row, ``@<column> where <column>=<value>, …`` (values are fnmatch patterns, alternatives joined by
  `` or ``): a cell of a Markdown
  table, or a field of a JSON Lines or CSV file's row:
  ``[117.6](../benchmarks/SERVE-LOAD.md "@requests/s where server=engine, clients=1")``;
- an expression over such values, after ``=``: each ``{…}`` is a pointer or cell of the link's file, or
  ``{<path>#<pointer or cell>}`` of another file (paths relative to the page):
  ``[1.2](../benchmarks/SERVE-LOAD.md "= {@requests/s where server=engine, clients=32} / {…}")``. Python's arithmetic,
  comparisons, ``x if c else y``, comprehensions, ``min max abs round len sum sorted zip mean std`` (sample std),
  ``like(text, pattern)`` (fnmatch) and ``join(items, sep=", ")``; ``{}`` is the whole file (a JSON Lines or CSV
  file: its rows).

The page's text sets the format: a number is printed with the page's decimals and thousands separator (``0.826`` as
``0.8260`` where the page shows four decimals), a sign where the page shows one (``+0.0013``, ``−0.0044``); anything
else as ``str()``. Files are read from the working tree or from a git revision.
"""

from __future__ import annotations

import ast
import csv
import fnmatch
import functools
import io
import json
import re
import statistics
import subprocess
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
QUOTE = re.compile(r'\[([^\[\]]+)\]\(([^)\s]+\.(?:json|jsonl|csv|ya?ml|md)) "([/@=][^"]*)"\)')
NUMBER = re.compile(r"[−+-]?\d[\d,]*(\.\d+)?")
OPERAND = re.compile(r"\{([^{}]*)\}")
CELL = re.compile(r"@(.+?)(?: where (.*))?")
FUNCTIONS = {"min": min, "max": max, "abs": abs, "round": round, "len": len, "sum": sum, "sorted": sorted, "zip": zip,
             "mean": statistics.mean, "std": statistics.stdev, "like": fnmatch.fnmatch,
             "join": lambda items, sep=", ": sep.join(str(i) for i in items)}
EXPRESSION_NODES = (ast.Expression, ast.BinOp, ast.UnaryOp, ast.BoolOp, ast.Compare, ast.IfExp, ast.Call, ast.Name,
                    ast.Load, ast.Store, ast.Constant, ast.List, ast.Tuple, ast.ListComp, ast.GeneratorExp,
                    ast.comprehension, ast.Subscript, ast.operator, ast.unaryop, ast.boolop, ast.cmpop)


class QuoteError(ValueError):
    """A quote that names no file, no value, or an expression that cannot be computed: its message says which."""


@functools.cache
def read(name: str, rev: str | None = None) -> str | None:
    """The text of file ``name`` (relative to the repository root): in the working tree, or at git revision ``rev``;
    None when it is absent. Cached: a command reads each file once."""
    if rev is None:
        path = ROOT / name
        return path.read_text() if path.is_file() else None
    shown = subprocess.run(["git", "show", f"{rev}:{name}"], cwd=ROOT, capture_output=True, text=True)
    return shown.stdout if shown.returncode == 0 else None


def data(name: str, rev: str | None = None):
    """File ``name`` parsed: JSON, YAML, JSON Lines or CSV (a list of rows), or a Markdown file's text.

    Raises:
        QuoteError: no such file, or it does not parse.
    """
    text = read(name, rev)
    if text is None:
        raise QuoteError(f"no file {name}")
    try:
        if name.endswith(".json"):
            return json.loads(text)
        if name.endswith(".jsonl"):
            return [json.loads(line) for line in text.splitlines() if line.strip()]
        if name.endswith(".csv"):
            return [{k: number(v) for k, v in row.items()} for row in csv.DictReader(io.StringIO(text))]
        return yaml.safe_load(text) if name.endswith((".yaml", ".yml")) else text
    except (ValueError, yaml.YAMLError) as err:
        raise QuoteError(f"{name} does not parse: {err}") from None


def pointed(value, pointer: str):
    """The value at JSON pointer ``pointer`` (``/configurations/0/validation.f1/mean``; ``""`` is the whole) of
    ``value``.

    Raises:
        KeyError, IndexError, ValueError, TypeError: the pointer names nothing.
    """
    for part in pointer.split("/")[1:]:
        part = part.replace("~1", "/").replace("~0", "~")
        value = value[int(part)] if isinstance(value, list) else value[part]
    return value


def tables(text: str) -> list[list[dict[str, str]]]:
    """The Markdown tables of ``text``, each a list of rows as ``{column: cell}``."""
    found, rows = [], []
    for line in text.splitlines() + [""]:
        if line.startswith("|"):
            rows.append([c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]])
        elif rows:
            if len(rows) > 1:
                found.append([dict(zip(rows[0], r)) for r in rows[2:]])
            rows = []
    return found


def number(cell: str):
    """A cell's value: its number (``3.42x`` as 3.42, ``1,725`` as 1725) when it is one number with a unit at most, else
    the text."""
    match = re.fullmatch(r"(-?\d[\d,]*(?:\.\d+)?(?:e-?\d+)?)\s*[^\d\s]{0,8}", cell)
    if not match:
        return cell
    value = float(match.group(1).replace(",", ""))
    return int(value) if value.is_integer() and "." not in match.group(1) else value


def field(source: str | list[dict], selector: str):
    """The field that ``selector`` (``@<column> where <column>=<value>, …``) names: in a Markdown text, the column of
    the first row, in the first table that has it, whose cells match the conditions (fnmatch patterns: ``*batch 1*``;
    alternatives joined by `` or ``: ``engine or tools.serve``), as a number where the cell is one; in a list of rows
    (JSON Lines, CSV), the column of the first such row.

    Raises:
        KeyError: no such table, row or column.
    """
    column, conditions = CELL.fullmatch(selector).groups()
    wanted = dict(c.split("=", 1) for c in re.split(r",\s*(?=[^,=]+=)", conditions)) if conditions else {}
    wanted = {k.strip(): v.strip() for k, v in wanted.items()}
    for rows in tables(source) if isinstance(source, str) else [source]:
        for row in rows:
            if column in row and all(any(fnmatch.fnmatchcase(str(row.get(k)), pattern) for pattern in v.split(" or "))
                                     for k, v in wanted.items()):
                return number(row[column]) if isinstance(source, str) else row[column]
    raise KeyError(selector)


def value_of(name: str, where: str, rev: str | None = None):
    """The value that ``where`` (a JSON pointer, or ``@…`` a table cell) names in file ``name``.

    Raises:
        QuoteError: no file, or nothing there.
    """
    source = data(name, rev)
    try:
        return field(source, where) if where.startswith("@") else pointed(source, where)
    except (KeyError, IndexError, ValueError, TypeError, AttributeError):
        raise QuoteError(f"{name} has no {where}") from None


def named(path: Path) -> str:
    """``path`` as the messages name it: from the repository root when it is inside."""
    path = path.resolve()
    return path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path)


def relative(page: Path, target: str) -> str:
    """``target``, a path relative to ``page``, as a path from the repository root."""
    return named(page.parent / target)


def evaluate(page: Path, target: str, title: str, rev: str | None = None):
    """The value a quote's title names: a pointer or cell of file ``target`` (relative to ``page``), or an expression
    (``= …``) over such values.

    Raises:
        QuoteError: a file or value missing, or an expression that does not compute.
    """
    if not title.startswith("="):
        return value_of(relative(page, target), title, rev)
    names = {}

    def operand(match: re.Match) -> str:
        path, _, where = match.group(1).rpartition("#")
        names[f"_{len(names)}"] = value_of(relative(page, path or target), where, rev)
        return f"_{len(names) - 1}"

    expression = OPERAND.sub(operand, title[1:].strip())
    try:
        tree = ast.parse(expression, mode="eval")
    except SyntaxError:
        raise QuoteError(f"not an expression: {title[1:].strip()}") from None
    if bad := [type(n).__name__ for n in ast.walk(tree) if not isinstance(n, EXPRESSION_NODES)]:
        raise QuoteError(f"{title}: {bad[0]} is not allowed in an expression")
    try:
        # the values as globals: a comprehension's own scope sees globals, not the locals of eval
        return eval(compile(tree, "<quote>", "eval"), {"__builtins__": {}, **FUNCTIONS, **names})
    except Exception as err:  # the expression is the page's: any failure is its problem, named
        raise QuoteError(f"{title}: {type(err).__name__}: {err}") from None


def shown(value, like: str) -> str:
    """``value`` as the page prints it: a number with the decimals, thousands separator and sign style of ``like``."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and NUMBER.fullmatch(like):
        decimals = len(like.partition(".")[2])
        text = f"{value:{'+' if like[0] in '+−' else ''}{',' if ',' in like else ''}.{decimals}f}"
        return text.replace("-", "−") if like[0] in "+−" else text
    return str(value)


def quotes(page: Path, text: str, rev: str | None = None) -> tuple[str, list[str]]:
    """``text`` (of ``page``) with every quote rewritten from its file (the working tree's, or git revision ``rev``'s),
    and the quotes that name no file or value, one line each."""
    problems = []

    def rewrite(match: re.Match) -> str:
        text_shown, target, title = match.groups()
        try:
            value = evaluate(page, target, title, rev)
            if isinstance(value, (dict, list)):
                raise QuoteError(f"names a {type(value).__name__}, not a value")
        except QuoteError as err:
            problems.append(f"{named(page)}: [{text_shown}]({target} \"{title}\"): {err}")
            return match.group(0)
        return f'[{shown(value, text_shown)}]({target} "{title}")'

    return QUOTE.sub(rewrite, text), problems


def stale_quotes(page: Path, text: str, rev: str | None = None) -> list[str]:
    """Every quote of ``text`` (of ``page``) that differs from its file or names nothing: one line each, with what the
    file gives."""
    new, lines = quotes(page, text, rev)
    for old, fresh in zip(QUOTE.finditer(text), QUOTE.finditer(new)):
        if old.group(1) != fresh.group(1):
            lines.append(f"{named(page)}: [{old.group(1)}]({old.group(2)} \"{old.group(3)}\"): the file "
                         f"gives {fresh.group(1)}")
    return lines
