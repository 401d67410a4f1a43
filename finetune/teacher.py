"""The teacher stage's work: a fine-tuned teacher's logits of every train row, for knowledge distillation (the loss
and the train stage's side: finetune/distill.py; docs/distillation.md).

The teacher is any model this pipeline fine-tuned on the same task (a ``save_pretrained`` folder under models/own,
``distill.teacher``), of any family and tokenizer: it reads the texts of data/raw with its own tokenizer, row for row
with the student's data/tokenized. data/teacher holds:

- ``logits.npy``: ``[rows, num_labels]`` float32 (``[rows, 1]``, the score, for regression), row i of the train split
  of data/tokenized (and data/raw) in row i;
- ``logits_swapped.npy``: the same of each pair in the other order, where data/tokenized holds both orders
  (``train.swap_pairs``), so a row trained in the swapped order is taught by the teacher's logits of that order;
- ``teacher.json``: the teacher's identity (folder, ``_name_or_path``, model type, sha256 of its weights, labels, task
  type), the train rows (``rows``) and the data's fingerprint, precision, device and seconds; with
  ``distill.teacher: null`` only ``{"distillation": false, ...}``;
- with ``distill.transfer`` (finetune/transfer.py) the transfer set: ``transfer.parquet`` (its texts, and how each
  pair was made), ``transfer_logits.npy`` ``[pairs, num_labels]`` (and ``transfer_logits_swapped.npy`` with both
  orders), recorded in teacher.json's ``transfer`` (params, rows, how, the parquet's sha256).

With ``distill.fold_teachers`` (cross-fitting, finetune/folds.py) the train rows' logits come from the fold teachers
instead, each row's from the teacher whose run left its fold out; teacher.json's ``fold_teachers`` records them.

torch, transformers and datasets are imported inside the functions that use them: the teacher stage with
distillation off imports none of them.
"""

from __future__ import annotations

import hashlib
import json
import logging
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from finetune.errors import DataError, TeacherError
from finetune.folds import HOLDOUT_KEY, row_folds
from finetune.params import Params
from finetune.paths import Paths
from finetune.runtime import atomic_dir, write_json
from finetune.tasks import Task
from finetune.transfer import SWAPPED_TRANSFER_LOGITS_FILE, TRANSFER_FILE, TRANSFER_LOGITS_FILE, make_transfer_set

if TYPE_CHECKING:
    from datasets import Dataset, DatasetDict

log = logging.getLogger(__name__)

TEACHER_FILE = "teacher.json"  # in data/teacher: the teacher's identity, or that distillation is off
LOGITS_FILE = "logits.npy"  # [rows, num_labels] float32, the train split's row order
SWAPPED_LOGITS_FILE = "logits_swapped.npy"  # the same, each pair in the other order (train.swap_pairs)
WEIGHT_SUFFIXES = (".safetensors", ".bin")  # the weights files of a save_pretrained folder, hashed into teacher.json


@dataclass(frozen=True)
class TransferSet:
    """The transfer set and the teacher's logits of it (finetune/transfer.py)."""

    pairs: pd.DataFrame  # the task's text columns, and how each pair was made (similarity or source)
    logits: np.ndarray  # [pairs, num_labels] float32, in the row order of ``pairs``
    logits_swapped: np.ndarray | None  # the same of each pair in the other order, or None


@dataclass(frozen=True)
class Teacher:
    """The teacher stage's output (data/teacher): what the train stage distils from."""

    identity: dict  # teacher.json
    logits: np.ndarray  # [rows, num_labels] float32, the train split's row order
    logits_swapped: np.ndarray | None  # the same of each pair in the other order, or None
    transfer: TransferSet | None = None  # with distill.transfer

    def arrays(self) -> list[np.ndarray]:
        """Every array of logits, train rows first."""
        extra = [] if self.transfer is None else [self.transfer.logits, self.transfer.logits_swapped]
        return [a for a in (self.logits, self.logits_swapped, *extra) if a is not None]

    def fingerprint(self) -> dict:
        """What of the teacher decides a run's result, for the resume fingerprint (``finetune.resume``): its identity
        (not its seconds) and the sha256 of its logits."""
        return {"identity": {k: v for k, v in self.identity.items() if k != "seconds"},
                "logits": hashlib.sha256(b"".join(a.tobytes() for a in self.arrays())).hexdigest()}


def write_off(folder: Path) -> dict:
    """``folder/teacher.json`` saying distillation is off (``distill.teacher: null``), atomically; nothing else. The
    content is constant, so the train stage's dependency on ``folder`` does not change."""
    off = {"distillation": False, "teacher": None,
           "note": "distill.teacher is null: distillation is off, the train stage learns from the labels only"}
    with atomic_dir(folder) as tmp:
        write_json(tmp / TEACHER_FILE, off)
    return off


def card_base_model(folder: Path) -> str | None:
    """``base_model`` of the model card ``folder/README.md`` (its YAML header, read with huggingface_hub's
    ``ModelCard`` as the card stage writes it for models/finetuned), or None without a card, that key or a readable
    header."""
    from huggingface_hub import ModelCard
    from yaml import YAMLError

    card = folder / "README.md"
    if not card.is_file():
        return None
    try:
        return ModelCard.load(card, ignore_metadata_errors=True).data.base_model
    except (ValueError, YAMLError):  # a header that is not YAML, or not a mapping
        return None


def describe_teacher(folder: Path, teacher: str) -> dict:
    """The identity of the teacher checkpoint ``folder`` (``distill.teacher`` is ``teacher``), from its config.json:
    ``teacher``, ``name_or_path`` (config's ``_name_or_path``, which transformers 5 no longer saves: often None),
    ``base_model`` (its model card's, for a models/finetuned folder of this pipeline), ``model_type``,
    ``architectures``, ``weights`` (file -> sha256), ``task_type`` (regression or classification), ``num_labels``,
    ``id2label`` and ``holdout_fold`` (what its run left out with ``train.holdout_fold``, or None).

    Raises:
        CheckpointError: the folder lacks config, weights or tokenizer.
    """
    from finetune.sources import check_checkpoint
    from finetune.split_zip import sha256_file

    check_checkpoint(folder)
    config = json.loads((folder / "config.json").read_text())
    id2label = {str(k): v for k, v in (config.get("id2label") or {}).items()}
    num_labels = len(id2label) or config.get("num_labels", 2)
    regression = config.get("problem_type") == "regression" or (config.get("problem_type") is None and num_labels == 1)
    return {"distillation": True, "teacher": teacher, "name_or_path": config.get("_name_or_path"),
            "base_model": card_base_model(folder), "model_type": config.get("model_type"),
            "architectures": config.get("architectures"),
            "weights": {f.name: sha256_file(f) for f in sorted(folder.iterdir()) if f.suffix in WEIGHT_SUFFIXES},
            "task_type": "regression" if regression else "classification", "num_labels": num_labels,
            "id2label": id2label, "holdout_fold": config.get(HOLDOUT_KEY)}


def check_labels(identity: dict, task: Task, where: str, param: str = "distill.teacher") -> None:
    """The teacher (``identity``: teacher.json's fields) predicts what the task's student learns: the same task type,
    and for classification the same class names in the same id order.

    Raises:
        TeacherError: naming ``where`` and ``param`` (the param that names the teacher or its logits).
    """
    teacher = f"the teacher {identity['teacher']!r} ({param})"
    kind = "regression" if task.is_regression else "classification"
    if identity["task_type"] != kind:
        raise TeacherError(f"{where}: {teacher} is a {identity['task_type']} model, but task {task.name!r} is "
                           f"{kind}; a teacher must be fine-tuned on the same task")
    if task.is_regression:
        return
    names = [identity["id2label"].get(str(i)) for i in range(identity["num_labels"])]
    if names != list(task.label_names):
        raise TeacherError(f"{where}: {teacher} has {len(names)} labels {names}, but task {task.name!r} has "
                           f"{task.num_labels} {list(task.label_names)}; a teacher must be fine-tuned on the same "
                           "labels, in the same id order")


def check_aligned(raw: Dataset, tokenized: Dataset, paths: Paths) -> None:
    """The train splits of data/raw (the teacher's texts) and data/tokenized (the student's rows) are the same rows
    in the same order: the same count, and the same label in every row where both have labels.

    Raises:
        DataError: naming both folders and the first row that differs.
    """
    if len(raw) != len(tokenized):
        raise DataError(f"{paths.raw}: {len(raw)} train rows, but {paths.tokenized} has {len(tokenized)}: the teacher "
                        f"reads the texts of {paths.raw} row for row; rerun `dvc repro tokenize`")
    if "label" in raw.column_names and "labels" in tokenized.column_names:
        differ = np.flatnonzero(np.asarray(raw["label"]) != np.asarray(tokenized["labels"]))
        if differ.size:
            raise DataError(f"{paths.raw}: train row {int(differ[0])} (idx={raw[int(differ[0])]['idx']}) has another "
                            f"label than row {int(differ[0])} of {paths.tokenized} ({differ.size} rows differ): the "
                            "splits are not in the same order; rerun `dvc repro tokenize`")


def teacher_logits(params: Params, paths: Paths) -> Teacher:
    """The teacher's logits of every row of the train split, in the row order of ``paths.tokenized``, and with
    ``distill.transfer`` of every pair of the transfer set (``finetune.transfer.make_transfer_set``): the teacher
    (``paths.root / distill.teacher``) and the data checked (``teacher_inputs``), then scored (``score_rows``).

    Returns:
        The ``Teacher``: logits float32 ``[rows, num_labels]`` (``[rows, 1]`` for regression), the same for the
        swapped pairs or None, teacher.json's content (``describe_teacher`` and ``rows`` (the train rows),
        ``swapped``, ``data`` (the datasets' fingerprint of the tokenized train split, and ``rows_sha256`` of the
        raw one: the same on every machine), ``max_length``,
        ``mixed_precision``, ``device``, ``seconds``, and ``transfer``: the transfer set's description or None), and
        the transfer set with its logits or None.

    Raises:
        CheckpointError: the teacher folder lacks config, weights or tokenizer.
        TeacherError: the teacher's labels or task type differ from the task's (``check_labels``).
        DataError: the train splits of data/raw and data/tokenized are not the same rows (``check_aligned``); the
            transfer set can't be made (``make_transfer_set``).
        ParamsError: ``distill.transfer.kind: neighbours`` for a single-text task.
    """
    from datasets import Dataset

    from finetune.tokenization import has_both_orders

    start = time.perf_counter()
    folder = paths.root / params.distill.teacher
    identity, task, raw, tokenized = teacher_inputs(folder, params.distill.teacher, paths)
    swapped = has_both_orders(tokenized)
    fold_teachers = params.distill.fold_teachers  # cross-fitting: they score the train rows instead
    sets, pairs, described = {} if fold_teachers else {"train": raw["train"]}, None, None
    if params.distill.transfer.kind is not None:
        pairs, described = make_transfer_set(params.distill.transfer, raw, task)
        columns = list(task.text_columns)
        sets["transfer"] = Dataset.from_pandas(pairs[columns].assign(idx=range(len(pairs))), preserve_index=False)
    outputs, run = score_rows(params, folder, identity, task, sets, swapped) if sets else ({}, {})
    if fold_teachers:
        outputs["train"], run, identity["fold_teachers"] = cross_fitted_logits(params, paths, task, raw["train"],
                                                                               swapped)
    identity.update({"rows": len(raw["train"]), "swapped": swapped,
                     "data": {"fingerprint": tokenized._fingerprint, "sha256": rows_sha256(raw["train"], task)}, **run, "transfer": described, "seconds": round(time.perf_counter() - start, 1)})
    transfer = None if pairs is None else TransferSet(pairs, *outputs["transfer"])
    return Teacher(identity, *outputs["train"], transfer=transfer)


def rows_sha256(rows: Dataset, task: Task) -> str:
    """sha256 of what the teacher reads of ``rows`` (a split of data/raw): each row's texts (the task's text columns)
    and label, one JSON list per row, in row order. Unlike the datasets fingerprint, which hashes how a split was
    made and differs between machines and setups, it is the same wherever the rows are the same: what
    carried logits (``distill.logits``) are checked against."""
    columns = [c for c in (*task.text_columns, "label") if c in rows.column_names]
    digest = hashlib.sha256()
    for row in zip(*(rows[c] for c in columns)):
        digest.update(json.dumps(row).encode() + b"\n")
    return digest.hexdigest()


def carried_teacher(params: Params, paths: Paths) -> Teacher:
    """The teacher stage's output made elsewhere (``distill.logits``: a data/teacher folder carried in git under
    data/teachers, e.g. from a GPU machine), checked against this project's data and params, for ``save_teacher``.
    No model is loaded. teacher.json gains ``carried`` (the folder and what it recorded of its own run's data
    fingerprint, device and seconds), this data/tokenized's fingerprint (which the train stage checks), ``swapped``
    as data/tokenized has it (carried logits of both orders serve a run on one order: the row order's are kept) and
    this stage's seconds.

    Raises:
        TeacherError: naming the carried teacher.json: it says distillation is off; its rows are other rows than
            data/raw's train split (``rows_sha256``, or none recorded); its labels or task type differ from the task's;
            its transfer set was made with another ``distill.transfer`` (``weight`` aside: a train param), its
            transfer.parquet is not the file it records or holds a validation or test text of this data; a logits
            file is missing (the swapped order's, where data/tokenized holds both orders) or of another shape.
        DataError: the train splits of data/raw and data/tokenized are not the same rows (``check_aligned``).
    """
    from datasets import load_from_disk

    from finetune.split_zip import sha256_file
    from finetune.tokenization import has_both_orders

    start = time.perf_counter()
    folder = paths.root / params.distill.logits
    file, carried = folder / TEACHER_FILE, f"(distill.logits: {params.distill.logits!r})"
    identity = json.loads(file.read_text())
    if not identity.get("distillation"):
        raise TeacherError(f"{file}: says distillation is off {carried}; carry the output of a teacher stage run "
                           "with distill.teacher")
    task = Task.load(paths.tokenized)
    splits, tokenized = load_from_disk(str(paths.raw)), load_from_disk(str(paths.tokenized))["train"]
    raw = splits["train"]
    check_aligned(raw, tokenized, paths)
    check_labels(identity, task, str(file), "distill.logits")
    recorded, here = identity.get("data", {}).get("sha256"), rows_sha256(raw, task)
    if recorded != here:
        raise TeacherError(f"{file}: its logits are of other train rows {carried}: rows sha256 {recorded}, but the "
                           f"train split of {paths.raw} has {here} ({len(raw)} rows, {identity.get('rows')} "
                           "recorded); make them again from this data (docs/distillation.md)")
    transfer, wanted = identity.get("transfer"), params.distill.transfer.model_dump(exclude={"weight"})
    made_with = transfer and {k: v for k, v in transfer["params"].items() if k != "weight"}
    if made_with != (wanted if params.distill.transfer.kind is not None else None):
        raise TeacherError(f"{file}: holds the transfer set of {made_with}, not of distill.transfer {wanted} "
                           f"{carried}; set distill.transfer to what it was made with")
    if transfer is not None and sha256_file(folder / TRANSFER_FILE) != transfer["sha256"]:
        raise TeacherError(f"{folder / TRANSFER_FILE}: not the transfer set {file} records (sha256) {carried}")
    pairs = None if transfer is None else pd.read_parquet(folder / TRANSFER_FILE)
    held_out = {t for name, rows in splits.items() if name != "train" for c in task.text_columns for t in rows[c]}
    if pairs is not None and pairs[list(task.text_columns)].isin(held_out).any(axis=None):
        raise TeacherError(f"{folder / TRANSFER_FILE}: holds texts of this data's validation or test split {carried}; "
                           "a transfer set must never hold them")
    both = has_both_orders(tokenized)  # the orders data/tokenized trains on (train.swap_pairs)
    arrays = {}
    for name, rows in ((LOGITS_FILE, len(raw)), (SWAPPED_LOGITS_FILE, len(raw)),
                       (TRANSFER_LOGITS_FILE, None if pairs is None else len(pairs)),
                       (SWAPPED_TRANSFER_LOGITS_FILE, None if pairs is None else len(pairs))):
        needed = rows is not None and (both or name in (LOGITS_FILE, TRANSFER_LOGITS_FILE))
        if not needed:  # e.g. both orders carried for a run on one order: the row order's logits are enough
            continue
        if not (folder / name).is_file():
            raise TeacherError(f"{folder / name}: not found {carried}" + ("; it was made without train.swap_pairs, "
                               "which this run sets" if name in (SWAPPED_LOGITS_FILE, SWAPPED_TRANSFER_LOGITS_FILE)
                               else ""))
        arrays[name] = np.load(folder / name)
        if arrays[name].shape != (rows, task.num_labels):
            raise TeacherError(f"{folder / name}: shape {list(arrays[name].shape)}, expected [{rows}, "
                               f"{task.num_labels}] (rows, labels of this data) {carried}")
    identity["carried"] = {"from": params.distill.logits, "data_fingerprint": identity["data"]["fingerprint"],
                           "device": identity.get("device"), "seconds": identity.get("seconds")}
    identity.update({"swapped": both, "data": {**identity["data"], "fingerprint": tokenized._fingerprint},
                     "seconds": round(time.perf_counter() - start, 1)})
    if transfer is not None:  # this run's weight (a train param), which the train stage checks with the rest
        identity["transfer"] = {**transfer, "params": params.distill.transfer.model_dump()}
    return Teacher(identity, arrays[LOGITS_FILE], arrays.get(SWAPPED_LOGITS_FILE), transfer=None if pairs is None else
                   TransferSet(pairs, arrays[TRANSFER_LOGITS_FILE], arrays.get(SWAPPED_TRANSFER_LOGITS_FILE)))


def teacher_inputs(folder: Path, teacher: str, paths: Paths) -> tuple[dict, Task, DatasetDict, Dataset]:
    """``(identity, task, raw, tokenized)``: the identity of the teacher checkpoint ``folder`` (``describe_teacher``;
    ``distill.teacher`` is ``teacher``), the task of ``paths.tokenized``, every split of ``paths.raw`` (the teacher's
    texts) and the train split of ``paths.tokenized`` (the student's rows), its train split checked against raw's.

    Raises:
        CheckpointError: the teacher folder lacks config, weights or tokenizer.
        TeacherError: the teacher's labels or task type differ from the task's (``check_labels``).
        DataError: the train splits of data/raw and data/tokenized are not the same rows (``check_aligned``).
    """
    from datasets import load_from_disk

    task = Task.load(paths.tokenized)
    identity = describe_teacher(folder, teacher)
    check_labels(identity, task, str(folder / "config.json"))
    raw, tokenized = load_from_disk(str(paths.raw)), load_from_disk(str(paths.tokenized))["train"]
    check_aligned(raw["train"], tokenized, paths)
    return identity, task, raw, tokenized


def cross_fitted_logits(params: Params, paths: Paths, task: Task, train: Dataset,
                        swapped: bool) -> tuple[list[np.ndarray | None], dict, list[dict]]:
    """Every train row's logits from the teacher that never saw it: fold k of the train rows
    (``finetune.folds.row_folds``) scored by ``distill.fold_teachers[k]``, whose run left fold k out
    (``train.holdout_fold``), put back in row order.

    Returns:
        ``([logits, logits_swapped], run, identities)``: float32 ``[rows, num_labels]`` (the second None without
        ``swapped``), the scoring's ``max_length``, ``mixed_precision`` and ``device``, and each fold teacher's
        ``describe_teacher``.

    Raises:
        CheckpointError: a folder lacks config, weights or tokenizer.
        TeacherError: naming a fold teacher's config.json and its place in ``distill.fold_teachers``: other labels
            or task type than the task's, or its run did not leave out its own fold of this many folds of this many
            train rows (its config.json's ``holdout_fold``); the teachers' folds were cut with different seeds.
    """
    names = params.distill.fold_teachers
    identities = []
    for k, name in enumerate(names):
        identity, where = describe_teacher(paths.root / name, name), f"{paths.root / name / 'config.json'}"
        check_labels(identity, task, f"{where} (distill.fold_teachers[{k}])")
        record, wanted = identity["holdout_fold"] or {}, {"folds": len(names), "fold": k, "rows": len(train)}
        if {key: record.get(key) for key in wanted} != wanted:
            raise TeacherError(f"{where}: distill.fold_teachers[{k}] must be a run that left out fold {k} of "
                               f"{len(names)} of the {len(train)} train rows, but its holdout_fold is "
                               f"{identity['holdout_fold']}; train it with -S 'train.holdout_fold={{folds: "
                               f"{len(names)}, fold: {k}, seed: 42}}' (docs/distillation.md)")
        identities.append(identity)
    seeds = sorted({identity["holdout_fold"]["seed"] for identity in identities})
    if len(seeds) > 1:
        raise TeacherError(f"distill.fold_teachers: their runs cut the folds with different seeds {seeds} "
                           "(train.holdout_fold.seed in their config.json); train every fold teacher with one seed")
    fold_of, logits, run = row_folds(len(train), len(names), seeds[0]), [None, None], {}
    for k, (name, identity) in enumerate(zip(names, identities)):
        rows = np.flatnonzero(fold_of == k)
        outputs, run = score_rows(params, paths.root / name, identity, task, {"train": train.select(rows)}, swapped)
        for i, fold_logits in enumerate(outputs["train"]):
            if fold_logits is not None:
                if logits[i] is None:
                    logits[i] = np.zeros((len(train), fold_logits.shape[1]), dtype=np.float32)
                logits[i][rows] = fold_logits
    return logits, run, identities


def score_rows(params: Params, folder: Path, identity: dict, task: Task, sets: dict[str, Dataset],
               swapped: bool) -> tuple[dict[str, list[np.ndarray | None]], dict]:
    """The logits of the teacher in ``folder`` (``identity``: its ``describe_teacher``) of every row of each of
    ``sets`` (name -> rows with the task's text columns and ``idx``: the train split of data/raw, the transfer set),
    in row order.

    The teacher is loaded as the evaluate stage loads a fine-tuned model (``load_finetuned``); it tokenizes the texts
    with its own tokenizer (truncated at ``tokenize.max_length``, at most its ``model_max_length``) and runs in eval
    mode without gradients, in batches of ``evaluate.batch_size`` with dynamic padding (sorted by length with
    ``evaluate.sort_by_length``, put back in row order), under the mixed precision ``train.mixed_precision`` resolves
    to. With ``swapped``, the pairs in the other order are scored too.

    Returns:
        ``(outputs, run)``: per set, ``[logits, logits_swapped]``, float32 ``[rows, num_labels]`` (the second None
        without ``swapped``), and the run's ``max_length``, ``mixed_precision`` and ``device``.
    """
    from datasets import DatasetDict
    from transformers import AutoTokenizer

    from finetune.batches import evaluation_loaders
    from finetune.evaluation import split_logits
    from finetune.modeling import load_finetuned
    from finetune.hardware import describe_device, resolve_mixed_precision
    from finetune.runtime import make_accelerator, set_cpu_threads
    from finetune.tokenization import tokenize, truncation_length

    set_cpu_threads(None)
    mixed_precision = resolve_mixed_precision(params.train.mixed_precision)
    accelerator = make_accelerator(mixed_precision=mixed_precision)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = accelerator.prepare(load_finetuned(folder))
    max_length = min(truncation_length(tokenizer, params.tokenize.max_length), tokenizer.model_max_length)
    log.info("Teacher %s (%s, %s) on %s%s, %s tokenizer (truncation at %d tokens), mixed precision %s, %s",
             identity["teacher"], identity["model_type"], identity["task_type"],
             " and ".join(f"{len(rows)} {name} rows" for name, rows in sets.items()), " in both orders" if swapped
             else "", type(tokenizer).__name__, max_length, mixed_precision, accelerator.device)
    outputs = {}
    with tempfile.TemporaryDirectory(prefix="teacher-tokens-") as scratch:  # memory-mapped, not in memory
        encoded = tokenize(DatasetDict(sets), tokenizer, max_length, task.text_columns, swapped,
                           cache_dir=Path(scratch))
        for name, rows in encoded.items():
            loaders, order = evaluation_loaders(rows, tokenizer, params.evaluate, both_orders=swapped)
            outputs[name] = [None, None]
            for i, loader in enumerate(loaders):  # in batches, with a progress bar
                logits, _ = split_logits(model, accelerator.prepare(loader), accelerator,
                                         desc=f"teacher: {name}" + (" (swapped)" if i else ""))
                if order is not None:  # back to row order
                    logits = logits[np.argsort(order)]
                outputs[name][i] = logits.numpy().astype(np.float32)
            del loaders
        del encoded
    return outputs, {"max_length": max_length, "mixed_precision": mixed_precision,
                     "device": describe_device(accelerator.device)}


def save_teacher(folder: Path, teacher: Teacher) -> None:
    """``logits.npy``, ``logits_swapped.npy`` (when not None), with a transfer set ``transfer.parquet`` and
    ``transfer_logits.npy`` (and ``transfer_logits_swapped.npy``), and ``teacher.json`` (with the parquet's sha256)
    into ``folder``, atomically: a failure leaves the previous folder as it was."""
    from finetune.split_zip import sha256_file

    identity = dict(teacher.identity)
    with atomic_dir(folder) as tmp:
        for name, array in ((LOGITS_FILE, teacher.logits), (SWAPPED_LOGITS_FILE, teacher.logits_swapped)):
            if array is not None:
                np.save(tmp / name, array)
        if teacher.transfer is not None:
            teacher.transfer.pairs.to_parquet(tmp / TRANSFER_FILE, index=False)
            for name, array in ((TRANSFER_LOGITS_FILE, teacher.transfer.logits),
                                (SWAPPED_TRANSFER_LOGITS_FILE, teacher.transfer.logits_swapped)):
                if array is not None:
                    np.save(tmp / name, array)
            identity["transfer"] = {**identity["transfer"], "sha256": sha256_file(tmp / TRANSFER_FILE)}
        write_json(tmp / TEACHER_FILE, identity)
