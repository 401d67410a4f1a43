"""One inference path: a classifier with its tokenizer and task, opened once from a model folder of any form
(``Predictor.open``), scoring rows in their order and turning logits into answers.

Inside ``Predictor.logits`` rows are sorted by length (little padding), batched, padded as the tokenizer pads
(``PreTrainedTokenizerBase.pad``, optionally to a multiple of some tokens, and optionally filled up to a few row counts,
so a compiled runtime meets few input shapes), run, and put back in row order. With an ``accelerate.Accelerator``
the batches are shared among its processes and gathered (``gather_for_metrics``), as in the Hugging Face course's
evaluation loop ("A full training", https://huggingface.co/learn/llm-course/chapter3/4).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import torch
from torch.utils.data import DataLoader, Subset
from tqdm.auto import tqdm
from transformers import AutoConfig, AutoTokenizer, PreTrainedTokenizerBase

from finetune.data.batches import length_order
from finetune.data.tokenization import position_limit, token_lengths, truncation_length
from finetune.errors import CheckpointError, PipelineError
from finetune.modeling import check_checkpoint, load_finetuned
from finetune.runtime import set_cpu_threads
from finetune.tasks import Task, predictions_of

if TYPE_CHECKING:
    from accelerate import Accelerator
    from datasets import Dataset

PYTORCH = "pytorch"  # the fine-tuned model as trained (fp32): the reference form, which ``Predictor.open`` opens
MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids")  # what a classifier reads, in ONNX's input order
Example = tuple[str, ...]  # one row's texts, in the task's ``text_columns`` order


class Predictor:
    """``model`` (``model(**batch).logits [batch, num_labels]``: a PyTorch classifier, prepared by ``accelerator``
    where given, or a served form's runtime) with the ``tokenizer`` and ``task`` it was trained with; texts are
    truncated at ``max_length`` tokens (None: the tokenizer's ``model_max_length``). Without an accelerator, batches
    go to ``device``."""

    def __init__(self, model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, task: Task,
                 max_length: int | None = None, *, accelerator: Accelerator | None = None,
                 device: str | torch.device = "cpu"):
        self.model, self.tokenizer, self.task, self.accelerator = model, tokenizer, task, accelerator
        self.max_length = max_length or tokenizer.model_max_length
        self.device = torch.device(device) if accelerator is None else accelerator.device

    @classmethod
    def open(cls, folder: str | Path, *, load: Callable[[Path], torch.nn.Module] | None = None, form: str = PYTORCH,
             task: Task | None = None, max_length: int | None = None, max_length_key: str = "max_length",
             num_threads: int | None = None, device: str = "cpu", dtype: torch.dtype | None = None,
             accelerator: Accelerator | None = None) -> Predictor:
        """Open the model folder ``folder``: its task (its task.json, unless ``task`` is given), tokenizer, truncation
        length and classifier, on ``num_threads`` CPU threads (None: this process's share of the CPUs). A classifier
        with torch parameters goes to ``accelerator`` (prepared: its device and mixed precision) or to ``device`` in
        ``dtype``; one without (a runtime's session, holding no torch parameters) runs on the CPU.

        Args:
            load: the classifier's loader, ``(folder) -> torch.nn.Module`` (a served form's, from the registry:
                ``finetune.export.registry.open_form``); None: the fine-tuned PyTorch model (fp32).
            form: the form's name, for errors.
            max_length: truncation in tokens, at most the model's positions; None: the model's own length.
            max_length_key: where ``max_length`` came from, for the error (``--max-length``).

        Raises:
            CheckpointError: the folder is missing, or lacks task.json, config.json or the tokenizer, or its weights
                can't be read (a damaged file); one line naming the folder.
            ExportError: the form's runtime is not installed, or its file is missing.
            ParamsError: ``max_length`` is above the model's positions.
        """
        folder = Path(folder)
        if not folder.is_dir():
            raise CheckpointError(f"{folder}: model folder not found")
        task = task or Task.load(folder)
        check_checkpoint(folder, need_weights=load is None)
        set_cpu_threads(num_threads)  # torch's, which the other runtimes take too
        try:
            tokenizer = AutoTokenizer.from_pretrained(folder)
            limit = position_limit(AutoConfig.from_pretrained(folder))
        except (OSError, ValueError) as err:
            raise CheckpointError(f"{folder}: cannot load its config or tokenizer: {_first_line(err)}") from None
        max_length = truncation_length(tokenizer, max_length, limit, key=max_length_key)
        try:
            model = (load or load_finetuned)(folder).eval()
        except PipelineError:
            raise
        except Exception as err:  # a damaged weights file: safetensors', torch's and the runtimes' own errors
            raise CheckpointError(f"{folder}: cannot load the {form} model: {_first_line(err)}") from None
        if next(model.parameters(), None) is not None:
            model = accelerator.prepare(model) if accelerator is not None else model.to(device, dtype=dtype)
        return cls(model, tokenizer, task, max_length, accelerator=accelerator, device=device)

    def encode(self, examples: Sequence[Example]) -> dict[str, list[list[int]]]:
        """The token ids of ``examples`` as the tokenizer gives them for a pair or single text, truncated at
        ``max_length``, unpadded: ``{"input_ids": [[...], ...], "attention_mask": ..., ...}``, one list per example."""
        return dict(self._tokenize(examples)) if examples else {"input_ids": []}

    def _tokenize(self, examples: Sequence[Example], **padding: Any):
        """The tokenizer's ``BatchEncoding`` of ``examples`` (one column of texts per text of a row), truncated at
        ``max_length``; ``padding`` are the tokenizer's padding arguments."""
        return self.tokenizer(*[list(column) for column in zip(*examples)], truncation=True,
                              max_length=self.max_length, **padding)

    def logits(self, rows: Sequence[Example] | Dataset | dict[str, list], *, batch_size: int = 32,
               sort_by_length: bool = True, pad_to_multiple_of: int | None = None, fill_rows: bool = False,
               desc: str | None = None) -> torch.Tensor:
        """Logits ``[rows, num_labels]`` (float32, on the CPU) in the order of ``rows``.

        Args:
            rows: examples (tuples of texts, tokenized here), or token ids: a tokenized split (``input_ids``,
                ``attention_mask``, maybe ``token_type_ids``; other columns are ignored) or ``encode``'s output.
            batch_size: rows per forward pass (per process, with an accelerator).
            sort_by_length: batch the rows shortest first (stable), else in their order.
            pad_to_multiple_of: pad each batch's length to a multiple of this many tokens; None: to its longest row.
            fill_rows: fill each batch up to the next of ``row_buckets(batch_size)`` rows with copies of its last
                row (their logits are dropped); not with an accelerator.
            desc: a progress bar's label; None: no bar.
        """
        if fill_rows and self.accelerator is not None:
            raise ValueError("fill_rows: not with an accelerator (its processes gather each batch's rows)")
        if isinstance(rows, list | tuple) and 0 < len(rows) <= batch_size and not fill_rows and not self.accelerator:
            return self._one_batch(rows, pad_to_multiple_of)  # nothing to sort: as the tokenizer pads, in one call
        features = _Features(self.encode(rows) if isinstance(rows, list | tuple) else rows)
        order = length_order(features.lengths()) if sort_by_length else np.arange(len(features))

        def collate(batch: list[dict]) -> tuple[Any, int]:
            size = len(batch)
            if fill_rows:
                batch = batch + batch[-1:] * (bucket(size, batch_size) - size)
            return self.tokenizer.pad(batch, padding=True, pad_to_multiple_of=pad_to_multiple_of,
                                      return_tensors="pt"), size

        # its own generator: iterating the loader leaves torch's global RNG (training's dropout) as it is
        loader = DataLoader(Subset(features, order.tolist()), batch_size=batch_size, collate_fn=collate,
                            generator=torch.Generator())
        if self.accelerator is not None:
            loader = self.accelerator.prepare(loader)
        main = self.accelerator is None or self.accelerator.is_local_main_process
        outputs = []
        self.model.eval()
        with torch.no_grad():
            for batch, size in tqdm(loader, desc=desc, unit="batch", leave=False, disable=desc is None or not main):
                if self.accelerator is None:
                    batch = batch.to(self.device)
                logits = self.model(**batch).logits[:size]
                if self.accelerator is not None:
                    logits = self.accelerator.gather_for_metrics(logits)
                outputs.append(logits.float().cpu())
        sorted_logits = torch.cat(outputs) if outputs else torch.empty(0, self.task.num_labels)
        logits = torch.empty_like(sorted_logits)
        logits[torch.from_numpy(order)] = sorted_logits
        return logits

    def _one_batch(self, examples: Sequence[Example], pad_to_multiple_of: int | None) -> torch.Tensor:
        """Logits ``[examples, num_labels]`` of examples that fit one batch, tokenized and padded by the tokenizer
        in one call: the same batch as ``encode`` and ``PreTrainedTokenizerBase.pad`` give, without the token ids'
        trip through Python lists."""
        batch = self._tokenize(examples, padding=True, pad_to_multiple_of=pad_to_multiple_of,
                               return_tensors="pt").to(self.device)
        self.model.eval()
        with torch.no_grad():
            return self.model(**batch).logits.float().cpu()

    def answers(self, logits: torch.Tensor) -> list[dict]:
        """``answers`` of ``logits`` for this task."""
        return answers(logits, self.task)

    def table(self, table: pd.DataFrame, logits: torch.Tensor) -> pd.DataFrame:
        """``with_predictions`` of ``table`` and ``logits`` for this task."""
        return with_predictions(table, logits, self.task)


class _Features(torch.utils.data.Dataset):
    """Rows of token ids, each ``{name: ids}`` for the ``MODEL_INPUTS`` present, from a tokenized split or a dict of
    lists."""

    def __init__(self, rows: Dataset | dict[str, list]):
        if isinstance(rows, dict):
            self.columns, self.dataset = {k: v for k, v in rows.items() if k in MODEL_INPUTS}, None
        else:
            self.columns, self.dataset = None, rows.select_columns([c for c in MODEL_INPUTS if c in rows.column_names])

    def __len__(self) -> int:
        return len(self.dataset) if self.dataset is not None else len(self.columns["input_ids"])

    def __getitem__(self, i: int) -> dict:
        return self.__getitems__([i])[0]

    def __getitems__(self, indices: list[int]) -> list[dict]:
        if self.dataset is not None:
            return self.dataset.__getitems__(indices)
        return [{name: values[i] for name, values in self.columns.items()} for i in indices]

    def lengths(self) -> list[int]:
        """Tokens per row, special tokens included."""
        if self.dataset is not None:
            return token_lengths(self.dataset)
        return [len(ids) for ids in self.columns["input_ids"]]


def row_buckets(max_rows: int) -> list[int]:
    """The row counts a batch is filled up to (``Predictor.logits(fill_rows=True)``): 1, 2, 4, 8, then multiples of
    8, and ``max_rows``."""
    sizes = [size for size in (1, 2, 4) if size < max_rows] + list(range(8, max_rows, 8))
    return [*sizes, max_rows]


def bucket(rows: int, max_rows: int) -> int:
    """The smallest of ``row_buckets(max_rows)`` that holds ``rows``."""
    return next(size for size in row_buckets(max_rows) if size >= rows)


def with_predictions(table: pd.DataFrame, logits: torch.Tensor, task: Task) -> pd.DataFrame:
    """``table`` (one row per example, in the order of ``logits`` ``[examples, num_labels]``) plus ``prediction`` (the
    class name, or the score rounded to 5 decimals) and, for classification, ``probability_<name>`` per class (softmax,
    5 decimals)."""
    predicted = predictions_of(logits, task).numpy()
    if task.is_regression:
        return table.assign(prediction=predicted.round(5))
    probabilities = logits.softmax(dim=-1).numpy().round(5)
    return table.assign(prediction=np.array(task.label_names)[predicted],
                        **{f"probability_{name}": probabilities[:, i] for i, name in enumerate(task.label_names)})


def answers(logits: torch.Tensor, task: Task) -> list[dict]:
    """Per row of ``logits`` ``[examples, num_labels]``, what ``with_predictions`` writes as a record:
    ``{"label": name, "probabilities": {name: p, ...}}`` (5 decimals), or ``{"score": s}`` for regression."""
    if task.is_regression:  # rounded as float32, as in the table, then written as the shortest decimal
        return [{"score": round(score, 5)} for score in predictions_of(logits, task).numpy().round(5).tolist()]
    names = task.label_names
    probabilities = logits.softmax(dim=-1).numpy().round(5).tolist()
    return [{"label": names[label], "probabilities": {name: round(p, 5) for name, p in zip(names, row)}}
            for label, row in zip(predictions_of(logits, task).tolist(), probabilities)]


def _first_line(err: Exception) -> str:
    return f"{type(err).__name__}: {(str(err).strip().splitlines() or [''])[0][:300]}"
