"""Generated blocks: the parts of a page written from committed result files, between markers that name the
generator and its files (paths relative to the page)::

    <!-- generated: sweep ../metrics/sweeps/issue14-test.json -->
    (the table, rewritten by `python -m tools.results_block`)
    <!-- end generated -->

A block whose opening marker ends its line is a block of lines; one inside a sentence is inline. Every table says
where it comes from: the command, the CPU and the precision as the file records them (or that the file does not
record them), and the date and commit that last changed the file (``git log``).

Generators (``GENERATORS``):

- ``committed-run``: the committed run (metrics/*.json and DVCLive's per-epoch validation log);
- ``sweep FILE``: a ``tools.summarize`` JSON, one row per configuration (mean ± std over its seeds);
- ``runs FOLDER …``: run folders (params.yaml, train.json, eval.json; ``metrics``: the committed run), one row each;
- ``seeds FILE``: JSON Lines of runs named ``<configuration>-<seed>``, one row per configuration (mean ± std);
- ``export FILE``: an export stage's export.json, one row per form, and the fastest at parity;
- ``flagged FILE``: inline, the forms of an export.json flagged as losing more than ``export.max_metric_drop``;
- ``best-at-parity FILE``: a ``benchmarks.serve`` report's best way at parity per model, at batch 1 and 32;
- ``exp-run FILE N``: the ``dvc exp run`` that sets the params of configuration N of a ``tools.summarize`` JSON, as a
  bash block (``tests/test_docs.py`` runs its flags through DVC's parser and checks its keys against params.yaml).
"""

from __future__ import annotations

import math
import re
import statistics
import subprocess
from pathlib import Path

from tools.quotes import ROOT, QuoteError, data, named, read, relative, tables

BLOCK = re.compile(r"<!-- generated: ([\w-]+)((?: [^\s>]+)*) -->(.*?)<!-- end generated -->", re.S)
EPOCH_LOG = "dvclive/train/epochs/plots/metrics/validation/{metric}.tsv"  # DVCLive's per-epoch validation metric
COMMITTED = ["metrics/train.json", "metrics/eval.json", "metrics/export.json", "metrics/provenance.json"]
NOT_METRICS = {"loss", "examples", "baseline", "most_predicted", "collapsed", "agreement", "max_abs_logit_diff"}


def metric(value: float) -> str:
    """A metric as the pages print it: four decimals."""
    return f"{value:.4f}"


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    """A Markdown table."""
    def line(cells: list[str]) -> str:
        return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"
    return [line(header), "|" + "---|" * len(header)] + [line(r) for r in rows]


def committed(*names: str, rev: str | None = None) -> str:
    """When and in which commit the files or folders ``names`` last changed (``committed 2026-11-28 in 1a72c39``), as
    of git revision ``rev`` (HEAD when None).

    Raises:
        QuoteError: ``rev`` is None (the working tree) and one of ``names`` has changes not committed, so no commit
            holds it.
    """
    if rev is None and (dirty := subprocess.run(["git", "status", "--porcelain", "--", *names], cwd=ROOT,
                                                capture_output=True, text=True).stdout.strip()):
        raise QuoteError(f"{dirty.split()[-1]} has changes not committed: commit the result files first, then rerun")
    log = subprocess.run(["git", "-c", "core.abbrev=7", "log", "-1", "--format=%cs in %h", rev or "HEAD", "--",
                          *names], cwd=ROOT, capture_output=True, text=True)
    return f"committed {log.stdout.strip()}" if log.returncode == 0 and log.stdout.strip() else "not committed"


def source(name: str, command: str, machine: str | None, rev: str | None = None) -> str:
    """The line above a table: its file, command, machine and commit."""
    where = f"on `{machine}`" if machine else "the file records no CPU"
    return f"`{name}`: `{command}`, {where}; {committed(name, rev=rev)}."


def precision(mixed_precision: str | None) -> str | None:
    """``train.mixed_precision`` as a precision's name: ``no`` is fp32."""
    return "fp32" if mixed_precision == "no" else mixed_precision


def metric_names(split: dict) -> list[str]:
    """The task's metrics in a split's results, in the file's order."""
    return [k for k, v in split.items() if k not in NOT_METRICS and isinstance(v, (int, float))]


def by_epoch(name: str, rev: str | None = None) -> str | None:
    """The validation metric ``name`` after each epoch, from DVCLive's log (``0.7974 → 0.8597``), or None."""
    text = read(EPOCH_LOG.format(metric=name), rev)
    values = [line.split("\t")[-1] for line in (text or "").splitlines()[1:] if line.strip()]
    return " → ".join(metric(float(v)) for v in values) or None


def committed_run(page: Path, args: list[str], rev: str | None = None) -> str:
    """What the committed run trained, where, how long and how well, and its served forms."""
    train, evaluation = data("metrics/train.json", rev), data("metrics/eval.json", rev)
    provenance, export = data("metrics/provenance.json", rev), data("metrics/export.json", rev)
    checkpoint, dataset, numerics = provenance["checkpoint"], provenance["dataset"], train.get("numerics", {})
    best = next(k for k in train if k.startswith("best_validation_"))
    name = best.removeprefix("best_validation_")
    collapse = train.get("collapse", {})
    epochs = ", ".join(str(e) for e in collapse.get("collapsed_epochs", [])) or "none"
    lines = [
        f"`dvc repro` of `params.yaml`: {', '.join(f'`{n}`' for n in COMMITTED)} {committed(*COMMITTED, rev=rev)}.",
        "",
        f"- **Checkpoint** `{checkpoint['requested']}` ({checkpoint['model_type']}, from {checkpoint['location']}); "
        f"**data** `{dataset['requested']}` `{dataset['config']}` (from {dataset['location']}).",
        f"- **Machine and precision** {precision(train['mixed_precision'])} on `{train['device']}` "
        f"({numerics.get('vendor')} family {numerics.get('family')} model {numerics.get('model_number')}; "
        f"matmul {numerics.get('matmul')}; "
        f"vector kernels {numerics.get('vector_kernels')}; torch {numerics.get('torch')}).",
        f"- **Training** {train['steps']} optimizer steps, {train['epochs']} epochs, best epoch {train['best_epoch']} "
        f"(validation {name} {metric(train[best])}); {train['train_seconds']} s of training "
        f"({train['samples_per_second']} samples/s), peak RSS {train['peak_memory_mb']} MB, {train['parameters']:,} "
        f"parameters. Validation {name} by epoch {by_epoch(name, rev)}. Epochs flagged collapsed: {epochs}; the kept "
        f"model collapsed: {'yes' if collapse.get('kept_model_collapsed') else 'no'}.",
        "",
    ]
    names = metric_names(next(iter(evaluation.values())))
    rows = [[split, r.get("examples", ""), metric(r["loss"]), *(metric(r[n]) for n in names),
             f"{r['baseline'].get('class', '')}: " + " / ".join(metric(r["baseline"][n]) for n in names),
             "yes" if r.get("collapsed") else "no"] for split, r in evaluation.items()]
    lines += table(["split (`metrics/eval.json`)", "rows", "loss", *names, "constant model: " + " / ".join(names),
                    "collapsed"], rows)
    return "\n".join(lines + ["", export_lines("metrics/export.json", export)])


def export_lines(name: str, export: dict) -> str:
    """One row per form of an export.json: parity on each split, size, speed, flags; then the fastest at parity."""
    forms = {k: v for k, v in export.items() if k != "fastest_at_parity"}
    splits = list(dict.fromkeys(s for r in forms.values() for s, v in r.items() if isinstance(v, dict)
                                and s != "speed"))
    names = metric_names(next(r[splits[0]] for r in forms.values() if splits[0] in r))
    rows = []
    for form, r in forms.items():
        if "skipped" in r:
            rows.append([form] + [""] * (len(splits) + 5) + [f"skipped: {r['skipped']}"])
            continue
        speed = r.get("speed", {})
        rows.append([form, *(" / ".join(metric(r[s][n]) for n in names) if s in r else "" for s in splits),
                     " / ".join(str(r[s].get("agreement", "—")) for s in splits if s in r),
                     " / ".join(str(r[s].get("max_abs_logit_diff", "—")) for s in splits if s in r),
                     r.get("size_mb", ""), speed.get("batch_1_p50_ms", "not timed"),
                     speed.get("batch_32_rows_per_s", "not timed"), "; ".join(r.get("warning", []))])
    lines = table([f"form (`{name}`)", *(f"{s} {' / '.join(names)}" for s in splits), "agreement with pytorch",
                   "largest logit diff", "size MB", "batch 1 p50 ms", "batch 32 rows/s", "flagged"], rows)
    if fastest := export.get("fastest_at_parity"):
        lines += ["", f"Fastest at parity on `{fastest.get('machine')}`: batch 1 **{fastest.get('batch_1')}**, "
                      f"batch 32 **{fastest.get('batch_32')}**."]
    return "\n".join(lines)


def export(page: Path, args: list[str], rev: str | None = None) -> str:
    name = relative(page, args[0])
    contents = data(name, rev)
    machine = contents.get("fastest_at_parity", {}).get("machine")
    return source(name, "dvc repro export", machine, rev) + "\n\n" + export_lines(name, contents)


def best_at_parity(page: Path, args: list[str], rev: str | None = None) -> str:
    """From a ``benchmarks.serve`` report: per model, the way best at parity at batch 1 and at batch 32, each with its
    speed as a multiple of ``pipeline()``'s."""
    name = relative(page, args[0])
    text = data(name, rev)
    rows = next(t for t in tables(text) if t and "best at parity" in t[0])
    found = []
    for model in dict.fromkeys(r["model"] for r in rows):
        cells = [model]
        for batch in ("1", "32"):
            best = [r for r in rows if r["model"] == model and f"batch {batch}" in r["best at parity"]]
            cells.append(f"{best[0]['way']}, {best[0][f'× pipeline (batch {batch})']}x" if best else "none")
        found.append(cells)
    header = next(line for line in text.splitlines() if line.startswith("`"))  # command, date, CPU
    return "\n".join([f"`{name}`: {header.rstrip('.')}; {committed(name, rev=rev)}.", "",
                      *table(["model", "best at parity, batch 1 (× `pipeline()`)",
                              "best at parity, batch 32 (× `pipeline()`)"], found)])


def flagged(page: Path, args: list[str], rev: str | None = None) -> str:
    """The forms of an export.json with a warning, and the warning; or "none"."""
    contents = data(relative(page, args[0]), rev)
    found = [f"{form} ({'; '.join(r['warning'])})" for form, r in contents.items() if r.get("warning")]
    return ", ".join(found) or "none"


def spread(entry: dict, digits: int = 4) -> str:
    """A summary's ``{mean, std}`` as ``mean ± std`` (the mean alone for one seed)."""
    if entry["std"] is None or (isinstance(entry["std"], float) and math.isnan(entry["std"])):
        return f"{entry['mean']:.{digits}f}"
    return f"{entry['mean']:.{digits}f} ± {entry['std']:.{digits}f}"


def sweep(page: Path, args: list[str], rev: str | None = None) -> str:
    """A ``tools.summarize`` JSON: one row per configuration, its params, seeds and every metric's mean ± std."""
    name = relative(page, args[0])
    summary = data(name, rev)
    configurations = summary["configurations"]
    metrics = [k for k in dict.fromkeys(k for c in configurations for k in c)
               if k.startswith(("validation.", "test.")) and any(
                   isinstance(c.get(k), dict) and not math.isnan(c[k]["mean"]) for c in configurations)]
    baseline = next((c["vs_baseline"] for c in configurations if "vs_baseline" in c), None)
    rows = []
    for c in configurations:
        params = ", ".join(f"{k.removeprefix('train.')}={v}" for k, v in c["params"].items())
        versus = c.get("vs_baseline")
        rows.append([f"`{params or '-'}`", ", ".join(str(s) for s in c["seeds"]),
                     *(spread(c[m]) if isinstance(c.get(m), dict) and not math.isnan(c[m]["mean"]) else "—"
                       for m in metrics), spread(c["train_seconds"], 1)]
                    + ([f"{versus['diff']:+.4f} ({versus['se']:.4f})" if versus else "—"] if baseline else []))
    header = ["configuration (params that differ)", "seeds", *metrics, "train s"]
    header += [f"{baseline['metric']} − baseline (SE)"] if baseline else []
    command = "python -m tools.summarize " + " ".join(f"--match '{m}'" for m in summary["match"])
    return "\n".join([source(name, command, None, rev), "", *table(header, rows)])


def runs(page: Path, args: list[str], rev: str | None = None) -> str:
    """Run folders (``params.yaml``, ``train.json``, ``eval.json``): one row each."""
    rows = []
    for folder in (relative(page, a) for a in args):  # metrics/: the committed run, whose params are params.yaml
        files = ["params.yaml" if folder == "metrics" else f"{folder}/params.yaml", f"{folder}/train.json",
                 f"{folder}/eval.json"]
        params, train, evaluation = (data(name, rev) for name in files)
        scores = [" / ".join(f"{n} {metric(evaluation[s][n])}" for n in metric_names(evaluation[s])) or "—"
                  if s in evaluation else "—" for s in ("validation", "test")]
        rows.append([f"`{folder}/`", f"`{params['model']['checkpoint']}`", params["data"].get("config") or "own",
                     params["train"]["seed"], precision(train.get("mixed_precision")),
                     f"`{train['device']}`" if train.get("device") else "not recorded", *scores,
                     train.get("train_seconds"), committed(*files[1:], rev=rev).removeprefix("committed ")])
    return "\n".join(table(["run folder (`dvc exp run`, its params.yaml)", "checkpoint", "task", "seed", "precision",
                            "CPU", "validation", "test", "train s", "train.json, eval.json committed"], rows))


def seeds(page: Path, args: list[str], rev: str | None = None) -> str:
    """A JSON Lines file of runs named ``<configuration>-<seed>``: one row per configuration, mean ± std of each
    number over its seeds, and the device and precision the runs record."""
    name = relative(page, args[0])
    groups: dict[str, list[dict]] = {}
    for row in data(name, rev):
        groups.setdefault(re.sub(r"-\d+$", "", row["run"]), []).append(row)
    columns = [k for k, v in data(name, rev)[0].items() if isinstance(v, (int, float)) and not isinstance(v, bool)]
    rows = []
    for configuration, runs in groups.items():
        cells = []
        for column in columns:
            values = [r[column] for r in runs]
            mean, digits = sum(values) / len(values), 4 if all(abs(v) < 1 for v in values) else 1
            std = statistics.stdev(values) if len(values) > 1 else None
            cells.append(spread({"mean": mean, "std": std}, digits))
        seeds = ", ".join(r["run"].rpartition("-")[2] for r in runs if re.search(r"-\d+$", r["run"])) or "—"
        rows.append([configuration, seeds, *cells, " / ".join(sorted({f"{precision(r.get('mixed_precision'))} on "
                                                                      f"`{r.get('device')}`" for r in runs}))])
    return "\n".join([f"`{name}`: {committed(name, rev=rev)}.", "",
                      *table(["configuration", "seeds", *columns, "precision and device"], rows)])


def _yaml_value(value) -> str:
    """A param's value as ``-S`` takes it; the JSON files written before ``tools.summarize.typed`` hold bools and
    nulls as text."""
    if value in (None, "None"):
        return "null"
    return str(value).lower() if isinstance(value, bool) or value in ("True", "False") else str(value)


def exp_run(page: Path, args: list[str], rev: str | None = None) -> str:
    """The ``dvc exp run -S …`` of configuration ``args[1]`` of the ``tools.summarize`` JSON ``args[0]``."""
    params = data(relative(page, args[0]), rev)["configurations"][int(args[1])]["params"]
    settings = [f"-S {k}={_yaml_value(v)}" for k, v in params.items()]
    lines = ["dvc exp run " + " ".join(settings[:4])] + ["  " + " ".join(settings[i:i + 4])
                                                       for i in range(4, len(settings), 4)]
    return "```bash\n" + " \\\n".join(lines) + "\n```"


GENERATORS = {"committed-run": committed_run, "sweep": sweep, "runs": runs, "seeds": seeds, "export": export,
              "flagged": flagged, "exp-run": exp_run, "best-at-parity": best_at_parity}


def blocks(page: Path, text: str, rev: str | None = None) -> tuple[str, list[str]]:
    """``text`` (of ``page``) with every generated block rewritten from its files (working tree, or git revision
    ``rev``), and the blocks that could not be, one line each (such a block is left as it is)."""
    problems = []

    def rewrite(match: re.Match) -> str:
        name, args, old = match.group(1), match.group(2).split(), match.group(3)
        where = f"{named(page)}: <!-- generated: {name}{match.group(2)} -->"
        if name not in GENERATORS:
            problems.append(f"{where}: no generator {name!r}; there are {', '.join(GENERATORS)}")
            return match.group(0)
        try:
            new = GENERATORS[name](page, args, rev)
        except (QuoteError, KeyError, IndexError, TypeError, StopIteration) as err:
            problems.append(f"{where}: {err if isinstance(err, QuoteError) else f'{type(err).__name__}: {err}'}")
            return match.group(0)
        body = f"\n\n{new}\n\n" if old.startswith("\n") else new
        return f"<!-- generated: {name}{match.group(2)} -->{body}<!-- end generated -->"

    return BLOCK.sub(rewrite, text), problems


def stale_blocks(page: Path, text: str, rev: str | None = None) -> list[str]:
    """Every generated block of ``text`` that differs from what its files give, or cannot be generated."""
    new, lines = blocks(page, text, rev)
    for old, fresh in zip(BLOCK.finditer(text), BLOCK.finditer(new)):
        if old.group(0) != fresh.group(0):
            lines.append(f"{named(page)}: <!-- generated: {old.group(1)}{old.group(2)} --> differs from "
                         "what its files give")
    return lines
