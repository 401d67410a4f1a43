"""Speed settings keep results: length grouping, length-sorted evaluation, AdamW implementations, bf16."""

import numpy as np
import pandas as pd
import pytest
import torch
from datasets import load_from_disk
from safetensors.torch import load_file

from finetune.data.batches import make_collator, train_dataloader
from finetune.data.collate_check import check_split
from finetune.evaluate.predictions import evaluate_model
from finetune.tasks import glue_task
from finetune.train.recipe import train
from tests.helpers import reset_accelerate, tiny_params

MRPC = glue_task("mrpc")


@pytest.fixture(scope="module")
def tokenized(tiny_tokenized):
    return load_from_disk(str(tiny_tokenized))


def test_length_grouping_cuts_padding_and_keeps_every_row(tokenized, tokenizer):
    ds = tokenized["train"]
    collator = make_collator(tokenizer)
    random_batches = check_split(train_dataloader(ds, collator, 4, seed=0), tokenizer, "train", MRPC, labeled=True)
    grouped_loader = train_dataloader(ds, collator, 4, seed=0, group_by_length=True)
    grouped = check_split(grouped_loader, tokenizer, "train", MRPC, labeled=True)  # same dynamic-padding rules hold
    assert grouped["padding_fraction"] < random_batches["padding_fraction"]
    first = list(train_dataloader(ds, collator, 4, seed=0, group_by_length=True).sampler)
    assert sorted(first) == list(range(len(ds)))
    again = list(train_dataloader(ds, collator, 4, seed=0, group_by_length=True).sampler)
    assert again == first  # the order depends on the seed only


def test_length_sorted_evaluation_gives_the_same_predictions_in_row_order(tiny_project, tiny_raw):
    params = tiny_params(train={"max_steps": 3})
    paths = tiny_project(params=params)
    train(params, paths)
    results, tables = {}, {}
    for sort in (False, True):
        results[sort] = evaluate_model(tiny_params(evaluate={"batch_size": 4, "sort_by_length": sort}), paths)
        tables[sort] = pd.read_csv(paths.predictions / "validation.csv")
    assert tables[True]["idx"].tolist() == tables[False]["idx"].tolist() == tiny_raw["validation"]["idx"]
    assert (tables[True]["prediction"] == tables[False]["prediction"]).all()
    np.testing.assert_allclose(tables[True]["probability_equivalent"], tables[False]["probability_equivalent"],
                               atol=1e-4)
    assert results[True]["validation"]["accuracy"] == results[False]["validation"]["accuracy"]


@pytest.mark.parametrize("impl", ["foreach", "fused"])
def test_train_adamw_impl_is_a_speed_setting_that_keeps_the_weights_on_the_locked_torch(impl, tiny_project):
    # Ours: train.adamw_impl reaches torch.optim.AdamW through training, and params.yaml's `fused` is chosen for speed
    # alone. Torch's: its foreach and fused kernels compute the default update; a torch bump that breaks that would
    # change our metrics under a speed setting, so it fails here.
    default, other = tiny_params(train={"max_steps": 4}), tiny_params(train={"max_steps": 4, "adamw_impl": impl})
    default_paths, other_paths = tiny_project("default", default), tiny_project(impl, other)
    train(default, default_paths)
    train(other, other_paths)
    a, b = load_file(default_paths.trained / "model.safetensors"), load_file(other_paths.trained / "model.safetensors")
    for key in a:
        torch.testing.assert_close(b[key], a[key], rtol=1e-4, atol=1e-5)


def test_grouped_bf16_fused_training_runs_and_reports_padding(tiny_project):
    # 40 rows in batches of 4: grouping needs chunks of 2+ batches
    plain = tiny_params(train={"batch_size": 4})
    fast = tiny_params(train={"batch_size": 4, "group_by_length": True, "mixed_precision": "bf16",
                              "adamw_impl": "fused", "num_threads": 2})
    fast_metrics = train(fast, tiny_project("fast", fast))
    assert torch.get_num_threads() == 2  # train.num_threads
    reset_accelerate()
    plain_metrics = train(plain, tiny_project("plain", plain))
    assert np.isfinite(fast_metrics["final_loss"]) and fast_metrics["steps"] == plain_metrics["steps"] == 20
    assert fast_metrics["real_tokens"] == plain_metrics["real_tokens"]  # the same examples, only batched differently
    assert fast_metrics["padding_fraction"] < plain_metrics["padding_fraction"]
