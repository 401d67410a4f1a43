"""Issue 14's methods on the tiny model: swapped pairs, averaging both orders, the mean-pooling head, layer-wise
learning-rate decay, a fine-tuned model as the next run's checkpoint (intermediate training)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pandas as pd
import pytest
import torch
from datasets import load_from_disk
from safetensors.torch import load_file
from transformers import AutoModelForSequenceClassification, pipeline

from finetune.batches import evaluation_loaders, make_collator
from finetune.errors import ParamsError
from finetune.evaluation import average_orders, evaluate_split, load_metric, split_logits
from finetune.modeling import MeanPooledForSequenceClassification, load_classifier
from finetune.optim import layer_learning_rates, make_optimizer
from finetune.tasks import glue_task
from finetune.training import train
from stages.download import download_checkpoint
from stages.evaluate import evaluate_model
from stages.tokenize import tokenize_splits
from tests.helpers import make_project, reset_accelerate, tiny_params
from tools.predict import predict

MRPC, STSB = glue_task("mrpc"), glue_task("stsb")


def _rows(tiny_tokenized, n=4):
    return [load_from_disk(str(tiny_tokenized))["train"][i] for i in range(n)]


def test_tokenize_keeps_both_orders_of_a_symmetric_pair(tiny_raw, tiny_tokenized, tokenizer):
    row, raw = load_from_disk(str(tiny_tokenized))["train"][0], tiny_raw["train"][0]
    assert row["input_ids"] == tokenizer(raw["sentence1"], raw["sentence2"])["input_ids"]
    assert row["swapped_input_ids"] == tokenizer(raw["sentence2"], raw["sentence1"])["input_ids"]
    assert row["swapped_token_type_ids"] == tokenizer(raw["sentence2"], raw["sentence1"])["token_type_ids"]


@pytest.mark.parametrize("swap_pairs", [False, True])
def test_tokenize_stage_stores_the_swapped_order_only_for_swap_pairs(tiny_raw, tiny_checkpoint, tmp_path, swap_pairs):
    params = tiny_params(train={"swap_pairs": swap_pairs})
    paths = make_project(tmp_path, params, tiny_raw, tiny_checkpoint)
    shutil.rmtree(paths.tokenized)
    tokenize_splits(params, paths)
    columns = load_from_disk(str(paths.tokenized))["train"].column_names
    assert ("swapped_input_ids" in columns) is swap_pairs


def test_collator_swaps_pairs(tiny_tokenized, tokenizer):
    rows = _rows(tiny_tokenized)
    as_given, swapped = make_collator(tokenizer)(rows), make_collator(tokenizer, swap=1.0)(rows)
    assert set(as_given) == set(swapped) == {"input_ids", "token_type_ids", "attention_mask", "labels"}
    for i, row in enumerate(rows):
        n = len(row["input_ids"])
        assert as_given["input_ids"][i, :n].tolist() == row["input_ids"]
        assert swapped["input_ids"][i, :n].tolist() == row["swapped_input_ids"]
        assert swapped["token_type_ids"][i, :n].tolist() == row["swapped_token_type_ids"]
    assert torch.equal(as_given["labels"], swapped["labels"])


def test_random_order_is_per_row_and_replays_with_its_seed(tiny_tokenized, tokenizer):
    rows = load_from_disk(str(tiny_tokenized))["train"]
    rows = [rows[i] for i in range(len(rows))]
    collator = make_collator(tokenizer, swap=0.5, seed=3)
    first = collator(rows)["input_ids"]
    collator.generator.manual_seed(3)
    assert torch.equal(collator(rows)["input_ids"], first)
    swapped = [first[i, :len(r["input_ids"])].tolist() == r["swapped_input_ids"] != r["input_ids"]
               for i, r in enumerate(rows)]
    assert 0.25 < sum(swapped) / len(rows) < 0.75  # 40 rows, each swapped with probability 0.5


def test_average_orders_averages_probabilities_and_scores():
    a, b = torch.tensor([[2.0, 0.0], [0.0, 1.0]]), torch.tensor([[0.0, 2.0], [0.0, 3.0]])
    averaged = average_orders([a, b], MRPC)
    torch.testing.assert_close(averaged.softmax(-1), (a.softmax(-1) + b.softmax(-1)) / 2)
    assert averaged.argmax(-1).tolist() == [0, 1]  # [0.5, 0.5] ties go to the first class
    torch.testing.assert_close(average_orders([a[:, :1], b[:, :1]], STSB), torch.tensor([[1.0], [0.0]]))
    assert average_orders([a], MRPC) is a


def test_evaluate_split_over_both_orders_is_their_average(tiny_checkpoint, tiny_tokenized, tokenizer):
    from accelerate import Accelerator

    model = load_classifier(tiny_checkpoint, MRPC).eval()
    validation = load_from_disk(str(tiny_tokenized))["validation"]
    p = tiny_params().evaluate
    (given, swapped), _ = evaluation_loaders(validation, tokenizer, p, both_orders=True)
    accelerator = Accelerator(cpu=True)
    metrics, logits = evaluate_split(model, [given, swapped], accelerator, MRPC, load_metric(MRPC))
    one, labels = split_logits(model, given, accelerator)
    other, _ = split_logits(model, swapped, accelerator)
    assert not torch.allclose(one, other)  # the orders differ for this model
    torch.testing.assert_close(logits.softmax(-1), (one.softmax(-1) + other.softmax(-1)) / 2)
    expected = (logits.argmax(-1) == labels).float().mean().item()
    assert metrics["accuracy"] == pytest.approx(expected)


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


def test_layer_lr_decay_lowers_the_rate_layer_by_layer(tiny_checkpoint):
    model = load_classifier(tiny_checkpoint, MRPC)  # 2 encoder layers
    rates = layer_learning_rates(model, 1e-3, 0.5)
    assert rates["classifier.weight"] == rates["bert.pooler.dense.weight"] == 1e-3
    assert rates["bert.encoder.layer.1.output.dense.weight"] == pytest.approx(5e-4)
    assert rates["bert.encoder.layer.0.attention.self.query.weight"] == pytest.approx(2.5e-4)
    assert rates["bert.embeddings.word_embeddings.weight"] == pytest.approx(1.25e-4)
    groups = make_optimizer(model, tiny_params(train={"lr": 1e-3, "layer_lr_decay": 0.5}).train).param_groups
    lr_of = {id(t): g["lr"] for g in groups for t in g["params"]}
    assert all(lr_of[id(t)] == pytest.approx(rates[n]) for n, t in model.named_parameters())
    assert {round(g["lr"], 10) for g in groups} == {1e-3, 5e-4, 2.5e-4, 1.25e-4}
    assert set(layer_learning_rates(model, 1e-3, 1.0).values()) == {1e-3}


def test_swap_pairs_needs_a_symmetric_task(tiny_raw, tiny_checkpoint, tmp_path):
    params = tiny_params(train={"swap_pairs": True})
    paths = make_project(tmp_path, params, tiny_raw, tiny_checkpoint, task=glue_task("rte"))
    with pytest.raises(ParamsError, match="train.swap_pairs: task 'rte' is not symmetric"):
        train(params, paths)


def test_train_and_evaluate_with_mean_pooling_and_swapped_pairs(tiny_raw, tiny_checkpoint, tmp_path):
    params = tiny_params(model={"pooling": "mean"}, train={"swap_pairs": True, "layer_lr_decay": 0.8})
    paths = make_project(tmp_path, params, tiny_raw, tiny_checkpoint)
    metrics = train(params, paths)
    reset_accelerate()
    config = json.loads((paths.trained / "config.json").read_text())
    assert config["model_type"] == "mean_pooled" and config["encoder"]["model_type"] == "bert"
    assert config["swap_pairs"] is True
    assert metrics["steps"] == 10  # swapping changes the order of the texts, not the number of steps
    results = evaluate_model(params, paths)
    assert set(results) == {"validation", "test"} and 0 <= results["validation"]["accuracy"] <= 1
    model = AutoModelForSequenceClassification.from_pretrained(paths.trained)
    assert isinstance(model, MeanPooledForSequenceClassification)
    classify = pipeline("text-classification", model=str(paths.trained))
    [result] = classify([{"text": "The court rejected the appeal.", "text_pair": "The appeal was rejected."}])
    assert result["label"] in {"not_equivalent", "equivalent"}
    # tools.predict averages both orders as the evaluate stage does
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
