"""The docs stay true to the repository: every `python -m` and `dvc` command of the pages, of the benchmarks' reports,
of the module docstrings and of the `--help` texts of tools/ and benchmarks/ names a module that exists and flags its
parser accepts, and `-S` only keys of params.yaml; a guide that queues experiments waits for them before it reads
them; every relative link points to a file that exists (and, into a .md file, to a heading that exists); and no guide
cites the history (issue numbers) or a git tag the repository does not have. The numbers: tests/test_doc_numbers.py.
Fast: text and argument parsers only (each command's module imported, its `main()` stopped where it would parse), no
model."""

from __future__ import annotations

import importlib
import re
import shlex
from pathlib import Path

import pytest

from tests.doc_commands import (
    FENCE,
    LINK,
    MODULES,
    PAGES,
    READERS,
    REPORTS,
    ROOT,
    code_spans,
    command_problems,
    commands,
    docstring_lines,
    help_lines,
    help_text,
    page_commands,
    prose,
    texts,
)
from tests.helpers import FAMILIES
from tools import results_block


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


def test_commands_of_docstrings_and_help_texts_are_found():
    found = {where for where, _ in page_commands()}
    assert {"tools/summarize.py (docstring)", "tools/recipe.py (--help)", "benchmarks/load.py (docstring)",
            "benchmarks/SERVE-LOAD.md"} <= found
    assert docstring_lines("Run\n\n    dvc exp run -S a=1 \\\n        -S b=2   # note\n\nthen ``dvc exp show``.") == [
        "dvc exp run -S a=1 -S b=2   # note", "dvc exp show"]
    assert help_lines("--queue  dvc exp run --queue (then: dvc exp run --run-all), or `dvc exp show`") == [
        "dvc exp show", "dvc exp run --queue", "dvc exp run --run-all"]


def test_the_recipe_help_names_every_recipe():
    listed = help_text(ROOT / "tools" / "recipe.py")
    assert all(recipe.stem in listed for recipe in (ROOT / "configs" / "tasks").glob("*.yaml"))


def unwaited(argvs: list[list[str]]) -> list[str]:
    """The commands that read experiments after ``dvc queue start`` (which returns at once) with nothing between that
    waits for the queue (``dvc exp run --run-all``) or watches it (``dvc queue status``)."""
    wrong, started = [], False
    for argv in argvs:
        line = shlex.join(argv).removeprefix("python ")
        if line.startswith("dvc queue start"):
            started = True
        elif line.startswith(("dvc queue status", "dvc exp run --run-all")) or "--run-all" in argv:
            started = False
        elif started and line.startswith(READERS):
            wrong.append(line)
    return wrong


def test_a_guide_waits_for_the_experiments_it_queued_before_it_reads_them():
    assert unwaited([["dvc", "queue", "start"], ["python", "tools.summarize", "--match", "a"]]) == [
        "tools.summarize --match a"]
    assert not unwaited([["dvc", "queue", "start"], ["dvc", "queue", "status"], ["dvc", "exp", "show"]])
    wrong = [f"{where}: {line}" for where, lines in texts()
             for line in unwaited([argv for text in lines for argv in commands(text)])]
    assert not wrong, "`dvc queue start` returns at once: wait with `dvc exp run --run-all`\n" + "\n".join(wrong)


@pytest.mark.parametrize("report", REPORTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_a_report_names_the_command_that_wrote_it(report: Path):
    # A benchmark's report is a result file, quoted by the pages: its first lines say which command wrote it.
    head = "\n".join(report.read_text().splitlines()[:5])
    assert f"python -m {results_block.REPORTS[str(report.relative_to(ROOT))]}" in head


def test_pages_found():
    assert ROOT / "README.md" in PAGES and ROOT / "docs" / "results.md" in PAGES
    assert any("metrics" in p.parts for p in PAGES) and any("configs" in p.parts for p in PAGES)
    assert all(report.exists() for report in REPORTS)


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


HISTORY = re.compile(r"\b[Ii]ssue \d+|\blent\b|\bthis session\b|lab-2026-11")
DOCUMENTED = PAGES + REPORTS + MODULES + [ROOT / "dvc.yaml", ROOT / "params.yaml"]  # pages, reports, code and comments
YAMLS = sorted((ROOT / "configs").rglob("*.yaml"))
CONFIGS = YAMLS + sorted((ROOT / "finetune").rglob("*.py")) + sorted((ROOT / "stages").glob("*.py"))  # name code too
NAMED_PATH = re.compile(r"(?<![\w/.<-])((?:stages|finetune|tools|benchmarks|tests|configs|metrics|docs)/[\w./-]*\w)")


@pytest.mark.parametrize("page", DOCUMENTED, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_history_in_the_docs(page: Path):
    # What is, not which issue, session or lent machine made it; and no git tag the repository does not have.
    found = [f"line {n}: {m.group(0)}" for n, line in enumerate(page.read_text().splitlines(), 1)
             for m in HISTORY.finditer(line)]
    assert not found, f"{page.relative_to(ROOT)}: history, not what is:\n" + "\n".join(found)


def resolves(name: str) -> bool:
    """Whether a dotted name of the project (``finetune.launch.launch_if_distributed``) is a module or an attribute of
    one."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:end]))
        except ImportError:
            continue
        for attribute in parts[end:]:
            if not hasattr(found, attribute):
                return False
            found = getattr(found, attribute)
        return True
    return False


@pytest.mark.parametrize("page", [p for p in DOCUMENTED + YAMLS if p not in REPORTS],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_every_dotted_name_of_the_project_exists(page: Path):
    # Not the reports: each names the code as it was when its command ran.
    names = set(re.findall(r"(?<![\w./-])((?:finetune|tools|benchmarks|stages)(?:\.[A-Za-z_]\w*)+)", page.read_text()))
    assert not [n for n in sorted(names) if not resolves(n)], f"{page.relative_to(ROOT)} names what does not exist"




@pytest.mark.parametrize("page", DOCUMENTED + CONFIGS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_path_named_exists(page: Path):
    # finetune/ and stages/ too. A paragraph that names a commit may name the files that commit had; one that says a
    # command writes a file may name the file before it exists.
    missing = [path for paragraph in re.split(r"\n\s*\n", page.read_text())
               if not re.search(r"\b[0-9a-f]{7}\b|[Ww]rites", paragraph)
               for path in NAMED_PATH.findall(paragraph)
               if not (ROOT / path).exists() and not (page.parent / path).exists()]
    assert not missing, f"{page.relative_to(ROOT)} names files that do not exist: {sorted(set(missing))}"


FAMILY_LIST = re.compile(r"encoder families that work \(`model_type`.*?\): ((?:`[^`]+`,?\s*)+)", re.S)


@pytest.mark.parametrize("page", ["README.md", "docs/any-task.md"])
def test_the_families_that_work_are_those_the_tests_cover(page):
    # tests/helpers.py FAMILIES: each is trained, evaluated, reused (tests/test_families.py) and exported
    # (tests/test_export.py); a page names exactly those model types, in that order
    listed = FAMILY_LIST.search((ROOT / page).read_text())
    assert listed, f"{page}: no sentence 'encoder families that work (`model_type`...): `bert`, ...'"
    assert re.findall(r"`([^`]+)`", listed[1]) == list(FAMILIES), f"{page}: list tests/helpers.py FAMILIES' keys"
