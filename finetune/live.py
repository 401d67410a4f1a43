"""DVCLive logs: the train stage's step and epoch logs, and the evaluate stage's plots.

Inside a DVC stage, dvc.yaml declares the plots and `dvc exp run` saves the experiment, so DVCLive only writes
files: no dvc.yaml, no report, no experiment commit (https://dvc.org/doc/dvclive/how-it-works).
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Iterator

from finetune.runtime import atomic_dir
from finetune.tasks import Task


def open_live(directory: str | Path):
    """A DVCLive logger that only writes files under ``directory``. Call ``.end()`` to write its summary."""
    from dvclive import Live

    return Live(dir=str(directory), dvcyaml=None, save_dvc_exp=False, report=None)


class TrainLog:
    """The train stage's logs: ``<folder>/steps`` (``train/loss``: mean over the last ``log_every`` optimizer
    steps, ``train/lr``, every ``log_every`` steps and at the last step; with distillation ``train/hard_loss`` and
    ``train/soft_loss`` the same way) and ``<folder>/epochs`` (``train/loss``, with distillation its two parts,
    ``validation/<metric>``). A resumed run replays its earlier steps and epochs through the same two methods,
    so its logs equal an uninterrupted run's. With ``folder`` None (processes other than the main one) nothing
    is written.
    """

    def __init__(self, folder: Path | None, log_every: int, total_steps: int):
        self.steps = open_live(folder / "steps") if folder is not None else None
        self.epochs = open_live(folder / "epochs") if folder is not None else None
        self.log_every, self.total_steps = log_every, total_steps

    @classmethod
    @contextlib.contextmanager
    def open(cls, folder: Path, enabled: bool, log_every: int, total_steps: int) -> Iterator["TrainLog"]:
        """The log, written to a temp folder beside ``folder`` that replaces it at the end (removed on error)."""
        if not enabled:
            yield cls(None, log_every, total_steps)
            return
        with atomic_dir(folder) as tmp:
            log = cls(tmp, log_every, total_steps)
            yield log
            log.steps.end()
            log.epochs.end()

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

    def log_epoch(self, entry: dict) -> None:
        """Log one epoch: ``entry`` is ``{"epoch": n, "train/loss": ..., "validation/<metric>": ...}``."""
        if self.epochs is None:
            return
        self.epochs.step = entry["epoch"]
        for name, value in entry.items():
            if name != "epoch":
                self.epochs.log_metric(name, value)
        self.epochs.make_summary()

    def replay(self, losses: list[float], lrs: list[float], epoch_logs: list[dict], parts: dict | None = None) -> None:
        """Log the steps and epochs that a resumed run did before it was interrupted."""
        for step in range(1, len(losses) + 1):
            self.log_step(step, losses, lrs, parts)
        for entry in epoch_logs:
            self.log_epoch(entry)


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
