"""Stage 5, evaluate: accuracy and F1 of the fine-tuned model on validation, and on test when it has labels.

Writes metrics/eval.json ``{"validation": {"accuracy", "f1", "loss", "examples"}, "test": {...}}``,
data/predictions/<split>.csv (idx, sentence1, sentence2, label, prediction, probability of "equivalent") and,
per labeled split, DVCLive's confusion matrix, precision-recall and ROC data under
dvclive/evaluate/plots/sklearn/<split>/.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import numpy as np
from accelerate import PartialState
from datasets import load_from_disk
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from stages.common import (
    FINETUNED_DIR,
    LIVE_DIR,
    METRICS_DIR,
    PREDICTIONS_DIR,
    RAW_DIR,
    TOKENIZED_DIR,
    EvaluateParams,
    atomic_dir,
    load_params,
    make_accelerator,
    open_live,
    set_cpu_threads,
    setup_logging,
    write_json,
)
from stages.data import is_labeled, make_collator
from stages.modeling import check_checkpoint, evaluate_split, evaluation_batches, load_metric

log = setup_logging()


def log_plots(live, split: str, labels, predictions, probabilities) -> None:
    """Confusion matrix, precision-recall and ROC curves of one split, with DVCLive's ``log_sklearn_plot``.

    ``labels`` and ``predictions`` are 0/1 arrays ``[examples]``; ``probabilities`` is P(equivalent) ``[examples]``.
    Files land in ``<live dir>/plots/sklearn/<split>/{confusion_matrix,precision_recall,roc}.json``; dvc.yaml
    declares how they are drawn.
    """
    live.log_sklearn_plot("confusion_matrix", labels, predictions, name=f"{split}/confusion_matrix.json")
    live.log_sklearn_plot("precision_recall", labels, probabilities, name=f"{split}/precision_recall.json",
                          drop_intermediate=True)
    live.log_sklearn_plot("roc", labels, probabilities, name=f"{split}/roc.json", drop_intermediate=True)


def evaluate_model(p: EvaluateParams, model_dir: Path, tokenized_dir: Path, raw_dir: Path, predictions_dir: Path,
                   live_dir: Path | None = None) -> dict:
    """Evaluate ``model_dir`` on ``p.splits``; write one predictions CSV per split into ``predictions_dir``.

    With ``live_dir``, each labeled split's confusion matrix, PR and ROC data are logged there (``log_plots``).

    Returns:
        ``{split: {"accuracy", "f1", "loss", "examples"}}`` for each labeled split (an unlabeled split only
        gets its predictions file and ``{"examples": n}``).
    """
    set_cpu_threads(None)
    accelerator = make_accelerator()
    check_checkpoint(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = accelerator.prepare(AutoModelForSequenceClassification.from_pretrained(model_dir))
    main = accelerator.is_main_process  # every process evaluates its share; the main one writes the files
    tokenized, raw = load_from_disk(str(tokenized_dir)), load_from_disk(str(raw_dir))
    collator = make_collator(tokenizer)
    results = {}
    live_ctx = atomic_dir(live_dir) if live_dir is not None and main else contextlib.nullcontext()
    with atomic_dir(predictions_dir) if main else contextlib.nullcontext() as tmp, live_ctx as live_tmp:
        live = open_live(live_tmp) if live_tmp is not None else None
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
    params = load_params().evaluate
    results = evaluate_model(params, FINETUNED_DIR, TOKENIZED_DIR, RAW_DIR, PREDICTIONS_DIR, LIVE_DIR / "evaluate")
    if PartialState().is_main_process:
        write_json(METRICS_DIR / "eval.json", results)


if __name__ == "__main__":
    main()
