"""MRPC data: checks on the raw splits, tokenization, and the DataLoaders that training and evaluation share.

Follows the Hugging Face course, chapter 3 "A full training":
https://huggingface.co/learn/llm-course/chapter3/4
"""

from __future__ import annotations

import numpy as np
import torch
from datasets import Dataset, DatasetDict
from torch.utils.data import DataLoader
from transformers import DataCollatorWithPadding, PreTrainedTokenizerBase
from transformers.trainer_pt_utils import LengthGroupedSampler

TEXT_COLUMNS = ("sentence1", "sentence2")
RAW_COLUMNS = ("sentence1", "sentence2", "label", "idx")
SPLITS = ("train", "validation", "test")
UNLABELED = -1  # the Hub's GLUE test splits carry label -1


class DataError(ValueError):
    """The dataset breaks a rule; the message names the split, the row (idx) and the rule."""


def check_raw(raw: DatasetDict, source: str) -> None:
    """Check that ``raw`` looks like MRPC, before anything is saved. The rules, in the order they are checked:

    - the splits train, validation and test exist, each with the columns sentence1, sentence2, label and idx,
      and at least one row;
    - no label is missing (null); train and validation labels are in {0, 1}; test labels are in {0, 1} or all -1
      (unlabeled, as on the Hub);
    - no sentence is null, empty or only whitespace. This is an error, not a row quietly dropped: MRPC has none,
      so one means a damaged file, and dropping rows would change the split that metrics are compared on;
    - no idx appears twice in a split (predictions are matched to rows by idx).

    Every check is vectorised (pandas), so the full MRPC splits take milliseconds.

    Raises:
        DataError: naming ``source``, the split, the offending row (its idx; for a repeated idx, the 0-based
            row numbers) and the rule.
    """
    missing_splits = [s for s in SPLITS if s not in raw]
    if missing_splits:
        raise DataError(f"{source}: missing split(s) {missing_splits}; found {list(raw)}")
    for split in SPLITS:
        ds = raw[split]
        missing = [c for c in RAW_COLUMNS if c not in ds.column_names]
        if missing:
            raise DataError(f"{source}: split {split!r} lacks column(s) {missing}; has {ds.column_names}")
        if len(ds) == 0:
            raise DataError(f"{source}: split {split!r} is empty")
        df = ds.select_columns(list(RAW_COLUMNS)).to_pandas()

        labels = df["label"]
        allowed = {0, 1, UNLABELED} if split == "test" else {0, 1}
        null = np.flatnonzero(labels.isna().to_numpy())
        if null.size:
            raise DataError(f"{_row(source, split, df, null[0])}: label is missing (null); "
                            f"every row needs a label in {sorted(allowed)}")
        bad = np.flatnonzero(~labels.isin(allowed).to_numpy())
        if bad.size:
            raise DataError(f"{_row(source, split, df, bad[0])}: label {labels.iat[bad[0]]} not in {sorted(allowed)}")
        unlabeled = np.flatnonzero((labels == UNLABELED).to_numpy())
        if 0 < unlabeled.size < len(labels):
            raise DataError(f"{_row(source, split, df, unlabeled[0])}: label -1 (unlabeled) among labeled rows; "
                            "the test split is labeled throughout or -1 throughout")

        for column in TEXT_COLUMNS:
            text = df[column]
            empty = np.flatnonzero((text.isna() | (text.astype(str).str.strip() == "")).to_numpy())
            if empty.size:
                raise DataError(f"{_row(source, split, df, empty[0])}: empty {column} "
                                "(null, empty or only whitespace)")

        repeated = df["idx"].duplicated(keep=False).to_numpy()
        if repeated.any():
            first = df["idx"].to_numpy()[repeated][0]
            rows = np.flatnonzero((df["idx"] == first).to_numpy()).tolist()
            others = df["idx"][repeated].nunique() - 1
            more = f" (and {others} more repeated idx values)" if others else ""
            raise DataError(f"{source}: split {split!r}: idx={first} is repeated in rows {rows}{more}; "
                            "each idx must be unique")


def _row(source: str, split: str, df, row: int) -> str:
    """Where a row is, for a DataError: ``<source>: split '<split>' row idx=<idx>``."""
    return f"{source}: split {split!r} row idx={df['idx'].iat[row]}"


def is_labeled(ds: Dataset, label_column: str = "labels") -> bool:
    """True when the split carries real labels (the Hub's GLUE test split has -1 everywhere)."""
    return bool(len(ds)) and int(np.asarray(ds[label_column]).min()) != UNLABELED


def label_balance(ds: Dataset) -> dict:
    """Rows and label counts of a raw split: ``{"rows": n, "label_0": n0, "label_1": n1, "label_1_fraction": f}``."""
    labels = np.asarray(ds["label"])
    n1 = int((labels == 1).sum())
    return {"rows": len(ds), "label_0": int((labels == 0).sum()), "label_1": n1,
            "label_1_fraction": round(n1 / len(ds), 4) if len(ds) else None}


def tokenize(raw: DatasetDict, tokenizer: PreTrainedTokenizerBase, max_length: int | None) -> DatasetDict:
    """Tokenize sentence pairs as the course does: ``tokenizer(s1, s2, truncation=True)`` via ``map(batched=True)``.

    No padding here: DataCollatorWithPadding pads each batch to its own longest sequence.

    Returns:
        A DatasetDict with columns ``input_ids``, ``token_type_ids`` (BERT), ``attention_mask``, ``labels``;
        sentence1, sentence2 and idx are dropped (row order is kept, so row i is raw row i).
    """

    def encode(batch):
        return tokenizer(batch["sentence1"], batch["sentence2"], truncation=True, max_length=max_length)

    # keep_in_memory: no cache file is written into the input folder (a DVC output of the download stage).
    tokenized = raw.map(encode, batched=True, remove_columns=["sentence1", "sentence2", "idx"], keep_in_memory=True,
                        desc="Tokenizing")
    return tokenized.rename_column("label", "labels")


def length_stats(ds: Dataset, max_length: int) -> dict:
    """Token-length statistics of a tokenized split (tokens per example, special tokens included)."""
    lengths = np.array(token_lengths(ds))
    return {"examples": int(lengths.size), "mean": round(float(lengths.mean()), 2), "median": float(np.median(lengths)),
            "p95": float(np.percentile(lengths, 95)), "max": int(lengths.max()), "min": int(lengths.min()),
            "truncated": int((lengths >= max_length).sum()), "max_length": max_length}


def make_collator(tokenizer: PreTrainedTokenizerBase) -> DataCollatorWithPadding:
    """Dynamic padding: each batch is padded to its longest sequence, with the tokenizer's pad id, on the right."""
    return DataCollatorWithPadding(tokenizer=tokenizer)


def token_lengths(ds: Dataset) -> list[int]:
    """Tokens per example (special tokens included) of a tokenized split, in row order."""
    return [len(ids) for ids in ds["input_ids"]]


def train_dataloader(ds: Dataset, collator: DataCollatorWithPadding, batch_size: int, seed: int,
                     group_by_length: bool = False) -> DataLoader:
    """Shuffled training batches; the order depends on ``seed`` only.

    With ``group_by_length``, transformers' ``LengthGroupedSampler`` shuffles the rows, cuts them into chunks
    of up to 50 batches and sorts each chunk by length, so a batch holds sequences of similar length and
    dynamic padding adds little (the course's random batches pad about a quarter of all tokens on MRPC).

    Each batch is a dict of tensors ``[batch, seq_len]`` (``labels``: ``[batch]``).
    """
    generator = torch.Generator().manual_seed(seed)
    if group_by_length:
        sampler = LengthGroupedSampler(batch_size, lengths=token_lengths(ds), generator=generator)
        return DataLoader(ds, batch_size=batch_size, sampler=sampler, collate_fn=collator, generator=generator)
    return DataLoader(ds, batch_size=batch_size, shuffle=True, collate_fn=collator, generator=generator)


def eval_dataloader(ds: Dataset, collator: DataCollatorWithPadding, batch_size: int) -> DataLoader:
    """Evaluation batches in dataset order (so predictions line up with the raw rows).

    The loader has its own generator: without one, every ``iter(loader)`` draws a seed from torch's global
    RNG, so validating between epochs would change the dropout masks of the epochs after it.
    """
    return DataLoader(ds, batch_size=batch_size, shuffle=False, collate_fn=collator, generator=torch.Generator())


def length_order(ds: Dataset) -> np.ndarray:
    """Row indices ``[examples]`` sorting a tokenized split by length (stable), for evaluation with little padding.

    Evaluate ``ds.select(order)``, then ``out[order] = outputs`` puts the outputs back in row order.
    """
    return np.argsort(np.asarray(token_lengths(ds)), kind="stable")
