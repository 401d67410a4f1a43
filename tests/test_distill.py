"""Knowledge distillation: the loss by hand, the teacher stage (a tiny MPNet teacher, its own tokenizer, for a BERT
student), the refusals, training with the teacher's logits, and the transfer set: made, scored and trained on."""

from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pandas as pd
import pytest
import torch
import yaml
from datasets import Dataset, DatasetDict, load_from_disk
from safetensors.torch import load_file
from transformers import AutoTokenizer

from finetune.data.batches import TEACHER_LOGITS, make_collator
from finetune.distill.loss import (
    LOGITS_FILE,
    TEACHER_FILE,
    TRANSFER,
    TRANSFER_FILE,
    TRANSFER_LOGITS_FILE,
    Distillation,
    Teacher,
    distillation_loss,
    load_teacher,
    with_teacher_logits,
)
from finetune.distill.teacher import save_teacher, teacher_logits
from finetune.distill.transfer import make_transfer_set, neighbour_pairs
from finetune.errors import DataError, ParamsError, TeacherError
from finetune.modeling import load_classifier, load_finetuned
from finetune.overrides import with_overrides
from finetune.params import TransferParams
from finetune.paths import Paths
from finetune.tasks import glue_task, own_task
from finetune.train.recipe import train
from tests.helpers import (
    REPO,
    interrupt_and_resume,
    make_family_checkpoint,
    make_project,
    python,
    reset_accelerate,
    run,
    tiny_params,
)

MRPC = glue_task("mrpc")
TEACHER = "models/own/teacher"  # distill.teacher of the test projects
TIMING_KEYS = {"train_seconds", "samples_per_second", "wall_seconds", "peak_memory_mb", "resumed_from_step"}
TRANSFER_PARAMS = yaml.safe_load((REPO / "params.yaml").read_text())["distill"]["transfer"]  # params.yaml's
NEIGHBOURS = {"transfer": {**TRANSFER_PARAMS, "kind": "neighbours", "k": 3, "max_pairs": 48}}  # beside 40 train rows


def batch(seed: int = 0, rows: int = 6, classes: int = 3):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(rows, classes, generator=g) * 2, torch.randint(0, classes, (rows,), generator=g),
            torch.randn(rows, classes, generator=g) * 2)


def loss_of(student, labels, teacher, alpha=0.5, temperature=2.0, transfer=None, weight=1.0, regression=False):
    return distillation_loss(student, labels, teacher, transfer, alpha, temperature, weight, regression)


def test_alpha_0_is_the_plain_cross_entropy_and_alpha_1_with_the_teacher_as_student_has_no_soft_loss():
    student, labels, teacher = batch()
    loss, hard, soft = loss_of(student, labels, teacher, alpha=0.0)
    assert loss.item() == torch.nn.functional.cross_entropy(student, labels).item() == hard.item() and soft.item() > 0
    loss, hard, soft = loss_of(student, labels, student.clone(), alpha=1.0, temperature=3.0)
    assert abs(soft.item()) < 1e-6 and abs(loss.item()) < 1e-6 and hard.item() > 0


@pytest.mark.parametrize("temperature", [1.0, 2.0, 4.0])
def test_the_soft_loss_is_t_squared_times_the_kl_divergence_by_hand_mixed_by_alpha(temperature):
    student, labels, teacher = batch(seed=3)
    loss, hard, soft = loss_of(student, labels, teacher, alpha=0.3, temperature=temperature)
    s, t = student.double().numpy() / temperature, teacher.double().numpy() / temperature
    p = np.exp(t) / np.exp(t).sum(axis=1, keepdims=True)  # the teacher's softened distribution
    q = np.exp(s) / np.exp(s).sum(axis=1, keepdims=True)  # the student's
    kl_per_row = (p * (np.log(p) - np.log(q))).sum(axis=1)  # KL(p || q)
    assert soft.item() == pytest.approx(temperature ** 2 * kl_per_row.mean(), rel=1e-5)
    assert loss.item() == pytest.approx(0.7 * hard.item() + 0.3 * soft.item(), rel=1e-6)


def test_regression_uses_mean_squared_errors_without_temperature():
    student, teacher = torch.tensor([[1.0], [2.0], [4.0]]), torch.tensor([[1.5], [2.0], [3.0]])
    labels = torch.tensor([0.0, 2.0, 5.0])
    for temperature in (1.0, 5.0):
        loss, hard, soft = loss_of(student, labels, teacher, alpha=0.25, temperature=temperature, regression=True)
        assert (hard.item(), soft.item()) == pytest.approx(((1 + 0 + 1) / 3, (0.25 + 0 + 1) / 3))
        assert loss.item() == pytest.approx(0.75 * hard.item() + 0.25 * soft.item())
    loss, _, _ = loss_of(student, labels, teacher, alpha=0.0, regression=True)
    assert loss.item() == torch.nn.functional.mse_loss(student[:, 0], labels).item()


def test_transfer_rows_carry_no_hard_loss_only_weight_times_soft():
    student, labels, teacher = batch(seed=7)
    transfer = torch.tensor([0, 1, 0, 1, 1, 0])
    loss, hard, soft = loss_of(student, labels, teacher, alpha=0.3, transfer=transfer, weight=0.5)
    rows = [loss_of(student[[i]], labels[[i]], teacher[[i]], alpha=0.3) for i in range(6)]
    by_hand = [0.5 * r[2].item() if transfer[i] else r[0].item() for i, r in enumerate(rows)]
    assert loss.item() == pytest.approx(np.mean(by_hand), rel=1e-6)
    assert hard.item() == pytest.approx(np.mean([rows[i][1].item() for i in (0, 2, 5)]), rel=1e-6)
    assert soft.item() == pytest.approx(np.mean([r[2].item() for r in rows]), rel=1e-6)
    only = loss_of(student, labels, teacher, alpha=0.3, transfer=torch.ones(6))  # a batch of transfer rows alone
    assert math.isnan(only[1].item()) and only[0].item() == pytest.approx(soft.item(), rel=1e-6)
    scores = torch.tensor([[1.0], [2.0]], requires_grad=True)  # regression: a transfer row's label is NaN
    loss, hard, soft = loss_of(scores, torch.tensor([0.0, float("nan")]), torch.tensor([[1.5], [4.0]]),
                               transfer=torch.tensor([0, 1]), regression=True)
    assert (hard.item(), soft.item(), loss.item()) == pytest.approx((1.0, (0.25 + 4) / 2, (0.5 + 0.125 + 4) / 2))
    loss.backward()
    assert scores.grad[:, 0].tolist() == pytest.approx([(0.5 * 2 + 0.5 * 2 * -0.5) / 2, 2 * -2.0 / 2])  # finite


def save_teacher_model(encoder, task, folder):
    """A "fine-tuned" teacher of ``task``: ``encoder`` with a new head, saved as the train stage saves a model."""
    torch.manual_seed(1)
    load_classifier(encoder, task).save_pretrained(folder)
    AutoTokenizer.from_pretrained(encoder).save_pretrained(folder)
    task.save(folder)
    return folder


@pytest.fixture(scope="module")
def teacher_model(tmp_path_factory):
    """A random 2-layer MPNet with its own tokenizer (another family and vocabulary than the BERT student's)."""
    root = tmp_path_factory.mktemp("mpnet")
    return save_teacher_model(make_family_checkpoint(root / "encoder", "mpnet"), MRPC, root / "teacher")


def build(root, teacher, raw, checkpoint, score=False, distill=None):
    """A project: the train stage's inputs, params naming ``teacher`` (models/own); ``score``: its teacher stage run."""
    shutil.copytree(teacher, root / TEACHER)
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(root)  # distill.teacher is checked from the working directory, as for a stage
        params = tiny_params(distill={"teacher": TEACHER, **(distill or {})})
    paths = make_project(root, params, raw, checkpoint)
    if score:
        save_teacher(paths.teacher, teacher_logits(params, paths))
        reset_accelerate()
    return params, paths


@pytest.fixture(scope="module")
def scored(teacher_model, tiny_raw, tiny_checkpoint, tmp_path_factory):
    """A project whose teacher stage has run; tests train in clones of it (``clone``)."""
    return build(tmp_path_factory.mktemp("scored") / "p", teacher_model, tiny_raw, tiny_checkpoint, score=True)


@pytest.fixture(scope="module")
def with_transfer(teacher_model, tiny_raw, tiny_checkpoint, tmp_path_factory):
    """The same, with 48 neighbour pairs scored too."""
    return build(tmp_path_factory.mktemp("transfer") / "p", teacher_model, tiny_raw, tiny_checkpoint, True, NEIGHBOURS)


def clone(paths, root) -> Paths:
    return Paths(shutil.copytree(paths.root, root))


def direct_logits(teacher_folder, texts: list[tuple[str, str]]) -> np.ndarray:
    """The teacher's logits of each pair, one at a time, with its own tokenizer, without the stage's batching."""
    tokenizer, model = AutoTokenizer.from_pretrained(teacher_folder), load_finetuned(teacher_folder).eval()
    with torch.no_grad():
        return np.stack([model(**tokenizer(a, b, truncation=True, return_tensors="pt")).logits[0].numpy()
                         for a, b in texts])


def test_the_teacher_stage_writes_logits_row_for_row_with_its_own_tokenizer_and_of_the_transfer_set(
        scored, with_transfer, tiny_raw, teacher_model):
    params, paths = scored
    assert sorted(p.name for p in paths.teacher.iterdir()) == [LOGITS_FILE, TEACHER_FILE]
    logits, rows = np.load(paths.teacher / LOGITS_FILE), [0, 7, 39]
    assert logits.dtype == np.float32 and logits.shape == (40, 2)
    texts = [(tiny_raw["train"][i]["sentence1"], tiny_raw["train"][i]["sentence2"]) for i in rows]
    np.testing.assert_allclose(logits[rows], direct_logits(teacher_model, texts), atol=1e-4)
    # row i stays raw train row i when the stage batches sorted by length (evaluate.sort_by_length)
    by_length = params.model_copy(update={"evaluate": params.evaluate.model_copy(update={"sort_by_length": True})})
    np.testing.assert_allclose(teacher_logits(by_length, paths).logits, logits, atol=1e-5)
    saved = json.loads((paths.teacher / TEACHER_FILE).read_text())
    assert saved["distillation"] is True and saved["teacher"] == TEACHER and saved["model_type"] == "mpnet"
    assert saved["task_type"] == "classification" and saved["id2label"] == {"0": "not_equivalent", "1": "equivalent"}
    assert saved["rows"] == 40 and saved["transfer"] is None and saved["mixed_precision"] == "no"
    assert saved["data"] == {"fingerprint": load_from_disk(str(paths.tokenized))["train"]._fingerprint}
    assert list(saved["weights"]) == ["model.safetensors"] and len(saved["weights"]["model.safetensors"]) == 64
    params, paths = with_transfer
    assert sorted(p.name for p in paths.teacher.iterdir()) == [LOGITS_FILE, TEACHER_FILE, TRANSFER_FILE,
                                                               TRANSFER_LOGITS_FILE]
    pairs, logits = pd.read_parquet(paths.teacher / TRANSFER_FILE), np.load(paths.teacher / TRANSFER_LOGITS_FILE)
    assert len(pairs) == 48 and logits.shape == (48, 2) and logits.dtype == np.float32
    texts = [(pairs["sentence1"][i], pairs["sentence2"][i]) for i in (0, 30, 47)]
    np.testing.assert_allclose(logits[[0, 30, 47]], direct_logits(teacher_model, texts), atol=1e-4)
    recorded = json.loads((paths.teacher / TEACHER_FILE).read_text())["transfer"]
    assert recorded["params"] == params.distill.transfer.model_dump() and recorded["rows"] == 48
    assert recorded["made"] > 48 and "TF-IDF" in recorded["how"]


def test_off_writes_only_teacher_json_fast_and_loads_nothing(tmp_path):
    paths = make_project(tmp_path / "p", tiny_params())
    code = ("import runpy, sys, time; start = time.perf_counter(); runpy.run_module('stages.teacher', run_name="
            "'__main__'); print(round(time.perf_counter() - start, 3), sorted(m for m in ('torch', 'transformers', "
            "'datasets') if m in sys.modules))")  # python -m stages.teacher, timed
    seconds, loaded = run(python("-c", code), paths.root).strip().splitlines()[-1].split(" ", 1)
    assert float(seconds) < 1 and loaded == "[]"  # no model, not even torch
    assert [p.name for p in paths.teacher.iterdir()] == [TEACHER_FILE]  # constant: train's dependency does not change
    assert json.loads((paths.teacher / TEACHER_FILE).read_text()) == {"distillation": False, "teacher": None}


def test_the_teacher_stage_refuses_unaligned_rows_and_a_teacher_of_other_labels_or_task_type(
        teacher_model, tiny_raw, tiny_checkpoint, tmp_path):
    params, paths = build(tmp_path / "p", teacher_model, tiny_raw, tiny_checkpoint)
    shutil.rmtree(paths.raw)
    DatasetDict({**tiny_raw, "train": tiny_raw["train"].select(range(39))}).save_to_disk(str(paths.raw))
    with pytest.raises(DataError, match=r"data/raw: 39 train rows, but .*data/tokenized has 40; rerun `dvc repro"):
        teacher_logits(params, paths)
    for labels, message in [
        (("a", "b", "c"), r"has labels \['a', 'b', 'c'\], but task 'mrpc' has \['not_equivalent', 'equivalent'\]"),
        (("equivalent", "not_equivalent"), r"has labels \['equivalent', 'not_equivalent'\].*in the same id order"),
        (None, "is a regression model, but task 'mrpc' is classification; a teacher must be fine-tuned on the same"),
    ]:
        shutil.rmtree(paths.root / TEACHER)
        save_teacher_model(teacher_model, own_task(("sentence1", "sentence2"), labels), paths.root / TEACHER)
        with pytest.raises(TeacherError, match=rf"/models/own/teacher/config.json: the teacher 'models/own/teacher' "
                                               rf"\(distill.teacher\) {message}"):
            teacher_logits(params, paths)
    assert not paths.teacher.exists()


def changed(params, section: str, **values):
    """``params`` with ``values`` in ``section`` (unvalidated: no working directory needed)."""
    return params.model_copy(update={section: getattr(params, section).model_copy(update=values)})


def transfer_params(params, **changes):
    return changed(params, "distill", transfer=params.distill.transfer.model_copy(update=changes))


def stale(paths, folder, **edit):
    """``paths.teacher`` copied to ``folder``, teacher.json edited with ``edit``."""
    shutil.copytree(paths.teacher, folder, dirs_exist_ok=True)
    (folder / TEACHER_FILE).write_text(json.dumps({**json.loads((folder / TEACHER_FILE).read_text()), **edit}))
    return folder


def test_the_train_stage_refuses_stale_teacher_outputs_naming_the_file(scored, with_transfer, tmp_path):
    (params, paths), (t_params, t_paths) = scored, with_transfer
    rows, t_rows = (load_from_disk(str(p.tokenized))["train"] for p in (paths, t_paths))
    assert load_teacher(params.distill, paths.teacher, MRPC, rows).logits.shape == (40, 2)
    assert load_teacher(transfer_params(t_params, weight=0.5).distill, t_paths.teacher, MRPC, t_rows)  # train's alone
    (stale(paths, tmp_path / "none") / TEACHER_FILE).unlink()
    np.save(stale(paths, tmp_path / "rows") / LOGITS_FILE, np.zeros((30, 2), np.float32))
    np.save(stale(paths, tmp_path / "labels") / LOGITS_FILE, np.zeros((40, 1), np.float32))
    np.save(stale(t_paths, tmp_path / "short") / TRANSFER_LOGITS_FILE, np.zeros((40, 2), np.float32))
    rerun = r"\(distill.teacher: 'models/own/teacher'\); rerun `dvc repro teacher`"
    for p, folder, data, message in [
        (params, stale(paths, tmp_path / "another", teacher="models/own/another"), rows, "another/teacher.json: holds "
         f"no logits of this teacher {rerun}"),
        (params, tmp_path / "none", rows, "none/teacher.json: holds no logits of this teacher"),
        (transfer_params(params, kind="neighbours"), paths.teacher, rows, "teacher.json: holds the transfer set of "
         r"None, not of distill.transfer \{'kind': 'neighbours'"),
        (params, paths.teacher, rows.select(range(30)), f"teacher.json: the logits are of another data/tok.*{rerun}"),
        (params, tmp_path / "rows", rows, rf"rows/logits.npy: shape \[30, 2\], expected \[40, 2\] .*{rerun}"),
        (params, tmp_path / "labels", rows, r"labels/logits.npy: shape \[40, 1\], expected \[40, 2\]"),
        (transfer_params(t_params, k=4), t_paths.teacher, t_rows, r"teacher.json: holds the transfer set of .*'k': 3"
         rf".*, not of distill.transfer .*'k': 4.*{rerun}"),
        (transfer_params(t_params, kind=None), t_paths.teacher, t_rows, "holds the transfer set of .*'neighbours'.*, "
         "not of distill.transfer None"),
        (t_params, tmp_path / "short", t_rows, r"short/transfer_logits.npy: shape \[40, 2\], expected \[48, 2\]"),
    ]:
        with pytest.raises(TeacherError, match=message):
            load_teacher(p.distill, folder, MRPC, data)
    stale(paths, (project := clone(paths, tmp_path / "project")).teacher, teacher="models/own/another")  # train too
    with pytest.raises(TeacherError, match=r"project/data/teacher/teacher.json: holds no logits of this teacher"):
        train(params, project)
    assert not project.trained.exists()


@pytest.mark.parametrize("distill,message", [
    ({"teacher": "models/own/nowhere"}, "distill.teacher: folder 'models/own/nowhere' not found"),
    ({"teacher": "models/pretrained"}, "distill.teacher: 'models/pretrained' is not a folder under models/own/"),
    ({"alpha": 1.5}, "distill.alpha: Input should be less than or equal to 1"),
    ({"temperature": 0}, "distill.temperature: Input should be greater than 0"),
    ({"transfer": {"kind": "files"}}, "distill.transfer: files: set it"),
    ({"transfer": {"kind": "files", "files": ["elsewhere/x.csv"]}},
     "distill.transfer: files: 'elsewhere/x.csv' is not under data/own/"),
    ({"transfer": {"min_similarity": 0.5, "max_similarity": 0.5}}, r"distill.transfer: min_similarity \(0.5\) must"),
    ({"transfer": {"k": 0}}, "distill.transfer.k: Input should be greater than or equal to 1"),
    ({"transfer": {"weight": -1}}, "distill.transfer.weight: Input should be greater than or equal to 0"),
    ({"transfer": {"kind": "neighbours"}}, "distill: transfer.kind is 'neighbours' but teacher is null"),  # needs one
])
def test_bad_distill_and_transfer_params_are_named(distill, message, monkeypatch):
    monkeypatch.chdir(REPO)
    distill = {"transfer": {**TRANSFER_PARAMS, **distill["transfer"]}} if "transfer" in distill else distill
    with pytest.raises(ParamsError, match=f"tiny params: {message}"):
        tiny_params(distill=distill)
    with pytest.raises(ParamsError, match=f"overrides: {message}"):
        with_overrides(tiny_params(), {"distill": distill})


def outcome(paths, metrics: dict) -> tuple[dict, dict, dict]:
    """Final weights, train metrics without timings, and the DVCLive logs (step and value columns)."""
    logs = {str(tsv.relative_to(paths.root)): pd.read_csv(tsv, sep="\t").round(6).fillna("NaN").to_dict("list")
            for tsv in sorted(paths.train_logs.rglob("*.tsv"))}
    return (load_file(paths.trained / "model.safetensors"), {k: v for k, v in metrics.items() if k not in TIMING_KEYS},
            logs)


def test_training_with_a_teacher_logs_hard_and_soft_loss(scored, tmp_path):
    params, paths = scored[0], clone(scored[1], tmp_path / "p")
    metrics = train(params, paths)
    distill = metrics["distillation"]
    assert metrics["steps"] == 10 and distill == {
        "teacher": TEACHER, "teacher_model_type": "mpnet", "alpha": 0.5, "temperature": 2.0,
        "final_hard_loss": distill["final_hard_loss"], "final_soft_loss": distill["final_soft_loss"], "transfer": None}
    assert distill["final_hard_loss"] > 0 and distill["final_soft_loss"] > 0
    for log, steps in (("steps", [2, 4, 6, 8, 10]), ("epochs", [1, 2])):  # log_every 2; an evaluation an epoch
        for name in ("hard_loss", "soft_loss"):
            table = pd.read_csv(paths.train_logs / log / "plots" / "metrics" / "train" / f"{name}.tsv", sep="\t")
            assert table["step"].tolist() == steps, name
    state = json.loads((paths.checkpoints / "step-10" / "trainer_state.json").read_text())  # each step's loss: the mix
    hard, soft = state["loss_parts"]["train/hard_loss"], state["loss_parts"]["train/soft_loss"]
    assert state["losses"] == pytest.approx([0.5 * h + 0.5 * s for h, s in zip(hard, soft, strict=True)], rel=1e-5)


def test_alpha_0_trains_exactly_like_no_teacher_which_never_reads_data_teacher(scored, tmp_path):
    # distillation takes nothing from the random stream, its hard loss is the model's own: the same weights, bit for bit
    paths = clone(scored[1], tmp_path / "alpha0")
    with_teacher = outcome(paths, train(changed(scored[0], "distill", alpha=0.0), paths))
    reset_accelerate()
    off, off_paths = changed(scored[0], "distill", teacher=None), clone(scored[1], tmp_path / "off")
    (off_paths.teacher / TEACHER_FILE).write_text("not even JSON")  # distill.teacher null: never opened
    without = outcome(off_paths, train(off, off_paths))
    assert all(with_teacher[0][k].equal(without[0][k]) for k in without[0])
    assert {k: v for k, v in with_teacher[1].items() if k != "distillation"} == without[1]
    assert "distillation" not in without[1] and not list(off_paths.train_logs.rglob("*_loss.tsv"))
    hard, loss = (f"dvclive/train/steps/plots/metrics/train/{name}.tsv" for name in ("hard_loss", "loss"))
    assert with_teacher[2][hard]["hard_loss"] == with_teacher[2][loss]["loss"]


def test_an_interrupted_distilled_run_resumes_to_the_uninterrupted_result_another_teacher_or_alpha_afresh(
        scored, tmp_path, monkeypatch):
    params = changed(changed(scored[0], "train", epochs=3), "distill", alpha=0.7, temperature=3.0)
    paths = clone(scored[1], tmp_path / "whole")
    expected = outcome(paths, train(params, paths))
    reset_accelerate()
    paths = clone(scored[1], tmp_path / "stopped")
    metrics = interrupt_and_resume(params, paths, monkeypatch)  # mid-epoch 2, after epoch 1's checkpoint at step 5
    assert metrics["resumed_from_step"] == 5
    weights, metrics, logs = outcome(paths, metrics)
    assert weights.keys() == expected[0].keys() and all(weights[k].equal(expected[0][k]) for k in weights)
    assert metrics == expected[1]
    assert logs == expected[2] and "dvclive/train/steps/plots/metrics/train/soft_loss.tsv" in logs
    reset_accelerate()  # the resume fingerprint: the same run continues after its last step, another starts afresh
    assert train(params, paths)["resumed_from_step"] == 15
    logits, alpha = np.load(paths.teacher / LOGITS_FILE), changed(params, "distill", alpha=0.9)
    for teacher in (logits, logits[:, ::-1].copy()):  # another alpha, then the logits of another teacher
        np.save(paths.teacher / LOGITS_FILE, teacher)
        reset_accelerate()
        assert train(alpha, paths)["resumed_from_step"] == 0


@pytest.mark.glue
def test_neighbour_pairs_are_of_train_texts_never_a_train_pair_a_repeat_or_a_held_out_text_of_a_pair_task():
    local_copy = yaml.safe_load((REPO / "params.yaml").read_text())["data"]["local_copy"]  # MRPC's train split
    mrpc = pd.read_parquet(REPO / local_copy / "mrpc" / "train-00000-of-00001.parquet").head(380)
    validation = mrpc[300:340].reset_index(drop=True)
    validation.loc[3, "sentence2"] = shared = mrpc["sentence1"][5]  # a train text held out too (MRPC has 284 such)
    raw = DatasetDict({split: Dataset.from_pandas(df, preserve_index=False)
                       for split, df in (("train", mrpc[:300]), ("validation", validation), ("test", mrpc[340:]))})
    p = TransferParams(**{**NEIGHBOURS["transfer"], "max_pairs": None, "min_similarity": 0.2, "max_similarity": 0.6})
    pairs, described = make_transfer_set(p, raw, MRPC)
    assert described["rows"] == described["made"] == len(pairs) > 100
    texts = {split: {*ds["sentence1"], *ds["sentence2"]} for split, ds in raw.items()}
    made = {*pairs["sentence1"], *pairs["sentence2"]}
    assert made <= texts["train"] and not made & (texts["validation"] | texts["test"]) and shared not in made
    train_pairs = set(zip(raw["train"]["sentence1"], raw["train"]["sentence2"]))
    assert all(a != b and not {(a, b), (b, a)} & train_pairs for a, b in zip(pairs["sentence1"], pairs["sentence2"]))
    assert len({frozenset(pair) for pair in zip(pairs["sentence1"], pairs["sentence2"])}) == len(pairs)  # MRPC is
    assert pairs["similarity"].between(0.2, 0.6, inclusive="left").all()  # symmetric: either order once
    assert pairs.groupby("sentence1").size().max() <= 3  # k neighbours a query
    sampled, described = make_transfer_set(p.model_copy(update={"max_pairs": 50}), raw, MRPC)
    pd.testing.assert_frame_equal(sampled, make_transfer_set(p.model_copy(update={"max_pairs": 50}), raw, MRPC)[0])
    kept = sampled.merge(pairs.reset_index())["index"]  # seeded: the same sample each time, of the pairs in order
    assert len(kept) == described["rows"] == 50 and described["made"] == len(pairs) and kept.is_monotonic_increasing
    with pytest.raises(ParamsError, match="neighbours makes pairs, but task 'sst2' has one text column"):
        make_transfer_set(p, {"train": None}, glue_task("sst2"))


def test_equally_similar_neighbours_come_in_first_seen_order(monkeypatch):
    from sklearn.neighbors import NearestNeighbors

    # the two Dow sentences differ only in what TF-IDF drops ("<" and ">"): equally similar to every query
    dow = ["The Dow Jones index <.DJI> fell 98 points on Friday.", "The Dow Jones index .DJI fell 98 points on Friday."]
    others = ["Dow Jones traders said the index fell sharply.", "Intel rose.", "Profits rose.", "Police left."]
    kneighbors = NearestNeighbors.kneighbors

    def last_seen_first(self, *args, **kwargs):  # as another machine may order ties
        distances, indices = kneighbors(self, *args, **kwargs)
        order = np.lexsort((-indices, np.round(distances, 9)), axis=1)
        return np.take_along_axis(distances, order, 1), np.take_along_axis(indices, order, 1)

    monkeypatch.setattr(NearestNeighbors, "kneighbors", last_seen_first)
    for first in (dow, dow[::-1]):
        rows = Dataset.from_dict({"sentence1": others[:3], "sentence2": [others[3], *first]})  # others[0] queried first
        pairs = neighbour_pairs(rows, ("sentence1", "sentence2"), True, k=1, min_similarity=0.0, max_similarity=0.99)
        assert pairs[pairs["sentence1"] == others[0]]["sentence2"].tolist() == [first[0]]  # the tie's first seen


def test_file_pairs_drop_empty_repeated_train_and_held_out_rows(tmp_path, monkeypatch, tiny_raw):
    monkeypatch.chdir(tmp_path)
    train_row, test_row = tiny_raw["train"][0], tiny_raw["test"][0]
    rows = [("A new sentence.", "Another one."), ("A new sentence.", "Another one."), ("", "Empty."), ("  ", "Blank."),
            (train_row["sentence1"], train_row["sentence2"]), (test_row["sentence1"], "Fine otherwise."),
            ("Last.", "Pair.")]
    (tmp_path / "data/own").mkdir(parents=True)
    pd.DataFrame(rows, columns=["sentence1", "sentence2"]).assign(note="x").to_csv("data/own/pairs.csv", index=False)
    p = TransferParams(**{**TRANSFER_PARAMS, "kind": "files", "files": ["data/own/pairs.csv"]})
    pairs, described = make_transfer_set(p, tiny_raw, MRPC)
    assert pairs.values.tolist() == [["A new sentence.", "Another one.", "data/own/pairs.csv"],
                                     ["Last.", "Pair.", "data/own/pairs.csv"]]
    assert described["rows"] == described["made"] == 2 and "data/own/pairs.csv" in described["how"]


def test_transfer_rows_follow_the_train_rows_flagged_and_the_collator_stacks_their_logits(tokenizer, tiny_tokenized):
    rows = load_from_disk(str(tiny_tokenized))["train"]
    pairs = pd.DataFrame({"sentence1": ["The court met.", "Police said so.", "It rained."],
                          "sentence2": ["The judges met.", "Officers said it.", "Shares fell."]})
    logits = np.arange(6, dtype=np.float32).reshape(3, 2)
    both = with_teacher_logits(rows, Teacher({}, np.zeros((40, 2), np.float32), pairs, logits), tokenizer, None, MRPC)
    assert len(both) == 43 and both[TRANSFER] == [0] * 40 + [1] * 3 and both["labels"][40:] == [-100] * 3
    assert both["labels"][:40] == rows["labels"] and both[TEACHER_LOGITS][:40] == [[0.0, 0.0]] * 40
    assert both[41]["input_ids"] == tokenizer("Police said so.", "Officers said it.")["input_ids"]
    padded = make_collator(tokenizer)([both[i] for i in (0, 41, 42)])  # teacher_logits [batch, num_labels] float32
    assert padded[TEACHER_LOGITS].dtype == torch.float32 and padded[TEACHER_LOGITS].tolist() == [[0, 0], [2, 3], [4, 5]]
    assert padded[TRANSFER].tolist() == [0, 1, 1] and padded["input_ids"].shape[0] == len(padded["labels"]) == 3
    both = with_teacher_logits(rows, Teacher({}, np.zeros((40, 1), np.float32), pairs, logits[:, :1]), tokenizer, None,
                               own_task(("sentence1", "sentence2"), None))  # regression: a transfer row's label is NaN
    assert all(math.isnan(v) for v in both["labels"][40:]) and both["labels"][:40] == [float(v) for v in rows["labels"]]


def test_training_with_a_transfer_set_sees_every_pair_each_epoch(with_transfer, tmp_path, monkeypatch):
    params, paths = with_transfer[0], clone(with_transfer[1], tmp_path / "p")
    seen, loss = [], Distillation.loss

    def recording(self, model, batch):  # the teacher's logits of each transfer row trained on
        seen.extend(map(tuple, batch[TEACHER_LOGITS][batch[TRANSFER].bool()].tolist()))
        return loss(self, model, batch)

    monkeypatch.setattr(Distillation, "loss", recording)
    metrics = train(params, paths)
    assert metrics["train_samples"] == 2 * (40 + 48) and metrics["steps"] == 2 * 11  # batch 8
    assert metrics["distillation"]["transfer"] == {"rows": 48, "kind": "neighbours", "weight": 1.0}
    assert not math.isnan(metrics["distillation"]["final_hard_loss"]) and metrics["distillation"]["final_soft_loss"] > 0
    pairs = sorted(map(tuple, np.load(paths.teacher / TRANSFER_LOGITS_FILE).tolist()))
    assert sorted(seen[:len(seen) // 2]) == sorted(seen[len(seen) // 2:]) == pairs  # each pair once an epoch
