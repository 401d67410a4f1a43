"""Hyperparameter search: an Optuna study whose every trial is a DVC experiment of the unchanged pipeline.

Not a pipeline stage. Each trial samples a configuration from a search space (``tools.search_space``) and runs
`dvc exp run --temp -n <study>-<n>` per seed, up to the evaluate stage, on validation only: trials show in
`dvc exp show`, `dvc metrics diff`, `dvc exp apply`, `dvc exp branch` and ``tools.summarize`` like any run, and, run
in a temporary copy, see only what git tracks. The objective is the mean over ``--seeds`` of the validation metric that
picks the best evaluation (``train.metric_for_best``: the task's main metric; loss and MSE minimised). A collapsed
seed (the collapse check) fails the configuration. Optuna's TPE sampler proposes, its MedianPruner stops a trial whose
first seed falls below the median of earlier trials at the same epoch (``finetune.train.trial``, the loop's one hook),
and its storage holds the study: killed, the same command resumes it; two processes (or machines, given one database
``--storage``) share it. See docs/search.md.

    python -m tools.tune --space configs/search/rte.yaml --trials 20              # study "rte", trials rte-0, rte-1…
    python -m tools.tune --space configs/search/rte.yaml --trials 20 --seeds 42 1 2
    python -m tools.tune --space configs/search/rte.yaml --report                 # rewrite the report only

Writes ``metrics/search/<study>/``: trials.md (a table), trials.json, recipe.yaml (the best configuration; run it
with ``python -m tools.recipe metrics/search/<study>/recipe.yaml``), history.png and importances.png.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import optuna
from sqlalchemy.exc import ArgumentError

from finetune.errors import ParamsError
from finetune.params import PARAMS_FILE
from finetune.tasks import GLUE_TASKS, LOWER_IS_BETTER, Task, glue_task
from finetune.train.trial import make_pruner, trial_env
from tools.cli import non_negative_int, positive_float, positive_int
from tools.recipe import check_seeds, flow, read_yaml
from tools.search_space import SearchSpace, load_space, with_fixed
from tools.tune_report import experiment_result, write_report
from tools.tune_storage import database_url, open_study_storage, shown

log = logging.getLogger("tools.tune")

TUNE_DIR = Path(".tune")  # the default storage and the trials' logs; git-ignored
REPORTS = Path("metrics/search")
MAX_FAILURES_IN_A_ROW = 3
PER_SEED_KEYS = ("train.seed", "evaluate.splits")  # what each seed's `dvc exp run` sets itself
BIN = Path(sys.executable).parent  # this environment's dvc, python and accelerate, activated or not


class TrialFailed(Exception):
    """A configuration failed: its `dvc exp run` exited non-zero, or one of its seeds collapsed."""


def failed(trial: optuna.Trial, reason: str) -> TrialFailed:
    """``TrialFailed(reason)``, the reason kept in the trial (user attribute ``fail_reason``) for the report."""
    trial.set_user_attr("fail_reason", reason)
    return TrialFailed(reason)


def objective_metric(params: dict, metric: str | None) -> tuple[str, str]:
    """``(metric, direction)`` of the study: ``metric`` if given, else ``train.metric_for_best`` or the task's main
    metric; the task from the GLUE config or, for own data, the prepared data's task.json (after `dvc repro
    download`), and the metric checked against it before any trial runs.

    Raises:
        SystemExit: the metric is neither ``loss`` nor one of the task's metrics (a misspelt ``--metric`` would fail
            every trial); own data not prepared yet and no ``--metric``.
    """
    data, choice = params["data"], metric or params["train"].get("metric_for_best")
    task = (glue_task(data["config"]) if data.get("files") is None and data.get("config") in GLUE_TASKS
            else Task.load("data/raw") if Path("data/raw/task.json").is_file() else None)
    if task is not None:
        if choice is not None and choice not in ("loss", *task.metrics):
            raise SystemExit(f"tools.tune: {'--metric' if metric else 'train.metric_for_best'} {choice!r} is not a "
                             f"metric of task {task.name!r}: choose one of {', '.join(['loss', *task.metrics])}")
        choice = choice or task.metrics[0]
    if choice is None:
        raise SystemExit("tools.tune: own data: run `dvc repro download` first (its task names the metric), "
                         "or pass --metric")
    return choice, "minimize" if choice in LOWER_IS_BETTER else "maximize"


def experiment_name(study: str, number: int, seed: int, seeds: list[int]) -> str:
    return f"{study}-{number}" if len(seeds) == 1 else f"{study}-{number}-s{seed}"


class Objective:
    """Runs one trial: its configuration as `dvc exp run --temp` per seed; returns the mean validation metric."""

    def __init__(self, args: argparse.Namespace, space: SearchSpace, metric: str):
        self.args, self.space, self.metric = args, space, metric
        head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True)
        if head.returncode != 0:  # not a git repository, or no commit yet: `dvc exp` needs one
            raise SystemExit(f"tools.tune: git rev-parse HEAD: {head.stderr.strip() or head.returncode}; the search "
                             "runs `dvc exp run` experiments of a commit: git init and commit first")
        self.head = head.stdout.strip()
        self.failures, self.last_log = 0, None

    def __call__(self, trial: optuna.Trial) -> float:
        values = self.space.sample(trial)
        trial.set_user_attr("worker", f"{socket.gethostname()}:{os.getpid()}")
        same = duplicate_of(trial)
        if same is not None:
            trial.set_user_attr("duplicate_of", same.number)
            if same.state == optuna.trial.TrialState.COMPLETE:
                log.info("Trial %d: the configuration of trial %d, already scored: its value, not run again",
                         trial.number, same.number)
                return same.value
            raise optuna.TrialPruned(f"the configuration of trial {same.number} ({same.state.name}), not run twice")
        # every key of the trial, whatever params.yaml holds: another worker's `dvc exp run` rewrites params.yaml
        # for a moment while it stashes its run (under DVC's lock), so reading it here could see that run's values
        pairs = [f"{key}={flow(value)}" for key, value in {**self.space.fixed, **values}.items()
                 if key not in PER_SEED_KEYS]
        scores = []
        for i, seed in enumerate(self.args.seeds):
            name = experiment_name(trial.study.study_name, trial.number, seed, self.args.seeds)
            result = self.run_seed(trial, name, pairs, seed, report=i == 0 and self.args.prune_after_trials is not None)
            trial.set_user_attr(f"seed_{seed}", result)
            if result["pruned"]:
                raise optuna.TrialPruned(f"seed {seed} pruned at epoch {result['epochs']}")
            if result["collapsed"]:
                raise failed(trial, f"seed {seed} collapsed (the collapse check on validation): the configuration "
                                    "fails, a lucky seed does not rescue it")
            scores.append(result["value"])
        self.failures = 0
        return sum(scores) / len(scores)

    def run_seed(self, trial: optuna.Trial, name: str, pairs: list[str], seed: int, report: bool) -> dict:
        """`dvc exp run --temp` of one seed up to the evaluate stage; its result (``experiment_result``)."""
        argv = [str(BIN / "dvc"), "exp", "run", "--temp", "-n", name, *[a for pair in pairs for a in ("-S", pair)],
                "-S", f"train.seed={seed}", "-S", f"evaluate.splits={flow(['validation'])}", "evaluate"]
        # trial._trial_id: the storage's id of the trial (Optuna has no public name for it)
        env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",  # the stages' python: this one
               **(trial_env(self.args.storage, trial.study.study_name, trial._trial_id, self.metric,
                            self.args.prune_after_trials, self.args.prune_from) if report else {})}
        logfile = TUNE_DIR / "logs" / f"{name}.log"
        logfile.parent.mkdir(parents=True, exist_ok=True)
        log.info("Trial %d: %s (log: %s)", trial.number, " ".join(argv), logfile)
        start = time.perf_counter()
        with open(logfile, "w") as out:
            code = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, env=env).returncode
        if code != 0:
            self.failures, self.last_log = self.failures + 1, logfile
            tail = "".join(logfile.read_text().splitlines(keepends=True)[-15:])
            log.error("Trial %d: %s failed (exit %d); the last lines of %s:\n%s", trial.number, name, code, logfile,
                      tail)
            if self.failures >= MAX_FAILURES_IN_A_ROW:
                trial.study.stop()  # after this trial, which Optuna marks FAIL: not left RUNNING to be retried
            raise failed(trial, f"{name}: dvc exp run exited {code} (log {logfile})")
        result = experiment_result(self.head, name, self.metric)
        result["wall_seconds"] = round(time.perf_counter() - start, 1)
        log.info("Trial %d: %s validation %s %.4f%s (train %.0f s)", trial.number, name, self.metric,
                 result["value"], " PRUNED" if result["pruned"] else "", result["train_seconds"])
        return result


def duplicate_of(trial: optuna.Trial) -> optuna.trial.FrozenTrial | None:
    """An earlier trial of the study with the same configuration (complete, running elsewhere or pruned), if any:
    Optuna's samplers can propose one twice, and two workers could run it twice."""
    states = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.RUNNING, optuna.trial.TrialState.PRUNED)
    for other in trial.study.get_trials(deepcopy=False, states=states):
        if other.number < trial.number and other.params == trial.params \
                and "duplicate_of" not in other.user_attrs:
            return other
    return None


def make_study(args: argparse.Namespace, direction: str | None) -> optuna.Study:
    """Create or load the study ``args.study`` in ``args.storage`` (TPE sampler, median pruner or none);
    ``direction`` ("maximize" or "minimize") is a new study's.

    With ``args.report``, load the study only (``direction`` unused).

    Raises:
        SystemExit: the storage cannot be opened (no server, a refused login, no driver): one line naming its URL,
            password hidden. Nothing else is opened or written, the default local study included. With
            ``args.report``, no such study in the storage.
    """
    storage = open_study_storage(args)
    sampler = optuna.samplers.TPESampler(n_startup_trials=args.random_trials, seed=args.sampler_seed)
    pruner = make_pruner(args.prune_after_trials, args.prune_from)
    if args.report:  # a report reads a study; it never makes one
        try:
            return optuna.load_study(study_name=args.study, storage=storage, sampler=sampler, pruner=pruner)
        except KeyError:
            names = optuna.get_all_study_names(storage)
            raise SystemExit(f"tools.tune: --report: no study {args.study!r} in {shown(args.storage)} (studies there: "
                             f"{', '.join(names) or 'none'}); nothing written") from None
    return optuna.create_study(study_name=args.study, storage=storage, direction=direction, sampler=sampler,
                               pruner=pruner, load_if_exists=True)


FINISHED = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED, optuna.trial.TrialState.FAIL)


def trial_baseline(params: dict, space: SearchSpace) -> dict:
    """What every trial of ``space`` inherits from ``params`` (params.yaml's sections): ``{"section.key": value}``
    with the space's fixed values, less the keys the space samples and those each trial sets (``train.seed``,
    ``evaluate.splits``), as JSON gives it back (a study's storage keeps it so)."""
    sampled = {*space.space, *PER_SEED_KEYS}
    merged = with_fixed(params, space.fixed)
    return json.loads(json.dumps({f"{section}.{key}": value for section, values in merged.items()
                                  for key, value in values.items() if f"{section}.{key}" not in sampled}))


def settle_study(study: optuna.Study, seeds: list[int] | None, default_seed: int, space: SearchSpace,
                 metric: str, params: dict) -> list[int]:
    """The seeds to score with: ``seeds``, else the study's own, else ``[default_seed]``. A study keeps the seeds,
    space, metric and trial baseline (``trial_baseline`` of ``params``) it began with, so that its trials stay
    comparable and its report's per-seed columns mean one thing: the first run records them, later runs (workers,
    resumes, ``--report``) must match.

    Raises:
        SystemExit: the study began with other seeds, another space (file or ranges), another metric or other
            params.yaml values outside the space; the message names the study and what differs.
    """
    began = study.user_attrs
    now = {"seeds": seeds or began.get("seeds") or [default_seed], "metric": metric,
           "space": {"file": space.source, "fixed": space.fixed, "space": space.space},
           "baseline": trial_baseline(params, space)}
    for key in ("seeds", "metric", "space"):
        if key in began and began[key] != now[key]:
            raise SystemExit(f"tools.tune: study {study.study_name} began with {key} {began[key]}, not {now[key]}: "
                             f"continue it with the same {key}, or start another with --study")
    if "baseline" in began and began["baseline"] != now["baseline"]:
        keys = sorted(set(began["baseline"]) | set(now["baseline"]))
        changed = [f"{key} {began['baseline'].get(key)!r}, now {now['baseline'].get(key)!r}" for key in keys
                   if began["baseline"].get(key) != now["baseline"].get(key)]
        more = f" (and {len(changed) - 3} more)" if len(changed) > 3 else ""
        raise SystemExit(f"tools.tune: study {study.study_name} began on other params.yaml values outside its space: "
                         f"{'; '.join(changed[:3])}{more}; its trials would not compare: restore them, or start "
                         "another with --study")
    for key, value in now.items():
        if key not in began:
            study.set_user_attr(key, value)
    return now["seeds"]


def finished(study: optuna.Study) -> int:
    """Trials finished, complete, pruned or failed (``--trials`` counts these: a search of failing configurations
    ends too)."""
    return len(study.get_trials(deepcopy=False, states=FINISHED))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--space", required=True, help="the search space, e.g. configs/search/rte.yaml")
    parser.add_argument("--trials", type=positive_int, default=20, help="trials of the study that finish (complete, "
                        "pruned or failed), all workers together")
    parser.add_argument("--study", help="the study's name, prefix of its experiments' (default: the space's name)")
    parser.add_argument("--storage", help="an Optuna database URL shared by workers, e.g. "
                        f"postgresql://user:password@host/db (default: sqlite under {TUNE_DIR}/)")
    parser.add_argument("--seeds", type=int, nargs="+", help="score a configuration by the mean over these "
                        "train.seed values, one experiment each (default: the study's, or params.yaml's train.seed)")
    parser.add_argument("--metric", help="the validation metric (default: train.metric_for_best, the task's main one)")
    parser.add_argument("--pruner", choices=["median", "none"], default="median")
    parser.add_argument("--prune-from", type=non_negative_int, default=2,
                        help="the first epoch (or step, with train.eval_every_steps) at which a trial may be pruned")
    parser.add_argument("--prune-after-trials", type=non_negative_int, default=3,
                        help="complete trials before pruning starts")
    parser.add_argument("--random-trials", type=non_negative_int, default=5,
                        help="random trials before TPE models the results")
    parser.add_argument("--sampler-seed", type=int, help="the sampler's seed: a one-worker study proposes the same "
                        "configurations again (default: none; workers sharing a study need different seeds, or none)")
    parser.add_argument("--timeout", type=positive_float,
                        help="start no trial after this many seconds (Optuna's timeout)")
    parser.add_argument("--heartbeat", type=positive_int, default=60, help="seconds between a worker's heartbeats")
    parser.add_argument("--grace", type=positive_int, default=180, help="a trial whose worker is silent this many "
                        "seconds (killed) is failed and retried once")
    parser.add_argument("--report", action="store_true", help="only rewrite the report of the study")
    args = parser.parse_args(argv)
    args.study = args.study or Path(args.space).stem
    args.prune_after_trials = None if args.pruner == "none" else args.prune_after_trials
    try:
        args.storage = database_url(args.storage or f"sqlite:///{(TUNE_DIR / 'studies.db').resolve()}")
    except ArgumentError as err:
        parser.error(f"--storage: {err}")
    return args


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = parse_args(argv)
    TUNE_DIR.mkdir(exist_ok=True)
    params = read_yaml(Path(PARAMS_FILE).read_text(), str(PARAMS_FILE))
    try:
        space = load_space(args.space, params)
        check_seeds(args.seeds, params, str(PARAMS_FILE))
    except ParamsError as err:
        raise SystemExit(f"tools.tune: {err}") from None
    # --report reads a study: the metric it recorded stands in for its task's (own data need not be prepared here)
    study = make_study(args, None) if args.report else None
    recorded = study.user_attrs.get("metric") if study else None
    metric, direction = objective_metric(with_fixed(params, space.fixed), args.metric or recorded)
    study = study or make_study(args, direction)
    study.set_metric_names([f"validation.{metric}"])
    args.seeds = settle_study(study, args.seeds, params["train"]["seed"], space, metric, params)
    out = REPORTS / args.study
    if not args.report and finished(study) < args.trials:
        log.info("Study %s (%s, %s validation.%s): %d of %d trials finished; storage %s", args.study,
                 direction, "mean over seeds " + " ".join(map(str, args.seeds)), metric, finished(study), args.trials,
                 shown(args.storage))
        stop = optuna.study.MaxTrialsCallback(args.trials, states=FINISHED)
        objective = Objective(args, space, metric)
        try:
            study.optimize(objective, callbacks=[stop], timeout=args.timeout, catch=(TrialFailed,),
                           gc_after_trial=False)
        except KeyboardInterrupt:
            log.warning("Interrupted: the running trial is marked FAIL and not retried; the same command continues "
                        "the study")
            sys.exit(130)
        if objective.failures >= MAX_FAILURES_IN_A_ROW:
            raise SystemExit(f"tools.tune: {objective.failures} trials failed in a row; see {objective.last_log}")
    if not study.get_trials(deepcopy=False):
        raise SystemExit(f"tools.tune: study {args.study} has no trials in {shown(args.storage)}: nothing to report; "
                         f"{out}/ is left as it is")
    write_report(study, space, metric, params, out)


if __name__ == "__main__":
    main()
