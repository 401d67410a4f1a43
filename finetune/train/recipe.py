"""The train stage's run as one object in the shape of a torchtune recipe (``setup``, ``train``, ``save_checkpoint``):
the Hugging Face course's "A full training" loop (https://huggingface.co/learn/llm-course/chapter3/4) on Accelerate,
with evaluations, early stopping, the kept model and checkpoints. The methods read in the order a run happens.
"""

from __future__ import annotations

import logging
import shutil
import time
from dataclasses import asdict, replace

import torch
from accelerate import Accelerator
from accelerate.utils import broadcast_object_list, set_seed
from datasets import Dataset, load_from_disk
from tqdm.auto import tqdm
from transformers import PreTrainedTokenizerBase

from finetune.data.batches import make_collator, train_dataloader
from finetune.data.tokenization import training_tokenizer
from finetune.distill.loss import Distillation, Teacher, load_teacher, with_teacher_logits
from finetune.errors import ParamsError
from finetune.evaluate.collapse import constant_baseline
from finetune.evaluate.evaluation import evaluate_split, load_metric
from finetune.hardware import resolve_mixed_precision
from finetune.inference.predictor import Predictor
from finetune.modeling import load_classifier
from finetune.params import Params
from finetune.paths import Paths
from finetune.runtime import atomic_dir, make_accelerator, set_cpu_threads
from finetune.tasks import Task
from finetune.train import report, resume
from finetune.train.early_stopping import EarlyStopping
from finetune.train.live import TrainLog
from finetune.train.optimization import Schedule, make_optimizer, make_scheduler
from finetune.train.trial import TrialReport, trial_from_env

log = logging.getLogger(__name__)


def train(params: Params, paths: Paths) -> dict:
    """Fine-tune ``paths.pretrained`` on ``paths.tokenized``'s train split; returns metrics/train.json's content
    (``finetune.train.report.train_metrics``). Reads ``pretrained``, ``tokenized``, ``teacher``; writes ``trained``,
    ``checkpoints``, ``train_logs``.

    Raises:
        CheckpointError: a checkpoint could not be written (the disk is full); and what ``FineTuneRecipe.setup``
            raises.
    """
    recipe = FineTuneRecipe(params, paths)
    recipe.setup()
    recipe.train()
    return report.train_metrics(recipe)


class FineTuneRecipe:
    """One fine-tuning run of ``params``: ``setup`` prepares it (fresh, or resumed with ``train.resume``), ``train``
    runs its epochs; ``finetune.train.report`` records and reports it (metrics/train.json: ``train_metrics``).
    Every process of an ``accelerate launch`` builds one; only the main one writes files.
    """

    # set up by ``setup``
    accelerator: Accelerator
    mixed_precision: str  # train.mixed_precision resolved for this machine
    tokenizer: PreTrainedTokenizerBase
    task: Task
    metric_for_best: str  # train.metric_for_best, or the task's main metric
    distill: Distillation | None  # with distill.teacher: the loss on the teacher's logits too
    model: torch.nn.Module  # prepared by the accelerator
    parameters: int  # the model's parameter count
    optimizer: torch.optim.Optimizer
    train_dl: torch.utils.data.DataLoader
    batch_order: torch.Generator  # reseeded every epoch: the batch order depends on seed and epoch only
    schedule: Schedule
    scheduler: torch.optim.lr_scheduler.LRScheduler
    fingerprint: str  # resume.run_fingerprint: a checkpoint of another run is never resumed
    validation: Dataset  # the tokenized validation split
    baseline: dict  # the constant model of train's labels on validation (finetune.evaluate.collapse.constant_baseline)
    predictor: Predictor  # the model in training, for validation
    trial: TrialReport | None  # in a search (tools.tune): the Optuna trial each validation is reported to
    state: resume.RunState  # what a checkpoint continues: steps, losses, evaluations
    stopping: EarlyStopping
    # set by ``train``
    logs: TrainLog
    progress: tqdm

    def __init__(self, params: Params, paths: Paths):
        self.params, self.paths, self.p = params, paths, params.train
        self.unit = "step" if self.p.eval_every_steps else "epoch"  # what an evaluation follows: an epoch, or steps
        self.start = time.perf_counter()
        self.resumed_from = 0  # the optimizer step a resumed run continued from (0: a fresh run)
        self.compile_seconds: float | None = None  # the first optimizer step, with train.torch_compile
        self.pruned = False  # the search's pruner stopped the run

    # --- set up --------------------------------------------------------------------------------------------------

    def setup(self) -> None:
        """Load tokenizer, task, data, teacher and model, prepare model, optimizer and loader for the processes,
        and start fresh or resume (``start_or_resume``).

        Raises:
            ParamsError: ``train.metric_for_best`` is not a metric of the task, ``train.warmup_steps`` is more than
                the run's steps, or ``train.scheduler_kwargs`` does not fit ``train.scheduler`` (``make_scheduler``).
            CheckpointError: ``paths.pretrained`` lacks config, weights or tokenizer, or has a head of another size.
            TeacherError: with ``distill.teacher``, the teacher's logits do not fit the task or the train split.
        """
        p, paths = self.p, self.paths
        threads = set_cpu_threads(p.num_threads)
        self.mixed_precision = resolve_mixed_precision(p.mixed_precision)
        self.accelerator = make_accelerator(p.ddp_timeout, mixed_precision=self.mixed_precision,
                                            gradient_accumulation_steps=p.gradient_accumulation_steps)
        set_seed(p.seed)
        self.tokenizer = training_tokenizer(paths.pretrained, self.params.tokenize.max_length)  # saved with the model
        self.task = Task.load(paths.tokenized)
        try:
            self.metric_for_best, _ = self.task.metric_for_best(p.metric_for_best)
        except ValueError as err:
            raise ParamsError(f"params.yaml: {err}") from None
        tokenized = load_from_disk(str(paths.tokenized))
        teacher = load_teacher(self.params.distill, paths.teacher, self.task, tokenized["train"])  # None: off
        train_rows = tokenized["train"] if teacher is None else with_teacher_logits(
            tokenized["train"], teacher, self.tokenizer, self.params.tokenize.max_length, self.task)
        self.setup_model(train_rows)
        report.log_setup(self, threads)
        self.distill = self.setup_distillation(teacher, len(train_rows))
        self.fingerprint = resume.run_fingerprint(self.params, paths, tokenized, self.accelerator.num_processes,
                                                  self.mixed_precision, distilling=teacher is not None)
        self.validation = tokenized["validation"]
        self.baseline = constant_baseline(self.task, load_metric(self.task), tokenized["train"]["labels"],
                                          self.validation["labels"])
        self.predictor = Predictor(self.model, self.tokenizer, self.task, accelerator=self.accelerator)
        main = self.accelerator.is_main_process
        self.trial = trial_from_env(self.metric_for_best) if main else None
        self.state, self.stopping = self.start_or_resume()

    def setup_model(self, train_rows: Dataset) -> None:
        """The model, its optimizer and the loader of ``train_rows``, prepared by the accelerator (compiled first
        with ``train.torch_compile``); the schedule and the learning-rate scheduler over the prepared loader."""
        p = self.p
        model = load_classifier(self.paths.pretrained, self.task, self.params.model.pooling)
        self.parameters = sum(t.numel() for t in model.parameters())
        train_dl = train_dataloader(train_rows, make_collator(self.tokenizer), p.batch_size, p.seed, p.group_by_length)
        self.batch_order = train_dl.generator
        optimizer = make_optimizer(model, p.lr, p.weight_decay, p.adamw_impl)
        if p.torch_compile:
            model = torch.compile(model)
        self.model, self.optimizer, self.train_dl = self.accelerator.prepare(model, optimizer, train_dl)
        self.schedule = Schedule.of(len(self.train_dl), p.gradient_accumulation_steps, p.epochs, p.max_steps,
                                    p.warmup_steps, p.warmup_ratio)
        self.scheduler = make_scheduler(self.optimizer, p.scheduler, p.scheduler_kwargs, self.schedule, p.lr)
        self.accelerator.register_for_checkpointing(self.scheduler)

    def setup_distillation(self, teacher: Teacher | None, train_rows: int) -> Distillation | None:
        """The distillation loss on ``teacher``'s logits (``load_teacher``'s), logged; None without a teacher.
        ``train_rows``: rows of the train split, transfer pairs included."""
        if teacher is None:
            return None
        report.log_distillation(self.params.distill, teacher, train_rows)
        d = self.params.distill
        return Distillation(d.alpha, d.temperature, self.task.is_regression, teacher.identity, d.transfer.weight)

    def start_or_resume(self) -> tuple[resume.RunState, EarlyStopping]:
        """``(state, stopping)``: fresh, or with ``train.resume`` the newest checkpoint's of ``self.fingerprint``
        (one saved before the first evaluation holds no early-stopping record: it resumes with a fresh one). Starting
        fresh deletes the checkpoints of other runs (main process)."""
        p, checkpoints = self.p, self.paths.checkpoints
        stopping = EarlyStopping(mode=self.task.metric_for_best(self.metric_for_best)[1],
                                 patience=p.early_stopping_patience, threshold=p.early_stopping_threshold)
        checkpoint = resume.last_checkpoint(checkpoints, self.fingerprint) if p.resume else None
        if checkpoint is None:
            if self.accelerator.is_main_process:
                shutil.rmtree(checkpoints, ignore_errors=True)
            return resume.RunState(self.fingerprint, stopping=asdict(stopping)), stopping
        state = resume.load_checkpoint(self.accelerator, checkpoint)
        self.resumed_from = state.step
        report.log_resume(state, self.schedule.steps_per_epoch, checkpoint)
        return state, replace(stopping, **state.stopping)  # a checkpoint from before the first evaluation may hold {}

    # --- train ---------------------------------------------------------------------------------------------------

    def train(self) -> None:
        """Run the epochs left until the last step, early stopping or a search's pruner; then copy the kept model
        to ``paths.trained``."""
        state, schedule = self.state, self.schedule
        with report.open_logs(self) as (self.logs, self.progress):
            while state.step < schedule.total_steps and not self.stopping.should_stop and not self.pruned:
                self.train_epoch()
            self.progress.close()
            self.save_kept_model()

    def train_epoch(self) -> None:
        """Run (the rest of) epoch ``state.epoch + 1`` with its evaluations and checkpoints, until it ends or the run,
        early stopping or a search's pruner stops; the batch order is seeded by ``train.seed + epoch``."""
        p, accelerator, schedule, state = self.p, self.accelerator, self.schedule, self.state
        epoch = state.epoch + 1
        done = state.step - state.epoch * schedule.steps_per_epoch  # steps of this epoch taken before a resume
        self.batch_order.manual_seed(p.seed + epoch)
        batches = accelerator.skip_first_batches(self.train_dl, done * p.gradient_accumulation_steps) if done else \
            self.train_dl
        self.model.train()
        micro_losses, micro_parts = [], {}  # of the batches of this optimizer step (distillation: hard and soft loss)
        tick = time.perf_counter()
        for batch in batches:
            # forward and backward; the optimizer steps on the last batch of each accumulation
            step_start = time.perf_counter()
            micro_losses.append(self.train_batch(batch, micro_parts))
            report.record_batch(state, batch, accelerator.num_processes)
            if not accelerator.sync_gradients:
                continue
            # an optimizer step done: the schedule, the step's loss and learning rate, progress and logs
            self.scheduler.step()
            state.step += 1
            if state.step == 1 and p.torch_compile:
                self.compile_seconds = time.perf_counter() - step_start
            report.record_step(self, epoch, micro_losses, micro_parts)
            micro_losses, micro_parts = [], {}
            state.train_seconds += time.perf_counter() - tick
            # the epoch's end; an evaluation (with its checkpoint) when due, else a checkpoint when due
            last = state.step == schedule.total_steps
            if last or state.step == epoch * schedule.steps_per_epoch:
                state.epoch = epoch
            if (state.step % p.eval_every_steps == 0 or last) if p.eval_every_steps else state.epoch == epoch:
                self.evaluate_and_keep()
                self.model.train()
            elif p.save_every_steps and state.step % p.save_every_steps == 0:
                self.save_checkpoint()
            tick = time.perf_counter()
            # the run's end, early stopping or the search's pruner
            if last or self.stopping.should_stop or self.pruned:
                break

    def train_batch(self, batch: dict, parts: dict[str, list[float]]) -> float:
        """Forward and backward of one batch, returning its loss; the optimizer steps on every
        ``gradient_accumulation_steps``-th batch, the gradient clipped to ``train.max_grad_norm`` first.

        Args:
            batch: ``input_ids``, ``attention_mask`` ``[batch, seq_len]``, ``labels`` ``[batch]``; with distillation
                ``teacher_logits`` ``[batch, num_labels]``.
            parts: with distillation, the batch's ``train/hard_loss`` and ``train/soft_loss`` are appended here.
        """
        accelerator, model = self.accelerator, self.model
        with accelerator.accumulate(model):
            if self.distill is None:
                loss = model(**batch).loss
            else:
                loss, hard, soft = self.distill.loss(model, batch)
                for name, value in zip(("train/hard_loss", "train/soft_loss"),
                                       torch.stack((hard, soft)).detach().tolist()):
                    parts.setdefault(name, []).append(value)
            accelerator.backward(loss)
            if accelerator.sync_gradients and self.p.max_grad_norm:
                accelerator.clip_grad_norm_(model.parameters(), self.p.max_grad_norm)
            self.optimizer.step()
            self.optimizer.zero_grad()
        return loss.item()

    # --- evaluate and keep ---------------------------------------------------------------------------------------

    def evaluate_and_keep(self) -> None:
        """Validate, append the evaluation to ``state.evaluations`` and log it, report it to a search's trial
        (setting ``self.pruned``), save the model to ``paths.checkpoints/best`` when it is the best so far (every
        time without ``train.keep_best``), and checkpoint the run. A collapsed evaluation is recorded in
        ``state.collapsed``.
        """
        state, unit = self.state, self.unit
        validation, logits = evaluate_split(self.predictor, self.validation, load_metric(self.task),
                                            self.params.evaluate, desc="validation")
        entry = report.evaluation_entry(state, validation, self.schedule.steps_per_epoch)
        state.evaluations.append(entry)
        improved = self.stopping.update(validation[self.metric_for_best], entry["epoch"], state.step)
        state.stopping = asdict(self.stopping)
        report.record_evaluation(self, entry, validation, logits, improved)
        pruned = [self.trial is not None and self.trial.report(validation, entry[unit])]  # a search's pruner
        self.pruned = broadcast_object_list(pruned)[0]
        if improved or not self.p.keep_best:
            resume.save_model(self.accelerator, self.model, self.tokenizer, self.task, self.paths.checkpoints / "best")
        self.save_checkpoint()

    # --- checkpoint ----------------------------------------------------------------------------------------------

    def save_checkpoint(self) -> None:
        """Checkpoint the run into ``paths.checkpoints/step-<step>``, keeping the newest ``train.save_total_limit``
        (``resume.save_checkpoint``). Every process must call it.

        Raises:
            CheckpointError: the checkpoint could not be written (e.g. the disk is full).
        """
        resume.save_checkpoint(self.accelerator, self.paths.checkpoints, self.state, self.p.save_total_limit)

    def save_kept_model(self) -> None:
        """Copy the kept evaluation's model (``paths.checkpoints/best``) to ``paths.trained``, atomically."""
        report.log_early_stopping(self)
        self.accelerator.wait_for_everyone()
        if self.accelerator.is_main_process:
            with atomic_dir(self.paths.trained) as tmp:
                shutil.copytree(self.paths.checkpoints / "best", tmp, dirs_exist_ok=True)
            report.log_kept_model(self)
