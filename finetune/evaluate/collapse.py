"""The collapse check: does the model beat a constant one? The constant model predicts train's majority class (ties:
the lowest id), or for regression train's mean score, for every row, and is scored by the task's own metric
(``finetune.evaluate.evaluation.score``). A split is collapsed when the task's main metric (``Task.metrics[0]``),
rounded to 4 decimals, is no better than the constant model's, or when one class is predicted for at least
``ONE_CLASS`` of the rows while train's majority class covers less than that of the gold rows. Used per validation
in training (``note_evaluation``, ``end_of_run``) and per labeled split by the evaluate stage
(``warn_if_collapsed``).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import numpy as np

from finetune.tasks import LOWER_IS_BETTER, Task

if TYPE_CHECKING:  # the card stage imports this module without importing evaluate (and transformers.pipelines)
    import evaluate

log = logging.getLogger(__name__)

ONE_CLASS = 0.95  # the share of rows predicted as one class that counts as collapsed


def constant_baseline(task: Task, metric: evaluate.EvaluationModule, train_labels, gold) -> dict:
    """The constant model of ``train_labels`` (train's class ids or scores ``[train examples]``) scored on ``gold``
    (``[examples]``, any order): classification ``{"class": <train's majority class name>, "share": <its share of
    gold>, <the task's metrics>}``; regression ``{"mean": <train's mean score>, <the task's metrics>}``; values rounded
    to 4 decimals."""
    # heavy: the card stage imports this module; evaluation loads evaluate and torch
    from finetune.evaluate.evaluation import score

    train_labels, gold = np.asarray(train_labels), np.asarray(gold)
    if task.is_regression:
        constant = float(train_labels.mean())
        about = {"mean": round(constant, 4)}
    else:
        constant = int(np.bincount(train_labels, minlength=task.num_labels).argmax())
        about = {"class": task.label_names[constant], "share": round(float(np.mean(gold == constant)), 4)}
    scores = score(metric, task, np.full(len(gold), constant), gold)
    return {**about, **{name: round(value, 4) for name, value in scores.items()}}


def collapse_check(task: Task, metrics: dict, predictions, baseline: dict) -> dict:
    """The collapse check (the rule: module docstring) of one split's task ``metrics`` and ``predictions`` (class ids or
    scores ``[examples]``) against its ``constant_baseline``: ``{"baseline": baseline, "most_predicted": {"class",
    "share"}, "collapsed": bool}``; no ``most_predicted`` for regression."""
    report, one_class = {"baseline": baseline}, False
    if not task.is_regression:
        counts = np.bincount(np.asarray(predictions), minlength=task.num_labels)
        share = float(counts.max() / counts.sum())
        report["most_predicted"] = {"class": task.label_names[int(counts.argmax())], "share": round(share, 4)}
        one_class = share >= ONE_CLASS and baseline["share"] < ONE_CLASS
    main = task.metrics[0]
    value = round(metrics[main], 4)
    no_better = value >= baseline[main] if main in LOWER_IS_BETTER else value <= baseline[main]
    return {**report, "collapsed": bool(one_class or no_better)}


def describe_constant(baseline: dict) -> str:
    """The constant model of ``baseline`` (``constant_baseline``) in words: ``train's majority class 'x'
    (68.4% of the rows)``, or for regression ``train's mean score 2.7``.
    """
    if "class" in baseline:
        return f"train's majority class {baseline['class']!r} ({baseline['share']:.1%} of the rows)"
    return f"train's mean score {baseline['mean']}"


ADVICE = ("Try another train.lr (a lower one first), more train.epochs, model.pooling: mean, or another "
          "model.checkpoint")


def describe_collapse(task: Task, metrics: dict, report: dict) -> str:
    """A collapsed split's model in words: the class it predicts and for what share of the rows, and its main
    metric against the constant model's (``report``: ``collapse_check``; ``metrics``: the split's).
    """
    base, main, most = report["baseline"], task.metrics[0], report.get("most_predicted")
    predicts = f"it predicts {most['class']!r} for {most['share']:.1%} of the rows; " if most else "its "
    constant = describe_constant(base)
    return f"{predicts}{main} {metrics[main]:.4f} against {base[main]:.4f} by always predicting {constant}"


def warn_if_collapsed(where: str, task: Task, metrics: dict, report: dict) -> None:
    """Log a WARNING when ``report`` (``collapse_check``) says collapsed, naming ``where`` (the split), what
    the model predicts, its main metric against the constant model's, and what to try.
    """
    if report["collapsed"]:
        log.warning("%s: the model looks collapsed (one class for nearly every row, or no better than a constant "
                    "model): %s. %s", where, describe_collapse(task, metrics, report), ADVICE)


def note_evaluation(point: int, task: Task, metrics: dict, report: dict, unit: str = "epoch") -> str | None:
    """The collapse check of one validation in training (``report``: its ``collapse_check``; ``point``: the epoch, or
    the optimizer step with ``unit`` ``step``): when collapsed, an INFO line and the description
    (``describe_collapse``); else None."""
    if not report["collapsed"]:
        return None
    about = describe_collapse(task, metrics, report)
    log.info("validation, %s %d: no better than a constant model yet: %s", unit, point, about)
    return about


def end_of_run(collapsed: dict[str, str], evaluations: int, kept: int, unit: str = "epoch") -> dict:
    """The run's collapse verdict, logged in one line: a WARNING (with what to try) when the kept model's evaluation
    collapsed, else INFO naming the collapsed evaluations, if any.

    Args:
        collapsed: ``{str(point): description}`` of the collapsed evaluations (``note_evaluation``).
        kept: the point (epoch or step) whose model is kept.
        unit: ``epoch``, or ``step`` with ``train.eval_every_steps``.

    Returns:
        ``{"collapsed_<unit>s": [points], "kept_model_collapsed": bool}`` for metrics/train.json.
    """
    which = sorted(int(point) for point in collapsed)
    about = collapsed.get(str(kept))
    of = f"of {evaluations}" if unit == "epoch" else f"(of {evaluations} evaluations)"
    some = (f"{unit} {which[0]} {of} was" if len(which) == 1 else f"{unit}s {', '.join(map(str, which))} {of} were")
    if about is not None:
        every = f"every {unit if unit == 'epoch' else 'evaluation'} ({evaluations}) was" if len(which) == evaluations \
            else some
        log.warning("Collapse check on validation: the kept model (%s %d) looks collapsed, and %s: %s. %s",
                    unit, kept, every, about, ADVICE)
    elif which:
        log.info("Collapse check on validation: %s no better than a constant model; the kept model (%s %d) is "
                 "not collapsed", some, unit, kept)
    else:
        log.info("Collapse check on validation: no %s of %d was collapsed", unit, evaluations)
    return {f"collapsed_{unit}s": which, "kept_model_collapsed": about is not None}
