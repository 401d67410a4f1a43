"""The mean-pooling head (``model.pooling: mean``) and a fine-tuned model as the next run's checkpoint (intermediate
training), on the tiny model."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForSequenceClassification, pipeline

from finetune.data.download import download_checkpoint
from finetune.evaluate.predictions import evaluate_model
from finetune.modeling import MeanPooledForSequenceClassification, load_classifier
from finetune.tasks import glue_task
from finetune.train.recipe import train
from tests.helpers import make_project, reset_accelerate, tiny_params
from tools.predict import predict

MRPC = glue_task("mrpc")


def test_mean_pooling_head_averages_real_tokens_only(tiny_checkpoint, tokenizer):
    model = load_classifier(tiny_checkpoint, MRPC, pooling="mean").eval()
    assert isinstance(model, MeanPooledForSequenceClassification) and model.config.num_labels == 2
    short = tokenizer(["A cat sat."], ["A cat sat down."], return_tensors="pt")
    padded = tokenizer(["A cat sat."], ["A cat sat down."], return_tensors="pt", padding="max_length", max_length=24)
    with torch.no_grad():
        logits = model(**short).logits
        torch.testing.assert_close(model(**padded).logits, logits)  # padding does not enter the mean
        hidden = model.bert(**short).last_hidden_state  # [1, seq_len, hidden]
        torch.testing.assert_close(logits, model.classifier(hidden.mean(dim=1)))


def test_mean_pooling_head_starts_from_the_checkpoint(tiny_checkpoint):
    cls_model, mean_model = load_classifier(tiny_checkpoint, MRPC), load_classifier(tiny_checkpoint, MRPC,
                                                                                    pooling="mean")
    cls_weights = dict(cls_model.named_parameters())
    for name, weight in mean_model.named_parameters():
        if name.startswith("bert."):
            assert torch.equal(weight, cls_weights[name]), name
    assert not any(name.startswith("bert.pooler") for name, _ in mean_model.named_parameters())


def test_train_and_evaluate_with_mean_pooling(tiny_raw, tiny_checkpoint, tmp_path):
    params = tiny_params(model={"pooling": "mean"})
    paths = make_project(tmp_path, params, tiny_raw, tiny_checkpoint)
    metrics = train(params, paths)
    reset_accelerate()
    config = json.loads((paths.trained / "config.json").read_text())
    assert config["model_type"] == "mean_pooled" and config["encoder"]["model_type"] == "bert"
    assert metrics["steps"] == 10
    results = evaluate_model(params, paths)
    assert set(results) == {"validation", "test"} and 0 <= results["validation"]["accuracy"] <= 1
    model = AutoModelForSequenceClassification.from_pretrained(paths.trained)
    assert isinstance(model, MeanPooledForSequenceClassification)
    classify = pipeline("text-classification", model=str(paths.trained))
    [result] = classify([{"text": "The court rejected the appeal.", "text_pair": "The appeal was rejected."}])
    assert result["label"] in {"not_equivalent", "equivalent"}
    # tools.predict scores as the evaluate stage does
    evaluated = pd.read_csv(paths.predictions / "validation.csv")
    new = tmp_path / "new.csv"
    tiny_raw["validation"].to_pandas()[["sentence1", "sentence2"]].to_csv(new, index=False)
    scored = predict(new, paths.trained, batch_size=4)
    np.testing.assert_allclose(scored["probability_equivalent"], evaluated["probability_equivalent"], atol=2e-5)
    assert (scored["prediction"] == evaluated["prediction"]).all()


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_a_finetuned_model_is_the_next_runs_checkpoint(tiny_raw, tiny_checkpoint, tmp_path, pooling):
    # Intermediate training (STILTs): the download stage takes a run's models/finetuned as model.checkpoint; the
    # next run starts from its encoder (all weights but the head) and gets a new head for its own task.
    first = tiny_params(model={"pooling": pooling})
    paths = make_project(tmp_path / "first", first, tiny_raw, tiny_checkpoint)
    train(first, paths)
    reset_accelerate()
    trained = AutoModelForSequenceClassification.from_pretrained(paths.trained).state_dict()
    pretrained = tmp_path / "second" / "models" / "pretrained"
    record = download_checkpoint(str(paths.trained), pretrained)
    assert record["model_type"] == "bert"
    encoder = load_file(pretrained / "model.safetensors")  # what the download stage saved: the encoder's weights
    assert encoder and all(torch.equal(w, trained["bert." + name]) for name, w in encoder.items())
    model = load_classifier(pretrained, glue_task("rte"), pooling=pooling)
    assert all(torch.equal(w, encoder[name.removeprefix("bert.")]) for name, w in model.state_dict().items()
               if name.startswith("bert.") and name.removeprefix("bert.") in encoder)
    assert not torch.equal(model.classifier.weight, trained["classifier.weight"])  # a new head
