"""Knowledge distillation, the train stage's side: the loss that mixes the labels with a fine-tuned teacher's
logits, and those logits (the teacher stage's data/teacher, finetune/teacher.py) riding with each train batch.

The loss (``distillation_loss``) is Hinton, Vinyals & Dean 2015, "Distilling the Knowledge in a Neural Network"
(https://arxiv.org/abs/1503.02531): ``(1 - alpha) * hard + alpha * soft``, the soft loss the KL divergence between the
teacher's and the student's class distributions softened by a temperature T and scaled by T^2, so its gradients keep
their size as T changes; DistilBERT (Sanh et al. 2019, https://arxiv.org/abs/1910.01108) distils BERT with it. For
regression the soft target is the teacher's score.

torch and datasets are imported inside the functions that use them (or for type checking only).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from finetune.errors import TeacherError
from finetune.params import DistillParams
from finetune.tasks import Task
from finetune.teacher import LOGITS_FILE, SWAPPED_LOGITS_FILE, TEACHER_FILE, check_labels

if TYPE_CHECKING:
    import torch
    from datasets import Dataset


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


@dataclass(frozen=True)
class Distillation:
    """What the train loop needs to distil: the loss's params and the teacher's identity (teacher.json)."""

    alpha: float
    temperature: float
    regression: bool
    teacher: dict

    def loss(self, model, batch: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(loss, hard, soft)`` of ``model`` on a train ``batch`` with ``teacher_logits`` (``distillation_loss``);
        the model runs without labels, so its own loss is not computed twice."""
        from finetune.batches import TEACHER_LOGITS

        inputs = {k: v for k, v in batch.items() if k not in ("labels", TEACHER_LOGITS)}
        return distillation_loss(model(**inputs).logits, batch["labels"], batch[TEACHER_LOGITS], self.alpha,
                                 self.temperature, self.regression)


# --- the train stage's side -----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Teacher:
    """The teacher stage's output as the train stage reads it."""

    identity: dict  # teacher.json
    logits: np.ndarray  # [rows, num_labels] float32, the train split's row order
    logits_swapped: np.ndarray | None  # the same of each pair in the other order, or None

    def fingerprint(self) -> dict:
        """What of the teacher decides a run's result, for the resume fingerprint (``finetune.resume``): its identity
        (not its seconds) and the sha256 of its logits."""
        arrays = [self.logits] + ([self.logits_swapped] if self.logits_swapped is not None else [])
        return {"identity": {k: v for k, v in self.identity.items() if k != "seconds"},
                "logits": hashlib.sha256(b"".join(a.tobytes() for a in arrays)).hexdigest()}


def load_teacher(p: DistillParams, folder: Path, task: Task, train: Dataset) -> Teacher | None:
    """The teacher's logits of ``train`` (the tokenized train split) from ``folder`` (data/teacher), checked; None
    when distillation is off (``distill.teacher: null``: ``folder`` is not read).

    Raises:
        TeacherError: naming ``folder/teacher.json`` and ``distill.teacher``: no teacher.json, or one of another
            teacher or saying distillation is off (a stale output: rerun the teacher stage); the teacher's labels or
            task type differ from the task's; its logits have another row count or label count than ``train``
            and ``task``, lack or have the swapped order where ``train`` has or lacks it, or are of other data.
    """
    if p.teacher is None:
        return None
    from finetune.tokenization import has_both_orders

    file = folder / TEACHER_FILE
    rerun = f"(distill.teacher: {p.teacher!r}); rerun `dvc repro teacher`"
    if not file.is_file():
        raise TeacherError(f"{file}: not found {rerun}")
    identity = json.loads(file.read_text())
    if not identity.get("distillation"):
        raise TeacherError(f"{file}: says distillation is off {rerun}")
    if os.path.normpath(identity["teacher"]) != os.path.normpath(p.teacher):
        raise TeacherError(f"{file}: holds the logits of teacher {identity['teacher']!r}, not of {rerun}")
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
    return Teacher(identity, logits, logits_swapped)


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
