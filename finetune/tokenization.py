"""Tokenization of the prepared splits (text to token ids, no padding) and their token lengths.

Tokenization follows the Hugging Face course, chapter 3 "A full training":
https://huggingface.co/learn/llm-course/chapter3/4
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from datasets import Dataset, DatasetDict
from transformers import PreTrainedTokenizerBase

SWAPPED = "swapped_"  # prefix of the columns that hold a pair in the other order (tokenize with swapped)


def tokenize(raw: DatasetDict, tokenizer: PreTrainedTokenizerBase, max_length: int | None,
             text_columns: tuple[str, ...], swapped: bool = False, cache_dir: Path | None = None,
             num_proc: int | None = None) -> DatasetDict:
    """Tokenize as the course does: ``tokenizer(s1, s2, truncation=True)`` (or ``tokenizer(s, ...)`` for a
    single-sentence task) via ``map(batched=True)``.

    No padding here: DataCollatorWithPadding pads each batch to its own longest sequence. With ``swapped`` (a
    symmetric pair task), each row also holds the pair in the other order, ``tokenizer(s2, s1, ...)``, under
    ``SWAPPED`` + the column name; ``finetune.batches.PairCollator`` picks one order per row.

    Where the rows go: with ``cache_dir``, Arrow files in that folder (``<split>.arrow``), memory-mapped, so the
    memory used does not grow with the rows (the tokenize stage: a scratch folder); without, memory (small data,
    tests). Never into the input folder (a DVC output of the download stage). ``num_proc`` worker processes
    tokenize shards of each split (``Dataset.map``; None: this process, where a fast tokenizer already uses every
    core for each batch); the result is the same.

    Returns:
        A DatasetDict with columns ``input_ids``, ``token_type_ids`` (where the tokenizer gives them: BERT,
        ELECTRA, DeBERTa-v2; not RoBERTa, DistilBERT, MPNet), ``attention_mask`` (each swapped too with
        ``swapped``) and, in labeled splits, ``labels``; the text columns and idx are dropped (row order is kept, so
        row i is raw row i).
    """

    def encode(batch):
        texts = [batch[c] for c in text_columns]
        encoded = tokenizer(*texts, truncation=True, max_length=max_length)
        if swapped:
            other = tokenizer(*texts[::-1], truncation=True, max_length=max_length)
            encoded.update({SWAPPED + name: values for name, values in other.items()})
        return encoded

    def where(split: str) -> dict:
        return {"keep_in_memory": True} if cache_dir is None else {"cache_file_name": str(cache_dir / f"{split}.arrow")}

    tokenized = DatasetDict({
        split: ds.map(encode, batched=True, remove_columns=[*text_columns, "idx"], num_proc=num_proc,
                      desc=f"Tokenizing {split}", **where(split))
        for split, ds in raw.items()})
    return DatasetDict({split: ds.rename_column("label", "labels") if "label" in ds.column_names else ds
                        for split, ds in tokenized.items()})


def truncation_length(tokenizer: PreTrainedTokenizerBase, max_length: int | None) -> int:
    """The truncation length in tokens: ``tokenize.max_length``, or (null) the tokenizer's ``model_max_length``."""
    return max_length or tokenizer.model_max_length


def has_both_orders(ds: Dataset) -> bool:
    """Whether the tokenized split ``ds`` holds each pair in both orders (``tokenize`` with ``swapped``: the
    ``SWAPPED`` columns beside the others, as ``train.swap_pairs`` needs)."""
    return SWAPPED + "input_ids" in ds.column_names


def length_stats(ds: Dataset, max_length: int) -> dict:
    """Token-length statistics of a tokenized split (tokens per example, special tokens included)."""
    lengths = np.array(token_lengths(ds))
    return {"examples": int(lengths.size), "mean": round(float(lengths.mean()), 2), "median": float(np.median(lengths)),
            "p95": float(np.percentile(lengths, 95)), "max": int(lengths.max()), "min": int(lengths.min()),
            "truncated": int((lengths >= max_length).sum()), "max_length": max_length}


def token_lengths(ds: Dataset) -> list[int]:
    """Tokens per example (special tokens included) of a tokenized split, in row order.

    Read from the Arrow list column's offsets (``pyarrow.compute.list_value_length``), not by turning every row into
    a Python list: 400 k rows take milliseconds and no memory beyond the result (benchmarks/SCALE.md).
    """
    import pyarrow.compute as pc

    return pc.list_value_length(ds.with_format("arrow")["input_ids"]).to_numpy().tolist()
