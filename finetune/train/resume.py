"""Resuming an interrupted training run: its state (``RunState``), its fingerprint, the ``step-N`` checkpoints
(``accelerator.save_state`` plus trainer_state.json) saved, found and pruned, and the best model so far saved
(``save_model``: ``checkpoints/best``, which a resumed run keeps).
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from accelerate import Accelerator
from datasets import DatasetDict
from transformers import PreTrainedTokenizerBase

from finetune.code import code_digest
from finetune.errors import CheckpointError
from finetune.params import Params
from finetune.paths import Paths
from finetune.runtime import atomic_dir, sha256_file
from finetune.tasks import Task

log = logging.getLogger(__name__)

STATE_FILE = "trainer_state.json"  # inside each checkpoint, beside accelerator.save_state's files


@dataclass
class RunState:
    """What continues a run beyond ``accelerator.save_state``; trainer_state.json of each checkpoint."""

    fingerprint: str
    epoch: int = 0  # epochs finished
    step: int = 0  # optimizer steps taken
    train_seconds: float = 0.0  # wall seconds of the optimisation steps (validation excluded)
    samples: int = 0  # training examples seen, all processes
    real_tokens: int = 0  # non-padding tokens of this process's training batches
    padded_tokens: int = 0  # all tokens of those batches, padding included
    losses: list = field(default_factory=list)  # train loss of every optimizer step
    lrs: list = field(default_factory=list)  # learning rate after every optimizer step
    # one dict per evaluation: epoch (in progress), step, train loss since the previous one, validation metrics
    evaluations: list = field(default_factory=list)
    stopping: dict = field(default_factory=dict)  # EarlyStopping fields
    # with distillation: {"train/hard_loss": [...], "train/soft_loss": [...]}, one value per optimizer step
    loss_parts: dict = field(default_factory=dict)
    collapsed: dict = field(default_factory=dict)  # {str(epoch or step): description} of evaluations found collapsed


def run_fingerprint(params: Params, paths: Paths, tokenized: DatasetDict, num_processes: int, mixed_precision: str,
                    distilling: bool = False) -> str:
    """A 16-hex-digit hash of everything that decides the run's result, so ``resume`` never continues another run.
    Covers the train params but ``resume`` and ``log_every``, ``model.pooling``, the evaluation batching, the accelerate
    config file, ``num_processes``, the resolved ``mixed_precision``, each tokenized split's fingerprint and task.json,
    the pretrained config and weights' sizes, the train stage's code (``finetune.code.code_digest``) and, when
    ``distilling``, the ``distill`` params and the sha256 of every file of ``paths.teacher``.
    """
    weights = sorted((f.name, f.stat().st_size) for f in paths.pretrained.glob("*.safetensors"))
    accelerate_config = Path(params.train.accelerate_config)
    parts = {
        "train": params.train.model_dump(exclude={"resume", "log_every"}),
        "pooling": params.model.pooling,
        "evaluate": params.evaluate.model_dump(include={"batch_size", "sort_by_length"}),
        "accelerate_config": accelerate_config.read_text() if accelerate_config.is_file() else None,
        "processes": num_processes,
        "mixed_precision": mixed_precision,
        "data": {split: ds._fingerprint for split, ds in tokenized.items()},
        "task": (paths.tokenized / "task.json").read_text(),
        "config": (paths.pretrained / "config.json").read_text(),
        "weights": weights,
        "code": code_digest("stages.train"),
        "distill": None if not distilling else {"params": params.distill.model_dump(), "teacher": {
            f.name: sha256_file(f) for f in sorted(paths.teacher.iterdir()) if f.is_file()}},
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def last_checkpoint(checkpoints_dir: Path, fingerprint: str) -> Path | None:
    """The newest complete ``step-N`` checkpoint of the run ``fingerprint``, or None (one still named
    ``.step-N.tmp`` is incomplete).
    """
    found = [(step, folder) for step, folder in checkpoints_of(checkpoints_dir)
             if json.loads((folder / STATE_FILE).read_text()).get("fingerprint") == fingerprint]
    return max(found)[1] if found else None


def checkpoints_of(checkpoints_dir: Path) -> list[tuple[int, Path]]:
    """The complete checkpoints in ``checkpoints_dir`` as ``(step, folder)``, oldest first."""
    return sorted((int(folder.name.split("-")[1]), folder) for folder in Path(checkpoints_dir).glob("step-*")
                  if (folder / STATE_FILE).is_file())


def load_checkpoint(accelerator: Accelerator, checkpoint: Path) -> RunState:
    """Restore model, optimizer, scheduler and RNG states from ``checkpoint``; return its run state."""
    accelerator.load_state(str(checkpoint))
    return RunState(**json.loads((checkpoint / STATE_FILE).read_text()))


def save_checkpoint(accelerator: Accelerator, checkpoints_dir: Path, state: RunState,
                    keep: int | None = 1) -> Path:
    """Save ``accelerator.save_state`` and ``state`` into ``checkpoints_dir/step-<state.step>`` (returned)
    atomically, then delete all but the newest ``keep`` (None: keep all). Every process must call it.

    Raises:
        CheckpointError: the checkpoint could not be written (e.g. the disk is full); the message names the folder
            and the checkpoint kept. The temp folder is removed; the earlier checkpoints are untouched.
    """
    final = Path(checkpoints_dir) / f"step-{state.step}"
    tmp = Path(checkpoints_dir) / f".step-{state.step}.tmp"
    try:
        if accelerator.is_main_process:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        accelerator.wait_for_everyone()
        accelerator.save_state(str(tmp))
        if accelerator.is_main_process:
            (tmp / STATE_FILE).write_text(json.dumps(asdict(state)))
            shutil.rmtree(final, ignore_errors=True)
            tmp.rename(final)
    except OSError as err:
        shutil.rmtree(tmp, ignore_errors=True)
        kept = checkpoints_of(checkpoints_dir)
        why = "the disk is full" if err.errno == errno.ENOSPC else err.strerror or str(err)
        raise CheckpointError(f"{tmp}: could not write the checkpoint of step {state.step} ({why}); "
                              f"{'the checkpoint ' + str(kept[-1][1]) + ' is kept' if kept else 'no checkpoint kept'}"
                              " and a rerun resumes from it once there is room") from err
    if accelerator.is_main_process and keep is not None:
        for _, old in checkpoints_of(checkpoints_dir)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    accelerator.wait_for_everyone()
    return final


def save_model(accelerator: Accelerator, model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, task: Task,
               folder) -> None:
    """Save the unwrapped ``model``, ``tokenizer`` and ``task`` into ``folder`` atomically on the main process;
    every process waits for it."""
    if accelerator.is_main_process:
        with atomic_dir(folder) as tmp:
            accelerator.unwrap_model(model, keep_torch_compile=False).save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
            task.save(tmp)
    accelerator.wait_for_everyone()
