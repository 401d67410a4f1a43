"""DVCLive logs: the train stage's step and epoch logs, and the evaluate stage's plots.

Inside a DVC stage, dvc.yaml declares the plots and `dvc exp run` saves the experiment, so DVCLive only writes
files: no dvc.yaml, no report, no experiment commit (https://dvc.org/doc/dvclive/how-it-works).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from finetune.paths import EVALUATION_LOGS
from finetune.runtime import atomic_dir
from finetune.tasks import Task


def open_live(directory: str | Path):
    """A DVCLive logger that only writes files under ``directory``. Call ``.end()`` to write its summary."""
    from dvclive import Live

    return Live(dir=str(directory), dvcyaml=None, save_dvc_exp=False, report=None)


class TrainLog:
    """The train stage's logs: ``<folder>/steps`` (``train/loss``: mean over the last ``log_every`` optimizer
    steps, ``train/lr``, every ``log_every`` steps and at the last step; with distillation ``train/hard_loss`` and
    ``train/soft_loss`` the same way) and the evaluations: ``<folder>/epochs`` (DVCLive's step is the epoch) or, with
    ``unit`` 'step' (``train.eval_every_steps``), ``<folder>/evaluations`` (its step is the optimizer step, and
    ``epoch`` a metric) with ``train/loss`` since the previous evaluation, with distillation its two parts, and
    ``validation/<metric>``. A resumed run replays its earlier steps and evaluations through the same two methods,
    so its logs equal an uninterrupted run's. With ``folder`` None (processes other than the main one) nothing
    is written.
    """

    def __init__(self, folder: Path | None, log_every: int, total_steps: int, unit: str = "epoch"):
        self.steps = open_live(folder / "steps") if folder is not None else None
        self.evaluations = open_live(folder / EVALUATION_LOGS[unit]) if folder is not None else None
        self.log_every, self.total_steps, self.unit = log_every, total_steps, unit

    @classmethod
    @contextlib.contextmanager
    def open(cls, folder: Path, enabled: bool, log_every: int, total_steps: int,
             unit: str = "epoch") -> Iterator[TrainLog]:
        """The log, written to a temp folder beside ``folder`` that replaces it at the end (removed on error)."""
        if not enabled:
            yield cls(None, log_every, total_steps, unit)
            return
        with atomic_dir(folder) as tmp:
            log = cls(tmp, log_every, total_steps, unit)
            yield log
            log.steps.end()
            log.evaluations.end()

    def log_step(self, step: int, losses: list[float], lrs: list[float], parts: dict | None = None) -> None:
        """Log optimizer step ``step`` (1-based) if it is due; ``losses``, ``lrs``: one value per optimizer step;
        ``parts``: more losses by name, one value per optimizer step each (distillation: ``train/hard_loss``,
        ``train/soft_loss``), logged like ``train/loss``."""
        if self.steps is None or not (step % self.log_every == 0 or step == self.total_steps):
            return
        self.steps.step = step
        for name, values in {"train/loss": losses, **(parts or {})}.items():
            recent = values[max(0, step - self.log_every):step]
            self.steps.log_metric(name, sum(recent) / len(recent))
        self.steps.log_metric("train/lr", lrs[step - 1])
        self.steps.make_summary()

    def log_evaluation(self, entry: dict) -> None:
        """Log one evaluation: ``entry`` is ``{"epoch": n, "step": s, "train/loss": ..., "validation/<metric>":
        ...}``, at DVCLive step ``entry[unit]``."""
        if self.evaluations is None:
            return
        self.evaluations.step = entry[self.unit]
        for name, value in entry.items():
            if name != self.unit and name != "step":
                self.evaluations.log_metric(name, value)
        self.evaluations.make_summary()

    def replay(self, losses: list[float], lrs: list[float], evaluations: list[dict], parts: dict | None = None) -> None:
        """Log the steps and evaluations that a resumed run did before it was interrupted."""
        for step in range(1, len(losses) + 1):
            self.log_step(step, losses, lrs, parts)
        for entry in evaluations:
            self.log_evaluation(entry)


def log_plots(live, split: str, task: Task, table) -> None:
    """The plots of one labeled split, from its predictions ``table`` (``label`` and ``prediction`` columns, and for
    classification ``probability_<name>`` per class), with DVCLive.

    Classification: the confusion matrix with the class names (any number of classes); for two classes also the
    precision-recall and ROC curves of the positive class (``task.positive_label``). Regression: predicted against
    gold scores (a scatter). Files land in ``<live dir>/plots/sklearn/<split>/{confusion_matrix,precision_recall,
    roc}.json`` or ``<live dir>/plots/custom/<split>/scatter.json``; dvc.yaml declares how they are drawn, and a plot
    a task does not have is simply not written (``dvc plots show`` skips a missing file).
    """
    if task.is_regression:
        points = [{"gold": float(g), "predicted": float(p)} for g, p in zip(table["label"], table["prediction"])]
        live.log_plot(f"{split}/scatter", points, x="gold", y="predicted", template="scatter",
                      title=f"{split}: predicted against gold score")
        return
    live.log_sklearn_plot("confusion_matrix", table["label"].astype(str).to_numpy(),
                          table["prediction"].astype(str).to_numpy(), name=f"{split}/confusion_matrix.json")
    if task.num_labels == 2:
        positive = task.label_names[task.positive_label]
        labels = (table["label"] == positive).astype(int).to_numpy()
        probability = table[f"probability_{positive}"].astype("float64").to_numpy()
        live.log_sklearn_plot("precision_recall", labels, probability, name=f"{split}/precision_recall.json",
                              drop_intermediate=True)
        live.log_sklearn_plot("roc", labels, probability, name=f"{split}/roc.json", drop_intermediate=True)
