"""The loop's features on a tiny model: gradient accumulation, the no-decay group, warmup, best epoch, early
stopping."""

from __future__ import annotations

import json
import math

import pytest
import torch
from safetensors.torch import load_file

import finetune.train.recipe as training
from finetune.errors import ParamsError
from finetune.modeling import load_classifier
from finetune.tasks import glue_task
from finetune.train import resume
from finetune.train.early_stopping import EarlyStopping
from finetune.train.optimization import Schedule, make_optimizer, make_scheduler
from finetune.train.recipe import train
from tests.helpers import make_checkpoint, make_project, reset_accelerate, tiny_params


@pytest.fixture(scope="module")
def no_dropout_checkpoint(tokenizer, tmp_path_factory):
    """The tiny BERT without dropout, so batches of different sizes see the same function."""
    return make_checkpoint(tmp_path_factory.mktemp("no-dropout"), tokenizer, hidden_dropout_prob=0.0,
                           attention_probs_dropout_prob=0.0, classifier_dropout=0.0)


def test_accumulating_4_batches_of_2_equals_batches_of_8(no_dropout_checkpoint, tiny_raw, tmp_path):
    p = tiny_params(train={"epochs": 2, "batch_size": 8, "warmup_steps": 0})
    accumulated = tiny_params(train={"epochs": 2, "batch_size": 2, "gradient_accumulation_steps": 4, "warmup_steps": 0})
    big_paths = make_project(tmp_path / "big", p, tiny_raw, no_dropout_checkpoint)
    small_paths = make_project(tmp_path / "accumulated", accumulated, tiny_raw, no_dropout_checkpoint)
    big = train(p, big_paths)
    reset_accelerate()
    small = train(accumulated, small_paths)
    assert small["steps"] == big["steps"] == 10  # 40 rows: 5 optimizer steps an epoch either way
    assert small["train_samples"] == big["train_samples"] == 80
    a = load_file(big_paths.trained / "model.safetensors")
    b = load_file(small_paths.trained / "model.safetensors")
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-4, atol=1e-5, msg=name)
    assert small["mean_loss"] == pytest.approx(big["mean_loss"], abs=1e-4)


def test_no_weight_decay_on_biases_and_layernorm(tiny_checkpoint):
    model = load_classifier(tiny_checkpoint, glue_task("mrpc"))
    decay, no_decay = make_optimizer(model, 1e-3, 0.1).param_groups
    names = {id(t): n for n, t in model.named_parameters()}
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all(not names[id(t)].endswith("bias") and "LayerNorm" not in names[id(t)] for t in decay["params"])
    assert {names[id(t)] for t in no_decay["params"]} >= {"classifier.bias", "bert.embeddings.LayerNorm.weight"}
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))


def test_warmup_ratio_counts_optimizer_steps(tiny_project):
    params = tiny_params(train={"epochs": 2, "warmup_steps": 0, "warmup_ratio": 0.4, "log_every": 1})
    paths = tiny_project(params=params)
    train(params, paths)
    lr_log = paths.train_logs / "steps/plots/metrics/train/lr.tsv"
    lrs = [float(line.split("\t")[-1]) for line in lr_log.read_text().splitlines()[1:]]
    # 10 optimizer steps, 4 of warmup: the learning rate rises to its peak after step 4, then decays to 0
    assert len(lrs) == 10 and max(lrs) == pytest.approx(1e-3) and lrs.index(max(lrs)) == 3
    assert lrs[:4] == sorted(lrs[:4]) and lrs[3:] == sorted(lrs[3:], reverse=True) and lrs[-1] == 0.0


def test_scheduler_kwargs_reach_the_schedule(tiny_project):
    params = tiny_params(train={"epochs": 2, "warmup_steps": 0, "log_every": 1, "scheduler": "cosine_with_restarts",
                                "scheduler_kwargs": {"num_cycles": 2}})
    paths = tiny_project(params=params)
    train(params, paths)
    lr_log = paths.train_logs / "steps/plots/metrics/train/lr.tsv"
    lrs = [float(line.split("\t")[-1]) for line in lr_log.read_text().splitlines()[1:]]
    # 10 optimizer steps, 2 hard restarts: the learning rate after step s is 1e-3 x cos-decay of (2 s / 10) mod 1
    expected = [1e-3 * 0.5 * (1 + math.cos(math.pi * ((2 * s / 10) % 1))) for s in range(1, 10)] + [0.0]
    assert lrs == pytest.approx(expected) and lrs[4] == pytest.approx(1e-3)  # the restart at step 5


def _lrs(scheduler: str, kwargs: dict, total: int = 10, warmup: int = 0) -> list[float]:
    """The learning rates (peak 1.0) of ``scheduler`` with ``kwargs`` over ``total`` steps, as the loop steps it."""
    p = tiny_params(train={"scheduler": scheduler, "scheduler_kwargs": kwargs, "lr": 0.5}).train
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    schedule = Schedule(steps_per_epoch=total, total_steps=total, epochs=1, warmup_steps=warmup)
    s = make_scheduler(optimizer, p.scheduler, p.scheduler_kwargs, schedule, p.lr)
    lrs = []
    for _ in range(total):
        optimizer.step()
        s.step()
        lrs.append(s.get_last_lr()[0])
    return lrs


def test_schedulers_beyond_warmup_and_length_take_their_own_arguments():
    assert _lrs("polynomial", {"power": 2.0, "lr_end": 0.0}) == pytest.approx([(1 - s / 10) ** 2 for s in range(1, 11)])
    assert _lrs("cosine_with_min_lr", {"min_lr_rate": 0.1})[-1] == pytest.approx(0.1)
    wsd = _lrs("warmup_stable_decay", {"num_decay_steps": 4}, warmup=2)  # 2 warmup, 4 stable, 4 decay steps
    assert wsd[1:6] == [1.0] * 5 and wsd[-1] == pytest.approx(0.0)


@pytest.mark.parametrize("scheduler,kwargs,message", [
    ("cosine", {"power": 2.0}, "power: not an argument of the 'cosine' scheduler (its own: num_cycles)"),
    ("constant", {"num_cycles": 2}, "num_cycles: not an argument of the 'constant' scheduler (its own: none)"),
    ("warmup_stable_decay", {}, "the 'warmup_stable_decay' scheduler refuses {}: get_wsd_schedule() missing 1"),
    ("cosine_with_min_lr", {}, "the 'cosine_with_min_lr' scheduler refuses {}: One of min_lr or min_lr_rate"),
    ("polynomial", {"power": "two"}, "the 'polynomial' scheduler refuses {'power': 'two'}: unsupported operand"),
])
def test_a_bad_scheduler_kwarg_is_one_params_error(scheduler, kwargs, message):
    with pytest.raises(ParamsError) as err:
        _lrs(scheduler, kwargs)
    assert str(err.value).startswith(f"params.yaml: train.scheduler_kwargs: {message}")
    assert "\n" not in str(err.value)


def test_a_warmup_longer_than_the_run_is_one_params_error():
    with pytest.raises(ParamsError) as err:
        _lrs("linear", {}, total=3, warmup=100)
    assert str(err.value) == ("params.yaml: train.warmup_steps: 100 is more than the run's 3 optimizer steps, so the "
                              "learning rate would never reach train.lr (0.5); use at most 3, or train.warmup_ratio")
    assert len(_lrs("linear", {}, total=3, warmup=3)) == 3  # as long as the run: allowed


@pytest.mark.parametrize("values,patience,threshold,stop_after,best", [
    ([0.5, 0.6, 0.6, 0.59, 0.7], 2, 0.0, 4, 2),     # two epochs without improvement after epoch 2
    ([0.5, 0.6, 0.605, 0.608, 0.62], 2, 0.01, 4, 2),  # gains of 0.005 and 0.008 are not above 0.01
    ([0.5, 0.4, 0.6, 0.5, 0.5, 0.7], 2, 0.0, 5, 3),  # the counter restarts after an improvement
    ([0.5, 0.4, 0.3], None, 0.0, None, 1),           # no patience: never stops
])
def test_early_stopping_on_a_scripted_metric(values, patience, threshold, stop_after, best):
    stopping = EarlyStopping(mode="max", patience=patience, threshold=threshold)
    stopped = None
    for epoch, value in enumerate(values, start=1):
        stopping.update(value, epoch)
        if stopping.should_stop:
            stopped = epoch
            break
    assert (stopped, stopping.best_epoch) == (stop_after, best)


def test_loss_is_minimised():
    stopping = EarlyStopping(mode="min", patience=1)
    assert stopping.update(0.7, 1) and stopping.update(0.6, 2) and not stopping.update(0.65, 3)
    assert stopping.should_stop and stopping.best_epoch == 2


def test_training_stops_early_and_keeps_the_best_epoch(tiny_project, monkeypatch):
    f1_by_epoch = iter([0.5, 0.7, 0.6, 0.65, 0.9, 0.95])
    evaluate_split = training.evaluate_split
    saved = {}

    def scripted(predictor, rows, metric, p, desc):
        metrics, logits = evaluate_split(predictor, rows, metric, p, desc)
        return {**metrics, "f1": next(f1_by_epoch)}, logits

    def remember(accelerator, model, tokenizer, task, folder):  # the weights of each saved best epoch
        saved[len(saved) + 1] = {k: v.clone() for k, v in accelerator.unwrap_model(model).state_dict().items()}
        return save_model(accelerator, model, tokenizer, task, folder)

    save_model = resume.save_model
    monkeypatch.setattr(training, "evaluate_split", scripted)
    monkeypatch.setattr(resume, "save_model", remember)
    params = tiny_params(train={"epochs": 6, "keep_best": True, "early_stopping_patience": 2})
    paths = tiny_project(params=params)
    metrics = train(params, paths)
    assert (metrics["epochs"], metrics["best_epoch"], metrics["stopped_early"]) == (4, 2, True)
    assert metrics["best_validation_f1"] == 0.7 and metrics["steps"] == 4 * 5
    kept = load_file(paths.trained / "model.safetensors")
    best = saved[2]  # saved after epochs 1 and 2, the improvements
    assert len(saved) == 2 and all(kept[k].equal(best[k]) for k in kept)
    state = json.loads((paths.checkpoints / "step-20" / "trainer_state.json").read_text())
    assert state["stopping"]["bad_evaluations"] == 2
