"""Train and evaluate stages on a tiny random BERT: outputs, loading, determinism, metrics."""

import numpy as np
import pandas as pd
import pytest
import torch
from datasets import DatasetDict, load_from_disk
from safetensors.torch import load_file
from sklearn.metrics import accuracy_score, f1_score
from transformers import AutoModelForSequenceClassification, pipeline

from stages.common import EvaluateParams
from stages.evaluate import evaluate_model
from stages.modeling import load_metric
from stages.train import train
from tests.conftest import tiny_train_params

TINY_TRAIN = tiny_train_params()


@pytest.fixture(scope="module")
def finetuned(tiny_tokenized, tiny_checkpoint, tmp_path_factory):
    out = tmp_path_factory.mktemp("run") / "finetuned"
    metrics = train(TINY_TRAIN, tiny_tokenized, tiny_checkpoint, out)
    return out, metrics


def test_train_reports_steps_loss_and_speed(finetuned):
    _, metrics = finetuned
    assert metrics["steps"] == 10 and metrics["epochs"] == 2  # 40 examples / batch 8 = 5 steps per epoch
    assert metrics["train_samples"] == 80
    assert np.isfinite(metrics["final_loss"]) and np.isfinite(metrics["mean_loss"])
    assert metrics["train_seconds"] > 0 and metrics["samples_per_second"] > 0


def test_finetuned_model_loads_with_labels_and_pipeline(finetuned):
    out, _ = finetuned
    model = AutoModelForSequenceClassification.from_pretrained(out)
    assert model.config.id2label == {0: "not_equivalent", 1: "equivalent"}
    classify = pipeline("text-classification", model=str(out))
    [result] = classify([{"text": "The court rejected the appeal.", "text_pair": "The appeal was rejected by the court."}])
    assert result["label"] in {"not_equivalent", "equivalent"} and 0 <= result["score"] <= 1


def test_max_steps_overrides_epochs(tiny_tokenized, tiny_checkpoint, tmp_path):
    metrics = train(TINY_TRAIN.model_copy(update={"max_steps": 7}), tiny_tokenized, tiny_checkpoint, tmp_path / "m")
    assert (metrics["steps"], metrics["epochs"]) == (7, 2)


def test_same_seed_gives_identical_weights(finetuned, tiny_tokenized, tiny_checkpoint, tmp_path):
    out, _ = finetuned
    train(TINY_TRAIN, tiny_tokenized, tiny_checkpoint, tmp_path / "again")
    first, again = load_file(out / "model.safetensors"), load_file(tmp_path / "again" / "model.safetensors")
    assert first.keys() == again.keys()
    assert all(torch.equal(first[k], again[k]) for k in first)


def test_metric_module_matches_scikit_learn():
    rng = np.random.default_rng(0)
    for n in (1, 7, 100, 1000):
        refs, preds = rng.integers(0, 2, n), rng.integers(0, 2, n)
        metric = load_metric()
        for start in range(0, n, 32):
            metric.add_batch(predictions=preds[start:start + 32], references=refs[start:start + 32])
        result = metric.compute()
        assert result["accuracy"] == pytest.approx(accuracy_score(refs, preds))
        assert result["f1"] == pytest.approx(f1_score(refs, preds, zero_division=0.0))
    assert load_metric().compute(predictions=[0, 0], references=[0, 0]) == {"accuracy": 1.0, "f1": 0.0}


def test_evaluate_writes_metrics_and_predictions(finetuned, tiny_tokenized, tiny_raw, tmp_path):
    out, _ = finetuned
    raw_dir = tmp_path / "raw"
    tiny_raw.save_to_disk(str(raw_dir))
    p = EvaluateParams(batch_size=4, sort_by_length=False, splits=["validation", "test"])
    results = evaluate_model(p, out, tiny_tokenized, raw_dir, tmp_path / "predictions")
    for split in ("validation", "test"):
        table = pd.read_csv(tmp_path / "predictions" / f"{split}.csv")
        assert list(table.columns) == ["idx", "sentence1", "sentence2", "label", "prediction", "probability"]
        assert table["idx"].tolist() == tiny_raw[split]["idx"]
        assert ((table["probability"] >= 0.5) == (table["prediction"] == 1)).all()
        assert results[split]["examples"] == len(table)
        assert results[split]["accuracy"] == pytest.approx(accuracy_score(table["label"], table["prediction"]), abs=1e-4)
        assert results[split]["f1"] == pytest.approx(f1_score(table["label"], table["prediction"]), abs=1e-4)


def test_unlabeled_test_split_gets_predictions_only(finetuned, tiny_tokenized, tiny_raw, tmp_path):
    out, _ = finetuned
    unlabeled = lambda ds: ds.cast_column("label", ds.features["idx"]).map(lambda r: {"label": -1})  # noqa: E731
    raw = DatasetDict({**tiny_raw, "test": unlabeled(tiny_raw["test"])})
    tokenized = load_from_disk(str(tiny_tokenized))
    tokenized = DatasetDict({**tokenized, "test": tokenized["test"].map(lambda r: {"labels": -1})})
    raw.save_to_disk(str(tmp_path / "raw"))
    tokenized.save_to_disk(str(tmp_path / "tokenized"))
    p = EvaluateParams(batch_size=8, sort_by_length=True, splits=["test"])
    results = evaluate_model(p, out, tmp_path / "tokenized", tmp_path / "raw", tmp_path / "predictions")
    assert results == {"test": {"examples": 19}}
    assert (tmp_path / "predictions" / "test.csv").exists()
