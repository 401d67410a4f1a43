"""Knowledge distillation in training: the loss on the labels and a teacher's logits (Hinton et al. 2015,
https://arxiv.org/abs/1503.02531; DistilBERT, https://arxiv.org/abs/1910.01108), and data/teacher's logits joined
to the train rows."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from finetune.errors import TeacherError
from finetune.params import DistillParams
from finetune.tasks import Task

if TYPE_CHECKING:
    import pandas as pd
    import torch
    from datasets import Dataset
    from transformers import PreTrainedTokenizerBase

TEACHER_FILE, LOGITS_FILE = "teacher.json", "logits.npy"  # in data/teacher
TRANSFER_FILE, TRANSFER_LOGITS_FILE = "transfer.parquet", "transfer_logits.npy"
TRANSFER = "transfer"  # a train row's column: 1 for a transfer pair (no label: the soft loss alone), else 0


def distillation_loss(student: torch.Tensor, labels: torch.Tensor, teacher: torch.Tensor, transfer: torch.Tensor | None,
                      alpha: float, temperature: float, weight: float,
                      regression: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The distillation loss of a batch: a labelled row's ``(1 - alpha) * hard + alpha * soft``, a transfer row's
    ``weight * soft``, with ``hard`` the cross-entropy with the label and ``soft = T^2 * KL(softmax(teacher / T) ||
    softmax(student / T))`` (Hinton et al. 2015, section 2); for regression, squared errors to label and teacher.

    Args:
        student, teacher: logits ``[batch, num_labels]`` (``[batch, 1]`` for regression); computed in float32.
        labels: ``[batch]`` class ids or scores; a transfer row's is ignored.
        transfer: ``[batch]``, 1 for a transfer row; None: every row is labelled.
        alpha: 0 to 1.

    Returns:
        ``(loss, hard, soft)`` scalars: the mean row loss, the labelled rows' mean hard loss (NaN without any) and
        the mean soft loss.
    """
    # heavy: the teacher stage imports this module for data/teacher's file names, and its off path loads no torch
    import torch
    import torch.nn.functional as F

    student, teacher = student.float(), teacher.float().to(student.device)
    labelled = torch.ones(len(student), dtype=torch.bool, device=student.device) if transfer is None else \
        ~transfer.bool().to(student.device)
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
class Teacher:
    """The teacher stage's output (data/teacher): what the train stage distils from."""

    identity: dict  # teacher.json
    logits: np.ndarray  # [rows, num_labels] float32, the train split's row order
    transfer: pd.DataFrame | None = None  # the transfer set's pairs (the task's text columns), or None
    transfer_logits: np.ndarray | None = None  # [pairs, num_labels] float32, in the order of ``transfer``


@dataclass(frozen=True)
class Distillation:
    """What the train loop needs to distil: the loss's params and the teacher's identity (teacher.json)."""

    alpha: float
    temperature: float
    regression: bool
    teacher: dict
    transfer_weight: float = 1.0  # a transfer row's loss: this x soft

    def loss(self, model, batch: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``distillation_loss`` of ``model`` on a ``batch`` holding ``teacher_logits`` (the model gets no labels)."""
        from finetune.data.batches import TEACHER_LOGITS  # heavy: torch (see distillation_loss)

        logits = model(**{k: v for k, v in batch.items() if k not in ("labels", TEACHER_LOGITS, TRANSFER)}).logits
        return distillation_loss(logits, batch["labels"], batch[TEACHER_LOGITS], batch.get(TRANSFER), self.alpha,
                                 self.temperature, self.transfer_weight, self.regression)


def load_teacher(p: DistillParams, folder: Path, task: Task, train: Dataset) -> Teacher | None:
    """The teacher's logits of ``train`` and of the transfer set from ``folder`` (data/teacher), checked; None,
    ``folder`` unread, when ``distill.teacher`` is null.

    Raises:
        TeacherError: naming the file: a stale output (of another teacher, transfer set or data/tokenized), a file
            missing, or logits of another shape than ``[rows, num_labels]``.
    """
    if p.teacher is None:
        return None
    import pandas as pd  # heavy: about 0.5 s, which the teacher stage's off path does not pay

    file, rerun = folder / TEACHER_FILE, f"(distill.teacher: {p.teacher!r}); rerun `dvc repro teacher`"
    identity = json.loads(file.read_text()) if file.is_file() else {}
    if identity.get("teacher") != p.teacher:
        raise TeacherError(f"{file}: holds no logits of this teacher {rerun}")
    recorded = (identity.get("transfer") or {}).get("params")
    wanted = p.transfer.model_dump(exclude={"weight"}) if p.transfer.kind is not None else None
    if (recorded and {k: v for k, v in recorded.items() if k != "weight"}) != wanted:
        raise TeacherError(f"{file}: holds the transfer set of {recorded}, not of distill.transfer {wanted} {rerun}")
    if (identity.get("data") or {}).get("fingerprint") != train._fingerprint:
        raise TeacherError(f"{file}: the logits are of another data/tokenized {rerun}")
    missing = [name for name in (LOGITS_FILE, *([TRANSFER_FILE, TRANSFER_LOGITS_FILE] if wanted else []))
               if not (folder / name).is_file()]
    if missing:
        raise TeacherError(f"{folder / missing[0]}: not found {rerun}")
    logits = np.load(folder / LOGITS_FILE)
    pairs = pd.read_parquet(folder / TRANSFER_FILE) if wanted else None
    transfer_logits = np.load(folder / TRANSFER_LOGITS_FILE) if wanted else None
    for name, array, rows in ((LOGITS_FILE, logits, len(train)),
                              (TRANSFER_LOGITS_FILE, transfer_logits, None if pairs is None else len(pairs))):
        if array is not None and array.shape != (rows, task.num_labels):
            raise TeacherError(f"{folder / name}: shape {list(array.shape)}, expected [{rows}, {task.num_labels}] "
                               f"(rows, labels of this data) {rerun}")
    return Teacher(identity, logits, pairs, transfer_logits)


def with_teacher_logits(train: Dataset, teacher: Teacher, tokenizer: PreTrainedTokenizerBase,
                        max_length: int | None, task: Task) -> Dataset:
    """``train`` with a ``teacher_logits`` column (``[num_labels]`` a row), then the transfer pairs tokenized as
    the tokenize stage does, with no label (-100; NaN for regression) and ``TRANSFER`` 1."""
    # heavy: datasets and transformers (see distillation_loss)
    from datasets import Dataset, DatasetDict, Value, concatenate_datasets

    from finetune.data.batches import TEACHER_LOGITS
    from finetune.data.tokenization import tokenize, truncation_length

    train = train.add_column(TEACHER_LOGITS, teacher.logits.tolist())
    if teacher.transfer is None:
        return train
    columns = list(task.text_columns)
    rows = Dataset.from_pandas(teacher.transfer[columns].assign(idx=range(len(teacher.transfer))), preserve_index=False)
    rows = tokenize(DatasetDict({"transfer": rows}), tokenizer, truncation_length(tokenizer, max_length),
                    task.text_columns)["transfer"]
    rows = rows.add_column("labels", [float("nan") if task.is_regression else -100] * len(rows))
    rows = rows.add_column(TEACHER_LOGITS, teacher.transfer_logits.tolist())
    train = train.cast_column("labels", Value("float32" if task.is_regression else "int64"))
    train = train.add_column(TRANSFER, [0] * len(train))
    rows = rows.add_column(TRANSFER, [1] * len(rows)).select_columns(train.column_names).cast(train.features)
    return concatenate_datasets([train, rows])
