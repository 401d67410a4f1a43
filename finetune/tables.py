"""The one Markdown-table writer of the reports (sweep summaries, benchmark results, ablation)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def markdown_table(header: list[str], rows: Iterable[Iterable[Any]]) -> str:
    """A GitHub-flavoured Markdown table: the header, a separator, one line per row; cells are ``str()``-ed.

    Raises:
        ValueError: a row has another number of cells than the header.
    """
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        cells = [str(cell) for cell in row]
        if len(cells) != len(header):
            raise ValueError(f"a table row has {len(cells)} cells, the header {len(header)}: {cells}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
