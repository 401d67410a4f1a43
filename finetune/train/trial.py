"""The training loop's hook for a hyperparameter search (``tools.tune``): report each validation to the Optuna trial
named by ``$FINETUNE_TRIAL`` and stop when its pruner says so; a no-op without one
(https://optuna.readthedocs.io/en/stable/tutorial/10_key_features/003_efficient_optimization_algorithms.html).
"""

from __future__ import annotations

import json
import logging
import os
import warnings
from dataclasses import dataclass

log = logging.getLogger(__name__)

TRIAL_ENV = "FINETUNE_TRIAL"


def open_storage(url: str, heartbeat_seconds: int | None = None, grace_seconds: int | None = None):
    """Optuna's ``RDBStorage`` at ``url``: ``sqlite:///<absolute path>``, ``postgresql://…`` or ``mysql://…``.

    Args:
        heartbeat_seconds: the worker's heartbeat interval in seconds; None: no heartbeat.
        grace_seconds: a trial whose worker was silent this many seconds is failed and retried once
            (``RetryHeartbeatStaleTrialCallback``) when a worker next starts a trial.
    """
    # optional: Optuna is loaded only by a search (tools.tune) and by a run that has a trial
    import optuna
    from optuna.storages import RDBStorage, RetryHeartbeatStaleTrialCallback

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)  # heartbeats, metric names
    if heartbeat_seconds is None:
        return RDBStorage(url)
    return RDBStorage(url, heartbeat_interval=heartbeat_seconds, grace_period=grace_seconds,
                      heartbeat_stale_trial_callback=RetryHeartbeatStaleTrialCallback(max_retry=1))


def make_pruner(prune_after_trials: int | None, prune_from: int = 1):
    """Optuna's ``MedianPruner(n_startup_trials=prune_after_trials, n_warmup_steps=prune_from)``, or ``NopPruner``
    when ``prune_after_trials`` is None. Optuna stores no pruner: the search and the train stage's hook each build it.
    """
    import optuna  # optional: only a search (tools.tune) and a run with a trial build a pruner

    if prune_after_trials is None:
        return optuna.pruners.NopPruner()
    return optuna.pruners.MedianPruner(n_startup_trials=prune_after_trials, n_warmup_steps=prune_from)


def trial_env(storage: str, study: str, trial_id: int, metric: str | None = None,
              prune_after_trials: int | None = None, prune_from: int = 1) -> dict[str, str]:
    """``{"FINETUNE_TRIAL": <JSON>}``: the environment that makes the train stage report validation ``metric``
    (None: its ``metric_for_best``) to trial ``trial_id`` of ``study`` in ``storage``, pruned by
    ``make_pruner(prune_after_trials, prune_from)``.
    """
    return {TRIAL_ENV: json.dumps({"storage": storage, "study": study, "trial_id": trial_id, "metric": metric,
                                   "prune_after_trials": prune_after_trials, "prune_from": prune_from})}


@dataclass
class TrialReport:
    """Reports validations of this run to one Optuna trial (``optuna.trial.Trial.report``) and says whether the
    pruner stops it (``should_prune``)."""

    trial: object  # optuna.trial.Trial
    metric: str

    def report(self, validation: dict[str, float], point: int) -> bool:
        """Report ``validation[metric]`` of the evaluation at ``point`` (epoch, or optimizer step); True: prune now."""
        self.trial.report(validation[self.metric], point)
        if self.trial.should_prune():
            log.warning("Search: trial %d pruned at %d: validation %s %.4f is below the median of earlier trials "
                        "there (Optuna's pruner); the run stops, keeping what it ran", self.trial.number, point,
                        self.metric, validation[self.metric])
            return True
        return False


def trial_from_env(metric: str) -> TrialReport | None:
    """The trial named by ``$FINETUNE_TRIAL``, reporting the metric it names or else ``metric`` (the run's
    ``metric_for_best``); None when the variable is unset: no search runs and nothing of Optuna is imported.

    Raises:
        ValueError: the variable is set but not the JSON ``trial_env`` writes (the message names it).
    """
    raw = os.environ.get(TRIAL_ENV)
    if not raw:
        return None
    try:
        where = json.loads(raw)
        storage, study_name, trial_id = where["storage"], where["study"], int(where["trial_id"])
        pruner = make_pruner(where.get("prune_after_trials"), where.get("prune_from", 1))
        metric = where.get("metric") or metric
    except (ValueError, KeyError, TypeError) as err:
        raise ValueError(f"${TRIAL_ENV}: expected JSON with storage, study and trial_id, got {raw!r}") from err
    import optuna  # optional: only a run with a trial (set by tools.tune) loads Optuna

    study = optuna.load_study(study_name=study_name, storage=open_storage(storage), pruner=pruner)
    log.info("Search: reporting validation %s to trial %s of study %s", metric, trial_id, study_name)
    return TrialReport(optuna.trial.Trial(study, trial_id), metric)
