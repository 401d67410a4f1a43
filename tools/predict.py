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
from pathlib import Path

import pandas as pd
import torch

from finetune.checkpoint_files import check_checkpoint_files
from finetune.data.checks import clean_texts
from finetune.data.loading import WRITE_FORMATS, check_writable, load_files, write_table
from finetune.errors import CheckpointError, DataError
from finetune.export.registry import FORMS, form_folder, open_form
from finetune.inference.predictor import PYTORCH
from finetune.runtime import run_stage
from finetune.tasks import Task
from tools.cli import positive_int

log = logging.getLogger(__name__)


def predict(input_file: Path, model_dir: Path, batch_size: int = 64, max_length: int | None = None,
            form: str = PYTORCH, exported_dir: Path = Path("models/exported")) -> pd.DataFrame:
    """The rows of ``input_file`` with ``prediction`` (class name, or score for regression) and, for classification,
    ``probability_<name>`` per class, in the file's order, by the model of ``form``: ``pytorch`` (``model_dir``) or
    a served form in ``exported_dir`` (``finetune.inference.predictor.Predictor``).

    Texts are prepared as for training (``finetune.data.checks.clean_texts``: numbers become text; empty ones are
    refused). The file is read and checked before the model is loaded.

    Args:
        batch_size: rows per forward pass, at least 1.
        max_length: truncation in tokens, at most the model's positions; None: the model's own length.

    Raises:
        ValueError: ``batch_size`` is below 1.
        ExportError: an unknown form, one not exported, or its runtime missing.
        CheckpointError: the model folder lacks task.json, config, weights or tokenizer, or can't be loaded.
        ParamsError: ``max_length`` is above the model's positions.
        DataError: the file can't be read, has no rows, lacks a text column (the message lists those it has), has
            an empty or nested text, or already has a column predict writes; naming the file and the row or column.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size: {batch_size}, expected at least 1")
    folder = form_folder(form, model_dir, exported_dir)  # the form's own tokenizer and task.json
    task = Task.load(folder)
    try:  # before the file is read; light: no torch
        check_checkpoint_files(folder, need_weights=form == PYTORCH)
    except CheckpointError as err:
        raise CheckpointError(f"{err}; --model needs a fine-tuned model folder (models/finetuned) or --form a form "
                              "of models/exported") from None
    data = load_files({"input": input_file}, origin="the input file argument")["input"]
    if len(data) == 0:
        raise DataError(f"{input_file}: no rows to predict")
    missing = [c for c in task.text_columns if c not in data.column_names]
    if missing:
        raise DataError(f"{input_file}: lacks column(s) {missing} that the model reads; has {data.column_names}")
    written = {"prediction", *(() if task.is_regression else (f"probability_{name}" for name in task.label_names))}
    taken = [c for c in data.column_names if c in written]
    if taken:
        raise DataError(f"{input_file}: has column(s) {taken}, which predict writes; rename or drop them first")
    rows = data.to_pandas()
    rows.attrs["numbered"] = True  # errors name the row's number in the file
    clean_texts(rows, task.text_columns, str(input_file), "input")

    predictor = open_form(folder, form, task=task, max_length=max_length, max_length_key="--max-length",
                               device=_device())
    examples = list(zip(*(rows[c].tolist() for c in task.text_columns)))
    return predictor.table(rows, predictor.logits(examples, batch_size=batch_size, desc="predict"))


def _device() -> str:
    """Where a PyTorch form runs: the GPU where torch sees one, else the CPU (other runtimes run on the CPU)."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("input", type=Path, help="CSV, TSV, JSON Lines, JSON or Parquet file of new examples")
    parser.add_argument("--model", type=Path, default=Path("models/finetuned"), help="fine-tuned model folder")
    parser.add_argument("--form", default=PYTORCH, help=f"{PYTORCH} (the model folder, fp32) or a form the export "
                        f"stage made: {', '.join(FORMS)} (docs/serving.md)")
    parser.add_argument("--exported", type=Path, default=Path("models/exported"), help="the export stage's folder")
    parser.add_argument("--out", type=Path, default=Path("predictions.csv"),
                        help=f"file to write, in the format of its suffix: {', '.join(WRITE_FORMATS)}")
    parser.add_argument("--overwrite-input", action="store_true", help="allow --out to be the input file")
    parser.add_argument("--batch-size", type=positive_int, default=64)
    parser.add_argument("--max-length", type=positive_int, default=None,
                        help="truncation in tokens (default: the model's)")
    args = parser.parse_args(argv)

    def run() -> None:
        if args.out.resolve() == args.input.resolve() and not args.overwrite_input:
            raise DataError(f"--out {args.out} is the input file; choose another --out, or pass --overwrite-input")
        check_writable(args.out, "--out")  # before any work: a bad path costs nothing
        table = predict(args.input, args.model, args.batch_size, args.max_length, args.form, args.exported)
        write_table(table, args.out)
        log.info("Wrote %d predictions to %s", len(table), args.out)

    run_stage(run)


if __name__ == "__main__":
    main()
