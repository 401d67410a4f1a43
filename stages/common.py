"""What every stage shares: params (read and validated once), paths, seeding, logging, safe writes."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import tempfile
import threading
from pathlib import Path
from typing import Annotated, Any, Iterator, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, ValidationError, field_validator, model_validator
from ruamel.yaml import YAML, YAMLError

PARAMS_FILE = Path("params.yaml")

# Artifacts, relative to the repository root (dvc.yaml declares the same paths).
RAW_DIR = Path("data/raw")
TOKENIZED_DIR = Path("data/tokenized")
PREDICTIONS_DIR = Path("data/predictions")
PRETRAINED_DIR = Path("models/pretrained")
FINETUNED_DIR = Path("models/finetuned")
CHECKPOINTS_DIR = Path("models/checkpoints")  # accelerator.save_state per epoch, for train.resume (persist: true)
METRICS_DIR = Path("metrics")
LIVE_DIR = Path("dvclive")  # DVCLive step/epoch logs and plot data (git-tracked, cache: false in dvc.yaml)

ID2LABEL = {0: "not_equivalent", 1: "equivalent"}
LABEL2ID = {name: i for i, name in ID2LABEL.items()}

# Schedulers of transformers.get_scheduler that need nothing beyond warmup and total steps.
SCHEDULERS = Literal[
    "linear", "cosine", "cosine_with_restarts", "polynomial", "constant", "constant_with_warmup", "inverse_sqrt"
]

PositiveInt = Annotated[int, Field(strict=True, ge=1)]
NonNegativeInt = Annotated[int, Field(strict=True, ge=0)]


class ParamsError(ValueError):
    """params.yaml is missing, unreadable or invalid; the message names the file and the key."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DataParams(_Section):
    dataset: str = Field(min_length=1)
    config: str = Field(min_length=1)
    local_copy: str | None
    max_samples: PositiveInt | None


class ModelParams(_Section):
    checkpoint: str = Field(min_length=1)
    reinit_head: StrictBool  # a checkpoint whose classification head has other than 2 labels: new head (true) or error


class TokenizeParams(_Section):
    max_length: Annotated[int, Field(strict=True, ge=8)] | None


class TrainParams(_Section):
    seed: NonNegativeInt  # model head initialisation, dropout and batch order
    epochs: PositiveInt | None  # the most epochs (early stopping may end sooner)
    max_steps: PositiveInt | None  # optimizer steps; overrides epochs when set
    batch_size: PositiveInt  # per process and per forward pass
    gradient_accumulation_steps: PositiveInt  # forward passes per optimizer step
    lr: float = Field(gt=0, lt=1)
    weight_decay: float = Field(ge=0, lt=1)  # not applied to biases and LayerNorm weights
    max_grad_norm: float | None = Field(gt=0)  # gradient clipping (null: none)
    scheduler: SCHEDULERS
    warmup_steps: NonNegativeInt  # warmup in optimizer steps ...
    warmup_ratio: float = Field(ge=0, lt=1)  # ... or as a fraction of all optimizer steps (not both)
    metric_for_best: Literal["f1", "accuracy", "loss"]  # validation metric that picks the kept epoch
    keep_best: StrictBool  # save the best epoch's weights (true) or the last epoch's (false)
    early_stopping_patience: PositiveInt | None  # epochs without improvement before stopping (null: never)
    early_stopping_threshold: float = Field(ge=0)  # smallest change of metric_for_best that counts as improvement
    resume: StrictBool  # continue from the last epoch checkpoint in models/checkpoints when it matches these params
    accelerate_config: str = Field(min_length=1)  # `accelerate launch --config_file` of the train and evaluate stages
    mixed_precision: Literal["auto", "no", "fp16", "bf16"]  # auto: see resolve_mixed_precision
    log_every: PositiveInt  # optimizer steps between DVCLive logs of train loss and learning rate
    group_by_length: StrictBool  # batches of similar lengths (transformers' LengthGroupedSampler)
    adamw_impl: Literal["default", "foreach", "fused"]  # torch.optim.AdamW implementation
    torch_compile: StrictBool
    num_threads: PositiveInt | None  # torch.set_num_threads on CPU (null: torch's default)

    @field_validator("mixed_precision", mode="before")
    @classmethod
    def _unquoted_no(cls, value):
        # YAML 1.1 readers and writers (PyYAML, some editors and tools) turn an unquoted `no` into false.
        return "no" if value is False else value

    @model_validator(mode="after")
    def _consistent(self) -> "TrainParams":
        if self.epochs is None and self.max_steps is None:
            raise ValueError("epochs and max_steps are both null: set epochs (a positive int) or max_steps")
        if self.warmup_steps and self.warmup_ratio:
            raise ValueError(f"warmup_steps ({self.warmup_steps}) and warmup_ratio ({self.warmup_ratio}) are both set: "
                             "set one, the other to 0")
        # Relative to the working directory, as `accelerate launch` reads it (a tracked file of the project).
        if not Path(self.accelerate_config).is_file():
            raise ValueError(f"accelerate_config: file {self.accelerate_config!r} not found (from {Path.cwd()}); "
                             "see configs/accelerate/ for examples")
        return self


class EvaluateParams(_Section):
    batch_size: PositiveInt
    sort_by_length: StrictBool  # evaluate in order of length (less padding); predictions keep the row order
    splits: list[Literal["validation", "test"]] = Field(min_length=1)


class Params(_Section):
    """The whole of params.yaml. Every key is required: params.yaml is the one source of defaults."""

    data: DataParams
    model: ModelParams
    tokenize: TokenizeParams
    train: TrainParams
    evaluate: EvaluateParams


def load_params(path: str | Path = PARAMS_FILE) -> Params:
    """Read and validate params.yaml.

    Raises:
        ParamsError: the file is missing or not YAML, or a key is unknown, missing, of the wrong
            type or out of range. The message names the file and each offending key, e.g.
            ``params.yaml: train.lr: Input should be greater than 0 (got -1)``.
    """
    path = Path(path)
    try:
        # YAML 1.2, as DVC reads and writes params.yaml (`dvc exp run -S` writes `no`, `3e-5` unquoted;
        # PyYAML's YAML 1.1 would read them as False and as a string).
        raw = YAML(typ="safe", pure=True).load(path.read_text())
    except FileNotFoundError:
        raise ParamsError(f"{path}: not found (run from the repository root)") from None
    except YAMLError as err:
        raise ParamsError(f"{path}: not valid YAML: {err}") from None
    try:
        return Params.model_validate(raw if raw is not None else {})
    except ValidationError as err:
        lines = []
        for e in err.errors():
            key = ".".join(str(part) for part in e["loc"]) or "<top level>"
            got = "" if e["type"] in ("missing", "value_error") else f" (got {e['input']!r})"
            lines.append(f"{path}: {key}: {e['msg']}{got}")
        raise ParamsError("\n".join(lines)) from None


def setup_logging() -> logging.Logger:
    """Configure the root logger for a stage (time, level, message) and return the 'stages' logger.

    Also makes SIGTERM (what `kill`, job schedulers and `dvc queue kill` send) unwind like Ctrl-C, so the temp
    outputs of ``atomic_dir`` and ``write_json`` are removed instead of left behind.
    """
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _raise_system_exit)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("httpx", "httpcore", "urllib3", "filelock"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    return logging.getLogger("stages")


def _raise_system_exit(signum, frame):
    raise SystemExit(128 + signum)


def resolve_mixed_precision(choice: str) -> str:
    """The Accelerate ``mixed_precision`` for a params choice; 'auto' picks what the hardware runs fast.

    'auto' is bf16 autocast on a GPU with bf16 (Ampere and newer) or a CPU with bf16 instructions (AVX512-BF16
    or AMX, read from /proc/cpuinfo), fp16 with a gradient scaler on an older GPU, and fp32 ('no') elsewhere.
    Any other choice is returned as is.
    """
    if choice != "auto":
        return choice
    import torch

    if torch.cuda.is_available():
        return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    try:
        flags = Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return "no"
    return "bf16" if {"avx512_bf16", "amx_bf16"} & set(flags) else "no"


def set_cpu_threads(num_threads: int | None) -> int:
    """Set torch's intra-op CPU threads and return the number: ``num_threads``, or when None the CPUs this process
    may run on divided among the processes of this machine (``LOCAL_WORLD_SIZE``, set by torchrun/accelerate).

    `accelerate launch` exports OMP_NUM_THREADS=1 unless told otherwise, which on a CPU-only machine halves training
    speed with 2 cores; this undoes that for the default single process.
    """
    import torch

    if num_threads is None:
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        num_threads = max(1, cpus // int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    torch.set_num_threads(num_threads)
    return num_threads


def make_accelerator(**kwargs):
    """``accelerate.Accelerator(**kwargs)``, on CPU processes when torchrun started several and there is no GPU.

    accelerate's own multi-CPU path (``--cpu --num_processes N``) needs MPI's mpirun; without it, it starts one
    process. ``accelerate launch --multi_gpu --num_processes N`` (configs/accelerate/cpu_2proc.yaml) starts N
    processes with torchrun instead, and with ``cpu=True`` they join a gloo process group on the CPU.
    """
    import torch
    from accelerate import Accelerator

    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    return Accelerator(cpu=world_size > 1 and not torch.cuda.is_available(), **kwargs)


def open_live(directory: str | Path):
    """A DVCLive logger that only writes files under ``directory``: no dvc.yaml, no report, no experiment commit.

    Inside a DVC stage, dvc.yaml declares the plots and `dvc exp run` saves the experiment; DVCLive must not do
    either (https://dvc.org/doc/dvclive/how-it-works). Call ``.end()`` (or use it as a context manager) to write
    its summary.
    """
    from dvclive import Live

    return Live(dir=str(directory), dvcyaml=None, save_dvc_exp=False, report=None)


def peak_memory_mb() -> float:
    """Peak resident set size of this process so far, in MiB (Linux ``ru_maxrss`` is in KiB)."""
    import resource

    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def write_json(path: str | Path, obj: Any) -> None:
    """Write ``obj`` as indented JSON, atomically: a temp file in the same folder, then a rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(obj, f, indent=2, sort_keys=False)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@contextlib.contextmanager
def atomic_dir(path: str | Path) -> Iterator[Path]:
    """Yield an empty temp folder beside ``path``; on success it replaces ``path``, on error it is removed.

    So a stage killed or failing half-way never leaves a folder that looks finished. Temp folders that a killed
    (SIGKILL) earlier run left beside ``path`` are removed first.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    for stale in path.parent.glob(f".{path.name}.*.tmp"):
        shutil.rmtree(stale, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp"))
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if path.exists():
        shutil.rmtree(path)
    os.replace(tmp, path)
