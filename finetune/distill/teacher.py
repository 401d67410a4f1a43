"""The teacher stage: a fine-tuned teacher's logits of every train row and transfer pair, in data/teacher
(docs/distillation.md). torch, transformers and datasets are imported inside functions: distillation off loads none.
"""

from __future__ import annotations

import json
import logging
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from finetune.distill.loss import LOGITS_FILE, TEACHER_FILE, TRANSFER_FILE, TRANSFER_LOGITS_FILE, Teacher
from finetune.errors import DataError, TeacherError
from finetune.params import Params
from finetune.paths import Paths
from finetune.runtime import atomic_dir, make_accelerator, sha256_file, write_json
from finetune.tasks import Task

if TYPE_CHECKING:
    from datasets import Dataset

log = logging.getLogger(__name__)

WEIGHT_SUFFIXES = (".safetensors", ".bin")  # the weights files of a save_pretrained folder, hashed into teacher.json


def write_off(folder: Path) -> None:
    """Write a constant ``teacher.json`` saying distillation is off, so the train stage does not rerun."""
    with atomic_dir(folder) as tmp:
        write_json(tmp / TEACHER_FILE, {"distillation": False, "teacher": None})


def describe_teacher(folder: Path, teacher: str, task: Task) -> dict:
    """The teacher checkpoint's identity from its config.json, checked against ``task``: ``teacher``,
    ``model_type``, ``weights`` (file -> sha256), ``task_type``, ``id2label``.

    Raises:
        CheckpointError: the folder lacks config, weights or tokenizer.
        TeacherError: another task type than the task's, or other class names or id order.
    """
    from finetune.modeling import check_checkpoint  # heavy: torch; distill.teacher null loads none

    check_checkpoint(folder)
    config = json.loads((folder / "config.json").read_text())
    id2label = {str(k): v for k, v in (config.get("id2label") or {}).items()}
    regression = (config.get("problem_type") or ("regression" if len(id2label) == 1 else None)) == "regression"
    kind, wanted = ("regression" if r else "classification" for r in (regression, task.is_regression))
    names = [id2label.get(str(i)) for i in range(len(id2label))]
    where = f"{folder / 'config.json'}: the teacher {teacher!r} (distill.teacher)"
    if kind != wanted:
        raise TeacherError(f"{where} is a {kind} model, but task {task.name!r} is {wanted}; a teacher must be "
                           "fine-tuned on the same task")
    if not task.is_regression and names != list(task.label_names):
        raise TeacherError(f"{where} has labels {names}, but task {task.name!r} has {list(task.label_names)}; a "
                           "teacher must be fine-tuned on the same labels, in the same id order")
    return {"distillation": True, "teacher": teacher, "model_type": config.get("model_type"),
            "weights": {f.name: sha256_file(f) for f in sorted(folder.iterdir()) if f.suffix in WEIGHT_SUFFIXES},
            "task_type": kind, "id2label": id2label}


def teacher_logits(params: Params, paths: Paths) -> Teacher:
    """The teacher's logits of every train row (``paths.tokenized``'s order) and transfer pair. Its identity
    (teacher.json) is ``describe_teacher``'s, ``rows``, ``data`` (the train split's fingerprint), ``transfer`` (the
    set's description, or None) and ``score_rows``'s run.

    Raises:
        CheckpointError, TeacherError: see ``describe_teacher``.
        DataError: data/raw and data/tokenized hold different train row counts; the transfer set can't be made.
    """
    # heavy: with distill.teacher null the teacher stage loads no torch, datasets or transformers
    from datasets import Dataset, load_from_disk

    from finetune.distill.transfer import make_transfer_set

    start, folder, task = time.perf_counter(), paths.root / params.distill.teacher, Task.load(paths.tokenized)
    identity = describe_teacher(folder, params.distill.teacher, task)
    raw, tokenized = load_from_disk(str(paths.raw)), load_from_disk(str(paths.tokenized))["train"]
    if len(raw["train"]) != len(tokenized):  # the teacher reads data/raw row for row with data/tokenized
        raise DataError(f"{paths.raw}: {len(raw['train'])} train rows, but {paths.tokenized} has {len(tokenized)}; "
                        "rerun `dvc repro tokenize`")
    sets, pairs, described = {"train": raw["train"]}, None, None
    if params.distill.transfer.kind is not None:
        pairs, described = make_transfer_set(params.distill.transfer, raw, task)
        sets["transfer"] = Dataset.from_pandas(pairs[list(task.text_columns)].assign(idx=range(len(pairs))),
                                               preserve_index=False)
    logits, run = score_rows(params, folder, task, sets)
    identity.update(rows=len(tokenized), data={"fingerprint": tokenized._fingerprint}, transfer=described, **run,
                    seconds=round(time.perf_counter() - start, 1))
    return Teacher(identity, logits["train"], pairs, logits.get("transfer"))


def score_rows(params: Params, folder: Path, task: Task, sets: dict[str, Dataset]) -> tuple[dict, dict]:
    """The logits of the teacher in ``folder`` (with its own tokenizer) of each of ``sets`` (name -> rows with the
    text columns and ``idx``), batched like evaluation, in ``train.mixed_precision``; ``tokenize.max_length`` is
    capped at the teacher's ``model_max_length``.

    Returns:
        ``(logits, run)``: per set float32 ``[rows, num_labels]`` in row order; the run's ``max_length``,
        ``mixed_precision`` and ``device``.
    """
    # heavy: with distill.teacher null the teacher stage loads no torch, datasets or transformers
    from datasets import DatasetDict

    from finetune.data.tokenization import tokenize, truncation_length
    from finetune.hardware import describe_device, resolve_mixed_precision
    from finetune.inference.predictor import Predictor

    mixed_precision = resolve_mixed_precision(params.train.mixed_precision)
    accelerator = make_accelerator(mixed_precision=mixed_precision)
    teacher = Predictor.open(folder, task=task, accelerator=accelerator)
    max_length = min(truncation_length(teacher.tokenizer, params.tokenize.max_length),
                     teacher.tokenizer.model_max_length)
    log.info("Teacher %s on %s, %s tokenizer (truncation at %d tokens), mixed precision %s, %s", folder,
             " and ".join(f"{len(rows)} {name} rows" for name, rows in sets.items()),
             type(teacher.tokenizer).__name__, max_length, mixed_precision, accelerator.device)
    logits = {}
    with tempfile.TemporaryDirectory(prefix="teacher-tokens-") as scratch:  # memory-mapped, not in memory
        encoded = tokenize(DatasetDict(sets), teacher.tokenizer, max_length, task.text_columns,
                           cache_dir=Path(scratch))
        for name, rows in encoded.items():
            outputs = teacher.logits(rows, batch_size=params.evaluate.batch_size,
                                     sort_by_length=params.evaluate.sort_by_length, desc=f"teacher: {name}")
            logits[name] = outputs.numpy().astype(np.float32)
        del encoded
    return logits, {"max_length": max_length, "mixed_precision": mixed_precision,
                    "device": describe_device(accelerator.device)}


def save_teacher(folder: Path, teacher: Teacher) -> None:
    """Write ``teacher`` into ``folder`` atomically (a failure leaves the previous folder as it was)."""
    with atomic_dir(folder) as tmp:
        np.save(tmp / LOGITS_FILE, teacher.logits)
        if teacher.transfer is not None:
            teacher.transfer.to_parquet(tmp / TRANSFER_FILE, index=False)
            np.save(tmp / TRANSFER_LOGITS_FILE, teacher.transfer_logits)
        write_json(tmp / TEACHER_FILE, teacher.identity)
