"""End to end: the real dvc.yaml in a temp git repo, tiny params, `dvc repro`, `dvc exp run`, `dvc exp show`. (The
report comparing two commits: the pull-request workflow in tests/test_team.py.)

Stages run as `python -m stages.<name>` exactly as for a user; the venv's bin folder goes first on PATH so
`python` and `dvc` are this interpreter's.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from huggingface_hub import ModelCard

from tests.helpers import (
    dvc,
    exp_show,
    make_project,
    own_frame,
    python,
    run,
    squeeze,
    tiny_params,
    write_own_file,
)

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def project(tmp_path_factory, hub_layout_dataset, tiny_checkpoint) -> Path:
    """A git repo holding the project's code with tiny params: the tiny local dataset and checkpoint, 3 steps."""
    params = tiny_params(data={"dataset": str(hub_layout_dataset), "local_copy": None},
                         model={"checkpoint": str(tiny_checkpoint)},
                         train={"max_steps": 3, "epochs": 1, "accelerate_config": "configs/accelerate/default.yaml"},
                         evaluate={"splits": ["validation", "test"]})
    root = make_project(tmp_path_factory.mktemp("e2e") / "project", params, code=True).root
    for cmd in (["git", "init", "-q", "-b", "main"], ["git", "add", "-A"], ["git", "commit", "-qm", "project"]):
        run(cmd, root)
    return root


def lr_of(data: dict) -> float:
    return float(data["params"]["params.yaml"]["data"]["train"]["lr"])


# The tests below run in order on one project: repro, then experiments from the baseline's commit.

def test_repro_runs_every_stage_then_nothing(project):
    root = project
    out = run(dvc("repro"), root)
    for stage in ("download", "tokenize", "collate-check", "train", "evaluate", "card", "export"):
        assert f"Running stage '{stage}'" in out
    for path in ("data/raw", "data/tokenized", "data/predictions/validation.csv", "data/predictions/test.csv",
                 "models/pretrained/config.json", "models/trained/model.safetensors",
                 "models/finetuned/model.safetensors", "dvc.lock"):
        assert (root / path).exists(), path
    metrics = json.loads((root / "metrics/eval.json").read_text())
    assert set(metrics) == {"validation", "test"}
    # The card stage's model card: eval.json's numbers as model-index results, this commit, dvc.lock's hashes.
    card = ModelCard.load(root / "models/finetuned/README.md")
    assert {(r.dataset_split, r.metric_type): r.metric_value for r in card.data.eval_results} == {
        (split, metric): metrics[split][metric] for split in metrics for metric in ("f1", "accuracy")}
    assert card.data.base_model == yaml.safe_load((root / "params.yaml").read_text())["model"]["checkpoint"]
    assert f"git commit `{run(['git', 'rev-parse', 'HEAD'], root).strip()}`" in card.text
    assert "no uncommitted changes" in card.text  # the pipeline's own writes (dvc.lock, metrics, .gitignore) are not
    assert "dvc.lock's md5 of the metrics files matches the files the card was written from" in card.text
    assert 0 <= metrics["validation"]["accuracy"] <= 1 and 0 <= metrics["validation"]["f1"] <= 1
    train = json.loads((root / "metrics/train.json").read_text())
    assert train["steps"] == 3 and train["parameters"] > 0 and train["peak_memory_mb"] > 0 and train["wall_seconds"] > 0
    assert train["mixed_precision"] == "no" and train["device"].startswith("cpu: ")  # the hardware, stated
    assert train["numerics"]["precision"] == "no" and train["numerics"]["matmul"].endswith("(MKL sgemm)")
    assert "collapsed_epochs" in train["collapse"]
    provenance = json.loads((root / "metrics/provenance.json").read_text())
    assert provenance["dataset"]["kind"] == "local" and provenance["dataset"]["splits"]["train"]["rows"] == 40
    # DVC outputs are git-ignored; metrics and DVCLive plot data are not.
    ignored = run(["git", "status", "--porcelain", "--ignored"], root)
    assert "!! data/raw" in ignored and "!! models/trained" in ignored and "!! models/finetuned" in ignored
    untracked = run(["git", "status", "--porcelain", "-uall"], root)
    assert "metrics/eval.json" in untracked and "dvclive/train/steps/plots/metrics/train/loss.tsv" in untracked

    # Nothing changed: status is clean and a second repro runs no stage.
    assert "up to date" in run(dvc("status"), root)
    assert "Running stage" not in run(dvc("repro"), root)
    run(["git", "add", "-A"], root)
    run(["git", "commit", "-qm", "baseline run"], root)


NEW_FORM = '''"""A served form added as docs/serving.md says: the onnx-fp32 file, copied."""

import shutil

from finetune.export.make import MakeJob


def make_onnx_copy(job: MakeJob) -> dict:
    shutil.copy(job.base / "model.onnx", job.folder / "model.onnx")
    return {}
'''


def stages_to_rerun(root: Path) -> set[str]:
    """The stages ``dvc status`` finds changed (their own deps or params, not those of the stages before them)."""
    return set(json.loads(run(dvc("status", "--json"), root)))


def test_a_new_form_reruns_only_export_and_an_edit_of_evaluate_plots_never_train(project):
    root = project
    fingerprint = python("-c", "from finetune.code import code_digest; print(code_digest('stages.train'))")
    before = run(fingerprint, root)
    registry = root / "finetune/export/registry.py"
    original = registry.read_text()
    (root / "finetune/export/onnx_copy.py").write_text(NEW_FORM)
    imported = original.replace("\nfrom finetune.inference", "\nfrom finetune.export.onnx_copy import make_onnx_copy"
                                "\nfrom finetune.inference", 1)
    entry = '    Form("onnx-copy", make_onnx_copy, OnnxClassifier, lossy=False, loaded_with="-", base="onnx-fp32"),\n'
    registered = imported.replace("\n)}\n", f"\n{entry})}}\n", 1)
    assert original != imported != registered  # both edits found their place
    registry.write_text(registered)
    try:
        assert stages_to_rerun(root) == {"export"}
        assert run(fingerprint, root) == before  # a training checkpoint still resumes
    finally:
        registry.write_text(original)
        (root / "finetune/export/onnx_copy.py").unlink()
    plots = root / "finetune/evaluate/plots.py"  # the evaluate stage's plots
    original = plots.read_text()
    plots.write_text(original + "\n# an edit of the evaluate stage's plots\n")
    try:
        assert stages_to_rerun(root) == {"evaluate"}
    finally:
        plots.write_text(original)
    assert "up to date" in run(dvc("status"), root)


def test_dvclive_logs_one_row_per_logged_step_and_epoch(project):
    root = project
    steps = (root / "dvclive/train/steps/plots/metrics/train/loss.tsv").read_text().splitlines()
    assert steps[0].split("\t")[-2:] == ["step", "loss"]
    assert [int(line.split("\t")[-2]) for line in steps[1:]] == [2, 3]  # log_every 2, and the last of 3 steps
    epochs = (root / "dvclive/train/epochs/plots/metrics/validation/f1.tsv").read_text().splitlines()
    trained_epochs = json.loads((root / "metrics/train.json").read_text())["epochs"]
    assert [int(line.split("\t")[0]) for line in epochs[1:]] == list(range(1, trained_epochs + 1))
    for split in ("validation", "test"):
        for plot in ("confusion_matrix", "precision_recall", "roc"):
            assert json.loads((root / f"dvclive/evaluate/plots/sklearn/{split}/{plot}.json").read_text())
    # No dvc.yaml inside a stage's outputs: dvc.yaml at the root is the only one.
    assert not list((root / "dvclive").rglob("dvc.yaml"))


def test_plots_show_renders_every_declared_plot(project):
    root = project
    run(dvc("plots", "show"), root)
    html = (root / "dvc_plots/index.html").read_text()
    declared = [next(iter(p)) for p in yaml.safe_load((root / "dvc.yaml").read_text())["plots"]]
    assert len(declared) >= 8
    for plot_id in declared:  # the regression scatter too: MRPC has no data for it, and that breaks nothing
        if "/" in plot_id and not (root / plot_id).exists():
            continue  # a folder of plots (one per metric) that this run has none of: evaluations by step
        assert plot_id in html, plot_id
    shutil.rmtree(root / "dvc_plots")


def test_exp_run_shows_in_exp_show(project):
    # (Queued experiments, run two at a time, each rerunning the export stage alone: tests/test_team.py.)
    root = project
    # Changing train params reruns train, evaluate, card and export only; several -S at once, `no` read as a string.
    # Validation every 2 of the 3 optimizer steps: at steps 2 and 3, logged by step (dvclive/train/evaluations).
    # The tiny params make no served form; a list by -S asks for two, and export.json is a metric.
    exp = run(dvc("exp", "run", "-S", "train.lr=3e-4", "-S", "train.warmup_steps=1", "-S", "train.warmup_ratio=0",
                  "-S", "train.mixed_precision=no", "-S", "train.eval_every_steps=2",
                  "-S", "export.forms=[onnx-fp32,onnx-int8]", "--name", "lr-3e-4"), root)
    assert "Running stage 'train'" in exp and "Running stage 'evaluate'" in exp and "Running stage 'card'" in exp
    assert "Running stage 'tokenize'" not in exp and "Running stage 'download'" not in exp
    f1 = (root / "dvclive/train/evaluations/plots/metrics/validation/f1.tsv").read_text().splitlines()
    assert [int(line.split("\t")[0]) for line in f1[1:]] == [2, 3]
    assert "| step | epoch | train loss |" in squeeze((root / "models/finetuned/README.md").read_text())

    runs = exp_show(root)
    assert "lr-3e-4" in runs and runs["lr-3e-4"]["params"]["params.yaml"]["data"]["train"]["mixed_precision"] == "no"
    train_json = runs["lr-3e-4"]["metrics"]["metrics/train.json"]["data"]
    assert (train_json["evaluations"], train_json["best_step"] in (2, 3)) == (2, True)
    assert {1e-3, 3e-4} <= {lr_of(data) for data in runs.values()}
    export = runs["lr-3e-4"]["metrics"]["metrics/export.json"]["data"]
    assert set(export) == {"pytorch", "onnx-fp32", "onnx-int8", "fastest_at_parity"}
    assert export["onnx-fp32"]["validation"]["agreement"] == 1.0
    for name, data in runs.items():
        assert set(data["metrics"]) >= {"metrics/eval.json", "metrics/train.json"}, name
        assert "f1" in data["metrics"]["metrics/eval.json"]["data"]["validation"], name
        assert list(data["params"]) == ["params.yaml"], name  # DVCLive's own params.yaml is not a second column set
    run(["git", "checkout", "--", "."], root)
    run(dvc("checkout"), root)


def test_bad_param_stops_the_stage_with_one_message(project):
    # The train stage checks params.yaml first: the message, no traceback, a failed experiment.
    root = project
    out = run(dvc("exp", "run", "-S", "train.lr=-1"), root, ok=False)
    assert "params.yaml: train.lr: Input should be greater than 0 (got -1)" in out
    assert "Traceback" not in out and "CalledProcessError" not in out
    run(["git", "checkout", "--", "params.yaml"], root)


def test_exp_run_switches_own_files_with_set_param_only(project):
    # From the GLUE task, the user's own CSV (one text column, three string labels, no validation and no test file) by
    # -S alone. -S merges a mapping into params.yaml's: with data.files already listing three splits (as after a run on
    # other own files), `-S data.files={train: ...}` keeps their validation and test entries, and
    # data.files.<split>=null drops one. (Own pair files with a test split: tests/test_tasks.py.)
    root = project
    write_own_file(own_frame("single-3", 48, 0), root / "data/own/b/reviews.csv")
    run(["git", "add", "data/own"], root)
    run(["git", "commit", "-qm", "own file b"], root)
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["data"]["files"] = {"train": "data/own/a/train.csv", "validation": "data/own/a/dev.csv",
                               "test": "data/own/a/test.csv"}
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))

    out = run(dvc("exp", "run", "--name", "own-b", "-S", "data.dataset=null", "-S", "data.config=null", "-S",
                  "data.files={train: data/own/b/reviews.csv}", "-S",
                  "data.files.validation=null", "-S", "data.files.test=null", "-S", "data.text_columns=[text]", "-S",
                  "data.label_column=mood"), root)
    assert "No test split in the data" in out
    assert yaml.safe_load((root / "params.yaml").read_text())["data"]["files"] == {
        "train": "data/own/b/reviews.csv", "validation": None, "test": None}
    evaluation = json.loads((root / "metrics/eval.json").read_text())
    assert list(evaluation) == ["validation"] and set(evaluation["validation"]) == {
        "loss", "accuracy", "macro_f1", "examples", "baseline", "most_predicted", "collapsed"}
    assert set(evaluation["validation"]["baseline"]) == {"class", "share", "accuracy", "macro_f1"}
    provenance = json.loads((root / "metrics/provenance.json").read_text())["dataset"]
    assert set(provenance["splits"]) == {"train", "validation"} and provenance["validation_carved"]["rows"] == 5
    assert provenance["task"]["label_names"] == ["negative", "neutral", "positive"]
    predictions = (root / "data/predictions/validation.csv").read_text().splitlines()
    assert predictions[0] == "idx,text,label,prediction,probability_negative,probability_neutral,probability_positive"
    shown = exp_show(root)["own-b"]["metrics"]["metrics/eval.json"]["data"]["validation"]
    assert "macro_f1" in shown and shown["baseline"] == evaluation["validation"]["baseline"]
    run(["git", "checkout", "--", "."], root)
    run(dvc("checkout"), root)
