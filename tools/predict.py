"""Score new examples with the fine-tuned model: a CSV / TSV / JSON Lines / JSON / Parquet file in, the same rows
with the predicted label and one probability per class (regression: the predicted score) out.

Not a pipeline stage: what users run next, on data the pipeline has never seen. The file needs the text columns the
model was trained on (``models/finetuned/task.json``, e.g. ``sentence1`` and ``sentence2`` for MRPC); other columns
are kept as they are.

    python -m tools.predict new_pairs.csv --out predictions.csv
    python -m tools.predict reviews.jsonl --model models/finetuned --batch-size 64 --out scored.csv
    python -m tools.predict new_pairs.csv --form onnx-int8 --out predictions.csv   # a served form (models/exported)
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from transformers import AutoTokenizer

from finetune.batches import evaluation_loader
from finetune.checks import check_text
from finetune.errors import DataError, PipelineError
from finetune.evaluation import evaluate_split, with_predictions
from finetune.loading import load_files
from finetune.forms import PYTORCH, load_form
from finetune.params import EvaluateParams
from finetune.runtime import make_accelerator, set_cpu_threads, setup_logging
from finetune.tasks import Task
from finetune.tokenization import tokenize

log = logging.getLogger(__name__)


def predict(input_file: Path, model_dir: Path, batch_size: int = 64, max_length: int | None = None,
            form: str = PYTORCH, exported_dir: Path = Path("models/exported")) -> pd.DataFrame:
    """The rows of ``input_file`` with ``prediction`` (class name, or score for regression) and, for classification,
    ``probability_<name>`` per class, in the file's order, by the model of ``form``: ``pytorch`` (``model_dir``) or
    a served form in ``exported_dir`` (finetune/forms.py).

    Batches go shortest first (length-sorted, little padding) and the outputs are put back in row order.

    Raises:
        CheckpointError: ``model_dir`` lacks config, weights or tokenizer.
        ExportError: an unknown form, one not exported, or ONNX Runtime missing.
        DataError: the file can't be read, has no rows, lacks a text column (the message lists those it has), or
            has an empty text; naming the file and the row.
    """
    set_cpu_threads(None)
    model = load_form(form, model_dir, exported_dir)
    model_dir = model_dir if form == PYTORCH else exported_dir / form  # the form's own tokenizer and task.json
    task = Task.load(model_dir)
    data = load_files({"input": input_file})["input"]
    if len(data) == 0:
        raise DataError(f"{input_file}: no rows to predict")
    missing = [c for c in task.text_columns if c not in data.column_names]
    if missing:
        raise DataError(f"{input_file}: lacks column(s) {missing} that the model reads; has {data.column_names}")
    rows = data.to_pandas()
    rows.attrs["numbered"] = True  # errors name the row's number in the file
    check_text(rows, task.text_columns, str(input_file), "input")
    text = data.select_columns(list(task.text_columns)).add_column("idx", list(range(len(data))))
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenized = tokenize({"input": text}, tokenizer, max_length or tokenizer.model_max_length, task.text_columns)
    accelerator = make_accelerator()
    if form in (PYTORCH, "torch-bf16"):  # an ONNX Runtime session runs on the CPU as it is
        model = accelerator.prepare(model)
    loader, order = evaluation_loader(tokenized["input"], tokenizer, EvaluateParams(
        batch_size=batch_size, sort_by_length=True, splits=["test"]))
    _, logits = evaluate_split(model, accelerator.prepare(loader), accelerator, task, None, desc="predict")
    return with_predictions(rows, logits[np.argsort(order)], task)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("input", type=Path, help="CSV, TSV, JSON Lines, JSON or Parquet file of new examples")
    parser.add_argument("--model", type=Path, default=Path("models/finetuned"), help="fine-tuned model folder")
    parser.add_argument("--form", default=PYTORCH, help="pytorch (the model folder, fp32) or a form the export "
                        "stage made: onnx-fp32, onnx-int8, torch-bf16, openvino-fp32, openvino-bf16, "
                        "openvino-int8 (docs/serving.md)")
    parser.add_argument("--exported", type=Path, default=Path("models/exported"), help="the export stage's folder")
    parser.add_argument("--out", type=Path, default=Path("predictions.csv"), help="CSV to write")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--max-length", type=int, default=None, help="truncation in tokens (default: the model's)")
    args = parser.parse_args(argv)
    setup_logging()
    try:
        table = predict(args.input, args.model, args.batch_size, args.max_length, args.form, args.exported)
    except PipelineError as err:
        sys.exit(f"ERROR: {err}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    partial = args.out.with_name(f".{args.out.name}.tmp")  # renamed when complete: never a half-written file
    table.to_csv(partial, index=False)
    os.replace(partial, args.out)
    log.info("Wrote %d predictions to %s", len(table), args.out)


if __name__ == "__main__":
    main()
