"""What a search (``tools.tune``) leaves for a person: one trial's result read from its experiment, and the study's
report: a Markdown table of trials, the same as JSON, the best configuration as a recipe, and Optuna's optimisation
history and parameter importances as PNG (``optuna.visualization.matplotlib``: no browser)."""

from __future__ import annotations

import fcntl
import io
import json
import logging
import math
import subprocess
from pathlib import Path

import optuna

from finetune.runtime import atomic_dir, markdown_table, read_yaml, write_json, yaml_reader
from tools.search_space import SearchSpace, nested

log = logging.getLogger(__name__)

MIN_TRIALS_FOR_IMPORTANCES = 5  # complete trials; parameter importances from fewer say nothing


def experiment_file(head: str, name: str, path: str) -> str:
    """The text of ``path`` in experiment ``name`` of baseline commit ``head`` (DVC keeps experiment ``name`` as the
    git ref ``refs/exps/<head[:2]>/<head[2:]>/<name>``).

    Raises:
        FileNotFoundError: no such experiment, or it has no ``path``.
    """
    ref = f"refs/exps/{head[:2]}/{head[2:]}/{name}"
    done = subprocess.run(["git", "show", f"{ref}:{path}"], capture_output=True, text=True)
    if done.returncode != 0:
        raise FileNotFoundError(f"experiment {name} ({ref}): no {path}: {done.stderr.strip()}")
    return done.stdout


def experiment_result(head: str, name: str, metric: str) -> dict:
    """One seed's result from its experiment: ``value`` (eval.json's validation ``metric``; with ``metric`` 'loss'
    the validation loss), ``collapsed`` (its collapse check), ``pruned``, ``epochs`` and ``steps`` run, the
    ``planned_epochs`` (train.epochs), ``train_seconds`` and ``saved_seconds``: for a pruned run, the training time the
    epochs it did not run would have taken at its own seconds per epoch (an estimate; 0 otherwise)."""
    validation = json.loads(experiment_file(head, name, "metrics/eval.json"))["validation"]
    train = json.loads(experiment_file(head, name, "metrics/train.json"))
    params = read_yaml(experiment_file(head, name, "params.yaml"), f"{name}:params.yaml")["train"]
    planned = params["epochs"] if params.get("max_steps") is None else train["epochs"]
    saved = train["train_seconds"] * (planned / train["epochs"] - 1) if train.get("pruned") else 0.0
    return {"experiment": name, "value": validation[metric], "collapsed": bool(validation.get("collapsed")),
            "pruned": bool(train.get("pruned")), "epochs": train["epochs"], "steps": train["steps"],
            "planned_epochs": planned, "best_epoch": train["best_epoch"], "train_seconds": train["train_seconds"],
            "saved_seconds": round(max(saved, 0.0), 1)}


def trial_rows(study: optuna.Study, seeds: list[int]) -> list[dict]:
    """One dict per trial: number, state, params, each seed's value, the objective (mean), train and saved
    seconds, its experiments, and a note (pruned where, why it failed, duplicate or retry of which trial)."""
    rows = []
    for trial in study.get_trials(deepcopy=False):
        runs = [trial.user_attrs[f"seed_{seed}"] for seed in seeds if f"seed_{seed}" in trial.user_attrs]
        retry_of = optuna.storages.RetryHeartbeatStaleTrialCallback.retried_trial_number(trial)
        note = ("; ".join(filter(None, [
            f"pruned at epoch {runs[-1]['epochs']} of {runs[-1]['planned_epochs']}" if runs and runs[-1]["pruned"]
            else "", trial.user_attrs.get("fail_reason", ""),
            f"same configuration as trial {trial.user_attrs['duplicate_of']}" if "duplicate_of" in trial.user_attrs
            else "", f"retry of trial {retry_of}" if retry_of is not None else ""])))
        rows.append({"trial": trial.number, "state": trial.state.name, "params": trial.params,
                     "seeds": {seed: run["value"] for seed, run in zip(seeds, runs)},
                     "value": trial.value, "train_seconds": round(sum(r["train_seconds"] for r in runs), 1),
                     "saved_seconds": round(sum(r["saved_seconds"] for r in runs), 1),
                     "experiments": [r["experiment"] for r in runs], "note": note})
    return rows


def recipe_text(study: optuna.Study, space: SearchSpace, metric: str, seeds: list[int], params: dict) -> str:
    """The best trial's configuration (``fixed`` + its params, less what equals ``params``: params.yaml) as a
    partial params file with a comment saying where it came from; ``tools.recipe`` runs it."""
    best = study.best_trial
    values = {key: value for key, value in {**space.fixed, **best.params}.items()
              if params.get(key.split(".")[0], {}).get(key.split(".", 1)[1]) != value}
    out = io.StringIO()
    writer = yaml_reader()
    writer.default_flow_style = False
    writer.dump(nested(values), out)
    header = (f"# Found by `python -m tools.tune --space {space.source}` (study {study.study_name}): "
              f"trial {best.number},\n# validation {metric} {best.value:.4f}, mean over seeds "
              f"{' '.join(map(str, seeds))}. Only what differs "
              "from params.yaml.\n# Run: python -m tools.recipe <this file> --seeds 42 1 2 --run\n")
    return header + out.getvalue()


def fmt(value) -> str:
    if isinstance(value, float):
        return "" if math.isnan(value) else f"{value:.4g}" if abs(value) < 1e-2 else f"{value:.4f}".rstrip("0")
    return "" if value is None else str(value)


def write_plots(study: optuna.Study, out: Path) -> None:
    """history.png (every trial's objective and the best so far) and, from ``MIN_TRIALS_FOR_IMPORTANCES`` complete
    trials on, importances.png (fANOVA importances; from fewer they are noise); a plot Optuna cannot draw is logged
    and skipped."""
    import matplotlib  # heavy: loads only when a report is written, not in every trial

    matplotlib.use("Agg")  # no display: before pyplot loads
    # heavy: matplotlib's pyplot, under the Agg backend chosen above
    import matplotlib.pyplot as plt
    from optuna.visualization.matplotlib import plot_optimization_history, plot_param_importances

    complete = len(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)))
    plots = [("history.png", plot_optimization_history)]
    if complete >= MIN_TRIALS_FOR_IMPORTANCES:
        plots.append(("importances.png", plot_param_importances))
    for name, plot in plots:
        try:
            axes = plot(study)
        except (ValueError, RuntimeError) as err:
            log.info("%s not drawn: %s", name, err)
            continue
        axes.figure.set_size_inches(8, 5)
        axes.figure.tight_layout()
        axes.figure.savefig(out / name, dpi=100)
        plt.close(axes.figure)


def write_report(study: optuna.Study, space: SearchSpace, metric: str, params: dict, out: Path) -> None:
    """Write ``out``/trials.md, trials.json, recipe.yaml (with a complete trial; the keys that differ from
    ``params``, params.yaml's content) and the plots, all at once: the folder is replaced when the report is whole
    (``atomic_dir``), so an error leaves the earlier report as it was. Workers of one project that end together
    write it one at a time (a lock in the project's .tune/), so neither removes the other's temp folder."""
    lock = Path(".tune") / f"{out.name}.report.lock"
    lock.parent.mkdir(exist_ok=True)
    with open(lock, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        with atomic_dir(out) as tmp:
            _write_report(study, space, metric, params, tmp)
    log.info("Report of study %s in %s/ (%s)", study.study_name, out, ", ".join(sorted(p.name for p in out.iterdir())))


def _write_report(study: optuna.Study, space: SearchSpace, metric: str, params: dict, out: Path) -> None:
    """``write_report``'s files, into the empty folder ``out``."""
    seeds = study.user_attrs.get("seeds", [])
    rows = trial_rows(study, seeds)
    keys = list(space.space)
    states = [r["state"] for r in rows]
    summary = {"study": study.study_name, "metric": f"validation.{metric}", "direction": study.direction.name.lower(),
               "seeds": seeds, "space": space.source, "trials": len(rows),
               **{state.lower(): states.count(state) for state in ("COMPLETE", "PRUNED", "FAIL", "RUNNING")},
               "train_seconds": round(sum(r["train_seconds"] for r in rows), 1),
               "saved_by_pruning_seconds": round(sum(r["saved_seconds"] for r in rows), 1)}
    complete = [r for r in rows if r["state"] == "COMPLETE"]
    if complete:
        best = study.best_trial
        summary["best"] = {"trial": best.number, "value": best.value, "params": best.params}
    write_json(out / "trials.json", {"summary": summary, "trials": rows})
    header = ["trial", "state", *keys, *[f"seed {s}" for s in seeds], f"mean {metric}", "train s", "note"]
    table = markdown_table(header, [[r["trial"], r["state"], *[fmt(r["params"].get(k)) for k in keys],
                                     *[fmt(r["seeds"].get(s)) for s in seeds], fmt(r["value"]),
                                     fmt(r["train_seconds"]), r["note"]] for r in rows])
    lines = [f"# Study {study.study_name}: validation {metric} ({summary['direction']}), "
             f"mean over seeds {', '.join(map(str, seeds))}", "",
             f"Space: `{space.source}`; {len(rows)} trials: {summary['complete']} complete, "
             f"{summary['pruned']} pruned, "
             f"{summary['fail']} failed, {summary['running']} running. Training {summary['train_seconds'] / 60:.1f} "
             f"min in all; pruning saved about {summary['saved_by_pruning_seconds'] / 60:.1f} min (each pruned run's "
             "epochs not run, at its own seconds per epoch).", ""]
    if complete:
        lines += [f"Best: trial {best.number}, {metric} {best.value:.4f}: " +
                  ", ".join(f"{k} = {fmt(v)}" for k, v in best.params.items()) + " (recipe.yaml).", ""]
        (out / "recipe.yaml").write_text(recipe_text(study, space, metric, seeds, params))
    if summary["complete"] < MIN_TRIALS_FOR_IMPORTANCES:
        lines += [f"Parameter importances are drawn from {MIN_TRIALS_FOR_IMPORTANCES} complete trials on "
                  f"(here {summary['complete']}).", ""]
    (out / "trials.md").write_text("\n".join(lines) + "\n" + table)
    write_plots(study, out)
