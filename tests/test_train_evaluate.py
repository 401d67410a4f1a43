"""Train and evaluate stages on a tiny random BERT: outputs, loading, determinism, metrics."""

import json

import numpy as np
import pandas as pd
import pytest
import torch
from datasets import DatasetDict, load_from_disk
from safetensors.torch import load_file
from sklearn.metrics import accuracy_score, f1_score
from transformers import AutoModelForSequenceClassification, pipeline

from finetune.evaluate.evaluation import load_metric
from finetune.evaluate.predictions import evaluate_model
from finetune.tasks import glue_task
from finetune.train.recipe import train
from tests.helpers import make_project, reset_accelerate, tiny_params

MRPC = glue_task("mrpc")


@pytest.fixture(scope="module")
def finetuned(tiny_raw, tiny_checkpoint, tmp_path_factory):
    """A project whose model was trained for 2 epochs with the tiny params, and the train metrics."""
    paths = make_project(tmp_path_factory.mktemp("run"), tiny_params(), tiny_raw, tiny_checkpoint)
    metrics = train(tiny_params(), paths)
    reset_accelerate()
    return paths, metrics


def test_train_reports_steps_loss_and_speed(finetuned):
    _, metrics = finetuned
    assert metrics["steps"] == 10 and metrics["epochs"] == 2  # 40 examples / batch 8 = 5 steps per epoch
    assert metrics["train_samples"] == 80
    assert np.isfinite(metrics["final_loss"]) and np.isfinite(metrics["mean_loss"])
    assert metrics["train_seconds"] > 0 and metrics["samples_per_second"] > 0


def test_finetuned_model_loads_with_labels_and_pipeline(finetuned):
    paths, _ = finetuned
    model = AutoModelForSequenceClassification.from_pretrained(paths.trained)
    assert model.config.id2label == {0: "not_equivalent", 1: "equivalent"}
    classify = pipeline("text-classification", model=str(paths.trained))
    [result] = classify([{"text": "The court rejected the appeal.",
                          "text_pair": "The appeal was rejected by the court."}])
    assert result["label"] in {"not_equivalent", "equivalent"} and 0 <= result["score"] <= 1


def test_max_steps_overrides_epochs(tiny_project):
    params = tiny_params(train={"max_steps": 7})
    metrics = train(params, tiny_project(params=params))
    assert (metrics["steps"], metrics["epochs"]) == (7, 2)


def test_same_seed_gives_identical_weights(finetuned, tiny_project):
    paths, _ = finetuned
    again = tiny_project("again")
    train(tiny_params(), again)
    first, second = load_file(paths.trained / "model.safetensors"), load_file(again.trained / "model.safetensors")
    assert first.keys() == second.keys()
    assert all(torch.equal(first[k], second[k]) for k in first)


def test_mrpc_metric_matches_scikit_learn():
    rng = np.random.default_rng(0)
    for n in (1, 7, 100, 1000):
        refs, preds = rng.integers(0, 2, n), rng.integers(0, 2, n)
        metric = load_metric(MRPC)
        for start in range(0, n, 32):
            metric.add_batch(predictions=preds[start:start + 32], references=refs[start:start + 32])
        result = metric.compute()
        assert result["accuracy"] == pytest.approx(accuracy_score(refs, preds))
        assert result["f1"] == pytest.approx(f1_score(refs, preds, zero_division=0.0))
    assert load_metric(MRPC).compute(predictions=[0, 0], references=[0, 0]) == {"accuracy": 1.0, "f1": 0.0}


def test_evaluate_writes_metrics_predictions_and_plots(finetuned, tiny_raw):
    paths, _ = finetuned
    params = tiny_params(evaluate={"batch_size": 4, "splits": ["validation", "test"]})
    results = evaluate_model(params, paths)
    for split in ("validation", "test"):
        table = pd.read_csv(paths.predictions / f"{split}.csv")
        assert list(table.columns) == ["idx", "sentence1", "sentence2", "label", "prediction",
                                       "probability_not_equivalent", "probability_equivalent"]
        assert table["idx"].tolist() == tiny_raw[split]["idx"]
        assert set(table["label"]) <= {"not_equivalent", "equivalent"}
        assert ((table["probability_equivalent"] >= 0.5) == (table["prediction"] == "equivalent")).all()
        assert np.allclose(table["probability_equivalent"] + table["probability_not_equivalent"], 1, atol=1e-4)
        assert results[split]["examples"] == len(table)
        accuracy = accuracy_score(table["label"], table["prediction"])
        assert results[split]["accuracy"] == pytest.approx(accuracy, abs=1e-4)
        assert results[split]["f1"] == pytest.approx(
            f1_score(table["label"], table["prediction"], pos_label="equivalent"), abs=1e-4)
        cells = json.loads((paths.eval_logs / "plots" / "sklearn" / split / "confusion_matrix.json").read_text())
        assert {cell["actual"] for cell in cells} <= {"not_equivalent", "equivalent"}
        for plot in ("confusion_matrix", "precision_recall", "roc"):
            assert (paths.eval_logs / "plots" / "sklearn" / split / f"{plot}.json").is_file()


def test_predictions_written_in_chunks_equal_one_table(tiny_raw, tmp_path, monkeypatch):
    import torch

    from finetune.evaluate import predictions
    from finetune.tasks import glue_task

    task, split = glue_task("mrpc"), tiny_raw["validation"]  # 21 rows
    logits = torch.randn(len(split), 2, generator=torch.Generator().manual_seed(0))
    predictions.prediction_table(split, logits, task).to_csv(tmp_path / "whole.csv", index=False)
    monkeypatch.setattr(predictions, "CHUNK_ROWS", 8)  # 8 + 8 + 5
    predictions.write_predictions(split, logits, task, tmp_path / "chunks.csv")
    assert (tmp_path / "chunks.csv").read_bytes() == (tmp_path / "whole.csv").read_bytes()


def test_unlabeled_test_split_gets_predictions_only(finetuned, tiny_raw, tmp_path):
    paths, _ = finetuned
    # A prepared unlabeled split has no label column (download drops GLUE's -1 labels).
    project = make_project(tmp_path / "unlabeled", tiny_params())
    DatasetDict({**tiny_raw, "test": tiny_raw["test"].remove_columns("label")}).save_to_disk(str(project.raw))
    tokenized = load_from_disk(str(paths.tokenized))
    DatasetDict({**tokenized, "test": tokenized["test"].remove_columns("labels")}).save_to_disk(str(project.tokenized))
    MRPC.save(project.raw)
    MRPC.save(project.tokenized)
    project.trained.parent.mkdir(parents=True)
    project.trained.symlink_to(paths.trained)
    results = evaluate_model(tiny_params(evaluate={"sort_by_length": True, "splits": ["test"]}), project)
    assert results == {"test": {"examples": 19}}
    table = pd.read_csv(project.predictions / "test.csv")
    assert "label" not in table and set(table["prediction"]) <= {"not_equivalent", "equivalent"}
    assert not (project.eval_logs / "plots").exists()  # no labels, no plots


def interrupt_after_first_write(monkeypatch, module, name):
    """Make ``module.name`` (a writer) write its first output, then stop as Ctrl-C or SIGTERM would."""
    real = getattr(module, name)

    def write_then_stop(*args, **kwargs):
        real(*args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(module, name, write_then_stop)


def test_an_interrupted_tokenize_leaves_the_previous_output_and_no_scratch(tiny_raw, tiny_checkpoint, tmp_path,
                                                                          monkeypatch):
    from datasets import DatasetDict, load_from_disk

    from finetune.data.tokenized import tokenize_splits

    paths = make_project(tmp_path / "p", tiny_params(), tiny_raw, tiny_checkpoint)  # tokenized once
    before = load_from_disk(str(paths.tokenized))["train"].to_dict()
    interrupt_after_first_write(monkeypatch, DatasetDict, "save_to_disk")
    with pytest.raises(KeyboardInterrupt):
        tokenize_splits(tiny_params(tokenize={"max_length": 16}), paths)  # other rows: truncated
    assert load_from_disk(str(paths.tokenized))["train"].to_dict() == before
    assert [p.name for p in paths.tokenized.parent.iterdir() if p.name.startswith(".")] == []  # temp, scratch


def test_an_interrupted_evaluate_leaves_the_previous_predictions(finetuned, monkeypatch):
    from finetune.evaluate import predictions

    paths, _ = finetuned
    params = tiny_params(evaluate={"splits": ["validation", "test"]})
    evaluate_model(params, paths)
    before = {f.name: f.read_bytes() for f in paths.predictions.iterdir()}
    interrupt_after_first_write(monkeypatch, predictions, "write_predictions")  # validation.csv written, then stopped
    with pytest.raises(KeyboardInterrupt):
        evaluate_model(params, paths)
    assert {f.name: f.read_bytes() for f in paths.predictions.iterdir()} == before
    assert not [p for p in paths.predictions.parent.iterdir() if p.name.startswith(".predictions")]


def test_one_model_one_validation_score_under_bf16(tiny_project, monkeypatch):
    # Issue 41: training validates under train.mixed_precision; the evaluate stage runs in the same precision, so the
    # kept evaluation's score in train.json is eval.json's (before, evaluate ran in fp32 and the two differed).
    from finetune.evaluate import predictions

    params = tiny_params(train={"mixed_precision": "bf16", "keep_best": True, "epochs": 2},
                         evaluate={"sort_by_length": True, "splits": ["validation"]})
    paths = tiny_project("bf16", params)
    metrics = train(params, paths)
    reset_accelerate()
    assert metrics["mixed_precision"] == "bf16"
    made, make = [], predictions.make_accelerator
    monkeypatch.setattr(predictions, "make_accelerator", lambda *args, **kw: made.append(kw) or make(*args, **kw))
    validation = evaluate_model(params, paths)["validation"]
    assert made == [{"mixed_precision": "bf16"}]  # the precision training ran in
    assert metrics["best_validation_f1"] == round(validation["f1"], 4)
    kept = pd.read_csv(paths.train_logs / "epochs" / "plots" / "metrics" / "validation" / "loss.tsv", sep="\t")
    assert round(kept.loc[kept["step"] == metrics["best_epoch"], "loss"].item(), 4) == validation["loss"]
