"""A Markdown report comparing a run with a base revision: params diff, metrics diff and the key plots as PNG.

Not a pipeline stage: a command for pull requests and reviews, e.g.

    python -m tools.report                          # the workspace against main
    python -m tools.report --rev lr-3e-5 --base main  # an experiment (by name), a branch or a commit

It writes ``<out>/report.md`` and ``<out>/plots/<plot id>.png``. The tables come from ``dvc params diff --md``
and ``dvc metrics diff --md``; the plots from ``dvc plots diff --json`` (the Vega-Lite specs that
``dvc plots show`` draws, data included), rendered to PNG with vl-convert (no browser needed).
"""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
from pathlib import Path

import vl_convert

from finetune.errors import PipelineError
from finetune.runtime import run_stage, write_text

log = logging.getLogger(__name__)

WORKSPACE = "workspace"
# Plot ids of dvc.yaml shown in the report, in order.
# Plot ids of dvc.yaml, or a folder plot's prefix (one plot per validation metric of the task). A plot the task does not
# have (a confusion matrix for regression, a scatter for classification) is left out.
KEY_PLOTS = ["train_loss_by_step", "dvclive/train/epochs/plots/metrics/validation/", "validation_confusion_matrix",
             "predicted_against_gold"]


class ReportError(PipelineError):
    """A dvc command failed (e.g. an unknown revision); the message holds the command and DVC's error."""


def dvc(*args: str) -> str:
    """Run ``dvc <args>`` with this interpreter's DVC and return its stdout.

    Raises:
        ReportError: with the command and DVC's error output.
    """
    result = subprocess.run([sys.executable, "-m", "dvc", *args], capture_output=True, text=True)
    if result.returncode != 0:
        raise ReportError(f"dvc {' '.join(args)} failed: {result.stderr.strip() or result.stdout.strip()}")
    return result.stdout


def check_repository() -> None:
    """Check that the working directory is in a git repository with at least one commit (the revisions compared).

    Raises:
        ReportError: naming the working directory and what to do.
    """
    head = subprocess.run(["git", "rev-parse", "--verify", "--quiet", "HEAD"], capture_output=True, text=True)
    if head.returncode != 0:
        raise ReportError(f"{Path.cwd()}: not a git repository with a commit; tools.report compares revisions: run "
                          "it in the project's repository (git init, git commit first)")


def render_plots(revs: list[str], out_dir: Path, plot_ids: list[str]) -> dict[str, Path]:
    """Render ``plot_ids`` (ids, or prefixes ending in '/') of ``dvc plots diff <revs>`` to ``out_dir/<name>.png``
    (the id with '/' as '_'); return {id: path} of those found."""
    shown = json.loads(dvc("plots", "diff", *revs, "--json"))
    if "data" not in shown:
        raise ReportError(f"dvc plots diff {' '.join(revs)} --json gave no plots: {shown.get('errors') or shown}")
    specs = shown["data"]
    out_dir.mkdir(parents=True, exist_ok=True)
    images = {}
    for key in plot_ids:
        found = [i for i in specs if specs[i] and (i == key or key.endswith("/") and i.startswith(key))]
        if not found:
            log.warning("Plot %s: no data in %s, left out", key, " or ".join(revs))
        for plot_id in found:
            path = out_dir / f"{Path(plot_id).stem if key.endswith('/') else plot_id}.png"
            path.write_bytes(vl_convert.vegalite_to_png(specs[plot_id][0]["content"], scale=1.5))
            images[plot_id] = path
    return images


def write_report(base: str = "main", rev: str = WORKSPACE, out_dir: Path = Path("report")) -> Path:
    """Write ``out_dir/report.md`` comparing ``rev`` (workspace, git revision or experiment name) with ``base``.

    Returns:
        The Markdown file's path.

    Raises:
        ReportError: not in a git repository with a commit, or a dvc command failed, e.g. on a revision that is
            neither in git nor an experiment.
    """
    check_repository()
    revs = [base] + ([] if rev == WORKSPACE else [rev])  # DVC resolves branches, commits and experiment names
    params = _rows_or(dvc("params", "diff", *revs, "--md"), "No params changed.")
    metrics = _rows_or(dvc("metrics", "diff", *revs, "--md", "--precision", "4"), "No metrics changed.")
    images = render_plots(revs, out_dir / "plots", KEY_PLOTS)

    lines = [f"# Fine-tuning: `{rev}` compared with `{base}`", "",
             "## Params", "", params, "", "## Metrics", "", metrics, "", "## Plots", ""]
    for plot_id, path in images.items():
        title = f"validation {path.stem} by epoch" if plot_id.endswith(".tsv") else plot_id.replace("_", " ")
        lines += [f"### {title.capitalize()}", "", f"![{plot_id}]({path.relative_to(out_dir)})", ""]
    rev_option = "" if rev == WORKSPACE else f" --rev {rev}"
    lines += [f"Regenerate: `python -m tools.report --base {base}{rev_option}`", ""]
    report = out_dir / "report.md"
    write_text(report, "\n".join(lines))
    log.info("Wrote %s (%d plots)", report, len(images))
    return report


def _rows_or(table: str, nothing: str) -> str:
    """A Markdown table from ``dvc ... diff --md``, or ``nothing`` when it has no rows (DVC prints the header alone
    or nothing at all)."""
    return table.strip() if len(table.strip().splitlines()) > 2 else nothing


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", default="main", help="revision to compare with (default: main)")
    parser.add_argument("--rev", default=WORKSPACE, help="workspace (default), a git revision or an experiment name")
    parser.add_argument("--out", type=Path, default=Path("report"), help="output folder (default: report/)")
    args = parser.parse_args(argv)
    if args.out.exists() and not args.out.is_dir():
        parser.error(f"--out {args.out}: is a file; name a folder")
    write_report(args.base, args.rev, args.out)


if __name__ == "__main__":
    run_stage(main)
