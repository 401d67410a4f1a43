"""The collapse check (finetune/evaluate/collapse.py): the constant baseline of every metric, the rule, the warning,
and the train and evaluate stages on a tiny model forced to predict one class and on one whose predictions follow the
gold."""

import logging

import numpy as np
import pytest
import torch

from finetune.evaluate import predictions
from finetune.evaluate.collapse import collapse_check, constant_baseline, end_of_run, warn_if_collapsed
from finetune.evaluate.evaluation import load_metric, score
from finetune.evaluate.predictions import evaluate_model
from finetune.tasks import glue_task, own_task
from finetune.train import recipe as training
from finetune.train.recipe import train
from tests.helpers import force_one_class, save_collapsed_model, tiny_params

MRPC, RTE = glue_task("mrpc"), glue_task("rte")
THREE = own_task(("text",), ("a", "b", "c"))


def warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "finetune.evaluate.collapse" and r.levelno == logging.WARNING]


def baseline(task, train_labels, gold):
    return constant_baseline(task, load_metric(task), train_labels, gold)


def gold(share: float, n: int = 100, majority: int = 1, other: int = 0) -> np.ndarray:
    """``n`` labels, ``share`` of them ``majority`` and the rest ``other``."""
    return np.array([majority] * round(share * n) + [other] * (n - round(share * n)))


# The baseline: train's majority class (or mean score) predicted for every row, scored by the task's metric.

@pytest.mark.parametrize("task,train_labels,gold_labels,expected", [
    (RTE, [0, 0, 1], gold(0.527, 1000, 0, 1), {"class": "entailment", "share": 0.527, "accuracy": 0.527}),
    # F1 of the positive class: 2p / (1 + p) when it is the majority; 0 when the negative class is
    (MRPC, [1, 1, 0], gold(0.6), {"class": "equivalent", "share": 0.6, "accuracy": 0.6, "f1": 0.75}),
    # train's majority, not the evaluated split's: a trivial model learns it from train
    (MRPC, [0, 0, 1], gold(0.6), {"class": "not_equivalent", "share": 0.4, "accuracy": 0.4, "f1": 0.0}),
    (glue_task("cola"), [1, 1, 0], gold(0.69), {"class": "acceptable", "share": 0.69, "matthews_correlation": 0.0}),
    # macro-F1: 2p / (1 + p) over the three classes; ties in train go to the lowest id
    (THREE, [1, 1, 2, 2, 0], np.array([1] * 6 + [2] * 4 + [0] * 2), {"class": "b", "share": 0.5, "accuracy": 0.5,
                                                                     "macro_f1": 0.2222}),
    (own_task(("t",), ("no", "yes"), "no"), [1, 1, 0], gold(0.6), {"class": "yes", "share": 0.6, "accuracy": 0.6,
                                                                   "f1": 0.0}),  # F1 of 'no'
    # regression: train's mean; a constant's correlations are 0, its MSE the gold's spread around that mean
    (own_task(("t",), None), [1.0, 2.0, 3.0], np.array([0.0, 2.0, 4.0, 2.0]),
     {"mean": 2.0, "pearson": 0.0, "spearmanr": 0.0, "mse": 2.0}),
], ids=["rte", "mrpc", "mrpc-negative-majority", "cola", "three-classes", "binary-pos-no", "regression"])
def test_the_baseline_is_the_constant_model_scored_by_the_tasks_metric(task, train_labels, gold_labels, expected):
    assert baseline(task, train_labels, gold_labels) == expected


# The rule: one class for nearly every row, or the main metric no better than the baseline.

def test_a_model_that_follows_the_gold_has_not_collapsed_and_one_that_predicts_one_class_has(caplog):
    labels = gold(0.6)
    base = baseline(MRPC, [1, 1, 0], labels)
    metric = load_metric(MRPC)
    follows = collapse_check(MRPC, score(metric, MRPC, labels, labels), labels, base)
    assert follows == {"baseline": base, "most_predicted": {"class": "equivalent", "share": 0.6}, "collapsed": False}

    ones = np.zeros_like(labels)
    metrics = score(metric, MRPC, ones, labels)
    report = collapse_check(MRPC, metrics, ones, base)
    assert report["most_predicted"] == {"class": "not_equivalent", "share": 1.0} and report["collapsed"]
    with caplog.at_level(logging.WARNING, logger="finetune.evaluate.collapse"):
        warn_if_collapsed("validation", MRPC, {}, follows)
        assert not warnings(caplog)
        warn_if_collapsed("validation", MRPC, metrics, report)
    assert warnings(caplog) == [
        "validation: the model looks collapsed (one class for nearly every row, or no better than a constant model): "
        "it predicts 'not_equivalent' for 100.0% of the rows; f1 0.0000 against 0.7500 by always predicting train's "
        "majority class 'equivalent' (60.0% of the rows). Try another train.lr (a lower one first), more "
        "train.epochs, model.pooling: mean, or another model.checkpoint"]


def test_each_half_of_the_rule():
    metric = load_metric(RTE)
    labels = gold(0.6, 100, 0, 1)
    base = baseline(RTE, [0, 0, 1], labels)
    # No better than the baseline with both classes predicted half the time each.
    halves = np.arange(100) % 2
    report = collapse_check(RTE, score(metric, RTE, halves, labels), halves, base)
    assert report["most_predicted"]["share"] == 0.5 and report["collapsed"]
    # Better than the baseline, but one class for 96 % of the rows: collapsed all the same.
    nearly = np.where(np.arange(100) < 96, 0, labels)
    metrics = score(metric, RTE, nearly, labels)
    assert metrics["accuracy"] > base["accuracy"] and collapse_check(RTE, metrics, nearly, base)["collapsed"]
    # Gold as skewed as that: predicting its majority for 97 % of the rows may be right.
    skewed = gold(0.97, 100, 0, 1)
    right = collapse_check(RTE, score(metric, RTE, skewed, skewed), skewed, baseline(RTE, [0, 0, 1], skewed))
    assert right["most_predicted"]["share"] == 0.97 and not right["collapsed"]


def test_regression_collapses_when_it_does_not_correlate(caplog):
    task = own_task(("t",), None)
    scores = np.array([0.5, 1.0, 3.0, 4.5, 2.0])
    base = baseline(task, [1.0, 2.0, 3.0], scores)
    metric = load_metric(task)
    assert collapse_check(task, score(metric, task, scores, scores), scores, base) == {"baseline": base,
                                                                                      "collapsed": False}
    constant = np.full(5, 2.2)
    metrics = score(metric, task, constant, scores)
    report = collapse_check(task, metrics, constant, base)
    with caplog.at_level(logging.WARNING, logger="finetune.evaluate.collapse"):
        warn_if_collapsed("test", task, metrics, report)
    [warning] = warnings(caplog)
    assert report["collapsed"] and "constant model): its pearson 0.0000 against 0.0000 by always predicting " \
                                   "train's mean score 2.0. Try " in warning


# The stages: train notes each collapsed epoch at INFO and warns once, at the end, when the kept model collapsed;
# evaluate warns and writes the check.

def collapse_records(caplog) -> list[tuple[str, str]]:
    return [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "finetune.evaluate.collapse"]


def test_training_a_model_forced_to_one_class_notes_every_epoch_and_warns_once(tiny_project, tiny_raw, monkeypatch,
                                                                              caplog):
    load_classifier = training.load_classifier
    monkeypatch.setattr(training, "load_classifier", lambda *args: force_one_class(load_classifier(*args), 0))
    with caplog.at_level(logging.INFO, logger="finetune.evaluate.collapse"):
        metrics = train(tiny_params(), tiny_project())
    records = collapse_records(caplog)
    notes = ("no better than a constant model yet: it predicts 'not_equivalent' for 100.0% of the rows; f1 0.0000 "
             "against ")
    assert [(level, m.split(notes)[0]) for level, m in records[:2]] == [
        ("INFO", "validation, epoch 1: "), ("INFO", "validation, epoch 2: ")]
    [(level, verdict)] = records[2:]
    assert level == "WARNING" and verdict.startswith(
        "Collapse check on validation: the kept model (epoch 2) looks collapsed, and every epoch (2) was: it predicts "
        "'not_equivalent' for 100.0% of the rows; f1 0.0000 against ") and verdict.endswith("another model.checkpoint")
    assert metrics["collapse"] == {"collapsed_epochs": [1, 2], "kept_model_collapsed": True}
    majority = int(np.bincount(tiny_raw["train"]["label"]).argmax())
    assert metrics["validation_baseline"] == baseline(MRPC, tiny_raw["train"]["label"], tiny_raw["validation"]["label"])
    assert metrics["validation_baseline"]["class"] == MRPC.label_names[majority]


def validation_by_epoch(collapsed_epochs: set[int]):
    """An ``evaluate_split`` whose n-th call (in training: epoch n) predicts one class for every row when n is in
    ``collapsed_epochs``, else the gold labels: a run that collapses and recovers, without training to get there."""
    calls = []

    def fake(predictor, rows, metric, p, desc):
        calls.append(desc)
        task, labels = predictor.task, torch.tensor(rows["labels"])
        predicted = torch.zeros_like(labels) if len(calls) in collapsed_epochs else labels
        logits = 10.0 * torch.nn.functional.one_hot(predicted, task.num_labels).float()
        return {"loss": 0.5, **score(metric, task, predicted.numpy(), labels.numpy())}, logits

    return fake


def test_a_run_that_recovers_after_a_collapsed_epoch_does_not_warn(tiny_project, monkeypatch, caplog):
    monkeypatch.setattr(training, "evaluate_split", validation_by_epoch({1}))
    with caplog.at_level(logging.INFO, logger="finetune.evaluate.collapse"):
        metrics = train(tiny_params(train={"keep_best": True}), tiny_project())  # epoch 2 is the best
    records = collapse_records(caplog)
    assert [level for level, _ in records] == ["INFO", "INFO"]
    assert records[0][1].startswith("validation, epoch 1: no better than a constant model yet: it predicts "
                                    "'not_equivalent' for 100.0% of the rows; f1 0.0000 against ")
    assert records[1][1] == ("Collapse check on validation: epoch 1 of 2 was no better than a constant model; the "
                             "kept model (epoch 2) is not collapsed")
    assert metrics["best_epoch"] == 2 and metrics["collapse"] == {"collapsed_epochs": [1],
                                                                  "kept_model_collapsed": False}


def test_a_kept_model_that_collapsed_warns_even_when_an_earlier_epoch_did_not(tiny_project, monkeypatch, caplog):
    monkeypatch.setattr(training, "evaluate_split", validation_by_epoch({2}))
    with caplog.at_level(logging.INFO, logger="finetune.evaluate.collapse"):
        metrics = train(tiny_params(train={"keep_best": False}), tiny_project())  # the last epoch's is kept
    (_, note), (level, verdict) = collapse_records(caplog)
    assert note.startswith("validation, epoch 2: no better than a constant model yet") and level == "WARNING"
    assert verdict.startswith("Collapse check on validation: the kept model (epoch 2) looks collapsed, and epoch 2 of "
                              "2 was: it predicts 'not_equivalent' for 100.0% of the rows")
    assert metrics["collapse"] == {"collapsed_epochs": [2], "kept_model_collapsed": True}


def test_the_verdict_names_the_collapsed_epochs(caplog):
    with caplog.at_level(logging.INFO, logger="finetune.evaluate.collapse"):
        assert end_of_run({"1": "x", "2": "y"}, 4, 3) == {"collapsed_epochs": [1, 2], "kept_model_collapsed": False}
        assert end_of_run({"2": "y", "3": "z"}, 4, 3) == {"collapsed_epochs": [2, 3], "kept_model_collapsed": True}
    assert collapse_records(caplog) == [
        ("INFO", "Collapse check on validation: epochs 1, 2 of 4 were no better than a constant model; the kept model "
                 "(epoch 3) is not collapsed"),
        ("WARNING", "Collapse check on validation: the kept model (epoch 3) looks collapsed, and epochs 2, 3 of 4 "
                    "were: z. Try another train.lr (a lower one first), more train.epochs, model.pooling: mean, or "
                    "another model.checkpoint")]


def test_a_run_with_no_collapsed_epoch_says_so_at_info(tiny_project, monkeypatch, caplog):
    monkeypatch.setattr(training, "evaluate_split", validation_by_epoch(set()))
    with caplog.at_level(logging.INFO, logger="finetune.evaluate.collapse"):
        metrics = train(tiny_params(), tiny_project())
    assert collapse_records(caplog) == [("INFO", "Collapse check on validation: no epoch of 2 was collapsed")]
    assert metrics["collapse"] == {"collapsed_epochs": [], "kept_model_collapsed": False}


def test_evaluate_writes_the_check_of_a_collapsed_model_and_warns(tiny_project, tiny_raw, caplog):
    paths = tiny_project()
    save_collapsed_model(paths, MRPC, winner=1)
    with caplog.at_level(logging.WARNING, logger="finetune.evaluate.collapse"):
        results = evaluate_model(tiny_params(), paths)
    for split in ("validation", "test"):
        expected = baseline(MRPC, tiny_raw["train"]["label"], tiny_raw[split]["label"])
        assert results[split]["baseline"] == expected
        # One class for every row: the metrics are the baseline's when it is train's majority.
        assert results[split]["most_predicted"] == {"class": "equivalent", "share": 1.0}
        assert results[split]["collapsed"] is True
        if expected["class"] == "equivalent":
            assert (results[split]["accuracy"], results[split]["f1"]) == (expected["accuracy"], expected["f1"])
    assert [m.split(": ")[0] for m in warnings(caplog)] == ["validation", "test"]


def test_evaluate_of_a_model_that_follows_the_gold_does_not_warn(tiny_project, monkeypatch, caplog):
    paths = tiny_project()
    save_collapsed_model(paths, MRPC, winner=1)  # its weights are not used: the logits follow the gold
    monkeypatch.setattr(predictions, "evaluate_split", validation_by_epoch(set()))
    with caplog.at_level(logging.WARNING, logger="finetune.evaluate.collapse"):
        results = evaluate_model(tiny_params(evaluate={"splits": ["validation"]}), paths)
    assert results["validation"]["collapsed"] is False and results["validation"]["f1"] == 1.0
    assert not warnings(caplog)
