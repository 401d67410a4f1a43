"""The evaluate stage's work: the fine-tuned model's metrics and collapse check on each asked-for split, its
predictions for every row as a CSV, and DVCLive plots of each labeled split.
"""

from __future__ import annotations

import contextlib
import logging

import numpy as np
import pandas as pd
import torch
from datasets import Dataset, load_from_disk

from finetune.data.prepare import is_labeled, present_splits
from finetune.evaluate.collapse import collapse_check, constant_baseline, warn_if_collapsed
from finetune.evaluate.evaluation import evaluate_split, load_metric
from finetune.evaluate.plots import log_plots
from finetune.hardware import resolve_mixed_precision
from finetune.inference.predictor import Predictor, with_predictions
from finetune.logs import open_live
from finetune.params import Params
from finetune.paths import Paths
from finetune.runtime import atomic_dir, make_accelerator
from finetune.tasks import Task, predictions_of

log = logging.getLogger(__name__)


CHUNK_ROWS = 10_000  # rows of the predictions table built and written at a time


def prediction_table(raw: Dataset, logits: torch.Tensor, task: Task, columns: tuple[str, ...] | None = None,
                     ) -> pd.DataFrame:
    """One row per example of a prepared split ``raw``, in its order: ``columns`` (default ``idx`` and the text
    columns), ``label`` (the gold class name or score; absent when unlabeled), ``prediction`` and the probabilities
    (``finetune.inference.predictor.with_predictions``) of ``logits`` ``[examples, num_labels]``."""
    table = raw.select_columns(list(columns if columns is not None else ["idx", *task.text_columns])).to_pandas()
    if "label" in raw.column_names:
        labels = np.asarray(raw["label"])
        table["label"] = labels if task.is_regression else np.array(task.label_names)[labels]
    return with_predictions(table, logits, task)


def write_predictions(raw: Dataset, logits: torch.Tensor, task: Task, file) -> None:
    """Write ``prediction_table`` of the split to the CSV ``file``, ``CHUNK_ROWS`` rows at a time (the same
    file as one table gives).
    """
    with open(file, "w", newline="") as f:
        for start in range(0, len(raw), CHUNK_ROWS):
            rows = range(start, min(start + CHUNK_ROWS, len(raw)))
            prediction_table(raw.select(rows), logits[start:rows.stop], task).to_csv(f, index=False,
                                                                                     header=start == 0)


def evaluate_model(params: Params, paths: Paths) -> dict:
    """Evaluate ``paths.trained`` on those of ``evaluate.splits`` the data has, in the precision, CPU threads and
    batches that training used (``train.mixed_precision``, ``train.num_threads``), so its validation scores match the
    kept evaluation in metrics/train.json. Writes ``paths.predictions/<split>.csv`` per split (``write_predictions``)
    and each labeled split's plots into ``paths.eval_logs``; only the main process writes.

    Returns:
        ``{split: {"loss", <the task's metrics>, "examples", "baseline", "most_predicted", "collapsed"}}`` for a
        labeled split (the last three: ``finetune.evaluate.collapse.collapse_check``, with a WARNING when collapsed);
        ``{split: {"examples": n}}`` for an unlabeled one.
    """
    p = params.evaluate
    accelerator = make_accelerator(params.train.ddp_timeout,
                                   mixed_precision=resolve_mixed_precision(params.train.mixed_precision))
    predictor = Predictor.open(paths.trained, num_threads=params.train.num_threads, accelerator=accelerator)
    main = accelerator.is_main_process  # every process evaluates its share; the main one writes the files
    tokenized, raw, task = load_from_disk(str(paths.tokenized)), load_from_disk(str(paths.raw)), Task.load(paths.raw)
    results = {}
    with (atomic_dir(paths.predictions) if main else contextlib.nullcontext()) as tmp, \
            (atomic_dir(paths.eval_logs) if main else contextlib.nullcontext()) as live_tmp:
        live = open_live(live_tmp) if main else None
        for split in present_splits(p.splits, tokenized):
            labeled = is_labeled(tokenized[split])
            metric = load_metric(task) if labeled else None
            metrics, logits = evaluate_split(predictor, tokenized[split], metric, p, desc=split)
            if main:
                write_predictions(raw[split], logits, task, tmp / f"{split}.csv")
            results[split] = {**{k: round(v, 4) for k, v in metrics.items()}, "examples": len(logits)}
            if labeled:
                baseline = constant_baseline(task, metric, tokenized["train"]["labels"], tokenized[split]["labels"])
                results[split].update(collapse_check(task, metrics, predictions_of(logits, task), baseline))
                warn_if_collapsed(split, task, metrics, results[split])
            if live is not None and labeled:  # gold and predicted classes, probabilities: no texts
                log_plots(live, split, task, prediction_table(raw[split], logits, task, columns=("idx",)))
            log.info("%s: %s", split, results[split] if labeled else "no labels, predictions only")
        if live is not None:
            live.end()
    accelerator.wait_for_everyone()
    return results
