"""Summarise DVC experiments by configuration: mean ± std of each metric over the seeds of one configuration.

Not a pipeline stage: a command to run after a sweep. Experiments are read with ``dvc.api.exp_show`` (the data of
`dvc exp show`); those whose params differ only in ``train.seed`` form one configuration.

    dvc exp run --queue -n r3 -S 'train.seed=42,1,2' -S train.lr=1e-4 -S 'evaluate.splits=[validation]'
    dvc exp run --run-all   # runs the queue and returns when it is done
    python -m tools.summarize --match 'r3-*' --out metrics/sweeps/round-3.json --md metrics/sweeps/round-3.md
"""

from __future__ import annotations

import argparse
import fnmatch
import logging
import math
from pathlib import Path

import dvc.api
import pandas as pd
from dvc.scm import RevError

from finetune.runtime import markdown_table, unwritable, write_json, write_text
from tools.cli import positive_int

log = logging.getLogger(__name__)

# Params that never change a validation result, left out of the configuration (the seed is what varies within one).
IGNORED_PARAMS = {"train.seed", "train.resume", "train.log_every", "train.num_threads", "evaluate.splits",
                  # metrics, not params: the train.json of the i20-a* runs named its distillation block `distill`.
                  # Names only train.json has come bare from `dvc exp show` (no `params.yaml:` prefix to strip), so
                  # without these the per-seed losses would count as params and split each configuration.
                  "distill.final_hard_loss", "distill.final_soft_loss", "distill.teacher_model_type"}
# pruned: a search's pruner stopped the run (tools.tune); summarised as the share of the seeds pruned
RUN_METRICS = ["best_epoch", "best_step", "epochs", "pruned", "train_seconds", "wall_seconds"]
PARAM_PREFIXES = ("data.", "model.", "tokenize.", "train.", "evaluate.", "distill.")
# eval.json's collapse check (finetune/evaluate/collapse.py): the constant baseline and the predictions' shape, not
# metrics
CHECK_FIELDS = ("baseline.", "most_predicted.", "collapsed")


def load_experiments(patterns: list[str], num: int = 50, revs: list[str] | None = None) -> pd.DataFrame:
    """One row per finished experiment whose name matches one of ``patterns`` (fnmatch), from `dvc exp show`.

    ``num``: how many commits back (from HEAD, and from each of ``revs``: branches or commits whose experiments
    count too, e.g. a branch that tracks an intermediate checkpoint) to look for experiments. A name under several
    commits (a sweep run again after a commit) counts once, from the newest commit; a warning names the others.

    Raises:
        SystemExit: no experiment matches, or a revision of ``revs`` is unknown.
    """
    try:
        shown = dvc.api.exp_show(revs=["HEAD", *revs] if revs else None, num=num)
    except RevError as err:
        raise SystemExit(f"ERROR: --rev: {err}") from None
    rows, baseline = [], None
    for r in shown:  # each commit's row (typ "baseline"), then its experiments; the newest commit first
        if r.get("typ") == "baseline":
            baseline = r.get("rev")
        elif (r.get("Experiment") and r.get("State") in (None, "Success")
              and any(fnmatch.fnmatch(r["Experiment"], p) for p in patterns)):
            rows.append({**r, "baseline": baseline})
    if not rows:
        raise SystemExit(f"no finished experiment matches {patterns} in the last {num} commits (see `dvc exp show`)")
    df = pd.DataFrame(rows)
    newest = df.drop_duplicates("Experiment").set_index("Experiment")
    for name, older in df[df.duplicated("Experiment")].groupby("Experiment")["baseline"]:
        log.warning("%s: also an experiment of %s (older); the one of %s is summarised", name,
                    ", ".join(map(str, older)), newest.loc[name, "baseline"])
    df = newest.drop(columns="baseline").sort_index()
    # a name both params.yaml and a metrics file hold comes as "<file>:<name>": keep the param under its name
    return typed(df.rename(columns=lambda c: c.removeprefix("params.yaml:")))


def typed(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with the cells ``dvc.api.exp_show`` gives as text ``"True"``, ``"False"`` and ``"None"`` as the values
    they stand for (a bool param, ``pruned``, a missing metric)."""
    return df.replace({"True": True, "False": False, "None": None})


def metric_columns(df: pd.DataFrame, with_test: bool = False) -> list[str]:
    """The task's metrics of the experiments (``validation.<metric>``, e.g. accuracy and F1 for MRPC, Pearson for
    STS-B; with ``with_test`` also ``test.<metric>``; those none of them has, and the collapse check, are left out),
    then the run's cost and length (``RUN_METRICS``)."""
    splits = ("validation", "test") if with_test else ("validation",)
    found = [c for split in splits for c in df.columns
             if c.startswith(f"{split}.") and c.split(".", 1)[1] not in ("loss", "examples")
             and not c.split(".", 1)[1].startswith(CHECK_FIELDS)
             and pd.to_numeric(df[c], errors="coerce").notna().any()]  # dvc writes a missing metric as 'None'
    return found + RUN_METRICS


def main_metric(metrics: list[str]) -> str | None:
    """The metric that ranks configurations: validation F1 where the task has it (macro F1 for more classes, as
    ``Task.metrics`` ranks), else its first validation metric."""
    return next((m for m in ("validation.f1", "validation.macro_f1") if m in metrics),
                next((m for m in metrics if m.startswith("validation.")), None))


def summarize(df: pd.DataFrame, metrics: list[str] | None = None) -> tuple[list[dict], list[str]]:
    """Group experiments by their params except the seed; mean, std (sample, n-1) and values of each metric
    (default: ``metric_columns``).

    Returns:
        ``(configurations, varying)``: one dict per configuration, best first by mean validation F1 (or the task's
        first validation metric when it has no F1), with
        ``params`` (the params that vary across ``df``), ``experiments``, ``seeds``, ``n`` and per metric
        ``{"mean", "std", "values"}``; and the names of the varying params.
    """
    metrics = metrics or metric_columns(df)
    params = [c for c in df.columns if c.startswith(PARAM_PREFIXES) and c not in IGNORED_PARAMS]
    as_text = df[params].astype(str)
    varying = [c for c in params if as_text[c].nunique() > 1]
    keys = as_text.apply(lambda row: tuple(row), axis=1)
    configurations = []
    for _, group in df.groupby(keys, sort=False):
        entry = {"params": {c: _plain(group[c].iloc[0]) for c in varying},
                 "experiments": list(group.index), "seeds": [int(s) for s in group["train.seed"]], "n": len(group)}
        for metric in metrics:
            if metric not in group or group[metric].isna().all():
                continue
            values = pd.to_numeric(group[metric], errors="coerce").dropna()
            if values.empty:  # no number among them: nothing to average (JSON has no NaN)
                continue
            entry[metric] = {"mean": round(float(values.mean()), 4),
                             "std": round(float(values.std(ddof=1)), 4) if len(values) > 1 else None,
                             "values": [_plain(v) for v in values]}
        configurations.append(entry)
    key = main_metric(metrics)
    configurations.sort(key=lambda c: -c.get(key, {}).get("mean", -math.inf))
    return configurations, varying


def compare_to(configurations: list[dict], baseline: str, metric: str) -> None:
    """Add to each configuration ``"vs_baseline"``: the difference of its mean ``metric`` from the baseline's (the
    configuration holding an experiment that matches the fnmatch pattern ``baseline``), the standard error of that
    difference, ``sqrt(s_a**2 / n_a + s_b**2 / n_b)`` (sample stds, seeds taken as independent), and whether the
    difference exceeds it (``wins``): the rule of docs/results.md for replacing a default.

    Raises:
        SystemExit: no configuration matches ``baseline``.
    """
    base = next((c for c in configurations if any(fnmatch.fnmatch(e, baseline) for e in c["experiments"])), None)
    if base is None:
        raise SystemExit(f"--baseline {baseline!r}: no summarised experiment matches (add it with --match)")
    for c in configurations:
        a, b = c.get(metric), base.get(metric)
        if a is None or b is None or a["std"] is None or b["std"] is None:
            continue
        diff = a["mean"] - b["mean"]
        se = math.sqrt(a["std"] ** 2 / c["n"] + b["std"] ** 2 / base["n"])
        c["vs_baseline"] = {"metric": metric, "baseline": base["experiments"], "diff": round(diff, 4),
                            "se": round(se, 4), "wins": diff > se}


def markdown(configurations: list[dict], varying: list[str], metrics: list[str]) -> str:
    """A Markdown table: the varying params, n, seeds and ``mean ± std`` of each metric, best first; with
    ``compare_to``, the difference from the baseline and its standard error."""
    metrics = [m for m in metrics if any(m in c for c in configurations)]
    compared = next((c["vs_baseline"]["metric"] for c in configurations if "vs_baseline" in c), None)
    rows = []
    for c in configurations:
        cells = [str(c["params"][p]) for p in varying] + [str(c["n"]), ",".join(map(str, c["seeds"]))]
        for m in metrics:
            s = c.get(m)
            digits = 4 if m.startswith(("validation.", "test.")) else 1
            cells.append("" if s is None else f"{s['mean']:.{digits}f}" +
                         (f" ± {s['std']:.{digits}f}" if s["std"] is not None else ""))
        if compared:
            v = c.get("vs_baseline")
            cells.append("" if v is None else f"{v['diff']:+.4f} (SE {v['se']:.4f})")
        rows.append(cells)
    extra = [f"{compared} − baseline"] if compared else []
    return markdown_table([*varying, "n", "seeds", *metrics, *extra], rows)


def _plain(value):
    """numpy scalars to Python ones for JSON; whole floats (pandas turns int columns with gaps into floats) to int."""
    value = value.item() if hasattr(value, "item") else value
    return int(value) if isinstance(value, float) and value.is_integer() else value


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--match", action="append", required=True,
                        help="experiment name pattern (fnmatch, e.g. 'r3-*'); repeat for several")
    parser.add_argument("--num", type=positive_int, default=50, help="commits back from HEAD to search (default 50)")
    parser.add_argument("--rev", action="append", default=[],
                        help="also search experiments based on this branch or commit (and --num commits before it)")
    parser.add_argument("--out", type=Path, help="write the summary JSON here")
    parser.add_argument("--md", type=Path, help="write the Markdown table here")
    parser.add_argument("--baseline", help="experiment name pattern of the configuration to compare with: adds the "
                        "difference of the main validation metric and its standard error")
    parser.add_argument("--with-test", action="store_true",
                        help="also summarise test metrics (only for the chosen configuration: select on validation)")
    args = parser.parse_args(argv)
    for option, file in (("--out", args.out), ("--md", args.md)):
        if file is not None and (reason := unwritable(file)):
            raise SystemExit(f"ERROR: {option} {file}: {reason}")

    df = load_experiments(args.match, args.num, args.rev)
    metrics = metric_columns(df, args.with_test)
    configurations, varying = summarize(df, metrics)
    if args.baseline:
        compare_to(configurations, args.baseline, main_metric(metrics))
    table = markdown(configurations, varying, metrics)
    print(table)
    columns = [c for c in df.columns if c.startswith(PARAM_PREFIXES) or c in metrics]
    experiments = {name: {c: _plain(v) for c, v in row.items() if c in columns and pd.notna(v)}
                   for name, row in df.iterrows()}
    if args.out:
        write_json(args.out, {"match": args.match, "varying_params": varying, "configurations": configurations,
                              "experiments": experiments})
        log.info("Wrote %s", args.out)
    if args.md:
        write_text(args.md, table)
        log.info("Wrote %s", args.md)


if __name__ == "__main__":
    main()
