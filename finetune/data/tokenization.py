"""Tokenization of the prepared splits (text to token ids, no padding) as in the Hugging Face course, "A full
training" (https://huggingface.co/learn/llm-course/chapter3/4); the truncation length, which the tokenizer training
uses (and saves with the fine-tuned model) carries as its ``model_max_length``, and token lengths.
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

import pyarrow.compute as pc
from datasets import Dataset, DatasetDict
from transformers import AutoConfig, AutoTokenizer, PretrainedConfig, PreTrainedTokenizerBase
from transformers.tokenization_utils_base import VERY_LARGE_INTEGER

from finetune.errors import ParamsError

log = logging.getLogger(__name__)


def tokenize(raw: DatasetDict, tokenizer: PreTrainedTokenizerBase, max_length: int | None,
             text_columns: tuple[str, ...], cache_dir: Path | None = None,
             num_proc: int | None = None) -> DatasetDict:
    """Tokenize every prepared split as the course does: ``tokenizer(s1, s2, truncation=True)`` (``tokenizer(s, ...)``
    for one text column) via ``Dataset.map(batched=True)``; no padding (the collator pads each batch). Per split:
    ``input_ids``, ``token_type_ids`` (where the tokenizer gives them: BERT, ELECTRA, DeBERTa-v2; not RoBERTa,
    DistilBERT, MPNet), ``attention_mask`` and, in labeled splits, ``labels``; text columns and ``idx`` dropped; row i
    is raw row i.

    Args:
        max_length: truncation length in tokens; None: the tokenizer's ``model_max_length``.
        cache_dir: write each split to ``<cache_dir>/<split>.arrow`` (memory-mapped); None: in memory.
        num_proc: worker processes per split (``Dataset.map``); None: this process. The result is the same.
    """

    def encode(batch):
        texts = [batch[c] for c in text_columns]
        return tokenizer(*texts, truncation=True, max_length=max_length)

    def where(split: str) -> dict:
        return {"keep_in_memory": True} if cache_dir is None else {"cache_file_name": str(cache_dir / f"{split}.arrow")}

    # The result's fingerprint (datasets' cache identity) from what decides its rows: the input's fingerprint, the
    # tokenizer's serialized rules (not its path), the length and the columns; datasets' default would pickle the
    # whole tokenizer to hash ``encode``.
    backend = getattr(tokenizer, "backend_tokenizer", None)
    rules = backend.to_str() if backend is not None else repr(sorted(tokenizer.get_vocab().items()))

    def fingerprint(ds: Dataset) -> str:
        key = (ds._fingerprint, hashlib.sha256(rules.encode()).hexdigest(), max_length, text_columns)
        return hashlib.sha256(repr(key).encode()).hexdigest()[:32]

    tokenized = DatasetDict({
        split: ds.map(encode, batched=True, remove_columns=[*text_columns, "idx"], num_proc=num_proc,
                      desc=f"Tokenizing {split}", new_fingerprint=fingerprint(ds), **where(split))
        for split, ds in raw.items()})
    return DatasetDict({split: ds.rename_column("label", "labels") if "label" in ds.column_names else ds
                        for split, ds in tokenized.items()})


# Families whose position ids start after the padding index (RoBERTa's embeddings): max_position_embeddings less
# pad_token_id + 1 positions are left for tokens.
PADDING_OFFSET_FAMILIES = ("roberta", "xlm-roberta", "camembert", "mpnet", "data2vec-text")


def position_limit(config: PretrainedConfig) -> int | None:
    """The most tokens, special tokens included, that the encoder of ``config`` has absolute positions for:
    ``max_position_embeddings``, less ``pad_token_id + 1`` for RoBERTa-style embeddings (``PADDING_OFFSET_FAMILIES``);
    None where positions are relative only (DeBERTa-v2 without ``position_biased_input``) or the config names none."""
    if config.model_type == "deberta-v2" and not getattr(config, "position_biased_input", True):
        return None
    positions = getattr(config, "max_position_embeddings", None)
    if positions is None:
        return None
    if config.model_type in PADDING_OFFSET_FAMILIES:
        positions -= (config.pad_token_id or 0) + 1
    return positions


def training_tokenizer(checkpoint: str | Path, max_length: int | None) -> PreTrainedTokenizerBase:
    """The tokenizer of the checkpoint folder ``checkpoint`` with ``model_max_length`` set to the truncation length
    of training (``truncation_length`` of ``max_length``, ``tokenize.max_length``, and the model's positions). The
    tokenize stage truncates there, and the train stage saves this tokenizer with the model, so evaluation, the
    exported forms, ``pipeline()``, ``tools.predict`` and ``tools.serve`` truncate there by default.

    Raises:
        ParamsError: ``max_length`` is above the model's positions, or is None where neither the tokenizer
            (``model_max_length`` unset) nor the model (relative positions only, as DeBERTa-v3) gives a length.
    """
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    config = AutoConfig.from_pretrained(checkpoint)
    limit = position_limit(config)
    length = truncation_length(tokenizer, max_length, limit)
    if length >= VERY_LARGE_INTEGER:  # transformers' "unset" model_max_length: nothing would ever be truncated
        pretrained = getattr(config, "max_position_embeddings", None)
        raise ParamsError(f"params.yaml: tokenize.max_length: null, but {checkpoint}'s tokenizer sets no length "
                          "(model_max_length) and the model's positions are relative, so no text would be cut: set "
                          "tokenize.max_length" + (f" (its pretraining length: {pretrained})" if pretrained else ""))
    tokenizer.model_max_length = length
    return tokenizer


def truncation_length(tokenizer: PreTrainedTokenizerBase, max_length: int | None, limit: int | None = None,
                      key: str = "params.yaml: tokenize.max_length") -> int:
    """The truncation length in tokens: ``max_length`` (``tokenize.max_length``), else the tokenizer's
    ``model_max_length``, at most ``limit`` (the model's positions, ``position_limit``).

    Raises:
        ParamsError: ``max_length`` is above ``limit`` (``check_max_length``).
    """
    check_max_length(max_length, limit, key)
    if max_length is not None:
        return max_length
    return min(tokenizer.model_max_length, limit) if limit is not None else tokenizer.model_max_length


def check_max_length(max_length: int | None, limit: int | None, key: str) -> None:
    """Raises ParamsError naming ``key`` and the limit when ``max_length`` is above ``limit`` (the model's positions,
    ``position_limit``; None: no limit)."""
    if max_length is not None and limit is not None and max_length > limit:
        raise ParamsError(f"{key}: {max_length} is more than the model's {limit} positions (max_position_embeddings "
                          "in its config.json); use at most that, or none for the model's own length")


def token_lengths(ds: Dataset) -> list[int]:
    """Tokens per example (special tokens included) of a tokenized split, in row order, read from the Arrow
    list offsets of ``input_ids`` (``pyarrow.compute.list_value_length``) without materialising the rows.
    """
    return pc.list_value_length(ds.with_format("arrow")["input_ids"]).to_numpy().tolist()
