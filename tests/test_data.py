"""Raw-data checks, tokenization and the shared DataLoaders."""

import pytest
import torch
from datasets import DatasetDict

from finetune.data.batches import make_collator, train_dataloader
from finetune.data.prepare import prepare_raw
from finetune.data.tokenization import tokenize
from finetune.data.tokenized import length_stats
from finetune.errors import DataError
from finetune.tasks import glue_task
from tests.helpers import tiny_params

MRPC = tiny_params().data  # data.config mrpc: GLUE's task, columns and labels


def _prepare(raw):
    return prepare_raw(raw, MRPC, {split: "tiny" for split in raw})


def _replace(raw, split, column, row, value):
    values = list(raw[split][column])
    values[row] = value
    ds = raw[split].remove_columns(column).add_column(column, values)
    return DatasetDict({**raw, split: ds})


def test_tiny_raw_passes_unchanged(tiny_raw):
    prepared, task = _prepare(tiny_raw)
    assert task == glue_task("mrpc") and task.label_names == ("not_equivalent", "equivalent")
    for split in tiny_raw:
        assert prepared[split].column_names == ["sentence1", "sentence2", "label", "idx"]
        assert prepared[split]["label"] == tiny_raw[split]["label"]
        assert prepared[split]["sentence2"] == tiny_raw[split]["sentence2"]


@pytest.mark.parametrize("column,value,message", [
    ("sentence1", "  ", "split 'validation' row idx=3: empty sentence1"),
    ("sentence2", None, "split 'validation' row idx=3: empty sentence2"),
])
def test_empty_sentences_are_named(tiny_raw, column, value, message):
    with pytest.raises(DataError, match=message):
        _prepare(_replace(tiny_raw, "validation", column, 3, value))


def test_bad_label_missing_column_and_empty_split(tiny_raw):
    with pytest.raises(DataError, match=r"tiny: split 'train' row idx=5: label 2 not in \[0, 1\]"):
        _prepare(_replace(tiny_raw, "train", "label", 5, 2))
    with pytest.raises(DataError, match=r"split 'test' lacks column\(s\) \['sentence2'\]"):
        _prepare(DatasetDict({**tiny_raw, "test": tiny_raw["test"].remove_columns("sentence2")}))
    with pytest.raises(DataError, match="split 'test' is empty"):
        _prepare(DatasetDict({**tiny_raw, "test": tiny_raw["test"].select([])}))
    with pytest.raises(DataError, match=r"no train split; found \['validation', 'test'\]"):
        _prepare(DatasetDict({"validation": tiny_raw["validation"], "test": tiny_raw["test"]}))


def test_repeated_idx_and_null_label_are_named(tiny_raw):
    # select() gives a dataset with an indices mapping, as max_samples does: the rows checked are the selected ones.
    repeated = DatasetDict({**tiny_raw, "train": tiny_raw["train"].select([0, 1, 2, 1])})
    with pytest.raises(DataError, match=r"tiny: split 'train': idx=1 is repeated in rows \[1, 3\]; each idx must be"):
        _prepare(repeated)
    labels = [None if i == 4 else label for i, label in enumerate(tiny_raw["validation"]["label"])]
    validation = tiny_raw["validation"].remove_columns("label").add_column("label", labels)
    null = DatasetDict({**tiny_raw, "validation": validation})
    with pytest.raises(DataError, match=r"split 'validation' row idx=4: label is missing \(null\)"):
        _prepare(null)


def test_tokenize_follows_the_course(tiny_raw, tokenizer):
    tokenized = tokenize(tiny_raw, tokenizer, 128, ("sentence1", "sentence2"))
    assert tokenized["train"].column_names == ["labels", "input_ids", "token_type_ids", "attention_mask"]
    assert tokenized["train"]["labels"] == tiny_raw["train"]["label"]
    row = tiny_raw["train"][0]
    expected = tokenizer(row["sentence1"], row["sentence2"], truncation=True)["input_ids"]
    assert tokenized["train"][0]["input_ids"] == expected
    # No padding at tokenization time: lengths differ between rows.
    assert len({len(ids) for ids in tokenized["train"]["input_ids"]}) > 1


def test_tokenize_to_memory_mapped_files_in_worker_processes_gives_the_same_rows(tiny_raw, tokenizer, tmp_path):
    # the tokenize stage's way (Arrow files in a scratch folder, datasets' num_proc) against the in-memory one
    in_memory = tokenize(tiny_raw, tokenizer, 128, ("sentence1", "sentence2"))
    on_disk = tokenize(tiny_raw, tokenizer, 128, ("sentence1", "sentence2"), cache_dir=tmp_path,
                       num_proc=2)
    assert sorted(p.name for p in tmp_path.glob("train*.arrow"))  # written there, memory-mapped
    for split in tiny_raw:
        assert on_disk[split].to_dict() == in_memory[split].to_dict()


def test_truncation_and_length_stats(tiny_raw, tokenizer):
    tokenized = tokenize(tiny_raw, tokenizer, 12, ("sentence1", "sentence2"))
    stats = length_stats(tokenized["train"], 12)
    assert stats["max"] == 12 and stats["truncated"] == stats["examples"] == 40
    assert stats["min"] <= stats["mean"] <= stats["max"]


def test_train_order_depends_on_the_seed_only(tiny_tokenized, tokenizer):
    from datasets import load_from_disk

    train = load_from_disk(str(tiny_tokenized))["train"]
    first = lambda seed: next(iter(train_dataloader(train, make_collator(tokenizer), 8, seed)))["input_ids"].tolist()  # noqa: E731
    assert first(1) == first(1)
    assert first(1) != first(2)


def test_evaluation_batches_leave_the_global_rng_alone(tiny_tokenized, tokenizer):
    # Validation between epochs must not shift the dropout masks of the following epochs.
    from datasets import load_from_disk

    from finetune.data.batches import TokenRows, scoring_batches

    loader = scoring_batches(TokenRows(load_from_disk(str(tiny_tokenized))["validation"]), tokenizer, 8)
    state = torch.get_rng_state()
    for _ in range(2):
        list(loader)
    assert torch.equal(torch.get_rng_state(), state)


def test_a_checkpoint_that_names_no_length_needs_tokenize_max_length(tiny_checkpoint, tmp_path):
    # As DeBERTa-v3: relative positions only (no position_biased_input) and a tokenizer_config.json without
    # model_max_length, which transformers reads as 1e30: null would cut no text, so the stage asks for a length.
    import json
    import shutil

    from transformers import DebertaV2Config

    from finetune.data.tokenization import training_tokenizer
    from finetune.errors import ParamsError

    folder = tmp_path / "relative-positions"
    shutil.copytree(tiny_checkpoint, folder)
    settings = json.loads((folder / "tokenizer_config.json").read_text())
    settings.pop("model_max_length", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(settings))
    DebertaV2Config(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                    relative_attention=True, position_biased_input=False).save_pretrained(folder)
    with pytest.raises(ParamsError) as err:
        training_tokenizer(folder, None)
    assert str(err.value) == (f"params.yaml: tokenize.max_length: null, but {folder}'s tokenizer sets no length "
                              "(model_max_length) and the model's positions are relative, so no text would be cut: "
                              "set tokenize.max_length (its pretraining length: 512)")
    assert training_tokenizer(folder, 64).model_max_length == 64
