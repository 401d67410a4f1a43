"""The shell commands the docs name, and the parser each runs under: for tests/test_docs.py (commands run as written)
and tests/test_doc_numbers.py (docstrings and help texts). The pages, the benchmarks' reports, the module docstrings
and the ``--help`` texts of tools/ and benchmarks/; a command's module is imported and its ``main()`` stopped where it
would parse."""

from __future__ import annotations

import argparse
import ast
import contextlib
import functools
import importlib
import importlib.util
import io
import os
import re
import shlex
from pathlib import Path
from unittest import mock

import yaml

from tools import results_block

ROOT = Path(__file__).resolve().parents[1]
PAGES = results_block.pages()
REPORTS = [ROOT / name for name in results_block.REPORTS]
MODULES = sorted(p for folder in ("tools", "benchmarks") for p in (ROOT / folder).glob("*.py"))
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^\s*(```|~~~)")
SHELL_FENCE = re.compile(r"^\s*(```|~~~)\s*(bash|sh|shell|console)?\s*$")  # an opening fence of shell lines
READERS = ("tools.summarize", "dvc exp show", "dvc metrics diff", "dvc plots diff")  # read finished experiments


def prose(text: str) -> list[str]:
    """The page's lines outside fenced code blocks, with inline code spans blanked."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        lines.append("" if fenced else re.sub(r"`[^`]*`", "``", line))
    return lines


def code_spans(text: str) -> list[str]:
    """The shell lines of a page: each line of its bash (or unnamed) fences, continuation lines joined, each
    indented command line, and each inline code span of its prose, a span broken over lines joined again."""
    found, fenced, shell, paragraph = [], False, False, []
    for line in text.splitlines() + [""]:
        if FENCE.match(line):
            fenced, shell = not fenced, bool(not fenced and SHELL_FENCE.match(line))
            continue
        if fenced:
            if shell and found and found[-1].endswith("\\"):
                found[-1] = found[-1][:-1] + line
            elif shell:
                found.append(line)
        elif re.match(r" {4,}(dvc|python|\.venv/bin/python) ", line):  # an indented code block's line
            found.append(line.strip())
        elif line.strip():
            paragraph.append(line.strip())
        else:
            found += re.findall(r"`([^`]+)`", " ".join(paragraph))
            paragraph = []
    return found


def commands(line: str) -> list[list[str]]:
    """The `python -m` and `dvc` commands of a shell line, as argv lists from the word after python or dvc: the line
    split at ``;``, ``&&``, ``||`` and ``|`` (a loop's ``do`` and leading ``NAME=value`` set-ups dropped), a
    placeholder ``<experiment>`` kept as one word (``PLACEHOLDER``), usage brackets ``[--form FORM]`` opened."""
    line = re.sub(r"<[^<>]*>", "PLACEHOLDER", line)
    line = re.sub(r"\[(-[^\[\]]*)\]", r"\1", line)
    lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|")
    lexer.whitespace_split = True
    segments, words = [], []
    try:
        for word in lexer:
            if word and set(word) <= set(";&|"):
                segments.append(words)
                words = []
            else:
                words.append(word)
    except ValueError:  # an unclosed quote: a command is named, a line of prose is not one
        return [["unparsed", line]] if re.search(r"python3? -m |\bdvc ", line) else []
    found = []
    for segment in [*segments, words]:
        while segment and (segment[0] in ("do", "then", "time") or re.fullmatch(r"\w+=\S*|\$\w+", segment[0])):
            segment = segment[1:]
        if len(segment) > 2 and re.fullmatch(r"(\S*/)?python3?", segment[0]) and segment[1] == "-m":
            found.append(["python", *segment[2:]])
        elif len(segment) > 1 and re.fullmatch(r"(\S*/)?dvc", segment[0]):
            found.append(segment)
    return found


def docstring(path: Path) -> str:
    """A module's docstring ("" without one)."""
    return ast.get_docstring(ast.parse(path.read_text())) or ""


def docstring_lines(text: str) -> list[str]:
    """The shell lines of a docstring: its indented command lines (a trailing backslash joins the next), and its
    ``code`` and `code` spans."""
    found = []
    for line in text.splitlines():
        if found and found[-1].endswith("\\"):
            found[-1] = found[-1][:-1].rstrip() + " " + line.strip()
        elif re.match(r" {4,}(dvc|python3?|\.venv/bin/python) ", line):
            found.append(line.strip())
    return found + re.findall(r"``?([^`]+?)``?", re.sub(r"^ {4,}.*$", "", text, flags=re.M))


@functools.cache
def help_text(path: Path) -> str | None:
    """``python -m <module> --help`` of a module of tools/ or benchmarks/ as one line per paragraph (no wrapping), or
    None when it parses no arguments."""
    module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
    parser = command_parser(module) if "def main" in path.read_text() else None
    if parser is None:
        return None
    with mock.patch.dict(os.environ, {"COLUMNS": "10000"}):
        return parser.format_help()


def help_lines(text: str) -> list[str]:
    """The commands a help text names: its indented command lines and code spans (``docstring_lines``), and in its
    other words each plain ``python -m`` or ``dvc`` to the end of its clause."""
    words = re.sub(r"``?[^`]+?``?", "", re.sub(r"^ {4,}.*$", "", text, flags=re.M))
    return docstring_lines(text) + [m.group(0).strip() for m in re.finditer(r"(?:python3? -m|\bdvc) [^;,()\n]*",
                                                                              words)]


def texts() -> list[tuple[str, list[str]]]:
    """Every text that names commands, with its shell lines: the pages, the benchmarks' reports, and the docstrings
    and ``--help`` of tools/ and benchmarks/."""
    found = [(str(page.relative_to(ROOT)), code_spans(page.read_text())) for page in PAGES + REPORTS]
    for path in MODULES:
        name = str(path.relative_to(ROOT))
        found.append((f"{name} (docstring)", docstring_lines(docstring(path))))
        if (shown := help_text(path)) is not None:
            found.append((f"{name} (--help)", help_lines(shown)))
    return found


def page_commands() -> list[tuple[str, list[str]]]:
    """Every `python -m` and `dvc` command of the pages, reports, docstrings and help texts, with where it is."""
    return [(where, argv) for where, lines in texts() for line in lines for argv in commands(line)]


class ParserFound(Exception):
    """Raised in place of ``parse_args``: the command's parser, built by its own ``main``."""

    def __init__(self, parser: argparse.ArgumentParser):
        super().__init__()
        self.parser = parser


@functools.cache
def command_parser(module: str) -> argparse.ArgumentParser | None:
    """The argparse parser that ``python -m module`` builds, taken from its ``main()`` at the moment it would parse
    (nothing after that runs), or None when the module parses no arguments."""
    loaded = importlib.import_module(module)
    if "parse_args" not in Path(loaded.__file__).read_text():
        return None

    def found(self, *args, **kwargs):
        raise ParserFound(self)

    with mock.patch.object(argparse.ArgumentParser, "parse_args", found):
        try:
            loaded.main()
        except ParserFound as parsed:
            return parsed.parser
    raise AssertionError(f"{module}: main() returned without parsing its arguments")


class Refused(Exception):
    """Raised in place of a parser's ``error``: its message."""


def refuse(self, message, *args):
    raise Refused(message)


def parse_problem(parser: argparse.ArgumentParser, argv: list[str]) -> str | None:
    """What ``parser`` says when it refuses ``argv``, else None. Missing operands are no problem: a page may name a
    command (`dvc exp push`) without them."""
    with contextlib.ExitStack() as stack:
        for cls in {argparse.ArgumentParser, type(parser)}:  # DvcParser has its own error()
            stack.enter_context(mock.patch.object(cls, "error", refuse))
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                parser.parse_args(argv)
        except SystemExit:  # --help, --version: printed and exited, as asked
            return None
        except Refused as refused:
            message = str(refused)
            flags = message.split(":")[0].removeprefix("argument ").split("/")
            if message.startswith("the following arguments are required") or (
                    message.endswith("expected one argument") and argv[-1] in flags):
                return None  # `dvc exp push`, `dvc exp run -S`: the command or flag named, not given
            return message
    return None


def unknown_flags(parser: argparse.ArgumentParser, argv: list[str]) -> str | None:
    """The flags of an elided command (``--space … --report``) that its (sub)command's parser lacks, else None."""
    for word in argv:  # into the subcommand a word names: dvc exp run
        subcommands = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if subcommands and word in subcommands[0].choices:
            parser = subcommands[0].choices[word]
    unknown = [w.partition("=")[0] for w in argv if w.startswith("-") and len(w) > 1
               and w.partition("=")[0] not in parser._option_string_actions]
    return f"unknown flags {' '.join(unknown)}" if unknown else None


def params_key_problem(setting: str) -> str | None:
    """Why a `dvc exp run -S` value names no key of params.yaml (``train.lr=3e-5``, ``~data.files.test``), else
    None. A key under a mapping that is empty or null in params.yaml (``data.files``) may be any."""
    node: object = yaml.safe_load((ROOT / "params.yaml").read_text())
    key = setting.lstrip("~+").partition("=")[0]  # ~ removes a key, + adds one to a mapping
    for part in key.split("."):
        if node is None or node == {}:
            return None
        if not isinstance(node, dict) or part not in node:
            return f"-S {setting}: params.yaml has no {key}"
        node = node[part]
    return None


def command_problems(argv: list[str]) -> list[str]:
    """What is wrong with one command of the pages (``["python", "tools.tune", ...]`` or ``["dvc", ...]``). A shell
    variable (``$seed``) or a usage word in capitals (``--soak N``) stands for a value; a command with an elided part
    (``…``) is held to its flags only."""
    from dvc.cli.parser import get_main_parser

    if argv[0] == "unparsed":
        return ["not a shell line (an unclosed quote)"]
    elided = any(w in ("...", "…") for w in argv)
    args = [re.sub(r"^(\$\{?\w+\}?|[A-Z][A-Z_]*)$", "1", w) for w in argv if w not in ("...", "…")]
    if argv[0] == "dvc":
        parser, args, problems = get_main_parser(), args[1:], [
            params_key_problem(value) for flag, value in zip(argv, argv[1:])
            if flag in ("-S", "--set-param") and "PLACEHOLDER" not in value]
    else:
        module, args, problems = args[1], args[2:], []
        if "PLACEHOLDER" in module:  # python -m stages.<name>
            return []
        top = ROOT / module.split(".")[0]
        if not (top / "__init__.py").exists():  # pytest, pip: another project's module and flags
            return [] if importlib.util.find_spec(module.split(".")[0]) else [f"no module {module}"]
        if importlib.util.find_spec(module) is None:
            return [f"no module {module}"]
        parser = command_parser(module)
        if parser is None:
            return [f"{module} takes no arguments"] if args else []
    problems.append(unknown_flags(parser, args) if elided else parse_problem(parser, args))
    return [p for p in problems if p]
