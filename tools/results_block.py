"""Regenerate every number of the pages that comes from a file: each quote (``tools/quotes.py``) and each generated
block (``tools/generated.py``) of README.md, docs/, benchmarks/README.md and the folders' READMEs, from the committed
result files, so that no page drifts from them. docs/numbers.md says how a page quotes a file.

    python -m tools.results_block           # rewrite every quote and generated block from the files
    python -m tools.results_block --check   # exit 1, naming each, on a stale quote or block, one that names nothing,
                                            # or a number typed by hand (tools/typed_numbers.py)

Commit new result files first: a generated table names the commit that last changed its file. Paths are from the
repository root, whatever the working directory.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from finetune.runtime import write_text
from tools import quotes as quoting
from tools.generated import blocks, stale_blocks
from tools.quotes import ROOT, named
from tools.typed_numbers import typed

# The pages: the guides, the benchmarks' README and the READMEs of the folders. Not the files a command writes
# (benchmarks/SERVE.md, metrics/sweeps/*.md, metrics/search/*/trials.md): those are results, quoted by the pages.
PAGE_GLOBS = ["README.md", "docs/*.md", "benchmarks/README.md", "configs/**/README.md", "metrics/**/README.md",
              "data/own/README.md", "models/own/README.md"]
# The reports the benchmarks write, with the command that writes each (named on the report's first lines): results,
# like metrics/*.json, whose numbers the pages quote.
REPORTS = {"benchmarks/RESULTS.md": "benchmarks.benchmark", "benchmarks/ABLATION.md": "benchmarks.benchmark",
           "benchmarks/CHECKPOINTS.md": "benchmarks.benchmark", "benchmarks/SCALE.md": "benchmarks.scale",
           "benchmarks/SERVE.md": "benchmarks.serve", "benchmarks/SERVE-LOAD.md": "benchmarks.load",
           "benchmarks/SERVE-LOAD-MPNET.md": "benchmarks.load", "benchmarks/SERVE-LOAD-GPU.md": "benchmarks.load"}


def pages() -> list[Path]:
    """The pages (``PAGE_GLOBS``)."""
    return sorted({page for pattern in PAGE_GLOBS for page in ROOT.glob(pattern)})


def regenerate(page: Path, text: str, rev: str | None = None) -> tuple[str, list[str]]:
    """``text`` (of ``page``) with its generated blocks and quotes rewritten from the files, and what could not be."""
    text, problems = blocks(page, text, rev)
    text, more = quoting.quotes(page, text, rev)
    return text, problems + more


def stale(rev: str | None = None) -> list[str]:
    """Every quote and generated block of the pages that differs from its files (the working tree's, or git revision
    ``rev``'s) or names nothing, and every number typed by hand: one line each."""
    lines = []
    for page in pages():
        text = page.read_text()
        lines += stale_blocks(page, text, rev) + quoting.stale_quotes(page, text, rev)
        name = named(page)
        lines += [f"{name}:{n}: {words!r} typed by hand: quote its file, generate it, or write it as code"
                  for n, words in typed(text, name)]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1, naming each, when a quote or "
                        "generated block differs from its file or names nothing, or a number is typed by hand")
    args = parser.parse_args(argv)
    if args.check:
        found = stale()
        if found:
            print("\n".join(found + ["run `python -m tools.results_block`"]), file=sys.stderr)
        return 1 if found else 0
    failed = False
    for page in pages():
        old = page.read_text()
        new, problems = regenerate(page, old)
        for line in problems:
            print(line, file=sys.stderr)
        failed = failed or bool(problems)
        if new != old:
            write_text(page, new)
            print(f"{named(page)}: rewritten")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
