"""Render every plot that dvc.yaml declares, for the workspace, into one PNG grid.

Not a pipeline stage: a command to look at a run's plots without a browser, e.g. after a real run of the pipeline

    python -m tools.plots_png                       # dvc_plots/plots.png, beside dvc plots show's HTML

The plots come from ``dvc plots show --json`` (the Vega-Lite specs that ``dvc plots show`` draws, data included),
each rendered to SVG with vl-convert, laid out in a grid and rasterised to PNG: no browser needed.
"""

from __future__ import annotations

import argparse
import json
import logging
import xml.etree.ElementTree as ET
from pathlib import Path

import vl_convert

from finetune.errors import PipelineError
from finetune.runtime import run_stage, unwritable, write_bytes
from tools.cli import positive_float, positive_int
from tools.report import dvc

log = logging.getLogger(__name__)


def svg_size(svg: str) -> tuple[float, float]:
    """The width and height of an SVG in user units: its root's ``width`` and ``height`` (``px`` or none), else its
    ``viewBox``'s."""
    root = ET.fromstring(svg)
    if root.get("width") and root.get("height"):
        return float(root.get("width").removesuffix("px")), float(root.get("height").removesuffix("px"))
    _, _, width, height = map(float, root.get("viewBox").replace(",", " ").split())
    return width, height


def grid_svg(svgs: list[str], columns: int, gap: float = 16) -> str:
    """One SVG holding ``svgs`` (at least one) in rows of ``columns`` (at most as many as plots), each cell as wide as
    the widest plot of its column."""
    columns = min(columns, len(svgs))
    sizes = [svg_size(s) for s in svgs]
    widths = [max(w for w, _ in sizes[c::columns]) for c in range(columns)]
    cells, y = [], 0.0
    for row in range(0, len(svgs), columns):
        x = 0.0
        for c, svg in enumerate(svgs[row:row + columns]):
            cells.append(f'<g transform="translate({x},{y})">{svg}</g>')
            x += widths[c] + gap
        y += max(h for _, h in sizes[row:row + columns]) + gap
    width = sum(widths) + gap * (columns - 1)
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{y - gap}">'
            f'<rect width="100%" height="100%" fill="white"/>{"".join(cells)}</svg>')


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("dvc_plots/plots.png"), help="the PNG to write")
    parser.add_argument("--columns", type=positive_int, default=2)
    parser.add_argument("--scale", type=positive_float, default=1.0, help="pixels per SVG unit")
    args = parser.parse_args(argv)
    if reason := unwritable(args.out):
        raise PipelineError(f"--out {args.out}: {reason}")
    plots = json.loads(dvc("plots", "show", "--json")).get("data") or {}
    svgs = [vl_convert.vegalite_to_svg(entries[0]["content"]) for entries in plots.values() if entries]
    if not svgs:
        raise PipelineError(f"dvc plots show: no plot has data in the workspace (run the pipeline first); {args.out} "
                            "is left as it is")
    write_bytes(args.out, vl_convert.svg_to_png(grid_svg(svgs, args.columns), scale=args.scale))
    log.info("Wrote %s: %d plots (%s)", args.out, len(svgs), ", ".join(plots))


if __name__ == "__main__":
    run_stage(main)
