"""The collapse check: does the model beat a constant one?

A model trained with another task's settings can end up predicting one class for every row (RTE and WNLI at MRPC's
learning rate, issue 21) while every stage exits 0. The train stage checks validation after every epoch (an INFO
line per collapsed epoch: early epochs often are) and warns at the end of the run only when the kept model collapsed;
the evaluate stage checks every labeled split: a WARNING in the log, and in metrics/eval.json the check beside the
metrics.

The baseline is what a trivial model learns from the train split: its majority class (ties: the lowest id), or for
regression its mean score, predicted for every row of the evaluated split and scored by the task's own metric
(``finetune.evaluate.evaluation.score``, finetune/evaluate/glue_metric.py), so it is right for every task. With ``p`` the share of
that class in the evaluated split: accuracy ``p``; F1 of the positive class ``2p / (1 + p)`` when that class is the
positive one, else 0; macro-F1 ``2p / (1 + p)`` over the number of classes in gold or prediction (scikit-learn's
average); Matthews correlation 0, Pearson and Spearman 0 (a constant predictor's: scikit-learn's Matthews returns 0.0,
glue_metric's correlations follow it); MSE the mean squared distance of the gold scores from train's mean.

A split is ``collapsed`` when the task's main metric (its first, ``Task.metrics[0]``) is no better than the
baseline's, at the 4 decimals written, or when one class is predicted for at least ``ONE_CLASS`` of the rows while
train's majority class covers less than that of the gold rows (data that skewed may be predicted so rightly).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import numpy as np

from finetune.tasks import LOWER_IS_BETTER, Task

if TYPE_CHECKING:  # the card stage reads the verdicts without importing evaluate (and with it transformers.pipelines)
    import evaluate

log = logging.getLogger(__name__)

ONE_CLASS = 0.95  # the share of rows predicted as one class that counts as collapsed


def constant_baseline(task: Task, metric: evaluate.EvaluationModule, train_labels, gold) -> dict:
    """The constant model of ``train_labels`` (``[train examples]``) scored on ``gold`` (``[examples]``, the evaluated
    split's labels, any order).

    Returns:
        classification ``{"class": <train's majority class name>, "share": <its share of gold>, <the task's metrics>}``;
        regression ``{"mean": <train's mean score>, <the task's metrics>}``; values rounded to 4 decimals.
    """
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
    """The check of one split: ``metrics`` (its task metrics), ``predictions`` (``[examples]``: class ids, or scores)
    and its ``constant_baseline``.

    Returns:
        ``{"baseline": baseline, "most_predicted": {"class", "share"}, "collapsed": bool}`` (no ``most_predicted``
        for regression); the rule is in the module's docstring.
    """
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
    """The constant model of ``baseline`` (``constant_baseline``) in words: "train's majority class 'x' (68.4% of
    the rows)", or for regression "train's mean score 2.7"."""
    if "class" in baseline:
        return f"train's majority class {baseline['class']!r} ({baseline['share']:.1%} of the rows)"
    return f"train's mean score {baseline['mean']}"


ADVICE = ("Try another train.lr (a lower one first), more train.epochs, model.pooling: mean, or another "
          "model.checkpoint")


def describe_collapse(task: Task, metrics: dict, report: dict) -> str:
    """What a collapsed split's model does, in words: the class it predicts and for what share of the rows, and its
    main metric against the constant model's (``report``: ``collapse_check``; ``metrics``: the split's)."""
    base, main, most = report["baseline"], task.metrics[0], report.get("most_predicted")
    predicts = f"it predicts {most['class']!r} for {most['share']:.1%} of the rows; " if most else "its "
    constant = describe_constant(base)
    return f"{predicts}{main} {metrics[main]:.4f} against {base[main]:.4f} by always predicting {constant}"


def warn_if_collapsed(where: str, task: Task, metrics: dict, report: dict) -> None:
    """Log a WARNING naming ``where`` (the split), what the model predicts, the main metric against the baseline's,
    and what to try, when ``report`` (``collapse_check``) says collapsed: the evaluate stage's check of the final
    model."""
    if report["collapsed"]:
        log.warning("%s: the model looks collapsed (one class for nearly every row, or no better than a constant "
                    "model): %s. %s", where, describe_collapse(task, metrics, report), ADVICE)


def note_evaluation(point: int, task: Task, metrics: dict, report: dict, unit: str = "epoch") -> str | None:
    """The collapse check of one validation in training (after epoch ``point``, or at optimizer step ``point`` with
    ``unit`` 'step'): an INFO line when ``report`` says collapsed (an early evaluation often is, before the model has
    learned: the end of the run decides, ``end_of_run``).

    Returns:
        the description (``describe_collapse``) when collapsed, else None.
    """
    if not report["collapsed"]:
        return None
    about = describe_collapse(task, metrics, report)
    log.info("validation, %s %d: no better than a constant model yet: %s", unit, point, about)
    return about


def end_of_run(collapsed: dict[str, str], evaluations: int, kept: int, unit: str = "epoch") -> dict:
    """The run's collapse verdict, logged in one line: a WARNING (with what to try) when the kept model's evaluation
    collapsed, which includes every evaluation having collapsed; else INFO naming the evaluations that did, if any.

    Args:
        collapsed: ``{str(point): description}`` of the collapsed evaluations (``note_evaluation``'s results), a
            point being an epoch, or an optimizer step with ``unit`` 'step' (``train.eval_every_steps``).
        evaluations: the evaluations run; kept: the point (epoch or step) whose model is kept.

    Returns:
        ``{"collapsed_<unit>s": [...], "kept_model_collapsed": bool}`` for metrics/train.json.
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
