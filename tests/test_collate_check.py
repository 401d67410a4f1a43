"""The collate check passes on dynamic padding and names split, batch and rule on any violation; an evaluated split
is checked in the batches evaluation scores it in."""

import pytest
import torch
from datasets import load_from_disk
from torch.utils.data import DataLoader
from transformers import DataCollatorWithPadding

from finetune.data.batches import TokenRows, make_collator, scoring_batches, train_dataloader
from finetune.data.collate_check import check_batch, check_forward, check_labels, check_split
from finetune.errors import CollateError
from finetune.modeling import load_classifier
from finetune.tasks import glue_task, own_task

MRPC = glue_task("mrpc")


@pytest.fixture(scope="module")
def tokenized(tiny_tokenized):
    return load_from_disk(str(tiny_tokenized))


def test_every_batch_of_every_split_passes(tokenized, tokenizer):
    collator = make_collator(tokenizer)
    report = check_split(train_dataloader(tokenized["train"], collator, 8, seed=0), tokenizer, "train", MRPC,
                         labeled=True)
    assert report["batches"] == 5
    assert report["first_batch_shapes"]["labels"] == [8]
    assert report["first_batch_shapes"]["input_ids"] == report["first_batch_shapes"]["attention_mask"]
    assert 0 < report["padding_fraction"] < 1
    report = check_split(scoring_batches(TokenRows(tokenized["validation"]), tokenizer, 8), tokenizer, "validation",
                         MRPC, labeled=False)
    assert report["batches"] == 3  # 21 examples: 8 + 8 + 5


def test_an_evaluated_split_is_checked_in_the_batches_evaluation_scores(tokenized, tokenizer):
    rows = TokenRows(tokenized["validation"])
    by_length = check_split(scoring_batches(rows, tokenizer, 8), tokenizer, "validation", MRPC, labeled=False)
    in_order = check_split(scoring_batches(rows, tokenizer, 8, sort_by_length=False), tokenizer, "validation", MRPC,
                           labeled=False)
    first, real_rows = next(iter(scoring_batches(rows, tokenizer, 8)))  # what Predictor.logits runs first
    assert by_length["first_batch_shapes"] == {k: list(v.shape) for k, v in first.items()} and real_rows == 8
    assert set(by_length["first_batch_shapes"]) == set(tokenizer.model_input_names)  # no labels: read beside
    assert by_length["padding_fraction"] < in_order["padding_fraction"]  # sorted by length, as evaluation runs
    check_labels(torch.tensor(tokenized["validation"]["labels"]), "split=validation", MRPC)
    with pytest.raises(CollateError, match=r"^split=validation rule=labels: labels \[0, 1, 2\] \(torch.int64\) not"):
        check_labels(torch.tensor([0, 1, 2]), "split=validation", MRPC)


def _first_batch(tokenized, collator):
    return next(iter(DataLoader(tokenized["validation"], batch_size=8, collate_fn=collator)))


def test_fixed_length_padding_breaks_the_dynamic_padding_rule(tokenized, tokenizer):
    collator = make_collator(tokenizer)
    collator.pad = DataCollatorWithPadding(tokenizer, padding="max_length", max_length=64)
    batch = _first_batch(tokenized, collator)
    with pytest.raises(CollateError, match="split=validation batch=0 rule=dynamic-padding: seq_len 64"):
        check_batch(batch, tokenizer, "split=validation batch=0", MRPC)


def test_left_padding_breaks_the_padding_at_end_rule(tokenized, tokenizer):
    batch = _first_batch(tokenized, make_collator(tokenizer))
    batch = {k: v.flip(dims=[1]) if v.dim() == 2 else v for k, v in batch.items()}
    with pytest.raises(CollateError, match="rule=padding-at-end"):
        check_batch(batch, tokenizer, "split=validation batch=0", MRPC)


@pytest.mark.parametrize("mutate,rule", [
    (lambda b: b.pop("token_type_ids"), "keys"),
    (lambda b: b.__setitem__("labels", torch.full_like(b["labels"], 2)), "labels"),
    (lambda b: b["attention_mask"][0].zero_(), "no-empty-sequence"),
    (lambda b: b["input_ids"][b["attention_mask"] == 0].fill_(7), "pad-id"),
    (lambda b: b.__setitem__("labels", b["labels"][:-1]), "shape"),
])
def test_each_rule_is_named(tokenized, tokenizer, mutate, rule):
    batch = _first_batch(tokenized, make_collator(tokenizer))
    assert (batch["attention_mask"] == 0).any()  # the batch has padding to corrupt
    if rule == "pad-id":
        batch["input_ids"][batch["attention_mask"] == 0] = 7
    else:
        mutate(batch)
    with pytest.raises(CollateError, match=f"split=validation batch=0 rule={rule}:"):
        check_batch(batch, tokenizer, "split=validation batch=0", MRPC)


def test_forward_pass_gives_two_logits(tokenized, tokenizer, tiny_checkpoint):
    batch = _first_batch(tokenized, make_collator(tokenizer))
    result = check_forward(load_classifier(tiny_checkpoint, MRPC).eval(), batch, MRPC)
    assert result["logits_shape"] == [8, 2]


def test_three_classes_and_regression_labels(tokenized, tokenizer, tiny_checkpoint):
    batch = _first_batch(tokenized, make_collator(tokenizer))
    three = own_task(("sentence1", "sentence2"), ("a", "b", "c"))
    check_batch({**batch, "labels": torch.full_like(batch["labels"], 2)}, tokenizer, "split=validation batch=0", three)
    with pytest.raises(CollateError, match=r"rule=labels: labels \[3\] \(torch.int64\) not all class ids in \[0, 3\)"):
        check_batch({**batch, "labels": torch.full_like(batch["labels"], 3)}, tokenizer, "split=validation batch=0",
                    three)
    regression = own_task(("sentence1", "sentence2"), None)
    scores = batch["labels"].float() * 2.5
    check_batch({**batch, "labels": scores}, tokenizer, "split=validation batch=0", regression)
    with pytest.raises(CollateError, match="rule=labels: regression labels must be finite floats"):
        check_batch({**batch, "labels": batch["labels"]}, tokenizer, "split=validation batch=0", regression)
    result = check_forward(load_classifier(tiny_checkpoint, regression).eval(), {**batch, "labels": scores}, regression)
    assert result["logits_shape"] == [8, 1]


def test_an_unlabeled_batch_has_no_labels_key(tokenized, tokenizer):
    batch = {k: v for k, v in _first_batch(tokenized, make_collator(tokenizer)).items() if k != "labels"}
    check_batch(batch, tokenizer, "split=test batch=0", MRPC, labeled=False)  # an unlabeled split: no error
    with pytest.raises(CollateError, match=r"split=validation batch=0.*labels"):
        check_batch(batch, tokenizer, "split=validation batch=0", MRPC)  # a labeled split must carry them


def test_a_big_split_is_checked_in_a_bounded_sample_and_described_whole(tokenized, tokenizer, monkeypatch):
    from finetune.data import collate_check

    monkeypatch.setattr(collate_check, "MAX_CHECKED_BATCHES", 8)
    checked = collate_check.batches_to_check(100, seed=3)
    assert len(checked) == 8 and checked[:2] == [0, 1] and checked[-2:] == [98, 99]  # the edges, then a sample
    assert checked == sorted(set(checked)) and checked == collate_check.batches_to_check(100, seed=3)
    big = tokenized["train"].select(list(range(40)) * 5)  # 200 rows: 50 batches of 4
    report = check_split(train_dataloader(big, make_collator(tokenizer), 4, seed=0), tokenizer, "train", MRPC,
                         labeled=True)
    assert (report["batches"], report["checked_batches"]) == (50, 8)
    monkeypatch.setattr(collate_check, "MAX_CHECKED_BATCHES", 1000)
    whole = check_split(train_dataloader(big, make_collator(tokenizer), 4, seed=0), tokenizer, "train", MRPC,
                        labeled=True)
    assert whole["checked_batches"] == 50
    assert {k: v for k, v in whole.items() if k != "checked_batches"} == \
        {k: v for k, v in report.items() if k != "checked_batches"}  # statistics over every batch either way


def test_the_checked_batches_are_the_ones_training_sees(tokenized, tokenizer):
    # length-grouped, seeded: the check draws the batch order as the DataLoader does
    loader = train_dataloader(tokenized["train"], make_collator(tokenizer), 8, seed=5, group_by_length=True)
    report = check_split(loader, tokenizer, "train", MRPC, labeled=True)
    first = next(iter(train_dataloader(tokenized["train"], make_collator(tokenizer), 8, seed=5,
                                       group_by_length=True)))
    assert report["first_batch_shapes"]["input_ids"] == list(first["input_ids"].shape)
