"""The docs stay true to the repository: docs/results.md's committed-run block and every quote of a JSON file are
what the committed files give (tools/results_block.py); every `python -m` and `dvc` command of the pages names a
module that exists and flags its parser accepts, and `-S` only keys of params.yaml; the guides hold no measurement
(docs/results.md and the files hold them); every relative link points to a file that exists (and, into a .md file,
to a heading that exists); and no guide cites the history (issue numbers) or a git tag the repository does not have.
Fast: text, `git show` and argument parsers only (each command's module imported, its `main()` stopped where it
would parse), no model."""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import importlib.util
import json
import re
import shlex
from pathlib import Path
from unittest import mock

import pytest
import yaml

from tests.helpers import FAMILIES
from tools import results_block

ROOT = Path(__file__).resolve().parents[1]
PAGES = results_block.pages()
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^\s*(```|~~~)")
SHELL_FENCE = re.compile(r"^\s*(```|~~~)\s*(bash|sh|shell|console)?\s*$")  # an opening fence of shell lines
# A guide (README.md, docs/, benchmarks/README.md) says how; its measurements are in docs/results.md and the files
# under metrics/ and benchmarks/, linked or quoted (tools/results_block.py). docs/serving.md is exempt while it is
# rewritten with the serving code.
MEASURED = {"docs/results.md", "docs/serving.md"}
MEASUREMENT = re.compile(r"±\s?\d|\b\d{1,3}\.\d{4,}\b|\b\d+(\.\d+)?\s?(ms|s|min|minutes|seconds|hours)\b|"
                         r"\b\d+\.\d+\s?(x|times)\b")


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


def page_commands() -> list[tuple[str, list[str]]]:
    """Every `python -m` and `dvc` command of the pages, with its page."""
    return [(str(page.relative_to(ROOT)), argv) for page in PAGES
            for line in code_spans(page.read_text()) for argv in commands(line)]


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
            parser.parse_args(argv)
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


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"`([^`]*)`", r"\1", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """The anchors of a Markdown file's headings (a repeated heading gets -1, -2, ... as on GitHub)."""
    seen: dict[str, int] = {}
    found = set()
    fenced = False
    for line in page.read_text().splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced and (m := re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)):
            base = slug(m.group(1))
            found.add(f"{base}-{seen[base]}" if base in seen else base)
            seen[base] = seen.get(base, 0) + 1
    return found


def test_commands_are_found_in_fences_loops_and_wrapped_spans():
    page = ("Run `dvc exp run -n a\n-S train.lr=1e-4` then:\n\n```bash\nfor s in 1 2; do dvc exp run -S train.seed=$s; "
            "done && python -m tools.summarize --match 'a-*'   # note\nX=1 .venv/bin/python -m tools.recipe rte \\\n"
            "  --run\n```\n\n```yaml\ndvc: not a command\n```\n")
    assert [c for line in code_spans(page) for c in commands(line)] == [
        ["dvc", "exp", "run", "-n", "a", "-S", "train.lr=1e-4"], ["dvc", "exp", "run", "-S", "train.seed=$s"],
        ["python", "tools.summarize", "--match", "a-*"], ["python", "tools.recipe", "rte", "--run"]]
    assert commands("dvc metrics diff main <experiment> && python -m benchmarks.load [--form FORM] …") == [
        ["dvc", "metrics", "diff", "main", "PLACEHOLDER"], ["python", "benchmarks.load", "--form", "FORM", "…"]]


def test_a_wrong_command_is_named():
    assert command_problems(["python", "tools.summarize", "--match", "a", "--nope"]) == [
        "unrecognized arguments: --nope"]
    assert command_problems(["python", "tools.summarize", "--match", "a", "--num", "0"]) == [
        "argument --num: must be at least 1, got 0"]
    assert command_problems(["python", "tools.tune", "--space", "…", "--reports"]) == ["unknown flags --reports"]
    assert command_problems(["python", "tools.nothing"]) == ["no module tools.nothing"]
    assert command_problems(["dvc", "exp", "run", "-S", "train.learning_rate=1"]) == [
        "-S train.learning_rate=1: params.yaml has no train.learning_rate"]
    assert command_problems(["dvc", "exp", "run", "--queues"]) and not command_problems(
        ["dvc", "exp", "run", "-S", "~data.files.test", "-S", "train.scheduler_kwargs.num_cycles=2"])


def test_every_command_of_the_pages_runs_as_written():
    # The module exists and its own parser takes the flags; -S keys are params.yaml's. Files need not exist.
    found = page_commands()
    assert {argv[1] for _, argv in found} >= {"tools.predict", "tools.serve", "tools.tune", "exp"}
    wrong = [f"{page}: {shlex.join(argv)}: {problem}" for page, argv in found for problem in command_problems(argv)]
    assert not wrong, "\n".join(wrong)


def test_a_quote_is_rewritten_from_its_file_with_the_pages_decimals():
    page = ROOT / "docs" / "page.md"  # not written: quotes() reads the files the links name
    evaluation = json.loads((ROOT / "metrics/eval.json").read_text())
    text = ('F1 [0.1](../metrics/eval.json "/validation/f1"), [1,000](../metrics/train.json "/parameters"), '
            '[0](../metrics/eval.json "/validation/nothing"), [0](../metrics/none.json "/a")')
    rewritten, problems = results_block.quotes(page, text)
    parameters = json.loads((ROOT / "metrics/train.json").read_text())["parameters"]
    assert rewritten.startswith(f'F1 [{evaluation["validation"]["f1"]:.1f}](../metrics/eval.json "/validation/f1"), '
                                f'[{parameters:,}](../metrics/train.json "/parameters")')
    assert problems == [
        'docs/page.md: [0](../metrics/eval.json "/validation/nothing"): metrics/eval.json has no /validation/nothing',
        'docs/page.md: [0](../metrics/none.json "/a"): no file metrics/none.json']


def test_quotes_of_files_are_what_the_committed_files_give():
    # Like the block: against the committed files, so that a `dvc repro` in the workspace breaks nothing.
    rev = "HEAD" if results_block.read("params.yaml", "HEAD") is not None else None
    stale = results_block.stale_quotes(rev)
    assert not stale, "\n".join(stale) + "\nrun `python -m tools.results_block` and commit the pages"


FAMILY_LIST = re.compile(r"encoder families that work \(`model_type`.*?\): ((?:`[^`]+`,?\s*)+)", re.S)


@pytest.mark.parametrize("page", ["README.md", "docs/any-task.md"])
def test_the_families_that_work_are_those_the_tests_cover(page):
    # tests/helpers.py FAMILIES: each is trained, evaluated, reused (tests/test_families.py) and exported
    # (tests/test_export.py); a page names exactly those model types, in that order
    listed = FAMILY_LIST.search((ROOT / page).read_text())
    assert listed, f"{page}: no sentence 'encoder families that work (`model_type`...): `bert`, ...'"
    assert re.findall(r"`([^`]+)`", listed[1]) == list(FAMILIES), f"{page}: list tests/helpers.py FAMILIES' keys"


@pytest.mark.parametrize("page", [p for p in PAGES if p.name == "README.md" and p.parent in (ROOT, ROOT / "benchmarks")
                                  or p.parent.name == "docs" and str(p.relative_to(ROOT)) not in MEASURED],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_guides_link_to_measurements_instead_of_copying_them(page: Path):
    text = results_block.QUOTE.sub("QUOTED", page.read_text())
    copied = [f"line {n}: {line.strip()}" for n, line in enumerate(prose(text), 1) if MEASUREMENT.search(line)]
    assert not copied, (f"{page.relative_to(ROOT)} states measurements: link to docs/results.md, or quote the file "
                        "(tools/results_block.py)\n" + "\n".join(copied))


def test_pages_found():
    assert ROOT / "README.md" in PAGES and ROOT / "docs" / "results.md" in PAGES
    assert any("metrics" in p.parts for p in PAGES) and any("configs" in p.parts for p in PAGES)


def test_results_block_is_what_the_committed_metrics_give():
    # The committed page against the committed metrics: a `dvc repro` in the workspace rewrites the timings of
    # metrics/*.json without making the repository's page wrong.
    text = results_block.read("docs/results.md", "HEAD")
    if text is None:  # not a git checkout: the working tree is what there is
        assert results_block.main(["--check"]) == 0
        return
    start, end = results_block.current(text)
    assert text[start:end] == results_block.block("HEAD"), \
        "run `python -m tools.results_block` after committing new metrics, and commit docs/results.md"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page: Path):
    broken = []
    for number, line in enumerate(prose(page.read_text()), 1):
        for target in LINK.findall(line):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            if not file.exists():
                broken.append(f"line {number}: {target}: no such file")
            elif anchor and file.suffix == ".md" and anchor not in anchors(file):
                broken.append(f"line {number}: {target}: no heading with that anchor in {file.relative_to(ROOT)}")
    assert not broken, f"{page.relative_to(ROOT)}:\n" + "\n".join(broken)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_history_in_the_guides(page: Path):
    text = page.read_text()
    assert not re.findall(r"[Ii]ssue \d+", text), "the guides say what is, not which issue did it"
    assert "lab-2026-11" not in text, "no such tag: cite the commit that last had the code"
