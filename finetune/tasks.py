"""The task of the data: its text columns, class names and metrics, for GLUE's nine tasks by name (``GLUE_TASKS``,
from the GLUE paper, Wang et al. 2018, https://arxiv.org/abs/1804.07461, and the Hub's ``nyu-mll/glue`` card) or
for own data from params and the data (``own_task``); saved as ``task.json`` beside the data and the models."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from finetune.errors import CheckpointError

TASK_FILE = "task.json"  # in data/raw, data/tokenized and models/finetuned


@dataclass(frozen=True)
class GlueTask:
    """One GLUE task: ``label_names`` in id order as on the Hub (None for regression); ``metrics``, the first the
    default ``train.metric_for_best``; ``splits``, the Hub's split name -> the pipeline's where they differ (MNLI);
    ``symmetric``, a pair task whose label does not depend on the order of the two texts."""

    text_columns: tuple[str, ...]
    label_names: tuple[str, ...] | None
    metrics: tuple[str, ...]
    splits: dict[str, str] = field(default_factory=dict)
    symmetric: bool = False


GLUE_TASKS = {
    "cola": GlueTask(("sentence",), ("unacceptable", "acceptable"), ("matthews_correlation",)),
    "sst2": GlueTask(("sentence",), ("negative", "positive"), ("accuracy",)),
    "mrpc": GlueTask(("sentence1", "sentence2"), ("not_equivalent", "equivalent"), ("f1", "accuracy"),
                     symmetric=True),
    "qqp": GlueTask(("question1", "question2"), ("not_duplicate", "duplicate"), ("f1", "accuracy"),
                    symmetric=True),
    "stsb": GlueTask(("sentence1", "sentence2"), None, ("pearson", "spearmanr"), symmetric=True),
    "mnli": GlueTask(("premise", "hypothesis"), ("entailment", "neutral", "contradiction"), ("accuracy",),
                     splits={"validation_matched": "validation", "test_matched": "test"}),
    "qnli": GlueTask(("question", "sentence"), ("entailment", "not_entailment"), ("accuracy",)),
    "rte": GlueTask(("sentence1", "sentence2"), ("entailment", "not_entailment"), ("accuracy",)),
    "wnli": GlueTask(("sentence1", "sentence2"), ("not_entailment", "entailment"), ("accuracy",)),
}
GLUE_DATASETS = ("nyu-mll/glue", "glue")  # Hub ids whose configs must be GLUE tasks

# The metrics of the user's own data, by kind (finetune/evaluate/glue_metric.py computes them under these config names).
OWN_METRICS = {"binary": ("f1", "accuracy"), "multiclass": ("macro_f1", "accuracy"),
               "regression": ("pearson", "spearmanr", "mse")}
LOWER_IS_BETTER = {"loss", "mse"}


@dataclass(frozen=True)
class Task:
    """The task of a prepared dataset: ``name``, the GLUE task or ``own``; ``label_names`` in id order (None for
    regression); ``metric_config``, the config of finetune/evaluate/glue_metric.py that scores it (a GLUE task, or
    ``binary``, ``multiclass``, ``regression``); ``metrics``, what it returns, the first the default
    ``train.metric_for_best``; ``positive_label``, the class id whose F1 is reported for binary own data;
    ``symmetric``, a pair task whose label ignores the texts' order."""

    name: str
    text_columns: tuple[str, ...]
    label_names: tuple[str, ...] | None
    metric_config: str
    metrics: tuple[str, ...]
    positive_label: int = 1
    symmetric: bool = False

    @property
    def is_regression(self) -> bool:
        """True when the task has no class names."""
        return self.label_names is None

    @property
    def num_labels(self) -> int:
        """Outputs of the model's head: 1 for regression (a score), else one logit per class."""
        return 1 if self.is_regression else len(self.label_names)

    @property
    def id2label(self) -> dict[int, str]:
        """Class id -> name for the model config (``{0: "score"}`` for regression)."""
        return {0: "score"} if self.is_regression else dict(enumerate(self.label_names))

    def metric_for_best(self, choice: str | None) -> tuple[str, str]:
        """The validation metric that picks the best evaluation, as ``(name, mode)``: ``choice``
        (``train.metric_for_best``), else the task's first metric; mode ``min`` for loss and MSE, else ``max``.

        Raises:
            ValueError: ``choice`` is neither ``loss`` nor one of the task's metrics; the message lists them.
        """
        name = choice or self.metrics[0]
        if name not in ("loss", *self.metrics):
            raise ValueError(f"train.metric_for_best: {name!r} is not a metric of task {self.name!r}; "
                             f"choose one of {['loss', *self.metrics]} or null (its main metric, {self.metrics[0]!r})")
        return name, "min" if name in LOWER_IS_BETTER else "max"

    def save(self, folder: str | Path) -> None:
        """Write the task as ``folder/task.json``."""
        (Path(folder) / TASK_FILE).write_text(json.dumps(asdict(self), indent=2) + "\n")

    @classmethod
    def load(cls, folder: str | Path) -> Task:
        """The task saved in ``folder/task.json`` (``save``); prepared data and fine-tuned model folders have one.

        Raises:
            CheckpointError: ``folder`` holds no task.json, or one that can't be read; naming the file.
        """
        file = Path(folder) / TASK_FILE
        if not file.is_file():
            raise CheckpointError(f"{file}: not found; {folder} is not a fine-tuned model folder (models/finetuned, "
                                  "or a form in models/exported) or prepared data (data/raw)")
        try:
            raw = json.loads(file.read_text())
            return cls(**{**raw, "text_columns": tuple(raw["text_columns"]),
                          "label_names": tuple(raw["label_names"]) if raw["label_names"] is not None else None,
                          "metrics": tuple(raw["metrics"])})
        except (ValueError, KeyError, TypeError) as err:
            raise CheckpointError(f"{file}: cannot read the task: {type(err).__name__}: {err}") from None


def predictions_of(logits, task: Task):
    """Class ids (argmax) ``[examples]`` of logits ``[examples, num_labels]`` (a torch tensor); for regression, the
    scores ``[examples]``."""
    return logits[:, 0] if task.is_regression else logits.argmax(dim=-1)


def glue_task(config: str) -> Task:
    """The Task of GLUE config ``config`` (a key of ``GLUE_TASKS``)."""
    g = GLUE_TASKS[config]
    return Task(config, g.text_columns, g.label_names, config, g.metrics, symmetric=g.symmetric)


def own_task(text_columns: tuple[str, ...], label_names: tuple[str, ...] | None,
             positive_label: str | None = None, symmetric: bool = False, where: str = "the data") -> Task:
    """The Task of the user's own data, named ``own``: regression when ``label_names`` is None, else binary (two
    classes; ``positive_label``, the class whose F1 is reported, defaults to class id 1) or multiclass, scored by the
    metric config of that name. ``symmetric``: the label ignores the order of the two texts; ``where``: the data's
    file, for errors.

    Raises:
        ValueError: ``positive_label`` with other than two classes or not one of ``label_names``, or ``symmetric``
            without two text columns; naming the key.
    """
    if symmetric and len(text_columns) != 2:
        raise ValueError(f"data.symmetric: true needs two text columns (got {list(text_columns)} for {where})")
    if positive_label is not None and label_names is not None and len(label_names) != 2:
        raise ValueError(f"data.positive_label: {positive_label!r} is set, but {where} has {len(label_names)} classes "
                         f"{list(label_names)}; it names the class whose F1 is reported for two classes (more are "
                         "scored by macro-F1): set data.positive_label: null")
    if positive_label is not None and label_names is not None and positive_label not in label_names:
        raise ValueError(f"data.positive_label: {positive_label!r} is not a class of {where} {list(label_names)}")
    if label_names is None:
        kind, positive = "regression", 1
    elif len(label_names) == 2:
        kind = "binary"
        positive = label_names.index(positive_label) if positive_label is not None else 1
    else:
        kind, positive = "multiclass", 1
    return Task("own", text_columns, label_names, kind, OWN_METRICS[kind], positive, symmetric)
