"""Any task: GLUE's by name and the user's own files, single sentences and pairs, two classes, three and regression;
the label names reach the model's config, the metric fits the task, and new data is scored with tools.predict."""

import json

import numpy as np
import pandas as pd
import pytest
from datasets import ClassLabel, load_from_disk
from scipy.stats import pearsonr, spearmanr
from sklearn.metrics import f1_score, matthews_corrcoef
from transformers import AutoModelForSequenceClassification, pipeline

from finetune.data.download import download_dataset
from finetune.data.tokenized import tokenize_splits
from finetune.errors import ParamsError
from finetune.evaluate.evaluation import load_metric
from finetune.evaluate.predictions import evaluate_model
from finetune.tasks import GLUE_TASKS, glue_task, own_task
from finetune.train.recipe import train
from tests.helpers import make_split, own_frame, reset_accelerate, tiny_params, write_hub_folder, write_own_file
from tools.predict import predict


def own_params(files: dict, text_columns: list, label_column: str, **data):
    return tiny_params(data={"dataset": None, "config": None, "local_copy": None, "files": files,
                             "text_columns": text_columns, "label_column": label_column, **data})


@pytest.fixture
def project_root(tmp_path, monkeypatch):
    """An empty project folder that relative paths of params (data/own/...) resolve against: the current folder, as
    for a stage under DVC."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


# Own files: each format, each kind of task.

@pytest.mark.parametrize("suffix", [".csv", ".tsv", ".json", ".jsonl", ".parquet"])
def test_own_files_in_each_format_load_with_string_labels(project_root, suffix):
    files = {}
    for split, (n, seed) in {"train": (30, 0), "validation": (12, 1), "test": (10, 2)}.items():
        write_own_file(own_frame("pair-2", n, seed), project_root / f"data/own/{split}{suffix}")
        files[split] = f"data/own/{split}{suffix}"
    record = download_dataset(own_params(files, ["question", "answer"], "verdict").data, project_root / "data/raw")
    raw = load_from_disk(str(project_root / "data/raw"))
    assert raw["train"].column_names == ["question", "answer", "label", "idx"]
    assert raw["train"].features["label"] == ClassLabel(names=["no", "yes"])  # sorted distinct labels
    expected = own_frame("pair-2", 30, 0)["verdict"].map({"no": 0, "yes": 1}).tolist()
    assert raw["train"]["label"] == expected and raw["train"]["idx"] == list(range(30))
    assert record["task"]["metric_config"] == "binary" and record["task"]["metrics"] == ("f1", "accuracy")
    assert set(record["files"]) == set(files.values())  # the sha256 of each file used


def test_label_names_from_params_set_the_id_order_and_positive_label(project_root):
    for split, seed in (("train", 0), ("validation", 1)):
        write_own_file(own_frame("pair-2", 20, seed), project_root / f"data/own/{split}.csv")
    files = {"train": "data/own/train.csv", "validation": "data/own/validation.csv"}
    params = own_params(files, ["question", "answer"], "verdict", label_names=["yes", "no"], positive_label="no")
    record = download_dataset(params.data, project_root / "data/raw")
    raw = load_from_disk(str(project_root / "data/raw"))
    assert raw["train"].features["label"].names == ["yes", "no"]
    assert raw["train"]["label"] == own_frame("pair-2", 20, 0)["verdict"].map({"yes": 0, "no": 1}).tolist()
    assert record["task"]["positive_label"] == 1


def test_no_validation_split_is_carved_from_train_stratified_and_recorded(project_root):
    write_own_file(own_frame("single-3", 60, 0), project_root / "data/own/train.jsonl")
    params = own_params({"train": "data/own/train.jsonl"}, ["text"], "mood", validation_fraction=0.25, split_seed=3)
    record = download_dataset(params.data, project_root / "data/raw")
    raw = load_from_disk(str(project_root / "data/raw"))
    assert list(raw) == ["train", "validation"]  # no test: evaluation covers what exists
    assert (len(raw["train"]), len(raw["validation"])) == (45, 15)
    assert record["validation_carved"] == {"from": "train", "fraction": 0.25, "seed": 3, "stratified": True, "rows": 15}
    assert not set(raw["train"]["idx"]) & set(raw["validation"]["idx"])  # rows of train, each in one split
    share = lambda ds: np.bincount(ds["label"], minlength=3) / len(ds)  # noqa: E731
    assert np.abs(share(raw["train"]) - share(raw["validation"])).max() < 0.1
    again = download_dataset(params.data, project_root / "data/again")  # seeded: the same split again
    assert load_from_disk(str(project_root / "data/again"))["validation"]["idx"] == raw["validation"]["idx"]
    assert again["validation_carved"] == record["validation_carved"]


def test_float_labels_are_regression_and_a_test_file_without_labels_is_unlabeled(project_root):
    write_own_file(own_frame("pair-regression", 30, 0), project_root / "data/own/train.parquet")
    write_own_file(own_frame("pair-regression", 10, 1), project_root / "data/own/dev.parquet")
    write_own_file(own_frame("pair-regression", 8, 2).drop(columns="score"), project_root / "data/own/new.csv")
    files = {"train": "data/own/train.parquet", "validation": "data/own/dev.parquet", "test": "data/own/new.csv"}
    record = download_dataset(own_params(files, ["sentence1", "sentence2"], "score").data, project_root / "data/raw")
    raw = load_from_disk(str(project_root / "data/raw"))
    assert raw["train"].features["label"].dtype == "float32" and "label" not in raw["test"].column_names
    assert record["task"]["label_names"] is None and record["task"]["metric_config"] == "regression"
    assert record["splits"]["test"] == {"rows": 8, "labeled": False}


def test_integer_labels_declared_regression_are_scores(project_root):
    df = own_frame("pair-regression", 40, 0).assign(score=lambda d: d.index % 5)  # whole numbers, varied in each split
    write_own_file(df, project_root / "data/own/train.csv")
    params = own_params({"train": "data/own/train.csv"}, ["sentence1", "sentence2"], "score", task_type="regression")
    download_dataset(params.data, project_root / "data/raw")
    assert load_from_disk(str(project_root / "data/raw"))["train"].features["label"].dtype == "float32"


# GLUE tasks by name: columns, labels, metric; MNLI's splits.

def test_glue_tasks_know_their_columns_labels_and_metric():
    assert glue_task("cola").text_columns == ("sentence",) and glue_task("cola").metrics == ("matthews_correlation",)
    assert glue_task("stsb").is_regression and glue_task("stsb").num_labels == 1
    assert glue_task("mnli").label_names == ("entailment", "neutral", "contradiction")
    assert glue_task("qqp").text_columns == ("question1", "question2")
    assert glue_task("rte").id2label == {0: "entailment", 1: "not_entailment"}
    assert set(GLUE_TASKS) == {"cola", "sst2", "mrpc", "qqp", "stsb", "mnli", "qnli", "rte", "wnli"}


def test_mnli_matched_splits_become_validation_and_test(tmp_path):
    def mnli(n, seed, labeled=True):
        df = make_split(n, seed, labeled).to_pandas()
        df = df.rename(columns={"sentence1": "premise", "sentence2": "hypothesis"})
        return df.assign(label=[i % 3 for i in range(n)] if labeled else -1)

    splits = {"train": mnli(30, 0), "validation_matched": mnli(9, 1), "validation_mismatched": mnli(8, 2),
              "test_matched": mnli(7, 3, False), "test_mismatched": mnli(6, 4, False)}
    folder = write_hub_folder(tmp_path / "glue", splits, config="mnli")
    params = tiny_params(data={"dataset": str(folder), "config": "mnli", "local_copy": None})
    record = download_dataset(params.data, tmp_path / "raw")
    assert {s: v["rows"] for s, v in record["splits"].items()} == {
        "train": 30, "validation": 9, "test": 7, "validation_mismatched": 8, "test_mismatched": 6}
    assert record["task"]["label_names"] == ("entailment", "neutral", "contradiction")
    assert record["splits"]["test"] == {"rows": 7, "labeled": False}


# Metrics: GLUE's per task and own data's, against scikit-learn and SciPy.

def test_each_metric_config_matches_the_reference_implementation():
    rng = np.random.default_rng(0)
    refs, preds = rng.integers(0, 3, 200), rng.integers(0, 3, 200)
    binary_refs, binary_preds = refs % 2, preds % 2
    scores_ref, scores = rng.uniform(0, 5, 200), rng.uniform(0, 5, 200)
    cola = load_metric(glue_task("cola")).compute(predictions=binary_preds, references=binary_refs)
    assert cola == {"matthews_correlation": pytest.approx(matthews_corrcoef(binary_refs, binary_preds))}
    stsb = load_metric(glue_task("stsb")).compute(predictions=scores, references=scores_ref)
    assert stsb["pearson"] == pytest.approx(pearsonr(scores_ref, scores)[0], abs=1e-5)
    assert stsb["spearmanr"] == pytest.approx(spearmanr(scores_ref, scores)[0], abs=1e-5)
    assert set(load_metric(glue_task("rte")).compute(predictions=binary_preds, references=binary_refs)) == {"accuracy"}
    multi = load_metric(own_task(("text",), ("a", "b", "c"))).compute(predictions=preds, references=refs)
    assert multi["macro_f1"] == pytest.approx(f1_score(refs, preds, average="macro"))
    binary = load_metric(own_task(("t",), ("no", "yes"), "no")).compute(predictions=binary_preds,
                                                                       references=binary_refs, pos_label=0)
    assert binary["f1"] == pytest.approx(f1_score(binary_refs, binary_preds, pos_label=0))
    regression = load_metric(own_task(("t",), None)).compute(predictions=scores, references=scores_ref)
    assert regression["mse"] == pytest.approx(float(np.mean((scores - scores_ref) ** 2)), rel=1e-5)
    for task in [glue_task(name) for name in GLUE_TASKS] + [own_task(("t",), ("a", "b")),
                                                             own_task(("t",), ("a", "b", "c")), own_task(("t",), None)]:
        regression_task = task.is_regression
        result = load_metric(task).compute(predictions=scores if regression_task else binary_preds,
                                           references=scores_ref if regression_task else binary_refs)
        assert tuple(sorted(result)) == tuple(sorted(task.metrics)), task.name  # what Task declares, no more


def test_metric_for_best_must_be_a_metric_of_the_task():
    assert glue_task("mrpc").metric_for_best(None) == ("f1", "max")
    assert glue_task("stsb").metric_for_best(None) == ("pearson", "max")
    assert own_task(("t",), None).metric_for_best("mse") == ("mse", "min")
    with pytest.raises(ValueError, match=r"train.metric_for_best: 'f1' is not a metric of task 'rte'; choose one of "
                                         r"\['loss', 'accuracy'\] or null"):
        glue_task("rte").metric_for_best("f1")


# Train, evaluate, predict on own data of each kind.

@pytest.mark.parametrize("kind,text_columns,label_column,metrics", [
    ("pair-2", ["question", "answer"], "verdict", {"loss", "f1", "accuracy"}),  # the README's own-data example
    ("single-3", ["text"], "mood", {"loss", "macro_f1", "accuracy"}),
    ("pair-regression", ["sentence1", "sentence2"], "score", {"loss", "pearson", "spearmanr", "mse"}),
])
def test_own_data_trains_evaluates_and_predicts_with_names(project_root, tiny_checkpoint, kind, text_columns,
                                                           label_column, metrics):
    import shutil

    from finetune.paths import Paths

    for split, (n, seed) in {"train": (32, 0), "validation": (12, 1), "test": (10, 2)}.items():
        write_own_file(own_frame(kind, n, seed), project_root / f"data/own/{split}.csv")
    files = {s: f"data/own/{s}.csv" for s in ("train", "validation", "test")}
    params = own_params(files, text_columns, label_column, max_samples=None)
    paths = Paths(project_root)
    download_dataset(params.data, paths.raw)
    shutil.copytree(tiny_checkpoint, paths.pretrained)
    tokenize_splits(params, paths)
    train(params, paths)
    reset_accelerate()
    results = evaluate_model(params, paths)
    reset_accelerate()
    # The task's metrics, then the collapse check: the constant baseline scored by the same metrics, and for
    # classification the most predicted class (finetune/evaluate/collapse.py).
    regression = kind == "pair-regression"
    check = {"baseline", "collapsed"} | (set() if regression else {"most_predicted"})
    assert set(results["validation"]) == metrics | {"examples"} | check and set(results) == {"validation", "test"}
    about = {"mean"} if regression else {"class", "share"}
    assert set(results["validation"]["baseline"]) == metrics - {"loss"} | about

    model = AutoModelForSequenceClassification.from_pretrained(paths.trained)
    table = pd.read_csv(paths.predictions / "test.csv")
    assert list(table.columns[:len(text_columns) + 1]) == ["idx", *text_columns]
    if kind == "pair-2":
        assert model.config.id2label == {0: "no", 1: "yes"} and set(table["prediction"]) <= {"no", "yes"}
        [result] = pipeline("text-classification", model=str(paths.trained))(
            [{"text": "Who won the final?", "text_pair": "The team won the final."}])
        assert result["label"] in {"no", "yes"}
        for plot in ("confusion_matrix", "precision_recall", "roc"):  # two classes: PR and ROC of 'yes'
            assert (paths.eval_logs / f"plots/sklearn/validation/{plot}.json").is_file()
    elif kind == "single-3":
        assert model.config.id2label == {0: "negative", 1: "neutral", 2: "positive"}
        assert [c for c in table.columns if c.startswith("probability_")] == [
            "probability_negative", "probability_neutral", "probability_positive"]
        assert set(table["label"]) <= {"negative", "neutral", "positive"}
        [result] = pipeline("text-classification", model=str(paths.trained))(["The team was brilliant today."])
        assert result["label"] in {"negative", "neutral", "positive"}  # the real names, not LABEL_0
        cells = json.loads((paths.eval_logs / "plots/sklearn/validation/confusion_matrix.json").read_text())
        assert {c["actual"] for c in cells} <= {"negative", "neutral", "positive"}
        assert not (paths.eval_logs / "plots/sklearn/validation/roc.json").exists()  # ROC: two classes only
    else:
        assert model.config.num_labels == 1 and model.config.problem_type == "regression"
        assert table["label"].dtype == float and table["prediction"].dtype == float
        points = json.loads((paths.eval_logs / "plots/custom/validation/scatter.json").read_text())
        assert len(points["data"] if isinstance(points, dict) else points) == 12
        assert not (paths.eval_logs / "plots/sklearn").exists()

    # Predict: new rows in any order of lengths come back in their order, with names and probabilities.
    new = own_frame(kind, 9, 5).drop(columns=label_column).assign(note=range(9))
    scored = predict(write_own_file(new, project_root / "new.jsonl"), paths.trained, batch_size=4)
    assert scored["note"].tolist() == list(range(9))
    assert scored[text_columns[0]].tolist() == new[text_columns[0]].tolist()
    if kind == "single-3":
        probabilities = scored[[f"probability_{n}" for n in ("negative", "neutral", "positive")]].to_numpy()
        assert np.allclose(probabilities.sum(axis=1), 1, atol=1e-4)
        assert (scored["prediction"] == np.array(["negative", "neutral", "positive"])[probabilities.argmax(1)]).all()


def test_another_glue_task_by_name_trains_and_evaluates_its_metric(project_root, tiny_checkpoint, caplog):
    # data.config=stsb (`dvc exp run -S data.config=stsb`; the switch by -S itself: tests/test_pipeline_e2e.py, on own
    # files): a regression task of GLUE with no test split, its metrics in train.json and eval.json.
    import logging
    import shutil

    from finetune.paths import Paths

    def stsb(n, seed):
        df = make_split(n, seed).to_pandas()
        return df.assign(label=[round(float(i % 11) / 2, 1) for i in range(n)]).astype({"label": "float32"})

    glue = write_hub_folder(project_root / "glue", {"train": stsb(40, 0), "validation": stsb(15, 1)}, config="stsb")
    params = tiny_params(data={"dataset": str(glue), "config": "stsb", "local_copy": None},
                         evaluate={"splits": ["validation", "test"]})
    paths = Paths(project_root)
    assert download_dataset(params.data, paths.raw)["task"]["metric_config"] == "stsb"
    shutil.copytree(tiny_checkpoint, paths.pretrained)
    tokenize_splits(params, paths)
    metrics = train(params, paths)
    reset_accelerate()
    with caplog.at_level(logging.WARNING, logger="finetune.data.prepare"):
        evaluation = evaluate_model(params, paths)
    reset_accelerate()
    assert "No test split in the data (it has train, validation): skipped" in caplog.text
    assert "best_validation_pearson" in metrics
    assert list(evaluation) == ["validation"] and set(evaluation["validation"]) == {
        "loss", "pearson", "spearmanr", "examples", "baseline", "collapsed"}
    assert (paths.eval_logs / "plots/custom/validation/scatter.json").is_file()


def test_three_class_own_data_is_held_to_the_collapse_check(project_root, tiny_checkpoint, caplog):
    import logging
    import shutil

    from finetune.paths import Paths
    from finetune.tasks import Task
    from tests.helpers import save_collapsed_model

    for split, (n, seed) in {"train": (30, 0), "validation": (24, 1)}.items():
        write_own_file(own_frame("single-3", n, seed), project_root / f"data/own/{split}.csv")
    params = own_params({"train": "data/own/train.csv", "validation": "data/own/validation.csv"}, ["text"], "mood")
    paths = Paths(project_root)
    download_dataset(params.data, paths.raw)
    shutil.copytree(tiny_checkpoint, paths.pretrained)
    tokenize_splits(params, paths)
    save_collapsed_model(paths, Task.load(paths.raw), winner=1)  # 'neutral' for every row
    with caplog.at_level(logging.WARNING, logger="finetune.evaluate.collapse"):
        result = evaluate_model(params, paths)["validation"]

    counts = own_frame("single-3", 30, 0)["mood"].value_counts()
    majority = min(counts[counts == counts.max()].index)  # ties: the lowest id, the first name in sorted order
    share = float((own_frame("single-3", 24, 1)["mood"] == majority).mean())
    assert result["baseline"] == {"class": majority, "share": round(share, 4), "accuracy": round(share, 4),
                                  "macro_f1": round(2 * share / (1 + share) / 3, 4)}
    assert result["most_predicted"] == {"class": "neutral", "share": 1.0} and result["collapsed"] is True
    [warning] = [r.getMessage() for r in caplog.records if r.name == "finetune.evaluate.collapse"]
    assert warning.startswith("validation: the model looks collapsed (one class for nearly every row, or no better "
                              "than a constant model): it predicts 'neutral' for 100.0% of the rows; "
                              f"macro_f1 {result['macro_f1']:.4f} against {result['baseline']['macro_f1']:.4f} by "
                              f"always predicting train's majority class {majority!r} ({share:.1%} of the rows). Try ")


def test_a_null_split_in_data_files_is_no_split(project_root):
    # `dvc exp run -S data.files.test=null` drops the test file a merged -S mapping keeps (tests/test_params.py).
    for split, seed in (("train", 0), ("validation", 1)):
        write_own_file(own_frame("pair-2", 20, seed), project_root / f"data/own/{split}.csv")
    files = {"train": "data/own/train.csv", "validation": "data/own/validation.csv", "test": None}
    record = download_dataset(own_params(files, ["question", "answer"], "verdict").data, project_root / "data/raw")
    assert list(load_from_disk(str(project_root / "data/raw"))) == ["train", "validation"]
    assert set(record["splits"]) == {"train", "validation"}


def test_metric_for_best_of_another_task_stops_train_with_the_choices(tiny_project):
    params = tiny_params(train={"metric_for_best": "pearson"})
    with pytest.raises(ParamsError, match=r"params.yaml: train.metric_for_best: 'pearson' is not a metric of task "
                                          r"'mrpc'; choose one of \['loss', 'f1', 'accuracy'\]"):
        train(params, tiny_project(params=params))


def test_predict_names_a_missing_column(finetuned_mrpc, tmp_path):
    from finetune.errors import DataError

    file = write_own_file(pd.DataFrame({"sentence1": ["A man sings."], "sentense2": ["A man is singing."]}),
                          tmp_path / "new.csv")
    with pytest.raises(DataError, match=r"new.csv: lacks column\(s\) \['sentence2'\] that the model reads; has "
                                        r"\['sentence1', 'sentense2'\]"):
        predict(file, finetuned_mrpc)


@pytest.fixture(scope="module")
def finetuned_mrpc(tiny_finetuned):
    return tiny_finetuned


def test_predict_command_writes_the_csv(finetuned_mrpc, tmp_path, caplog):
    # The command's main, in this process (its argv, its log): `python -m tools.predict` adds only the start.
    from tools.predict import main as predict_main

    rows = pd.DataFrame({"sentence1": ["The court rejected the appeal.", "Police arrested two men."],
                         "sentence2": ["The appeal was rejected.", "The team won the final."]})
    file = write_own_file(rows, tmp_path / "pairs.tsv")
    with caplog.at_level("INFO"):
        predict_main([str(file), "--model", str(finetuned_mrpc), "--out", str(tmp_path / "scored.csv")])
    out = caplog.text
    scored = pd.read_csv(tmp_path / "scored.csv")
    assert list(scored.columns) == ["sentence1", "sentence2", "prediction", "probability_not_equivalent",
                                    "probability_equivalent"]
    assert "Wrote 2 predictions" in out
    with pytest.raises(SystemExit) as exited:  # the command's error path, in this process: one line, no traceback
        predict_main([str(tmp_path / "missing.csv"), "--model", str(finetuned_mrpc)])
    assert str(exited.value).startswith("ERROR: ") and "missing.csv: split 'input': file not found" in str(exited.value)
