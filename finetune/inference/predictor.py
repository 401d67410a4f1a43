"""One inference path: a classifier with its tokenizer and task, opened once from a model folder of any form
(``Predictor.open``), scoring rows in their order and turning logits into answers.

Inside ``Predictor.logits`` texts are tokenized in one call, then rows of token ids (the tokenized ones, or a
tokenized split's) go one way: sorted by length (little padding), batched, padded as the tokenizer pads
(``finetune.data.batches.scoring_batches``: optionally to a multiple of some tokens, and optionally filled up to a few
row counts, so a compiled runtime meets few input shapes), run, and put back in row order. With an
``accelerate.Accelerator`` the batches are shared among its processes and gathered (``gather_for_metrics``), as in
the Hugging Face course's evaluation loop ("A full training", https://huggingface.co/learn/llm-course/chapter3/4).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm
from transformers import AutoTokenizer, PretrainedConfig, PreTrainedTokenizerBase

from finetune.data.batches import TokenRows, scoring_batches
from finetune.data.tokenization import position_limit, truncation_length
from finetune.errors import CheckpointError, PipelineError, first_line
from finetune.modeling import check_checkpoint, load_finetuned
from finetune.runtime import set_cpu_threads
from finetune.tasks import Task, predictions_of

if TYPE_CHECKING:
    from accelerate import Accelerator
    from datasets import Dataset

PYTORCH = "pytorch"  # the fine-tuned model as trained (fp32): the reference form, which ``Predictor.open`` opens
Example = tuple[str, ...]  # one row's texts, in the task's ``text_columns`` order


def read_model_folder(folder: Path, need_weights: bool = True, task: Task | None = None,
                      max_length: int | None = None, max_length_key: str = "max_length",
                      ) -> tuple[Task, PretrainedConfig, PreTrainedTokenizerBase, int]:
    """A model folder's task (its task.json, unless ``task`` is given), config (read once, ``check_checkpoint``),
    tokenizer and truncation length (``max_length``, else the tokenizer's ``model_max_length``), without loading the
    model: what ``Predictor.open`` and ``tools.serve``'s start-up check read.

    Raises:
        CheckpointError: the folder is missing, or lacks task.json, config.json, weights (``need_weights``) or a
            tokenizer that loads; one line naming the folder.
        ParamsError: ``max_length`` is above the model's positions, naming ``max_length_key``.
    """
    if not folder.is_dir():
        raise CheckpointError(f"{folder}: model folder not found")
    task = task or Task.load(folder)
    config = check_checkpoint(folder, need_weights=need_weights)
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, config=config)
    except Exception as err:  # transformers' and the tokenizers library's errors (a tokenizer.json of another shape)
        raise CheckpointError(f"{folder}: cannot load its tokenizer: {first_line(err)}") from None
    return task, config, tokenizer, truncation_length(tokenizer, max_length, position_limit(config), key=max_length_key)


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
    def open(cls, folder: str | Path, *, load: Callable[..., torch.nn.Module] | None = None, form: str = PYTORCH,
             task: Task | None = None, max_length: int | None = None, max_length_key: str = "max_length",
             num_threads: int | None = None, device: str = "cpu", dtype: torch.dtype | None = None,
             accelerator: Accelerator | None = None) -> Predictor:
        """Open the model folder ``folder``: its task (its task.json, unless ``task`` is given), tokenizer, truncation
        length and classifier, on ``num_threads`` CPU threads (None: this process's share of the CPUs). Its
        config.json is read once (``check_checkpoint``) and handed to the tokenizer and the loader. A classifier with
        torch parameters goes to ``accelerator`` (prepared: its device and mixed precision) or to ``device`` in
        ``dtype``; one without (a runtime's session, holding no torch parameters) runs on the CPU.

        Args:
            load: the classifier's loader, ``(folder, config) -> torch.nn.Module`` (a served form's, from the
                registry: ``finetune.export.registry.open_form``); None: the fine-tuned PyTorch model (fp32).
            form: the form's name, for errors.
            max_length: truncation in tokens, at most the model's positions; None: the model's own, the tokenizer's
                ``model_max_length`` (the train stage saves the length it trained with there).
            max_length_key: where ``max_length`` came from, for the error (``--max-length``).

        Raises:
            CheckpointError: the folder is missing, or lacks task.json, config.json or the tokenizer, or its weights
                can't be read (a damaged file); one line naming the folder.
            ExportError: the form's runtime is not installed, or its file is missing.
            ParamsError: ``max_length`` is above the model's positions.
        """
        folder = Path(folder)
        task, config, tokenizer, max_length = read_model_folder(folder, load is None, task, max_length, max_length_key)
        set_cpu_threads(num_threads)  # torch's, which the other runtimes take too
        try:
            model = (load or load_finetuned)(folder, config).eval()
        except PipelineError:
            raise
        except Exception as err:  # a damaged weights file: safetensors', torch's and the runtimes' own errors
            raise CheckpointError(f"{folder}: cannot load the {form} model: {first_line(err)}") from None
        if next(model.parameters(), None) is not None:
            model = accelerator.prepare(model) if accelerator is not None else model.to(device, dtype=dtype)
        else:  # a runtime's session: its batches stay on the CPU, whatever device was asked for
            device = "cpu"
        return cls(model, tokenizer, task, max_length, accelerator=accelerator, device=device)

    def encode(self, examples: Sequence[Example]) -> dict[str, list[list[int]]]:
        """The token ids of ``examples`` (one column of texts per text of a row) as the tokenizer gives them for a
        pair or single text, truncated at ``max_length``, unpadded, in one call of the tokenizer:
        ``{"input_ids": [[...], ...], "attention_mask": ..., ...}``, one list per example."""
        if not examples:
            return {"input_ids": []}
        return dict(self.tokenizer(*[list(column) for column in zip(*examples)], truncation=True,
                                   max_length=self.max_length))

    def logits(self, rows: Sequence[Example] | Dataset | dict[str, list], *, batch_size: int = 32,
               sort_by_length: bool = True, pad_to_multiple_of: int | None = None, fill_rows: bool = False,
               desc: str | None = None) -> torch.Tensor:
        """Logits ``[rows, num_labels]`` (float32, on the CPU) in the order of ``rows``, in the batches of
        ``finetune.data.batches.scoring_batches``.

        Args:
            rows: examples (tuples of texts, tokenized here by ``encode``), or token ids: a tokenized split
                (``input_ids``, ``attention_mask``, maybe ``token_type_ids``; other columns are ignored) or
                ``encode``'s output.
            batch_size: rows per forward pass (per process, with an accelerator).
            sort_by_length: batch the rows shortest first (stable), else in their order.
            pad_to_multiple_of: pad each batch's length to a multiple of this many tokens; None: to its longest row.
            fill_rows: fill each batch up to the next of ``row_buckets(batch_size)`` rows with copies of its last
                row (their logits are dropped); not with an accelerator.
            desc: a progress bar's label; None: no bar.
        """
        if fill_rows and self.accelerator is not None:
            raise ValueError("fill_rows: not with an accelerator (its processes gather each batch's rows)")
        rows = TokenRows(self.encode(rows) if isinstance(rows, list | tuple) else rows)
        loader = scoring_batches(rows, self.tokenizer, batch_size, sort_by_length=sort_by_length,
                                 pad_to_multiple_of=pad_to_multiple_of, fill_rows=fill_rows)
        if self.accelerator is not None:
            batches, main = self.accelerator.prepare(loader), self.accelerator.is_local_main_process
        else:  # the loader's own batches, fetched as its iterator fetches them, without that iterator's cost per call
            batches, main = (loader.collate_fn(loader.dataset.__getitems__(positions))
                             for positions in loader.batch_sampler), True
        outputs = []
        self.model.eval()
        with torch.no_grad():
            for batch, size in tqdm(batches, desc=desc, unit="batch", total=len(loader), leave=False,
                                    disable=desc is None or not main):
                if self.accelerator is None:
                    batch = batch.to(self.device)
                logits = self.model(**batch).logits[:size]
                if self.accelerator is not None:
                    logits = self.accelerator.gather_for_metrics(logits)
                outputs.append(logits.float().cpu())
        sorted_logits = torch.cat(outputs) if outputs else torch.empty(0, self.task.num_labels)
        logits = torch.empty_like(sorted_logits)
        logits[torch.tensor(loader.dataset.indices, dtype=torch.long)] = sorted_logits
        return logits

    def answers(self, logits: torch.Tensor) -> list[dict]:
        """``answers`` of ``logits`` for this task."""
        return answers(logits, self.task)

    def table(self, table: pd.DataFrame, logits: torch.Tensor) -> pd.DataFrame:
        """``with_predictions`` of ``table`` and ``logits`` for this task."""
        return with_predictions(table, logits, self.task)


def prediction_columns(logits: torch.Tensor, task: Task) -> dict[str, np.ndarray]:
    """The answers of ``logits`` ``[examples, num_labels]``, the one place logits become answers: ``prediction``, the
    class name (``task.label_names``, argmax) or, for regression, the score (float32 rounded to 5 decimals), and, for
    classification, ``probability_<name>`` per class (softmax, float32 rounded to 5 decimals)."""
    predicted = predictions_of(logits, task).numpy()
    if task.is_regression:
        return {"prediction": predicted.round(5)}
    probabilities = logits.softmax(dim=-1).numpy().round(5)
    return {"prediction": np.array(task.label_names)[predicted],
            **{f"probability_{name}": probabilities[:, i] for i, name in enumerate(task.label_names)}}


def with_predictions(table: pd.DataFrame, logits: torch.Tensor, task: Task) -> pd.DataFrame:
    """``table`` (one row per example, in the order of ``logits`` ``[examples, num_labels]``) with the columns of
    ``prediction_columns``."""
    return table.assign(**prediction_columns(logits, task))


def answers(logits: torch.Tensor, task: Task) -> list[dict]:
    """Per row of ``logits`` ``[examples, num_labels]``, ``prediction_columns`` as a record, each value written as
    its shortest decimal: ``{"label": name, "probabilities": {name: p, ...}}``, or ``{"score": s}`` for
    regression."""
    columns = prediction_columns(logits, task)
    if task.is_regression:
        return [{"score": round(score, 5)} for score in columns["prediction"].tolist()]
    names = task.label_names
    probabilities = zip(*(columns[f"probability_{name}"].tolist() for name in names))
    return [{"label": label, "probabilities": {name: round(p, 5) for name, p in zip(names, row)}}
            for label, row in zip(columns["prediction"].tolist(), probabilities)]
