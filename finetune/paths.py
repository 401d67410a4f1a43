"""Where the pipeline's artifacts live (``Paths``, the same paths as dvc.yaml declares), and how a path written in
params.yaml is found from inside a stage (``project_path``)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

OWN_DATA = "data/own"  # the user's own files live here: a dependency of the download stage (dvc.yaml)


def inside(path: str, folder: str) -> bool:
    """``path`` (from params.yaml) is relative and names something inside ``folder``, not ``folder`` itself."""
    parts, top = Path(os.path.normpath(path)).parts, Path(folder).parts
    return not Path(path).is_absolute() and parts[:len(top)] == top and len(parts) > len(top)


OWN_MODELS = "models/own"  # the user's own checkpoints and teachers live here: a dependency of download and teacher



def own_model_folder(teacher: str) -> str:
    """``teacher`` (a ``distill`` folder param), checked: a folder under models/own that exists.

    Raises:
        ValueError: naming the folder.
    """
    if not inside(teacher, OWN_MODELS):
        raise ValueError(f"{teacher!r} is not a folder under {OWN_MODELS}/; put the teacher there (a dependency of "
                         "the teacher stage in dvc.yaml, so DVC reruns it when the teacher changes)")
    # Relative to the working directory, the project root of a stage (a DVC-tracked folder of the project).
    if not Path(teacher).is_dir():
        raise ValueError(f"folder {teacher!r} not found (from {Path.cwd()}); a queued experiment sees it only "
                         f"when it is tracked: `dvc add {teacher}` (docs/distillation.md)")
    return teacher



def project_path(path: str) -> Path:
    """A path from params.yaml: absolute, or inside the project (``data/own/...``), as is (relative to the
    stage's folder); outside it (``../shared/...``) relative to ``$DVC_ROOT``, the original repository (a queued
    experiment runs in a copy under .dvc/tmp/exps), or to the current folder outside DVC.
    """
    if Path(path).is_absolute() or not Path(path).parts or Path(path).parts[0] != "..":
        return Path(path)
    return Path(os.environ.get("DVC_ROOT", ".")) / path


# The train stage's evaluation log inside Paths.train_logs, by what evaluations are counted in: epochs, or optimizer
# steps with train.eval_every_steps (DVCLive's step is then the optimizer step)
EVALUATION_LOGS = {"epoch": "epochs", "step": "evaluations"}


@dataclass(frozen=True)
class Paths:
    """Where every artifact of the pipeline lives, under ``root`` (dvc.yaml declares the same paths)."""

    root: Path = Path(".")

    @property
    def raw(self) -> Path:  # download: DatasetDict.save_to_disk
        return self.root / "data" / "raw"

    @property
    def tokenized(self) -> Path:  # tokenize: DatasetDict.save_to_disk
        return self.root / "data" / "tokenized"

    @property
    def teacher(self) -> Path:  # teacher: the teacher's train logits and teacher.json (finetune/distill/teacher.py)
        return self.root / "data" / "teacher"

    @property
    def predictions(self) -> Path:  # evaluate: <split>.csv
        return self.root / "data" / "predictions"

    @property
    def pretrained(self) -> Path:  # download: tokenizer + model, save_pretrained
        return self.root / "models" / "pretrained"

    @property
    def trained(self) -> Path:  # train: the kept epoch's model + tokenizer (+ task.json)
        return self.root / "models" / "trained"

    @property
    def finetuned(self) -> Path:  # card: models/trained and its model card README.md, the folder users load
        return self.root / "models" / "finetuned"

    @property
    def exported(self) -> Path:  # export: one folder per served form (finetune/export/make.py)
        return self.root / "models" / "exported"

    @property
    def checkpoints(self) -> Path:  # train: accelerator.save_state per epoch, for train.resume (not a DVC output)
        return self.root / "models" / "checkpoints"

    @property
    def metrics(self) -> Path:  # committed metrics JSON
        return self.root / "metrics"

    @property
    def train_logs(self) -> Path:  # DVCLive logs by step and by evaluation (git-tracked, cache: false)
        return self.root / "dvclive" / "train"

    @property
    def eval_logs(self) -> Path:  # DVCLive confusion matrix, precision-recall and ROC data per split
        return self.root / "dvclive" / "evaluate"
