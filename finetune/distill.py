"""Knowledge distillation, the train stage's side: the loss that mixes the labels with a fine-tuned teacher's
logits, and those logits (the teacher stage's data/teacher, finetune/teacher.py) riding with each train batch.

With a transfer set (``distill.transfer``, finetune/transfer.py) its unlabelled pairs join the labelled rows in one
shuffled stream, each row flagged (``TRANSFER``): a transfer row's loss is ``weight * soft`` alone
(``transfer_distillation_loss``), as the students of Turc et al. 2019 (https://arxiv.org/abs/1908.08962) learn from
the teacher's labels of text they have no label for.

The loss (``distillation_loss``) is Hinton, Vinyals & Dean 2015, "Distilling the Knowledge in a Neural Network"
(https://arxiv.org/abs/1503.02531): ``(1 - alpha) * hard + alpha * soft``, the soft loss the KL divergence between the
teacher's and the student's class distributions softened by a temperature T and scaled by T^2, so its gradients keep
their size as T changes; DistilBERT (Sanh et al. 2019, https://arxiv.org/abs/1910.01108) distils BERT with it. For
regression the soft target is the teacher's score.

torch and datasets are imported inside the functions that use them (or for type checking only).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from finetune.errors import TeacherError
from finetune.params import DistillParams
from finetune.split_zip import sha256_file
from finetune.tasks import Task
from finetune.teacher import LOGITS_FILE, SWAPPED_LOGITS_FILE, TEACHER_FILE, Teacher, TransferSet, check_labels
from finetune.transfer import SWAPPED_TRANSFER_LOGITS_FILE, TRANSFER_FILE, TRANSFER_LOGITS_FILE

if TYPE_CHECKING:
    import torch
    from datasets import Dataset
    from transformers import PreTrainedTokenizerBase

TRANSFER = "transfer"  # a train row's flag: 1 for a transfer pair (no label: the soft loss alone), else 0


# --- the loss -------------------------------------------------------------------------------------------------------

def distillation_loss(student: torch.Tensor, labels: torch.Tensor, teacher: torch.Tensor, alpha: float,
                      temperature: float, regression: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(loss, hard, soft)`` of a batch, each a scalar: ``loss = (1 - alpha) * hard + alpha * soft``.

    Classification: ``hard`` is the cross-entropy of ``student`` against ``labels`` (what the model's own loss
    computes), ``soft = T^2 * KL(softmax(teacher / T) || softmax(student / T))`` averaged over the batch (``T``:
    ``temperature``; Hinton et al. 2015, https://arxiv.org/abs/1503.02531, section 2: the T^2 keeps the soft
    gradients' size as T changes; DistilBERT, https://arxiv.org/abs/1910.01108). Regression: ``hard`` is the mean
    squared error to the label, ``soft`` to the teacher's score (no temperature).

    Args:
        student: the student's logits ``[batch, num_labels]`` (``[batch, 1]`` for regression); computed in float32.
        labels: class ids ``[batch]`` (int64), or scores ``[batch]`` for regression.
        teacher: the teacher's logits, the shape of ``student``.
        alpha: weight of the soft loss, in [0, 1] (0: the labels only; 1: the teacher only).
    """
    import torch.nn.functional as F

    student, teacher = student.float(), teacher.float().to(student.device)
    if regression:
        hard = F.mse_loss(student[:, 0], labels.to(student.dtype))
        soft = F.mse_loss(student[:, 0], teacher[:, 0])
    else:
        hard = F.cross_entropy(student, labels)
        soft = temperature ** 2 * F.kl_div(F.log_softmax(student / temperature, dim=-1),
                                           F.log_softmax(teacher / temperature, dim=-1),
                                           reduction="batchmean", log_target=True)
    return (1 - alpha) * hard + alpha * soft, hard, soft


def transfer_distillation_loss(student: torch.Tensor, labels: torch.Tensor, teacher: torch.Tensor,
                               transfer: torch.Tensor, alpha: float, temperature: float, weight: float,
                               regression: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(loss, hard, soft)`` of a batch mixing labelled rows and transfer rows (``transfer`` true: no label), each
    a scalar: the mean over the batch of each row's loss, ``(1 - alpha) * hard + alpha * soft`` for a labelled row
    and ``weight * soft`` for a transfer row, the per-row terms as in ``distillation_loss``. ``hard`` is the mean
    over the labelled rows (NaN when the batch has none), ``soft`` over all rows.

    Args:
        student, teacher: logits ``[batch, num_labels]`` (``[batch, 1]`` for regression).
        labels: ``[batch]``; a transfer row's is ignored (-100 for classification, NaN for regression).
        transfer: ``[batch]``, true (or 1) for a transfer row.
    """
    import torch
    import torch.nn.functional as F

    student, teacher = student.float(), teacher.float().to(student.device)
    labelled = ~transfer.bool().to(student.device)
    if regression:
        soft = (student[:, 0] - teacher[:, 0]) ** 2
        hard = (student[:, 0] - torch.where(labelled, labels.to(student.dtype), student[:, 0].detach())) ** 2
    else:
        soft = temperature ** 2 * F.kl_div(F.log_softmax(student / temperature, dim=-1),
                                           F.log_softmax(teacher / temperature, dim=-1),
                                           reduction="none", log_target=True).sum(dim=-1)
        hard = F.cross_entropy(student, torch.where(labelled, labels, 0), reduction="none")
    rows = torch.where(labelled, (1 - alpha) * hard + alpha * soft, weight * soft)
    hard_mean = hard[labelled].mean() if labelled.any() else torch.full((), float("nan"), device=student.device)
    return rows.mean(), hard_mean, soft.mean()


@dataclass(frozen=True)
class Distillation:
    """What the train loop needs to distil: the loss's params and the teacher's identity (teacher.json)."""

    alpha: float
    temperature: float
    regression: bool
    teacher: dict
    transfer_weight: float = 1.0  # a transfer row's loss: this x soft

    def loss(self, model, batch: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(loss, hard, soft)`` of ``model`` on a train ``batch`` with ``teacher_logits`` (``distillation_loss``,
        or ``transfer_distillation_loss`` where the batch has the ``transfer`` flag); the model runs without labels,
        so its own loss is not computed twice."""
        from finetune.batches import TEACHER_LOGITS

        inputs = {k: v for k, v in batch.items() if k not in ("labels", TEACHER_LOGITS, TRANSFER)}
        logits = model(**inputs).logits
        if TRANSFER in batch:
            return transfer_distillation_loss(logits, batch["labels"], batch[TEACHER_LOGITS], batch[TRANSFER],
                                              self.alpha, self.temperature, self.transfer_weight, self.regression)
        return distillation_loss(logits, batch["labels"], batch[TEACHER_LOGITS], self.alpha, self.temperature,
                                 self.regression)


# --- the train stage's side -----------------------------------------------------------------------------------------

def load_teacher(p: DistillParams, folder: Path, task: Task, train: Dataset) -> Teacher | None:
    """The teacher's logits of ``train`` (the tokenized train split) from ``folder`` (data/teacher), checked; None
    when distillation is off (``distill.teacher`` and ``distill.logits`` null: ``folder`` is not read).

    Raises:
        TeacherError: naming ``folder/teacher.json`` and ``distill.teacher`` (or ``distill.logits``): no
            teacher.json, or one of another teacher, other fold teachers (``distill.fold_teachers``) or other carried
            logits (``distill.logits``), or saying distillation is off (a stale
            output: rerun the teacher stage); the teacher's labels or task type differ from the task's; its logits
            have another row count or label count than ``train`` and ``task``, lack or have the swapped order where
            ``train`` has or lacks it, or are of other data.
    """
    if p.teacher is None and p.logits is None:
        return None
    from finetune.tokenization import has_both_orders

    file = folder / TEACHER_FILE
    source = f"distill.teacher: {p.teacher!r}" if p.logits is None else f"distill.logits: {p.logits!r}"
    rerun = f"({source}); rerun `dvc repro teacher`"
    if not file.is_file():
        raise TeacherError(f"{file}: not found {rerun}")
    identity = json.loads(file.read_text())
    if not identity.get("distillation"):
        raise TeacherError(f"{file}: says distillation is off {rerun}")
    carried = (identity.get("carried") or {}).get("from")  # distill.logits of the teacher stage's run, if any
    if (carried is None) != (p.logits is None) or \
            os.path.normpath(carried or identity["teacher"]) != os.path.normpath(p.logits or p.teacher):
        held = f"carried in {carried!r}" if carried else f"of teacher {identity['teacher']!r}"
        raise TeacherError(f"{file}: holds the logits {held}, not of {rerun}")
    recorded = [t["teacher"] for t in identity.get("fold_teachers") or []] or None
    if p.logits is None and [os.path.normpath(t) for t in recorded or []] != [os.path.normpath(t) for t in
                                                                              p.fold_teachers or []]:
        raise TeacherError(f"{file}: holds the logits of the fold teachers {recorded}, not of distill.fold_teachers "
                           f"{p.fold_teachers} {rerun}")
    check_labels(identity, task, str(file))
    logits = np.load(folder / LOGITS_FILE)
    swapped_file = folder / SWAPPED_LOGITS_FILE
    logits_swapped = np.load(swapped_file) if swapped_file.is_file() else None
    for name, array in ((LOGITS_FILE, logits), (SWAPPED_LOGITS_FILE, logits_swapped)):
        if array is None:
            continue
        if len(array) != len(train) or identity["rows"] != len(train):
            raise TeacherError(f"{file}: {identity['rows']} rows of teacher logits ({name}: {len(array)}), but the "
                               f"train split of data/tokenized has {len(train)}: they are of other data {rerun}")
        if array.ndim != 2 or array.shape[1] != task.num_labels:
            raise TeacherError(f"{file}: {name} has shape {list(array.shape)}, expected [{len(train)}, "
                               f"{task.num_labels}] {rerun}")
    has_swapped = has_both_orders(train)
    if has_swapped != (logits_swapped is not None):
        raise TeacherError(f"{file}: " + ("no logits of the swapped pairs, but data/tokenized holds both orders"
                                          if has_swapped else "logits of the swapped pairs, but data/tokenized holds "
                                          "one order") + f" {rerun}")
    if identity["data"]["fingerprint"] != train._fingerprint:
        raise TeacherError(f"{file}: the logits are of another data/tokenized (fingerprint "
                           f"{identity['data']['fingerprint']}, now {train._fingerprint}) {rerun}")
    return Teacher(identity, logits, logits_swapped, load_transfer(p, folder, identity, task, has_swapped, rerun))


def load_transfer(p: DistillParams, folder: Path, identity: dict, task: Task, has_swapped: bool,
                  rerun: str) -> TransferSet | None:
    """The transfer set and its logits from ``folder`` (data/teacher), checked against ``distill.transfer`` and
    teacher.json (``identity``); None without ``distill.transfer``.

    Raises:
        TeacherError: naming the file: teacher.json records another ``distill.transfer`` (or none, or one where
            there should be none), transfer.parquet is missing or not the file recorded (sha256), or a transfer
            logits file has another row count or label count, or lacks or has the swapped order where the train
            split has or lacks it.
    """
    import pandas as pd

    file, recorded, wanted = folder / TEACHER_FILE, identity.get("transfer"), p.transfer.model_dump()
    if p.transfer.kind is None:
        if recorded is not None:
            raise TeacherError(f"{file}: holds a transfer set ({recorded['params']['kind']}), but "
                               f"distill.transfer.kind is null {rerun}")
        return None
    if recorded is None or recorded["params"] != wanted:
        raise TeacherError(f"{file}: holds the transfer set of {recorded and recorded['params']}, not of "
                           f"distill.transfer {wanted} {rerun}")
    pairs_file = folder / TRANSFER_FILE
    if not pairs_file.is_file() or sha256_file(pairs_file) != recorded["sha256"]:
        raise TeacherError(f"{pairs_file}: " + ("not found" if not pairs_file.is_file() else
                                                "not the transfer set teacher.json records (sha256)") + f" {rerun}")
    pairs = pd.read_parquet(pairs_file)
    arrays = {}
    for name in (TRANSFER_LOGITS_FILE, SWAPPED_TRANSFER_LOGITS_FILE):
        array = np.load(folder / name) if (folder / name).is_file() else None
        if array is not None and (array.shape != (len(pairs), task.num_labels) or len(pairs) != recorded["rows"]):
            raise TeacherError(f"{folder / name}: shape {list(array.shape)}, but {pairs_file} has {len(pairs)} pairs "
                               f"({recorded['rows']} recorded) of {task.num_labels} labels {rerun}")
        arrays[name] = array
    if arrays[TRANSFER_LOGITS_FILE] is None or has_swapped != (arrays[SWAPPED_TRANSFER_LOGITS_FILE] is not None):
        raise TeacherError(f"{folder}: the transfer logits do not hold " + ("both orders" if has_swapped else "one "
                           "order") + f" of the pairs, as data/tokenized does {rerun}")
    return TransferSet(pairs, arrays[TRANSFER_LOGITS_FILE], arrays[SWAPPED_TRANSFER_LOGITS_FILE])


def with_teacher_logits(train: Dataset, teacher: Teacher) -> Dataset:
    """``train`` with the teacher's logits of each row as a column (``teacher_logits``, and ``swapped_teacher_logits``
    beside the swapped pairs), so they ride with their row through shuffling, length grouping and the processes'
    shards; ``finetune.batches.PairCollator`` takes the order it picks and stacks them ``[batch, num_labels]``."""
    from finetune.batches import TEACHER_LOGITS
    from finetune.tokenization import SWAPPED

    train = train.add_column(TEACHER_LOGITS, teacher.logits.tolist())
    if teacher.logits_swapped is not None:
        train = train.add_column(SWAPPED + TEACHER_LOGITS, teacher.logits_swapped.tolist())
    return train


def with_transfer_rows(train: Dataset, transfer: TransferSet, tokenizer: PreTrainedTokenizerBase,
                       max_length: int | None, task: Task) -> Dataset:
    """``train`` (with its teacher logits: ``with_teacher_logits``) followed by the transfer pairs, one shuffled
    stream for the DataLoader.

    The pairs are tokenized as the tokenize stage tokenizes (the student's ``tokenizer``, truncation at
    ``max_length`` (``tokenize.max_length``) or its ``model_max_length``, both orders where ``train`` has them);
    each gets the teacher's logits, no label (-100; NaN for regression) and the ``TRANSFER`` flag 1 (the train
    rows 0), which ``Distillation.loss`` reads.
    """
    from datasets import Dataset, DatasetDict, Value, concatenate_datasets

    from finetune.batches import TEACHER_LOGITS
    from finetune.tokenization import SWAPPED, has_both_orders, tokenize, truncation_length

    swapped, columns = has_both_orders(train), list(task.text_columns)
    rows = Dataset.from_pandas(transfer.pairs[columns].assign(idx=range(len(transfer.pairs))), preserve_index=False)
    rows = tokenize(DatasetDict({"transfer": rows}), tokenizer, truncation_length(tokenizer, max_length),
                    task.text_columns, swapped)["transfer"]
    rows = rows.add_column("labels", [float("nan") if task.is_regression else -100] * len(rows))
    rows = rows.add_column(TEACHER_LOGITS, transfer.logits.tolist())
    if swapped:
        rows = rows.add_column(SWAPPED + TEACHER_LOGITS, transfer.logits_swapped.tolist())
    train = train.cast_column("labels", Value("float32" if task.is_regression else "int64"))
    train = train.add_column(TRANSFER, [0] * len(train))
    rows = rows.add_column(TRANSFER, [1] * len(rows)).select_columns(train.column_names).cast(train.features)
    return concatenate_datasets([train, rows])
