"""Knowledge distillation: the loss against hand computations, the teacher stage on a tiny MPNet teacher with its own
tokenizer for a BERT student (rows aligned, both orders of the pairs), the refusals, training with the teacher's
logits (logged, resumed, on 2 processes), and training without a teacher exactly as before."""

from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pandas as pd
import pytest
import torch
import yaml
from safetensors.torch import load_file

import finetune.training as training
from finetune.batches import TEACHER_LOGITS, make_collator
from finetune.distill import distillation_loss, load_teacher
from finetune.errors import DataError, ParamsError, TeacherError
from finetune.modeling import load_classifier, load_finetuned
from finetune.tasks import Task, glue_task, own_task
from finetune.teacher import (LOGITS_FILE, SWAPPED_LOGITS_FILE, TEACHER_FILE, check_aligned, save_teacher,
                              teacher_logits)
from finetune.tokenization import SWAPPED
from finetune.training import train
from tests.helpers import (REPO, launch, make_family_checkpoint, make_project, python, reset_accelerate, run,
                           tiny_params)

MRPC = glue_task("mrpc")
TEACHER = "models/own/teacher"  # distill.teacher of the test projects
TIMING_KEYS = {"train_seconds", "samples_per_second", "wall_seconds", "peak_memory_mb", "resumed_from_step"}


# --- the loss ---------------------------------------------------------------------------------------------------------

def batch(seed: int = 0, rows: int = 6, classes: int = 3):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(rows, classes, generator=g) * 2, torch.randint(0, classes, (rows,), generator=g),
            torch.randn(rows, classes, generator=g) * 2)


def test_alpha_0_is_the_plain_cross_entropy():
    student, labels, teacher = batch()
    loss, hard, soft = distillation_loss(student, labels, teacher, alpha=0.0, temperature=2.0, regression=False)
    assert loss.item() == torch.nn.functional.cross_entropy(student, labels).item() == hard.item()
    assert soft.item() > 0


def test_alpha_1_with_the_teacher_equal_to_the_student_has_no_soft_loss():
    student, labels, _ = batch()
    loss, hard, soft = distillation_loss(student, labels, student.clone(), alpha=1.0, temperature=3.0,
                                         regression=False)
    assert abs(soft.item()) < 1e-6 and abs(loss.item()) < 1e-6 and hard.item() > 0


@pytest.mark.parametrize("temperature", [1.0, 2.0, 4.0])
def test_the_soft_loss_is_t_squared_times_the_kl_divergence_by_hand(temperature):
    student, labels, teacher = batch(seed=3)
    _, _, soft = distillation_loss(student, labels, teacher, alpha=0.5, temperature=temperature, regression=False)
    s, t = student.double().numpy() / temperature, teacher.double().numpy() / temperature
    p = np.exp(t) / np.exp(t).sum(axis=1, keepdims=True)  # the teacher's softened distribution
    q = np.exp(s) / np.exp(s).sum(axis=1, keepdims=True)  # the student's
    kl_per_row = (p * (np.log(p) - np.log(q))).sum(axis=1)  # KL(p || q)
    assert soft.item() == pytest.approx(temperature ** 2 * kl_per_row.mean(), rel=1e-5)


def test_the_mix_weighs_hard_and_soft_by_alpha():
    student, labels, teacher = batch(seed=5)
    loss, hard, soft = distillation_loss(student, labels, teacher, alpha=0.3, temperature=2.0, regression=False)
    assert loss.item() == pytest.approx(0.7 * hard.item() + 0.3 * soft.item(), rel=1e-6)


def test_regression_uses_mean_squared_errors_without_temperature():
    student, teacher = torch.tensor([[1.0], [2.0], [4.0]]), torch.tensor([[1.5], [2.0], [3.0]])
    labels = torch.tensor([0.0, 2.0, 5.0])
    for temperature in (1.0, 5.0):
        loss, hard, soft = distillation_loss(student, labels, teacher, alpha=0.25, temperature=temperature,
                                             regression=True)
        assert hard.item() == pytest.approx((1 + 0 + 1) / 3)
        assert soft.item() == pytest.approx((0.25 + 0 + 1) / 3)
        assert loss.item() == pytest.approx(0.75 * hard.item() + 0.25 * soft.item())
    loss, hard, _ = distillation_loss(student, labels, teacher, alpha=0.0, temperature=2.0, regression=True)
    assert loss.item() == torch.nn.functional.mse_loss(student[:, 0], labels).item()


def test_the_collator_stacks_the_teacher_logits_of_the_order_it_picks(tokenizer):
    rows = []
    for i in range(16):
        first, other = tokenizer(f"sentence {i}", "another one"), tokenizer("another one", f"sentence {i}")
        rows.append({**first, **{SWAPPED + k: v for k, v in other.items()}, "labels": i % 2,
                     TEACHER_LOGITS: [float(i), -float(i)], SWAPPED + TEACHER_LOGITS: [100.0 + i, -100.0 - i]})
    first = make_collator(tokenizer, swap=0.0)(rows)
    assert first[TEACHER_LOGITS].dtype == torch.float32 and first[TEACHER_LOGITS].shape == (16, 2)
    assert first[TEACHER_LOGITS][:, 0].tolist() == list(range(16))
    swapped = make_collator(tokenizer, swap=1.0)(rows)
    assert swapped[TEACHER_LOGITS][:, 0].tolist() == [100.0 + i for i in range(16)]
    mixed = make_collator(tokenizer, swap=0.5, seed=1)(rows)
    took_swapped = mixed[TEACHER_LOGITS][:, 0] >= 100
    assert 0 < int(took_swapped.sum()) < 16  # both orders drawn, each row with its own order's logits
    for i in range(16):
        ids = rows[i][(SWAPPED if took_swapped[i] else "") + "input_ids"]
        assert mixed["input_ids"][i, :len(ids)].tolist() == ids
    assert set(mixed) == {"input_ids", "token_type_ids", "attention_mask", "labels", TEACHER_LOGITS}


# --- the teacher stage ------------------------------------------------------------------------------------------------

def save_teacher_model(encoder, task: Task, folder):
    """A "fine-tuned" teacher of ``task``: ``encoder`` (a checkpoint folder) with a new seeded head, saved with its
    tokenizer and task.json as the train stage saves a model."""
    from transformers import AutoTokenizer

    torch.manual_seed(1)
    load_classifier(encoder, task).save_pretrained(folder)
    AutoTokenizer.from_pretrained(encoder).save_pretrained(folder)
    task.save(folder)
    return folder


@pytest.fixture(scope="module")
def mpnet_encoder(tmp_path_factory):
    """A random 2-layer MPNet with its own tokenizer (another family and vocabulary than the BERT student's)."""
    return make_family_checkpoint(tmp_path_factory.mktemp("mpnet"), "mpnet")


@pytest.fixture(scope="module")
def teacher_model(mpnet_encoder, tmp_path_factory):
    return save_teacher_model(mpnet_encoder, MRPC, tmp_path_factory.mktemp("teacher"))


@pytest.fixture
def project(tiny_raw, tiny_checkpoint, teacher_model, tmp_path, monkeypatch):
    """A function building a project (the train stage's inputs, the teacher in models/own/teacher, the working
    directory there, as for a stage): ``(teacher=..., raw=..., distill={...}, train={...}) -> (params, paths)``."""

    def build(teacher=teacher_model, raw=tiny_raw, name="p", distill=None, train=None):
        root = tmp_path / name
        shutil.copytree(teacher, root / TEACHER)
        monkeypatch.chdir(root)  # distill.teacher is checked from the working directory, as for a stage
        params = tiny_params(distill={"teacher": TEACHER, **(distill or {})}, train=train or {})
        return params, make_project(root, params, raw, tiny_checkpoint)

    return build


def run_teacher(params, paths):
    """The teacher stage's work (stages/teacher.py), in this process."""
    logits, logits_swapped, identity = teacher_logits(params, paths)
    save_teacher(paths.teacher, logits, logits_swapped, identity)
    reset_accelerate()
    return identity


def direct_logits(teacher_folder, texts: list[tuple[str, str]]) -> np.ndarray:
    """The teacher's logits of each pair, one at a time, without the stage's batching."""
    from transformers import AutoTokenizer

    tokenizer, model = AutoTokenizer.from_pretrained(teacher_folder), load_finetuned(teacher_folder).eval()
    with torch.no_grad():
        return np.stack([model(**tokenizer(a, b, truncation=True, return_tensors="pt")).logits[0].numpy()
                         for a, b in texts])


def test_the_teacher_stage_writes_logits_row_for_row_with_its_own_tokenizer(project, tiny_raw, teacher_model):
    params, paths = project(train={"swap_pairs": False})
    identity = run_teacher(params, paths)
    assert sorted(p.name for p in paths.teacher.iterdir()) == [LOGITS_FILE, TEACHER_FILE]
    logits = np.load(paths.teacher / LOGITS_FILE)
    assert logits.dtype == np.float32 and logits.shape == (40, 2)
    # row i is raw train row i, though the stage batches sorted by length (evaluate.sort_by_length)
    params = params.model_copy(update={"evaluate": params.evaluate.model_copy(update={"sort_by_length": True})})
    sorted_logits, _, _ = teacher_logits(params, paths)
    np.testing.assert_allclose(sorted_logits, logits, atol=1e-5)
    train = tiny_raw["train"]
    rows = [0, 7, 39]
    expected = direct_logits(teacher_model, [(train[i]["sentence1"], train[i]["sentence2"]) for i in rows])
    np.testing.assert_allclose(logits[rows], expected, atol=1e-4)
    saved = json.loads((paths.teacher / TEACHER_FILE).read_text())
    assert saved == identity
    assert saved["distillation"] is True and saved["teacher"] == TEACHER and saved["model_type"] == "mpnet"
    assert saved["task_type"] == "classification" and saved["id2label"] == {"0": "not_equivalent", "1": "equivalent"}
    assert saved["rows"] == 40 and saved["swapped"] is False and list(saved["data"]) == ["fingerprint"]  # rows once
    assert list(saved["weights"]) == ["model.safetensors"] and len(saved["weights"]["model.safetensors"]) == 64
    assert saved["mixed_precision"] == "no" and saved["seconds"] >= 0 and "name_or_path" in saved
    assert saved["base_model"] is None  # no model card in this teacher folder


def test_the_teacher_json_names_the_base_model_of_a_model_card(tmp_path):
    from finetune.teacher import card_base_model

    card = "---\nbase_model: sentence-transformers/all-mpnet-base-v2\nlicense: apache-2.0\n---\n# The card\n"
    (tmp_path / "README.md").write_text(card)
    assert card_base_model(tmp_path) == "sentence-transformers/all-mpnet-base-v2"
    (tmp_path / "README.md").write_text("# no header\n")
    assert card_base_model(tmp_path) is None
    (tmp_path / "README.md").write_text("---\nlicense: apache-2.0\n---\n# no base_model\n")
    assert card_base_model(tmp_path) is None
    (tmp_path / "README.md").unlink()
    assert card_base_model(tmp_path) is None  # no card: not looked for on the Hub


def test_with_swapped_pairs_the_other_order_is_scored_too(project, tiny_raw, teacher_model):
    params, paths = project(train={"swap_pairs": True})
    assert run_teacher(params, paths)["swapped"] is True
    logits, swapped = np.load(paths.teacher / LOGITS_FILE), np.load(paths.teacher / SWAPPED_LOGITS_FILE)
    assert logits.shape == swapped.shape == (40, 2) and not np.allclose(logits, swapped)
    train = tiny_raw["train"]
    np.testing.assert_allclose(swapped[[3, 20]], direct_logits(
        teacher_model, [(train[i]["sentence2"], train[i]["sentence1"]) for i in (3, 20)]), atol=1e-4)


def test_off_writes_only_teacher_json_fast_and_loads_nothing(tmp_path):
    paths = make_project(tmp_path / "p", tiny_params())
    code = ("import sys, time; from stages.teacher import main; start = time.perf_counter(); main(); "
            "print(round(time.perf_counter() - start, 3), sorted(m for m in ('torch', 'transformers', 'datasets') "
            "if m in sys.modules))")
    seconds, loaded = run(python("-c", code), paths.root).strip().splitlines()[-1].split(" ", 1)
    assert float(seconds) < 1 and loaded == "[]"  # no model, not even torch
    assert [p.name for p in paths.teacher.iterdir()] == [TEACHER_FILE]
    off = json.loads((paths.teacher / TEACHER_FILE).read_text())
    assert off["distillation"] is False and off["teacher"] is None
    first = (paths.teacher / TEACHER_FILE).read_bytes()
    run(python("-m", "stages.teacher"), paths.root)
    assert (paths.teacher / TEACHER_FILE).read_bytes() == first  # constant: train's dependency does not change


# --- the refusals -----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("task,message", [
    (own_task(("sentence1", "sentence2"), ("a", "b", "c")),
     r"the teacher 'models/own/teacher' \(distill.teacher\) has 3 labels \['a', 'b', 'c'\], but task 'mrpc' has 2 "
     r"\['not_equivalent', 'equivalent'\]"),
    (own_task(("sentence1", "sentence2"), None),
     r"the teacher 'models/own/teacher' \(distill.teacher\) is a regression model, but task 'mrpc' is "
     "classification"),
], ids=["labels", "regression"])
def test_the_teacher_stage_refuses_a_teacher_of_other_labels(project, mpnet_encoder, tmp_path_factory, task, message):
    other = save_teacher_model(mpnet_encoder, task, tmp_path_factory.mktemp("other-teacher"))
    params, paths = project(teacher=other)
    with pytest.raises(TeacherError, match=f"models/own/teacher/config.json: {message}"):
        teacher_logits(params, paths)
    assert not paths.teacher.exists()


@pytest.fixture
def distilled(project):
    """A project whose teacher stage has run (both orders: train.swap_pairs)."""
    params, paths = project(train={"swap_pairs": True})
    run_teacher(params, paths)
    return params, paths


def edit_teacher_json(paths, **changes):
    file = paths.teacher / TEACHER_FILE
    file.write_text(json.dumps({**json.loads(file.read_text()), **changes}))


def load(params, paths):
    from datasets import load_from_disk

    return load_teacher(params.distill, paths.teacher, MRPC, load_from_disk(str(paths.tokenized))["train"])


def test_the_train_stage_refuses_a_teacher_of_other_labels_or_task_type(distilled):
    params, paths = distilled
    assert load(params, paths).logits.shape == (40, 2)
    edit_teacher_json(paths, id2label={"0": "not_equivalent", "1": "equivalent", "2": "maybe"}, num_labels=3)
    with pytest.raises(TeacherError, match=r"data/teacher/teacher.json: the teacher 'models/own/teacher' "
                                           r"\(distill.teacher\) has 3 labels"):
        train(params, paths)
    edit_teacher_json(paths, id2label={"0": "equivalent", "1": "not_equivalent"}, num_labels=2)  # another order
    with pytest.raises(TeacherError, match="in the same id order"):
        load(params, paths)
    edit_teacher_json(paths, task_type="regression", id2label={"0": "score"}, num_labels=1)
    with pytest.raises(TeacherError, match=r"data/teacher/teacher.json: .* is a regression model, but task 'mrpc' is "
                                           "classification"):
        load(params, paths)
    assert not paths.trained.exists()


def test_the_train_stage_refuses_logits_of_another_row_count(distilled, project, tiny_raw):
    from datasets import DatasetDict

    params, paths = distilled
    fewer = DatasetDict({**tiny_raw, "train": tiny_raw["train"].select(range(30))})
    other_params, other = project(raw=fewer, name="fewer", train={"swap_pairs": True})
    shutil.copytree(paths.teacher, other.teacher)  # the teacher's logits of 40 rows, for a train split of 30
    with pytest.raises(TeacherError, match=r"data/teacher/teacher.json: 40 rows of teacher logits \(logits.npy: 40\), "
                                           r"but the train split of data/tokenized has 30: .*distill.teacher: "
                                           r"'models/own/teacher'\); rerun `dvc repro teacher`"):
        train(other_params, other)


def test_stale_or_missing_teacher_outputs_are_refused(distilled):
    params, paths = distilled
    (paths.teacher / SWAPPED_LOGITS_FILE).unlink()
    with pytest.raises(TeacherError, match="no logits of the swapped pairs, but data/tokenized holds both orders"):
        load(params, paths)
    edit_teacher_json(paths, teacher="models/own/another")
    with pytest.raises(TeacherError, match="holds the logits of teacher 'models/own/another'"):
        load(params, paths)
    (paths.teacher / TEACHER_FILE).write_text(json.dumps({"distillation": False, "teacher": None}))
    with pytest.raises(TeacherError, match="says distillation is off"):
        load(params, paths)
    shutil.rmtree(paths.teacher)
    with pytest.raises(TeacherError, match=r"data/teacher/teacher.json: not found \(distill.teacher: "
                                           r"'models/own/teacher'\); rerun `dvc repro teacher`"):
        load(params, paths)


def test_raw_and_tokenized_rows_must_align(tiny_raw, tiny_tokenized):
    from datasets import load_from_disk

    from finetune.paths import Paths

    tokenized, raw = load_from_disk(str(tiny_tokenized))["train"], tiny_raw["train"]
    check_aligned(raw, tokenized, Paths())
    with pytest.raises(DataError, match="data/raw: 39 train rows, but data/tokenized has 40"):
        check_aligned(raw.select(range(39)), tokenized, Paths())
    reordered = raw.select([1, 0, *range(2, 40)])
    if reordered["label"][:2] == raw["label"][:2]:
        reordered = raw.select([*range(39, -1, -1)])
    with pytest.raises(DataError, match="has another label than row .* not in the same order"):
        check_aligned(reordered, tokenized, Paths())


@pytest.mark.parametrize("distill,message", [
    ({"teacher": "models/own/nowhere"}, "distill.teacher: folder 'models/own/nowhere' not found"),
    ({"teacher": "models/pretrained"}, "distill.teacher: 'models/pretrained' is not a folder under models/own/"),
    ({"teacher": "models/own"}, "distill.teacher: 'models/own' is not a folder under models/own/"),
    ({"alpha": 1.5}, "distill.alpha: Input should be less than or equal to 1"),
    ({"alpha": -0.1}, "distill.alpha: Input should be greater than or equal to 0"),
    ({"temperature": 0}, "distill.temperature: Input should be greater than 0"),
])
def test_bad_distill_params_are_named(distill, message, monkeypatch):
    monkeypatch.chdir(REPO)
    with pytest.raises(ParamsError, match=f"tiny params: {message}"):
        tiny_params(distill=distill)


# --- training with the teacher ----------------------------------------------------------------------------------------

def outcome(paths, metrics: dict) -> tuple[dict, dict, dict]:
    """Final weights, train metrics without timings, and the DVCLive logs (step and value columns)."""
    weights = load_file(paths.trained / "model.safetensors")
    logs = {}
    for tsv in sorted(paths.train_logs.rglob("*.tsv")):
        logs[str(tsv.relative_to(paths.root))] = pd.read_csv(tsv, sep="\t").round(6).to_dict("list")
    return weights, {k: v for k, v in metrics.items() if k not in TIMING_KEYS}, logs


def test_training_with_a_teacher_logs_hard_and_soft_loss(distilled):
    params, paths = distilled
    metrics = train(params, paths)
    distill = metrics["distillation"]
    assert metrics["steps"] == 10 and distill == {
        "teacher": TEACHER, "teacher_model_type": "mpnet", "alpha": 0.5, "temperature": 2.0,
        "final_hard_loss": distill["final_hard_loss"], "final_soft_loss": distill["final_soft_loss"]}
    assert distill["final_hard_loss"] > 0 and distill["final_soft_loss"] > 0
    steps = paths.train_logs / "steps" / "plots" / "metrics" / "train"
    for name in ("loss", "hard_loss", "soft_loss", "lr"):
        table = pd.read_csv(steps / f"{name}.tsv", sep="\t")
        assert table["step"].tolist() == [2, 4, 6, 8, 10], name  # log_every 2
    for name in ("hard_loss", "soft_loss"):
        assert len(pd.read_csv(paths.train_logs / "epochs" / "plots" / "metrics" / "train" / f"{name}.tsv",
                               sep="\t")) == 2
    # every step's loss is the mix of its two parts: (1 - alpha) * hard + alpha * soft
    state = json.loads((paths.checkpoints / "step-10" / "trainer_state.json").read_text())
    hard, soft = state["loss_parts"]["train/hard_loss"], state["loss_parts"]["train/soft_loss"]
    assert len(hard) == len(soft) == len(state["losses"]) == 10
    for loss, h, s in zip(state["losses"], hard, soft):
        assert loss == pytest.approx(0.5 * h + 0.5 * s, rel=1e-5)


def test_an_interrupted_distilled_run_resumes_to_the_uninterrupted_result(project, monkeypatch):
    settings = {"train": {"swap_pairs": True, "epochs": 3}, "distill": {"alpha": 0.7, "temperature": 3.0}}
    params, paths = project(name="whole", **settings)
    run_teacher(params, paths)
    expected = outcome(paths, train(params, paths))
    reset_accelerate()

    params, paths = project(name="interrupted", **settings)
    run_teacher(params, paths)
    train_epoch = training.train_epoch

    def interrupt_in_epoch_2(run, state, *args):
        if state.epoch == 1:
            raise KeyboardInterrupt
        return train_epoch(run, state, *args)

    monkeypatch.setattr(training, "train_epoch", interrupt_in_epoch_2)
    with pytest.raises(KeyboardInterrupt):
        train(params, paths)
    assert not paths.trained.exists() and (paths.checkpoints / "step-5").is_dir()
    monkeypatch.setattr(training, "train_epoch", train_epoch)
    reset_accelerate()
    metrics = train(params, paths)
    assert metrics["resumed_from_step"] == 5
    weights, metrics, logs = outcome(paths, metrics)
    assert weights.keys() == expected[0].keys() and all(weights[k].equal(expected[0][k]) for k in weights)
    assert metrics == expected[1]
    assert logs == expected[2] and "dvclive/train/steps/plots/metrics/train/soft_loss.tsv" in logs


def changed(params, section: str, **values):
    """``params`` with ``values`` in ``section``."""
    return params.model_copy(update={section: getattr(params, section).model_copy(update=values)})


def test_another_teacher_or_alpha_starts_afresh(distilled):
    params, paths = distilled
    params = changed(params, "train", epochs=1)
    assert train(params, paths)["resumed_from_step"] == 0
    reset_accelerate()
    assert train(params, paths)["resumed_from_step"] == 5  # the same run: continued after its last epoch
    reset_accelerate()
    alpha = changed(params, "distill", alpha=0.9)
    assert train(alpha, paths)["resumed_from_step"] == 0
    reset_accelerate()
    logits = np.load(paths.teacher / LOGITS_FILE)  # the logits of another teacher, same folder name
    np.save(paths.teacher / LOGITS_FILE, logits[:, ::-1].copy())
    assert train(alpha, paths)["resumed_from_step"] == 0


def test_alpha_0_trains_exactly_like_no_teacher(distilled, tiny_raw, tiny_checkpoint, tmp_path):
    # The distillation path takes nothing from the random stream and its hard loss is the model's own: with alpha 0 the
    # weights are those of a run without a teacher, bit for bit.
    params, paths = distilled
    alpha0 = changed(params, "distill", alpha=0.0)
    with_teacher = outcome(paths, train(alpha0, paths))
    reset_accelerate()
    off = changed(params, "distill", teacher=None)
    off_paths = make_project(tmp_path / "off", off, tiny_raw, tiny_checkpoint)
    without = outcome(off_paths, train(off, off_paths))
    assert all(with_teacher[0][k].equal(without[0][k]) for k in without[0])
    assert {k: v for k, v in with_teacher[1].items() if k != "distillation"} == without[1]
    assert "distillation" not in without[1]
    hard = "dvclive/train/steps/plots/metrics/train/hard_loss.tsv"
    assert hard in with_teacher[2] and hard not in without[2]
    assert with_teacher[2][hard]["hard_loss"] == with_teacher[2]["dvclive/train/steps/plots/metrics/train/loss.tsv"][
        "loss"]


def test_without_a_teacher_the_teacher_output_is_not_read(tiny_project, tmp_path):
    # distill.teacher null: train never opens data/teacher (its teacher.json says off, or it is not there at all) and
    # logs no hard or soft loss.
    params = tiny_params()
    paths = tiny_project(params=params)
    paths.teacher.mkdir(parents=True)
    (paths.teacher / TEACHER_FILE).write_text("not even JSON")
    metrics = train(params, paths)
    assert "distillation" not in metrics
    assert not list(paths.train_logs.rglob("*hard_loss*")) and not list(paths.train_logs.rglob("*soft_loss*"))


def test_two_processes_distil_with_both_orders(project):
    config = REPO / "configs" / "accelerate" / "cpu_2proc.yaml"
    params, paths = project(train={"swap_pairs": True, "batch_size": 4, "warmup_steps": 0,
                                   "accelerate_config": str(config), "num_threads": 1})
    run(python("-m", "stages.teacher"), paths.root, timeout=300)
    output = launch("stages.train", config, paths.root)
    assert "on 2 process(es)" in output and "Distilling from models/own/teacher (mpnet)" in output
    metrics = json.loads((paths.root / "metrics" / "train.json").read_text())
    assert (metrics["steps"], metrics["epochs"]) == (10, 2) and metrics["train_samples"] == 80
    distilled = metrics["distillation"]
    assert distilled["final_soft_loss"] > 0 and not math.isnan(distilled["final_hard_loss"])
    soft = pd.read_csv(paths.train_logs / "steps" / "plots" / "metrics" / "train" / "soft_loss.tsv", sep="\t")
    assert soft["step"].tolist() == [2, 4, 6, 8, 10]


# --- dvc.yaml -----------------------------------------------------------------------------------------------------

def test_the_teacher_stage_sits_between_collate_check_and_train():
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    assert list(stages).index("collate-check") < list(stages).index("teacher") < list(stages).index("train")
    teacher = stages["teacher"]
    assert {"data/raw", "data/tokenized", "models/own"} <= set(teacher["deps"]) and teacher["outs"] == ["data/teacher"]
    assert "distill.teacher" in teacher["params"]
    assert "data/teacher" in stages["train"]["deps"] and "distill" in stages["train"]["params"]
