"""Stage 5, evaluate: accuracy and F1 of the fine-tuned model on validation, and on test when it has labels.

Writes metrics/eval.json ``{"validation": {"accuracy", "f1", "loss", "examples"}, "test": {...}}``,
data/predictions/<split>.csv (idx, sentence1, sentence2, label, prediction, probability of "equivalent") and,
per labeled split, DVCLive's confusion matrix, precision-recall and ROC data under
dvclive/evaluate/plots/sklearn/<split>/.
"""

from __future__ import annotations

import contextlib
import logging

import numpy as np
from accelerate import PartialState
from datasets import load_from_disk
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from finetune.batches import evaluation_batches, make_collator
from finetune.data import is_labeled
from finetune.live import log_plots, open_live
from finetune.evaluation import evaluate_split, load_metric
from finetune.params import Params, Paths, load_params
from finetune.runtime import atomic_dir, make_accelerator, run_stage, set_cpu_threads, write_json
from finetune.sources import check_checkpoint

log = logging.getLogger(__name__)


def evaluate_model(params: Params, paths: Paths) -> dict:
    """Evaluate ``paths.finetuned`` on ``evaluate.splits``; write one predictions CSV per split into
    ``paths.predictions`` and each labeled split's confusion matrix, PR and ROC data into ``paths.eval_logs``.

    Returns:
        ``{split: {"loss", "accuracy", "f1", "examples"}}`` for each labeled split (an unlabeled split only
        gets its predictions file and ``{"examples": n}``).
    """
    p = params.evaluate
    set_cpu_threads(None)
    accelerator = make_accelerator()
    check_checkpoint(paths.finetuned)
    tokenizer = AutoTokenizer.from_pretrained(paths.finetuned)
    model = accelerator.prepare(AutoModelForSequenceClassification.from_pretrained(paths.finetuned))
    main = accelerator.is_main_process  # every process evaluates its share; the main one writes the files
    tokenized, raw = load_from_disk(str(paths.tokenized)), load_from_disk(str(paths.raw))
    collator = make_collator(tokenizer)
    results = {}
    with (atomic_dir(paths.predictions) if main else contextlib.nullcontext()) as tmp, \
            (atomic_dir(paths.eval_logs) if main else contextlib.nullcontext()) as live_tmp:
        live = open_live(live_tmp) if main else None
        for split in p.splits:
            labeled = is_labeled(tokenized[split])
            dataloader, order = evaluation_batches(tokenized[split], collator, p)
            metrics, logits = evaluate_split(model, accelerator.prepare(dataloader), accelerator,
                                             load_metric() if labeled else None)
            if order is not None:  # back to row order
                logits = logits[np.argsort(order)]
            probability = logits.softmax(dim=-1)[:, 1]
            table = raw[split].select_columns(["idx", "sentence1", "sentence2", "label"]).to_pandas()
            table["prediction"] = logits.argmax(dim=-1).numpy()
            table["probability"] = probability.numpy().round(5)
            if main:
                table.to_csv(tmp / f"{split}.csv", index=False)
            results[split] = {**{k: round(v, 4) for k, v in metrics.items()}, "examples": len(table)}
            if live is not None and labeled:
                log_plots(live, split, table["label"].to_numpy(), table["prediction"].to_numpy(),
                          probability.double().numpy())
            log.info("%s: %s", split, results[split] if labeled else "no labels, predictions only")
        if live is not None:
            live.end()
    accelerator.wait_for_everyone()
    return results


def main() -> None:
    paths = Paths()
    results = evaluate_model(load_params(), paths)
    if PartialState().is_main_process:
        write_json(paths.metrics / "eval.json", results)


if __name__ == "__main__":
    run_stage(main)
