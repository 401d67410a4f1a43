"""Knowledge distillation: the loss against hand computations, the teacher stage on a tiny MPNet teacher with its own
tokenizer for a BERT student (rows aligned, both orders of the pairs), the refusals, training with the teacher's
logits (logged, resumed, on 2 processes), training without a teacher exactly as before, and logits carried in git
(distill.logits) checked and taught exactly as the teacher that made them."""

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
from finetune.params import TransferParams
from finetune.tasks import Task, glue_task, own_task
from finetune.teacher import (LOGITS_FILE, SWAPPED_LOGITS_FILE, TEACHER_FILE, check_aligned, rows_sha256,
                              save_teacher, teacher_logits)
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

def save_teacher_model(encoder, task: Task, folder, seed: int = 1):
    """A "fine-tuned" teacher of ``task``: ``encoder`` (a checkpoint folder) with a new head seeded with ``seed``,
    saved with its tokenizer and task.json as the train stage saves a model."""
    from transformers import AutoTokenizer

    torch.manual_seed(seed)
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
    teacher = teacher_logits(params, paths)
    save_teacher(paths.teacher, teacher)
    reset_accelerate()
    return teacher.identity


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
    sorted_logits = teacher_logits(params, paths).logits
    np.testing.assert_allclose(sorted_logits, logits, atol=1e-5)
    train = tiny_raw["train"]
    rows = [0, 7, 39]
    expected = direct_logits(teacher_model, [(train[i]["sentence1"], train[i]["sentence2"]) for i in rows])
    np.testing.assert_allclose(logits[rows], expected, atol=1e-4)
    saved = json.loads((paths.teacher / TEACHER_FILE).read_text())
    assert saved == identity
    assert saved["distillation"] is True and saved["teacher"] == TEACHER and saved["model_type"] == "mpnet"
    assert saved["task_type"] == "classification" and saved["id2label"] == {"0": "not_equivalent", "1": "equivalent"}
    assert saved["rows"] == 40 and saved["swapped"] is False  # rows once
    assert saved["data"] == {"fingerprint": saved["data"]["fingerprint"], "sha256": rows_sha256(tiny_raw["train"], MRPC)}
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
    ({"fold_teachers": ["models/own/a", "models/own/b"]}, "distill.fold_teachers: folder 'models/own/a' not found"),
    ({"fold_teachers": ["models/pretrained", "models/own/b"]},
     "distill.fold_teachers: 'models/pretrained' is not a folder under models/own/"),
    ({"fold_teachers": ["models/own/a"]}, "distill.fold_teachers: List should have at least 2 items"),
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
        logs[str(tsv.relative_to(paths.root))] = pd.read_csv(tsv, sep="\t").round(6).fillna("NaN").to_dict("list")
    return weights, {k: v for k, v in metrics.items() if k not in TIMING_KEYS}, logs


def test_training_with_a_teacher_logs_hard_and_soft_loss(distilled):
    params, paths = distilled
    metrics = train(params, paths)
    distill = metrics["distillation"]
    assert metrics["steps"] == 10 and distill == {
        "teacher": TEACHER, "teacher_model_type": "mpnet", "alpha": 0.5, "temperature": 2.0,
        "final_hard_loss": distill["final_hard_loss"], "final_soft_loss": distill["final_soft_loss"], "transfer": None,
        "fold_teachers": None, "logits": None}
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


def interrupt_in_epoch_2(params, paths, monkeypatch) -> None:
    """``train(params, paths)`` interrupted (KeyboardInterrupt) as its second epoch starts, after the first epoch's
    checkpoint; ``finetune.training.train_epoch`` is itself again afterwards."""
    train_epoch = training.train_epoch

    def interrupted(run, state, *args):
        if state.epoch == 1:
            raise KeyboardInterrupt
        return train_epoch(run, state, *args)

    with monkeypatch.context() as patch:
        patch.setattr(training, "train_epoch", interrupted)
        with pytest.raises(KeyboardInterrupt):
            train(params, paths)


def test_an_interrupted_distilled_run_resumes_to_the_uninterrupted_result(project, monkeypatch):
    settings = {"train": {"swap_pairs": True, "epochs": 3}, "distill": {"alpha": 0.7, "temperature": 3.0}}
    params, paths = project(name="whole", **settings)
    run_teacher(params, paths)
    expected = outcome(paths, train(params, paths))
    reset_accelerate()

    params, paths = project(name="interrupted", **settings)
    run_teacher(params, paths)
    interrupt_in_epoch_2(params, paths, monkeypatch)
    assert not paths.trained.exists() and (paths.checkpoints / "step-5").is_dir()
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


# --- the transfer set (distill.transfer) ------------------------------------------------------------------------------

TRANSFER = yaml.safe_load((REPO / "params.yaml").read_text())["distill"]["transfer"]  # params.yaml's
NEIGHBOURS = {"transfer": {**TRANSFER, "kind": "neighbours", "k": 3, "max_pairs": 48}}  # 48 pairs beside 40 train rows


def mrpc_rows(start: int, stop: int, **replace) -> "Dataset":
    """Rows ``start:stop`` of MRPC's train split (the local copy of params.yaml data.local_copy), with
    ``replace``: {column: {row: text}}."""
    from datasets import Dataset

    local_copy = yaml.safe_load((REPO / "params.yaml").read_text())["data"]["local_copy"]
    df = pd.read_parquet(REPO / local_copy / "mrpc" / "train-00000-of-00001.parquet").iloc[start:stop]
    df = df.reset_index(drop=True)
    for column, rows in replace.items():
        for row, text in rows.items():
            df.loc[row, column] = text
    return Dataset.from_pandas(df, preserve_index=False)


def test_neighbour_pairs_are_of_train_texts_never_a_train_pair_a_repeat_or_a_held_out_text():
    from datasets import DatasetDict

    from finetune.transfer import make_transfer_set

    train = mrpc_rows(0, 300)
    shared = train[5]["sentence1"]  # a train sentence that validation holds too (MRPC reuses 284 such sentences)
    raw = DatasetDict({"train": train, "validation": mrpc_rows(300, 340, sentence2={3: shared}),
                       "test": mrpc_rows(340, 380)})
    p = TransferParams(**{**NEIGHBOURS["transfer"], "max_pairs": None, "min_similarity": 0.2, "max_similarity": 0.6})
    pairs, described = make_transfer_set(p, raw, MRPC)
    assert described["rows"] == described["made"] == len(pairs) > 100
    train_texts = set(train["sentence1"]) | set(train["sentence2"])
    held_out = {t for split in ("validation", "test") for c in ("sentence1", "sentence2") for t in raw[split][c]}
    texts = set(pairs["sentence1"]) | set(pairs["sentence2"])
    assert texts <= train_texts and not texts & held_out and shared not in texts
    train_pairs = set(zip(train["sentence1"], train["sentence2"]))
    for a, b in zip(pairs["sentence1"], pairs["sentence2"]):
        assert a != b and (a, b) not in train_pairs and (b, a) not in train_pairs
    assert len({frozenset(pair) for pair in zip(pairs["sentence1"], pairs["sentence2"])}) == len(pairs)  # MRPC is
    assert pairs["similarity"].between(0.2, 0.6, inclusive="left").all()  # symmetric: either order once
    assert pairs.groupby("sentence1").size().max() <= 3  # k neighbours a query
    sampled, described = make_transfer_set(p.model_copy(update={"max_pairs": 50}), raw, MRPC)
    again, _ = make_transfer_set(p.model_copy(update={"max_pairs": 50}), raw, MRPC)
    assert len(sampled) == described["rows"] == 50 and described["made"] == len(pairs)
    pd.testing.assert_frame_equal(sampled, again)  # seeded
    assert sampled.merge(pairs).shape[0] == 50  # a sample of the pairs, in their order


def test_equally_similar_neighbours_come_in_first_seen_order(monkeypatch):
    from datasets import Dataset
    from sklearn.neighbors import NearestNeighbors

    from finetune.transfer import neighbour_pairs

    # the two Dow sentences differ only in what TF-IDF drops ("<" and ">"): equally similar to every query
    dow = ["The Dow Jones index <.DJI> fell 98 points on Friday.", "The Dow Jones index .DJI fell 98 points on Friday."]
    others = ["Dow Jones traders said the index fell sharply.", "Shares of Intel rose after the earnings report.",
              "The company said profits rose in the third quarter.", "Police arrested two men late on Friday."]
    kneighbors = NearestNeighbors.kneighbors

    def last_seen_first(self, *args, **kwargs):  # as another machine may order ties
        distances, indices = kneighbors(self, *args, **kwargs)
        order = np.lexsort((-indices, np.round(distances, 9)), axis=1)
        return np.take_along_axis(distances, order, 1), np.take_along_axis(indices, order, 1)

    monkeypatch.setattr(NearestNeighbors, "kneighbors", last_seen_first)
    for first in (dow, dow[::-1]):
        train = Dataset.from_dict({"sentence1": others[:3], "sentence2": [others[3], *first]})  # others[0] queried first
        pairs = neighbour_pairs(train, ("sentence1", "sentence2"), True, k=1, min_similarity=0.0,
                                max_similarity=0.99)
        chosen = pairs[pairs["sentence1"] == others[0]]["sentence2"].tolist()
        assert chosen == [first[0]]  # of the tie, the text seen first


def test_file_pairs_drop_empty_repeated_train_and_held_out_rows(tmp_path, monkeypatch, tiny_raw):
    from finetune.transfer import make_transfer_set

    monkeypatch.chdir(tmp_path)
    train, test = tiny_raw["train"][0], tiny_raw["test"][0]
    rows = [("A new sentence.", "Another one."), ("A new sentence.", "Another one."), ("", "Empty."),
            (train["sentence1"], train["sentence2"]), (test["sentence1"], "Fine otherwise."), ("Last.", "Pair.")]
    (tmp_path / "data/own").mkdir(parents=True)
    pd.DataFrame(rows, columns=["sentence1", "sentence2"]).assign(note="x").to_csv("data/own/pairs.csv", index=False)
    p = TransferParams(**{**TRANSFER, "kind": "files", "files": ["data/own/pairs.csv"]})
    pairs, described = make_transfer_set(p, tiny_raw, MRPC)
    assert pairs[["sentence1", "sentence2"]].values.tolist() == [["A new sentence.", "Another one."],
                                                                ["Last.", "Pair."]]
    assert set(pairs["source"]) == {"data/own/pairs.csv"} and described["rows"] == 2
    pd.DataFrame({"question": ["q"], "answer": ["a"]}).to_csv("data/own/other.csv", index=False)
    with pytest.raises(DataError, match=r"data/own/other.csv: no column 'sentence1' \(distill.transfer.files"):
        make_transfer_set(p.model_copy(update={"files": ["data/own/other.csv"]}), tiny_raw, MRPC)


@pytest.mark.parametrize("transfer,message", [
    ({"kind": "files"}, "distill.transfer: files: set it"),
    ({"files": ["data/own/x.csv"]}, "distill.transfer: files: set it"),
    ({"kind": "files", "files": ["elsewhere/x.csv"]}, "distill.transfer: files: 'elsewhere/x.csv' is not under data/own/"),
    ({"min_similarity": 0.5, "max_similarity": 0.5}, "distill.transfer: min_similarity \\(0.5\\) must be below"),
    ({"k": 0}, "distill.transfer.k: Input should be greater than or equal to 1"),
    ({"weight": -1}, "distill.transfer.weight: Input should be greater than or equal to 0"),
])
def test_bad_transfer_params_are_named(transfer, message, monkeypatch):
    monkeypatch.chdir(REPO)
    with pytest.raises(ParamsError, match=f"tiny params: {message}"):
        tiny_params(distill={"transfer": {**TRANSFER, **transfer}})


def test_a_transfer_set_needs_a_teacher_and_a_pair_task(monkeypatch):
    monkeypatch.chdir(REPO)
    with pytest.raises(ParamsError, match="tiny params: distill: transfer.kind is 'neighbours' but teacher is null"):
        tiny_params(distill={"transfer": {**TRANSFER, "kind": "neighbours"}})
    from finetune.transfer import make_transfer_set

    p = TransferParams(**{**TRANSFER, "kind": "neighbours"})
    with pytest.raises(ParamsError, match="neighbours makes pairs, but task 'sst2' has one text column"):
        make_transfer_set(p, {"train": None}, glue_task("sst2"))


def test_transfer_rows_follow_the_train_rows_flagged_and_batched_with_their_logits(tokenizer, tiny_tokenized):
    from datasets import load_from_disk

    from finetune.distill import TRANSFER, with_teacher_logits, with_transfer_rows
    from finetune.teacher import Teacher, TransferSet

    train = load_from_disk(str(tiny_tokenized))["train"]  # both orders of each pair
    train = with_teacher_logits(train, Teacher({}, np.zeros((40, 2), np.float32), np.ones((40, 2), np.float32)))
    pairs = pd.DataFrame({"sentence1": ["The court met.", "Police said so.", "It rained."],
                          "sentence2": ["The judges met.", "Officers said it.", "Shares fell."]})
    logits = np.arange(6, dtype=np.float32).reshape(3, 2)
    transfer = TransferSet(pairs, logits, logits + 10)
    rows = with_transfer_rows(train, transfer, tokenizer, None, MRPC)
    assert len(rows) == 43 and rows[TRANSFER] == [0] * 40 + [1] * 3 and rows["labels"][40:] == [-100] * 3
    assert rows["labels"][:40] == train["labels"]
    assert rows[41]["input_ids"] == tokenizer("Police said so.", "Officers said it.")["input_ids"]
    batch = make_collator(tokenizer)([rows[i] for i in (0, 41, 42)])
    assert batch[TRANSFER].tolist() == [0, 1, 1] and batch[TEACHER_LOGITS].tolist() == [[0, 0], [2, 3], [4, 5]]
    swapped = make_collator(tokenizer, swap=1.0)([rows[i] for i in (0, 41)])
    assert swapped[TEACHER_LOGITS].tolist() == [[1, 1], [12, 13]]
    assert swapped["input_ids"][1].tolist()[:len(rows[41]["input_ids"])] == tokenizer(
        "Officers said it.", "Police said so.")["input_ids"]


def transfer_params(params, **changes):
    return changed(params, "distill", transfer=params.distill.transfer.model_copy(update=changes))


@pytest.fixture
def with_transfer(project):
    """A project whose teacher stage has scored 48 neighbour pairs too (both orders: train.swap_pairs)."""
    params, paths = project(name="transfer", train={"swap_pairs": True}, distill=NEIGHBOURS)
    run_teacher(params, paths)
    return params, paths


def test_the_teacher_stage_scores_the_transfer_set_in_both_orders(with_transfer, teacher_model):
    from finetune.split_zip import sha256_file
    from finetune.transfer import SWAPPED_TRANSFER_LOGITS_FILE, TRANSFER_FILE, TRANSFER_LOGITS_FILE

    params, paths = with_transfer
    assert sorted(p.name for p in paths.teacher.iterdir()) == sorted(
        [LOGITS_FILE, SWAPPED_LOGITS_FILE, TEACHER_FILE, TRANSFER_FILE, TRANSFER_LOGITS_FILE,
         SWAPPED_TRANSFER_LOGITS_FILE])
    pairs = pd.read_parquet(paths.teacher / TRANSFER_FILE)
    logits, swapped = (np.load(paths.teacher / name) for name in (TRANSFER_LOGITS_FILE, SWAPPED_TRANSFER_LOGITS_FILE))
    assert len(pairs) == 48 and logits.shape == swapped.shape == (48, 2) and logits.dtype == np.float32
    rows = [0, 30, 47]
    texts = [(pairs["sentence1"][i], pairs["sentence2"][i]) for i in rows]
    np.testing.assert_allclose(logits[rows], direct_logits(teacher_model, texts), atol=1e-4)
    np.testing.assert_allclose(swapped[rows], direct_logits(teacher_model, [(b, a) for a, b in texts]), atol=1e-4)
    recorded = json.loads((paths.teacher / TEACHER_FILE).read_text())["transfer"]
    assert recorded["params"] == params.distill.transfer.model_dump() and recorded["rows"] == 48
    assert recorded["made"] > 48 and "TF-IDF" in recorded["how"]
    assert recorded["sha256"] == sha256_file(paths.teacher / TRANSFER_FILE)


def test_transfer_rows_carry_no_hard_label_loss():
    from finetune.distill import transfer_distillation_loss

    student, labels, teacher = batch(seed=7, rows=6)
    transfer = torch.tensor([0, 1, 0, 1, 1, 0])
    loss, hard, soft = transfer_distillation_loss(student, labels, teacher, transfer, 0.3, 2.0, 0.5, False)
    other = torch.where(transfer.bool(), (labels + 1) % 3, labels)  # another label on the transfer rows only
    assert transfer_distillation_loss(student, other, teacher, transfer, 0.3, 2.0, 0.5, False)[0].item() == \
        pytest.approx(loss.item(), abs=0)
    rows = [distillation_loss(student[[i]], labels[[i]], teacher[[i]], 0.3, 2.0, False) for i in range(6)]
    by_hand = [0.5 * r[2] if transfer[i] else r[0] for i, r in enumerate(rows)]
    assert loss.item() == pytest.approx(sum(v.item() for v in by_hand) / 6, rel=1e-6)
    assert hard.item() == pytest.approx(np.mean([rows[i][1].item() for i in (0, 2, 5)]), rel=1e-6)
    assert soft.item() == pytest.approx(np.mean([r[2].item() for r in rows]), rel=1e-6)
    all_transfer = transfer_distillation_loss(student, labels, teacher, torch.ones(6), 0.3, 2.0, 1.0, False)
    assert math.isnan(all_transfer[1].item()) and all_transfer[0].item() == pytest.approx(soft.item(), rel=1e-6)
    none = transfer_distillation_loss(student, labels, teacher, torch.zeros(6), 0.3, 2.0, 1.0, False)
    plain = distillation_loss(student, labels, teacher, 0.3, 2.0, False)
    assert [v.item() for v in none] == pytest.approx([v.item() for v in plain], rel=1e-6)
    scores, targets = torch.tensor([[1.0], [2.0]]), torch.tensor([0.0, float("nan")])  # regression: NaN, no label
    loss, hard, soft = transfer_distillation_loss(scores, targets, torch.tensor([[1.5], [4.0]]), torch.tensor([0, 1]),
                                                  0.5, 2.0, 1.0, True)
    assert (hard.item(), soft.item(), loss.item()) == pytest.approx((1.0, (0.25 + 4) / 2, (0.5 + 0.125 + 4) / 2))


def test_training_with_a_transfer_set_sees_every_pair_each_epoch_and_resumes(with_transfer, monkeypatch):
    params, paths = with_transfer
    params = changed(params, "train", epochs=2)
    metrics = train(params, paths)
    assert metrics["train_samples"] == 2 * (40 + 48) and metrics["steps"] == 2 * 11  # batch 8
    assert metrics["distillation"]["transfer"] == {"rows": 48, "kind": "neighbours", "weight": 1.0}
    assert not math.isnan(metrics["distillation"]["final_hard_loss"]) and metrics["distillation"]["final_soft_loss"] > 0
    expected = outcome(paths, metrics)
    reset_accelerate()
    shutil.rmtree(paths.checkpoints)
    interrupt_in_epoch_2(params, paths, monkeypatch)
    reset_accelerate()
    resumed = train(params, paths)
    assert resumed["resumed_from_step"] == 11
    weights, resumed, logs = outcome(paths, resumed)
    assert all(weights[k].equal(expected[0][k]) for k in weights) and resumed == expected[1] and logs == expected[2]


def test_transfer_outputs_that_do_not_match_are_refused_naming_the_file(with_transfer):
    from finetune.transfer import TRANSFER_FILE, TRANSFER_LOGITS_FILE

    params, paths = with_transfer
    assert len(load(params, paths).transfer.pairs) == 48
    with pytest.raises(TeacherError, match=r"teacher.json: holds the transfer set of .*'k': 3.*, not of "
                                           r"distill.transfer .*'k': 4.*rerun `dvc repro teacher`"):
        load(transfer_params(params, k=4), paths)
    with pytest.raises(TeacherError, match="teacher.json: holds a transfer set \\(neighbours\\), but "
                                           "distill.transfer.kind is null"):
        load(transfer_params(params, kind=None), paths)
    logits = np.load(paths.teacher / TRANSFER_LOGITS_FILE)
    np.save(paths.teacher / TRANSFER_LOGITS_FILE, logits[:40])
    with pytest.raises(TeacherError, match=r"transfer_logits.npy: shape \[40, 2\], but .*transfer.parquet has 48 "
                                           "pairs"):
        load(params, paths)
    np.save(paths.teacher / TRANSFER_LOGITS_FILE, logits)
    pairs = pd.read_parquet(paths.teacher / TRANSFER_FILE)
    pairs.iloc[::-1].to_parquet(paths.teacher / TRANSFER_FILE, index=False)  # other rows for the same logits
    with pytest.raises(TeacherError, match="transfer.parquet: not the transfer set teacher.json records"):
        train(params, paths)


# --- cross-fitted teachers: train.holdout_fold and distill.fold_teachers -------------------------------------------

def test_folds_cut_every_row_once_and_a_holdout_run_keeps_the_others():
    from finetune.folds import kept_rows, row_folds
    from finetune.params import HoldoutFold

    fold_of = row_folds(40, 3, seed=5)
    assert sorted(np.bincount(fold_of).tolist()) == [13, 13, 14]
    assert fold_of.tolist() == row_folds(40, 3, seed=5).tolist() != row_folds(40, 3, seed=6).tolist()
    assert kept_rows(40, HoldoutFold(folds=3, fold=1, seed=5)).tolist() == np.flatnonzero(fold_of != 1).tolist()
    with pytest.raises(DataError, match="2 train rows cannot make 3 folds"):
        row_folds(2, 3, seed=0)


@pytest.mark.parametrize("holdout,message", [
    ({"folds": 3, "fold": 3, "seed": 0}, "train.holdout_fold: fold 3 is not one of the 3 folds"),
    ({"folds": 1, "fold": 0, "seed": 0}, "train.holdout_fold.folds: Input should be greater than or equal to 2"),
    ({"folds": 2, "fold": 0}, "train.holdout_fold.seed: Field required"),
])
def test_bad_holdout_folds_are_named(holdout, message):
    with pytest.raises(ParamsError, match=f"tiny params: {message}"):
        tiny_params(train={"holdout_fold": holdout})


def test_a_holdout_run_trains_without_its_fold_and_says_so_in_its_config(tiny_project):
    params = tiny_params(train={"holdout_fold": {"folds": 4, "fold": 2, "seed": 3}})
    paths = tiny_project(params=params)
    assert train(params, paths)["train_samples"] == 2 * 30  # 2 epochs of the 30 train rows outside fold 2
    config = json.loads((paths.trained / "config.json").read_text())
    assert config["holdout_fold"] == {"folds": 4, "fold": 2, "seed": 3, "rows": 40}


def save_fold_teacher(encoder, root, fold: int, seed: int = 3) -> str:
    """``models/own/fold-<fold>`` under ``root``: a teacher with its own head, whose config.json says its run left
    out ``fold`` of 2 folds (cut with ``seed``) of 40 train rows, as a run with train.holdout_fold saves it."""
    folder = root / f"models/own/fold-{fold}"
    save_teacher_model(encoder, MRPC, folder, seed=10 + fold)
    config = json.loads((folder / "config.json").read_text())
    config["holdout_fold"] = {"folds": 2, "fold": fold, "seed": seed, "rows": 40}
    (folder / "config.json").write_text(json.dumps(config))
    return f"models/own/fold-{fold}"


@pytest.fixture
def cross_fitted(project, mpnet_encoder):
    """A project with the teacher and two fold teachers, and params naming them (one order of the pairs)."""
    params, paths = project(name="cross-fit", train={"swap_pairs": False})
    names = [save_fold_teacher(mpnet_encoder, paths.root, fold) for fold in (0, 1)]
    return changed(params, "distill", fold_teachers=names), paths


def test_each_train_row_is_labelled_by_the_fold_teacher_that_never_saw_it(cross_fitted, tiny_raw):
    from finetune.folds import row_folds

    params, paths = cross_fitted
    identity = run_teacher(params, paths)
    logits, fold_of = np.load(paths.teacher / LOGITS_FILE), row_folds(40, 2, seed=3)
    for fold in (0, 1):
        rows = np.flatnonzero(fold_of == fold)[:3]
        texts = [(tiny_raw["train"][int(i)]["sentence1"], tiny_raw["train"][int(i)]["sentence2"]) for i in rows]
        mine, other = (direct_logits(paths.root / f"models/own/fold-{k}", texts) for k in (fold, 1 - fold))
        np.testing.assert_allclose(logits[rows], mine, atol=1e-4)
        assert not np.allclose(logits[rows], other, atol=1e-3)  # the heads differ: the other teacher would not do
    assert [t["teacher"] for t in identity["fold_teachers"]] == params.distill.fold_teachers
    assert identity["fold_teachers"][1]["holdout_fold"] == {"folds": 2, "fold": 1, "seed": 3, "rows": 40}
    metrics = train(params, paths)
    assert metrics["distillation"]["fold_teachers"] == params.distill.fold_teachers


def test_fold_teachers_of_another_fold_or_seed_or_stale_logits_are_refused(cross_fitted, mpnet_encoder):
    params, paths = cross_fitted
    run_teacher(changed(params, "distill", fold_teachers=None), paths)  # the single teacher's logits
    with pytest.raises(TeacherError, match=r"teacher.json: holds the logits of the fold teachers None, not of "
                                           r"distill.fold_teachers \['models/own/fold-0', 'models/own/fold-1'\]"):
        load(params, paths)
    with pytest.raises(TeacherError, match=r"fold-1/config.json: distill.fold_teachers\[0\] must be a run that left "
                                           r"out fold 0 of 2 of the 40 train rows, but its holdout_fold is "
                                           r"\{'folds': 2, 'fold': 1"):
        teacher_logits(changed(params, "distill", fold_teachers=params.distill.fold_teachers[::-1]), paths)
    with pytest.raises(TeacherError, match=r"teacher/config.json: distill.fold_teachers\[0\] .* its holdout_fold is "
                                           "None"):
        teacher_logits(changed(params, "distill", fold_teachers=[TEACHER, "models/own/fold-1"]), paths)
    save_fold_teacher(mpnet_encoder, paths.root, 1, seed=4)
    with pytest.raises(TeacherError, match=r"their runs cut the folds with different seeds \[3, 4\]"):
        teacher_logits(params, paths)
    with pytest.raises(ParamsError, match="fold_teachers is set but teacher is null"):
        tiny_params(distill={"teacher": None, "fold_teachers": params.distill.fold_teachers})


# --- logits carried in git: distill.logits --------------------------------------------------------------------------

def carry(paths, root, name: str = "mpnet") -> str:
    """The teacher stage's output of ``paths`` copied into ``root``/data/teachers/``name``, as git carries it; the
    ``distill.logits`` naming it."""
    shutil.copytree(paths.teacher, root / "data/teachers" / name)
    return f"data/teachers/{name}"


@pytest.fixture
def carried(with_transfer, project, tmp_path, monkeypatch):
    """``(teacher's (params, paths), carried (params, paths))``: the with_transfer project's teacher output carried
    into a second project, whose params take it (``distill.logits``) instead of the teacher, with the same transfer
    params; the second project's teacher stage not run yet."""
    params, paths = with_transfer
    logits = carry(paths, tmp_path / "carried")
    carried = project(name="carried", train={"swap_pairs": True}, distill={**NEIGHBOURS, "teacher": None,
                                                                            "logits": logits})
    return (params, paths), carried


def run_teacher_stage(paths):
    """stages/teacher.py's main in the project ``paths`` (its params.yaml)."""
    from stages.teacher import main

    main()
    reset_accelerate()
    return json.loads((paths.teacher / TEACHER_FILE).read_text())


def test_carried_logits_teach_exactly_as_the_teacher_that_made_them_without_loading_it(carried, monkeypatch):
    from finetune.transfer import SWAPPED_TRANSFER_LOGITS_FILE, TRANSFER_FILE, TRANSFER_LOGITS_FILE

    (params, paths), (carried_params, carried_paths) = carried
    made = json.loads((paths.teacher / TEACHER_FILE).read_text())
    monkeypatch.setattr("finetune.modeling.load_finetuned", lambda *a, **k: pytest.fail("a model was loaded"))
    identity = run_teacher_stage(carried_paths)
    for name in (LOGITS_FILE, SWAPPED_LOGITS_FILE, TRANSFER_LOGITS_FILE, SWAPPED_TRANSFER_LOGITS_FILE):
        assert np.array_equal(np.load(carried_paths.teacher / name), np.load(paths.teacher / name))
    pd.testing.assert_frame_equal(pd.read_parquet(carried_paths.teacher / TRANSFER_FILE),
                                  pd.read_parquet(paths.teacher / TRANSFER_FILE))
    assert identity["carried"] == {"from": "data/teachers/mpnet", "data_fingerprint": made["data"]["fingerprint"],
                                   "device": made["device"], "seconds": made["seconds"]}
    assert identity["data"]["sha256"] == made["data"]["sha256"] and len(made["data"]["sha256"]) == 64
    assert identity["weights"] == made["weights"] and identity["teacher"] == made["teacher"] == TEACHER
    monkeypatch.undo()
    params, carried_params = (changed(p, "train", epochs=1) for p in (params, carried_params))
    expected, metrics = train(params, paths), (reset_accelerate(), train(carried_params, carried_paths))[1]
    weights = (load_file(p.trained / "model.safetensors") for p in (paths, carried_paths))
    assert all(a.equal(b) for a, b in zip(*(w.values() for w in weights)))
    assert metrics["distillation"] == {**expected["distillation"], "logits": "data/teachers/mpnet"}
    assert expected["distillation"]["logits"] is None


def test_carried_logits_of_other_rows_or_transfer_params_are_refused_naming_the_file(carried, project, tiny_raw,
                                                                                     tmp_path):
    from datasets import DatasetDict

    from finetune.teacher import carried_teacher

    (params, paths), (carried_params, carried_paths) = carried
    file = r"data/teachers/mpnet/teacher.json"
    with pytest.raises(TeacherError, match=rf"{file}: holds the transfer set of .*'k': 3.*, not of distill.transfer "
                                           r".*'k': 4.*\(distill.logits: 'data/teachers/mpnet'\)"):
        carried_teacher(transfer_params(carried_params, k=4), carried_paths)
    assert carried_teacher(transfer_params(carried_params, weight=0.5), carried_paths)  # a train param: no matter
    edited = tiny_raw["train"].map(lambda row, i: {"sentence1": row["sentence1"] + (" again" if i == 7 else "")},
                                   with_indices=True)
    carry(paths, tmp_path / "edited")
    other_params, other = project(raw=DatasetDict({**tiny_raw, "train": edited}), name="edited",
                                  train={"swap_pairs": True}, distill={**NEIGHBOURS, "teacher": None,
                                                                       "logits": "data/teachers/mpnet"})
    with pytest.raises(TeacherError, match=rf"{file}: its logits are of other train rows .*rows sha256 [0-9a-f]{{64}}, "
                                           r"but the train split of .*data/raw has [0-9a-f]{64} \(40 rows, 40 recorded\)"):
        carried_teacher(other_params, other)
    made = carried_paths.root / file
    made.write_text(json.dumps({**json.loads(made.read_text()), "data": {"fingerprint": "f"}}))  # an older stage's
    with pytest.raises(TeacherError, match="rows sha256 None"):
        carried_teacher(carried_params, carried_paths)


def test_carried_logits_of_both_orders_serve_one_order_and_missing_orders_or_held_out_texts_are_refused(
        carried, project, tiny_raw, tmp_path):
    from finetune.split_zip import sha256_file
    from finetune.teacher import carried_teacher
    from finetune.transfer import SWAPPED_TRANSFER_LOGITS_FILE, TRANSFER_FILE

    (params, paths), (carried_params, carried_paths) = carried
    logits = carry(paths, tmp_path / "one-order")  # both orders carried, for a run on one order
    one_params, one = project(name="one-order", train={"swap_pairs": False}, distill={**NEIGHBOURS, "teacher": None,
                                                                                       "logits": logits})
    teacher = carried_teacher(one_params, one)
    assert teacher.logits_swapped is None and teacher.transfer.logits_swapped is None
    assert teacher.identity["swapped"] is False and np.array_equal(teacher.logits, np.load(paths.teacher / LOGITS_FILE))
    save_teacher(one.teacher, teacher)
    assert load(one_params, one).logits.shape == (40, 2)  # the train stage takes them
    folder = carried_paths.root / logits
    (folder / SWAPPED_TRANSFER_LOGITS_FILE).unlink()
    with pytest.raises(TeacherError, match=r"mpnet/transfer_logits_swapped.npy: not found \(distill.logits: "
                                           r"'data/teachers/mpnet'\); it was made without train.swap_pairs"):
        carried_teacher(carried_params, carried_paths)
    shutil.copy(paths.teacher / SWAPPED_TRANSFER_LOGITS_FILE, folder)
    pairs = pd.read_parquet(folder / TRANSFER_FILE)
    pairs.loc[3, "sentence2"] = tiny_raw["validation"][0]["sentence2"]
    pairs.to_parquet(folder / TRANSFER_FILE, index=False)
    made = json.loads((folder / TEACHER_FILE).read_text())
    made["transfer"]["sha256"] = sha256_file(folder / TRANSFER_FILE)
    (folder / TEACHER_FILE).write_text(json.dumps(made))
    with pytest.raises(TeacherError, match="mpnet/transfer.parquet: holds texts of this data's validation or test"):
        carried_teacher(carried_params, carried_paths)


def test_the_train_stage_takes_only_the_logits_its_params_name(carried):
    (params, paths), (carried_params, carried_paths) = carried
    shutil.copytree(paths.teacher, carried_paths.teacher)  # the teacher's own output, not the carried one's
    with pytest.raises(TeacherError, match=r"data/teacher/teacher.json: holds the logits of teacher "
                                           r"'models/own/teacher', not of \(distill.logits: 'data/teachers/mpnet'\)"):
        load(carried_params, carried_paths)
    shutil.rmtree(carried_paths.teacher)
    run_teacher_stage(carried_paths)
    assert load(carried_params, carried_paths).transfer is not None
    with pytest.raises(TeacherError, match=r"holds the logits carried in 'data/teachers/mpnet', not of "
                                           r"\(distill.teacher: 'models/own/teacher'\)"):
        load(params, carried_paths)
    with pytest.raises(ParamsError, match="logits and teacher .* are both set"):
        tiny_params(distill={"teacher": TEACHER, "logits": "data/teachers/mpnet"})
    assert tiny_params(distill={**NEIGHBOURS, "teacher": None, "logits": "data/teachers/mpnet"})


@pytest.mark.parametrize("logits,message", [
    ("data/own/mpnet", "'data/own/mpnet' is not a folder under data/teachers/"),
    ("data/teachers", "'data/teachers' is not a folder under data/teachers/"),
    ("data/teachers/nowhere", "'data/teachers/nowhere' holds no teacher.json"),
])
def test_bad_carried_logits_folders_are_named(logits, message, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ParamsError, match=f"tiny params: distill.logits: .*{message}"):
        tiny_params(distill={"teacher": None, "logits": logits})
