"""params.yaml's schema (``Params``: every key required, validated once), ``load_params`` and ``validate_params``;
params changed by the commands: ``finetune.overrides``.

    python -m finetune.params      # check params.yaml: prints what is wrong and exits 1, or says it is valid
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, ValidationError, field_validator, model_validator

from finetune.errors import ParamsError, field_error
from finetune.paths import OWN_DATA, inside, own_model_folder
from finetune.runtime import read_yaml
from finetune.tasks import GLUE_DATASETS, GLUE_TASKS

PARAMS_FILE = Path("params.yaml")

# transformers.SchedulerType's values that the loop can step without a metric (tests/test_params.py keeps them equal).
SCHEDULERS = Literal["linear", "cosine", "cosine_with_restarts", "polynomial", "constant", "constant_with_warmup",
                     "inverse_sqrt", "cosine_with_min_lr", "cosine_warmup_with_min_lr", "warmup_stable_decay"]
# Arguments of transformers.get_scheduler's functions that the loop sets itself (train.warmup_*, the run's length).
LOOP_SCHEDULER_ARGS = ("optimizer", "num_warmup_steps", "num_training_steps", "last_epoch")

PositiveInt = Annotated[int, Field(strict=True, ge=1)]
NonNegativeInt = Annotated[int, Field(strict=True, ge=0)]


def first_repeated(values: list) -> Any:
    """The first of ``values`` that appears more than once, or None."""
    return next((v for v in dict.fromkeys(values) if values.count(v) > 1), None)


def _each_once(values: list) -> list:
    """``values`` unchanged; a list key names each item once (a pydantic field validator).

    Raises:
        ValueError: naming the first repeated item.
    """
    if (twice := first_repeated(values)) is not None:
        raise ValueError(f"{twice!r} is listed twice; list each once")
    return values


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


Split = Literal["train", "validation", "test"]


class DataParams(_Section):
    dataset: str | None = Field(min_length=1)  # Hub id or folder laid out like a Hub dataset (null: data.files)
    config: str | None = Field(min_length=1)  # the dataset's config, e.g. a GLUE task
    local_copy: str | None  # a folder laid out like ``dataset``, used when the Hub can't be reached
    # own data: a file per split under data/own (csv, tsv, json, jsonl, parquet); a split set to null has no file
    files: dict[Split, str | None] | None
    text_columns: list[Annotated[str, Field(min_length=1)]] | None = Field(min_length=1, max_length=2)
    label_column: str = Field(min_length=1)
    label_names: list[Annotated[str, Field(min_length=1)]] | None = Field(min_length=2)  # class names in id order
    task_type: Literal["classification", "regression"] | None  # null: float labels are regression
    positive_label: str | None  # binary own data: the class whose F1 is reported (null: the second name)
    symmetric: StrictBool | None  # own pair data whose label ignores the order of the texts (null: false)
    validation_fraction: float = Field(gt=0, lt=1)  # carved from train when the data has no validation split
    split_seed: NonNegativeInt  # seed of that split
    max_samples: PositiveInt | None

    @property
    def glue_task(self) -> str | None:
        """The GLUE task these params load, or None for other data (own files, other datasets and configs)."""
        return self.config if self.files is None and self.config in GLUE_TASKS else None

    @field_validator("files")
    @classmethod
    def _null_is_no_split(cls, files: dict | None) -> dict | None:
        # `dvc exp run -S 'data.files={...}'` merges into the mapping in params.yaml, keeping its other splits;
        # `-S data.files.test=null` drops one (docs/any-task.md).
        return None if files is None else {split: file for split, file in files.items() if file is not None}

    @model_validator(mode="after")
    def _one_source(self) -> DataParams:
        if self.files is not None:
            if self.dataset is not None or self.config is not None:
                raise ValueError("files and dataset/config are both set: own files need dataset: null and config: null")
            if "train" not in self.files:
                raise ValueError(f"files: no train file (got splits {sorted(self.files)})")
            for split, file in self.files.items():
                if not inside(file, OWN_DATA):
                    raise ValueError(f"files.{split}: {file!r} is not under {OWN_DATA}/; put your files there (a "
                                     "dependency of the download stage in dvc.yaml, so DVC reruns it when they change)")
            if self.text_columns is None:
                raise ValueError("text_columns: own files need the text column(s), e.g. [text] or "
                                 "[sentence1, sentence2]")
            return self
        if self.dataset is None or self.config is None:
            raise ValueError("dataset and config: set both (a Hub dataset or folder), or files for your own data")
        if self.dataset in GLUE_DATASETS and self.config not in GLUE_TASKS:
            raise ValueError(f"config: {self.config!r} is not a GLUE task; GLUE's are {', '.join(GLUE_TASKS)}")
        if self.glue_task:
            fixed = {k: getattr(self, k) for k in ("text_columns", "label_names", "task_type", "positive_label",
                                                        "symmetric")}
            if any(v is not None for v in fixed.values()):
                raise ValueError(f"GLUE task {self.config!r} defines its columns, labels and metric; set "
                                 f"{', '.join(k for k, v in fixed.items() if v is not None)} to null")
        return self


class ModelParams(_Section):
    checkpoint: str = Field(min_length=1)
    pooling: Literal["cls", "mean"]  # the head's input: the first token's vector ([CLS], <s>) or the tokens' mean


class TokenizeParams(_Section):
    max_length: Annotated[int, Field(strict=True, ge=8)] | None
    num_proc: PositiveInt | None  # worker processes of Dataset.map (null: one; the fast tokenizer uses every core)


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
    scheduler_kwargs: dict[Annotated[str, Field(min_length=1)], Any]  # get_scheduler's scheduler_specific_kwargs
    warmup_steps: NonNegativeInt  # warmup in optimizer steps ...
    warmup_ratio: float = Field(ge=0, lt=1)  # ... or as a fraction of all optimizer steps (not both)
    metric_for_best: str | None = Field(min_length=1)  # picks the kept epoch: loss or a task metric (null: its main)
    keep_best: StrictBool  # save the best epoch's weights (true) or the last epoch's (false)
    early_stopping_patience: PositiveInt | None  # evaluations without improvement before stopping (null: never)
    early_stopping_threshold: float = Field(ge=0)  # smallest change of metric_for_best that counts as improvement
    eval_every_steps: PositiveInt | None  # validate every this many optimizer steps and at the last (null: every epoch)
    save_every_steps: PositiveInt | None  # checkpoint every this many steps too (null: only after each evaluation)
    save_total_limit: PositiveInt | None  # checkpoints kept in models/checkpoints, newest first (null: all)
    resume: StrictBool  # continue from the last checkpoint in models/checkpoints when it matches these params
    accelerate_config: str = Field(min_length=1)  # `accelerate launch --config_file` of the train and evaluate stages
    ddp_timeout: PositiveInt  # seconds a process waits for the others in a collective before its stage fails
    mixed_precision: Literal["auto", "no", "fp16", "bf16"]  # auto: see resolve_mixed_precision
    log_every: PositiveInt  # optimizer steps between DVCLive logs of train loss and learning rate
    group_by_length: StrictBool  # batches of similar lengths (transformers' LengthGroupedSampler)
    adamw_impl: Literal["default", "foreach", "fused"]  # torch.optim.AdamW implementation
    torch_compile: StrictBool
    num_threads: PositiveInt | None  # torch.set_num_threads on CPU (null: torch's default)

    @field_validator("scheduler_kwargs")
    @classmethod
    def _not_the_loops(cls, kwargs: dict[str, Any]) -> dict[str, Any]:
        if taken := [key for key in kwargs if key in LOOP_SCHEDULER_ARGS]:
            raise ValueError(f"{', '.join(taken)}: set by the loop (from train.warmup_steps or warmup_ratio and the "
                             "run's length), not a scheduler kwarg")
        return kwargs

    @field_validator("mixed_precision", mode="before")
    @classmethod
    def _unquoted_no(cls, value):
        # YAML 1.1 readers and writers (PyYAML, some editors and tools) turn an unquoted `no` into false.
        return "no" if value is False else value

    @model_validator(mode="after")
    def _consistent(self) -> TrainParams:
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
    # A split the data lacks (e.g. SST-2's test here) is skipped with a warning; MNLI adds the *_mismatched ones.
    splits: list[Literal["validation", "test", "validation_mismatched", "test_mismatched"]] = Field(min_length=1)

    _splits_once = field_validator("splits")(_each_once)


class TransferParams(_Section):
    """Unlabelled pairs the teacher labels for the student (finetune/distill/transfer.py, docs/distillation.md)."""

    kind: Literal["neighbours", "files"] | None  # null: no transfer set
    k: PositiveInt  # neighbours: the nearest train texts paired with each train text
    min_similarity: float = Field(ge=0, lt=1)  # neighbours: pairs less alike than this (TF-IDF cosine) are dropped
    max_similarity: float = Field(gt=0, le=1)  # neighbours: pairs at least this alike are dropped (near-identical)
    files: list[Annotated[str, Field(min_length=1)]] | None = Field(min_length=1)  # files: under data/own
    max_pairs: PositiveInt | None  # keep a seeded sample of this many pairs (null: all)
    seed: NonNegativeInt  # the sample's seed
    # a transfer row's loss: weight x soft (a labelled row's: (1 - alpha) hard + alpha soft)
    weight: float = Field(ge=0)

    @model_validator(mode="after")
    def _files_with_kind_files(self) -> TransferParams:
        if self.min_similarity >= self.max_similarity:
            raise ValueError(f"min_similarity ({self.min_similarity}) must be below max_similarity "
                             f"({self.max_similarity})")
        if (self.kind == "files") != (self.files is not None):
            raise ValueError("files: set it (a list of files under data/own) with kind: files, and only then "
                             f"(kind {self.kind!r}, files {self.files!r})")
        for file in self.files or []:
            if not inside(file, OWN_DATA):
                raise ValueError(f"files: {file!r} is not under {OWN_DATA}/; put your unlabelled text there (a "
                                 "dependency of the teacher stage in dvc.yaml)")
        return self


class DistillParams(_Section):
    """Knowledge distillation from a fine-tuned teacher (finetune/distill/loss.py, docs/distillation.md)."""

    teacher: str | None = Field(min_length=1)  # a fine-tuned save_pretrained folder under models/own (null: off)
    alpha: float = Field(ge=0, le=1)  # weight of the soft loss: (1 - alpha) x hard + alpha x soft
    temperature: float = Field(gt=0)  # softens both distributions of the soft loss (classification)
    transfer: TransferParams  # unlabelled pairs labelled by the teacher only (kind null: none)

    @field_validator("teacher")
    @classmethod
    def _teacher_folder(cls, teacher: str | None) -> str | None:
        return None if teacher is None else own_model_folder(teacher)

    @model_validator(mode="after")
    def _transfer_needs_a_teacher(self) -> DistillParams:
        if self.transfer.kind is not None and self.teacher is None:
            raise ValueError(f"transfer.kind is {self.transfer.kind!r} but teacher is null: a transfer set is "
                             "labelled by the teacher; set distill.teacher, or transfer.kind: null")
        return self


class Int8Params(_Section):
    per_channel: StrictBool  # one weight scale per output channel (else one per tensor)
    # the attention projections kept fp32, by role; each family's module names: finetune/export/make.py
    keep_fp32: list[Literal["query", "key", "value"]]

    _keep_once = field_validator("keep_fp32")(_each_once)


class OpenVinoParams(_Section):
    calibration_rows: PositiveInt  # openvino-int8: NNCF calibrates on this many train rows (never validation or test)
    seed: NonNegativeInt  # which train rows


class ExportParams(_Section):
    """The served forms of the fine-tuned model (docs/serving.md). Only the export stage reads this section."""

    forms: list[str]  # names in finetune/export/registry.py, checked by the export stage (check_forms); [] makes none
    opset: int = Field(strict=True, ge=17)  # ONNX opset of torch.onnx.export
    int8: Int8Params
    openvino: OpenVinoParams
    fp32_tolerance: float = Field(gt=0)  # largest |logit - PyTorch's logit| of an fp32 form: beyond, the stage fails
    max_metric_drop: float = Field(ge=0)  # a lossy form (int8, bf16) losing more of the main metric: a WARNING

    _forms_once = field_validator("forms")(_each_once)


class Params(_Section):
    """The whole of params.yaml. Every key is required: params.yaml is the one source of defaults."""

    data: DataParams
    model: ModelParams
    tokenize: TokenizeParams
    train: TrainParams
    evaluate: EvaluateParams
    distill: DistillParams
    export: ExportParams


def load_params(path: str | Path = PARAMS_FILE) -> Params:
    """Read and validate params.yaml.

    Raises:
        ParamsError: the file is missing, unreadable (a folder, not UTF-8) or not YAML, or a key is unknown, missing,
            of the wrong type or out of range. The message names the file and each offending key, e.g.
            ``params.yaml: train.lr: Input should be greater than 0 (got -1)``.
    """
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ParamsError(f"{path}: not found (run from the repository root)") from None
    except (OSError, UnicodeDecodeError) as err:
        reason = err.strerror if isinstance(err, OSError) else err
        raise ParamsError(f"{path}: cannot be read ({type(err).__name__}: {reason})") from None
    return validate_params(read_yaml(text, str(path)), str(path))


def validate_params(raw: Any, source: str) -> Params:
    """``raw`` (params.yaml's content as Python objects) as ``Params``.

    Raises:
        ParamsError: one line per offending key, ``<source>: <key>: <what is wrong> (got <value>)``, the key as
            ``finetune.errors.field_error`` writes it (``evaluate.splits[0]``).
    """
    try:
        return Params.model_validate(raw if raw is not None else {})
    except ValidationError as err:
        lines = []
        for e in err.errors():
            got = "" if e["type"] in ("missing", "value_error") else f" (got {e['input']!r})"
            if e["type"] == "string_type" and isinstance(e["input"], (int, float)):  # YAML reads 1, 1.0, true so
                text = str(e["input"]).lower() if isinstance(e["input"], bool) else e["input"]
                got += f"; quote it for the text: '{text}'"
            lines.append(f"{source}: {field_error(e)}{got}")
        raise ParamsError("\n".join(lines)) from None


if __name__ == "__main__":
    try:
        load_params()
    except ParamsError as err:
        sys.exit(str(err))
    print(f"{PARAMS_FILE}: valid")
