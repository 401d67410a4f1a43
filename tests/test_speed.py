"""Speed settings keep results: length grouping, length-sorted evaluation, AdamW implementations, bf16."""

import numpy as np
import pandas as pd
import pytest
import torch
from datasets import load_from_disk
from safetensors.torch import load_file

from stages.collate_check import check_split
from stages.common import EvaluateParams
from stages.data import make_collator, train_dataloader
from stages.evaluate import evaluate_model
from stages.train import train
from tests.conftest import reset_accelerate, tiny_train_params

TINY_TRAIN = tiny_train_params()


@pytest.fixture(scope="module")
def tokenized(tiny_tokenized):
    return load_from_disk(str(tiny_tokenized))


def test_length_grouping_cuts_padding_and_keeps_every_row(tokenized, tokenizer):
    ds = tokenized["train"]
    collator = make_collator(tokenizer)
    random_batches = check_split(train_dataloader(ds, collator, 4, seed=0), tokenizer, "train", labeled=True)
    grouped_loader = train_dataloader(ds, collator, 4, seed=0, group_by_length=True)
    grouped = check_split(grouped_loader, tokenizer, "train", labeled=True)  # same dynamic-padding rules hold
    assert grouped["padding_fraction"] < random_batches["padding_fraction"]
    first = list(train_dataloader(ds, collator, 4, seed=0, group_by_length=True).sampler)
    assert sorted(first) == list(range(len(ds)))
    again = list(train_dataloader(ds, collator, 4, seed=0, group_by_length=True).sampler)
    assert again == first  # the order depends on the seed only


def test_length_sorted_evaluation_gives_the_same_predictions_in_row_order(tiny_checkpoint, tiny_tokenized, tiny_raw,
                                                                           tmp_path):
    out = tmp_path / "model"
    train(TINY_TRAIN.model_copy(update={"max_steps": 3}), tiny_tokenized, tiny_checkpoint, out)
    raw_dir = tmp_path / "raw"
    tiny_raw.save_to_disk(str(raw_dir))
    results, tables = {}, {}
    for sort in (False, True):
        p = EvaluateParams(batch_size=4, sort_by_length=sort, splits=["validation"])
        results[sort] = evaluate_model(p, out, tiny_tokenized, raw_dir, tmp_path / f"pred-{sort}")
        tables[sort] = pd.read_csv(tmp_path / f"pred-{sort}" / "validation.csv")
    assert tables[True]["idx"].tolist() == tables[False]["idx"].tolist() == tiny_raw["validation"]["idx"]
    assert (tables[True]["prediction"] == tables[False]["prediction"]).all()
    np.testing.assert_allclose(tables[True]["probability"], tables[False]["probability"], atol=1e-4)
    assert results[True]["validation"]["accuracy"] == results[False]["validation"]["accuracy"]


@pytest.mark.parametrize("impl", ["foreach", "fused"])
def test_adamw_implementations_give_the_same_weights(impl, tiny_tokenized, tiny_checkpoint, tmp_path):
    p = TINY_TRAIN.model_copy(update={"max_steps": 4})
    train(p, tiny_tokenized, tiny_checkpoint, tmp_path / "default")
    train(p.model_copy(update={"adamw_impl": impl}), tiny_tokenized, tiny_checkpoint, tmp_path / impl)
    default, other = load_file(tmp_path / "default/model.safetensors"), load_file(tmp_path / impl / "model.safetensors")
    for key in default:
        torch.testing.assert_close(other[key], default[key], rtol=1e-4, atol=1e-5)


def test_grouped_bf16_fused_training_runs_and_reports_padding(tiny_tokenized, tiny_checkpoint, tmp_path):
    small_batches = TINY_TRAIN.model_copy(update={"batch_size": 4})  # 40 rows: grouping needs chunks of 2+ batches
    fast = small_batches.model_copy(update={"group_by_length": True, "mixed_precision": "bf16", "adamw_impl": "fused",
                                         "num_threads": 2})
    metrics = train(fast, tiny_tokenized, tiny_checkpoint, tmp_path / "fast")
    reset_accelerate()
    plain = train(small_batches, tiny_tokenized, tiny_checkpoint, tmp_path / "plain")
    assert np.isfinite(metrics["final_loss"]) and metrics["steps"] == plain["steps"] == 20
    assert metrics["real_tokens"] == plain["real_tokens"]  # the same examples, only batched differently
    assert metrics["padding_fraction"] < plain["padding_fraction"]
    assert torch.get_num_threads() == 2
