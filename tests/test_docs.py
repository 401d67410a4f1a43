"""The docs stay true to the repository: docs/results.md's committed-run block is what metrics/*.json give
(tools/results_block.py), every relative link of the guides points to a file that exists (and, into a .md file, to a
heading that exists), and no guide cites the history (issue numbers) or a git tag the repository does not have. Fast:
text only, no model, no subprocess."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tools import results_block

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted({*ROOT.glob("README.md"), *ROOT.glob("docs/*.md"), *ROOT.glob("benchmarks/*.md"),
                *ROOT.glob("configs/**/README.md"), *ROOT.glob("metrics/**/README.md")})
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^\s*(```|~~~)")


def prose(text: str) -> list[str]:
    """The page's lines outside fenced code blocks, with inline code spans blanked."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        lines.append("" if fenced else re.sub(r"`[^`]*`", "``", line))
    return lines


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
