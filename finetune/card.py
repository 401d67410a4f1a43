"""The model card of models/finetuned (README.md): a YAML header of huggingface_hub's ``ModelCardData`` (base model,
dataset, license, metrics, metrics/eval.json as ``model-index`` results) and a body from the Jinja template
finetune/model_card.md.j2 (task, usage, evaluation and collapse check, params, validation table, hardware, git
commit and dvc.lock's hashes of the upstream outputs), and the model folder written with it. dvc.lock is read, not
declared as a dependency: ``dvc repro`` has written the upstream stages' entries when the card stage starts, and the
card says when the lock does not match the metrics files read."""

from __future__ import annotations

import csv
import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

from huggingface_hub import EvalResult, ModelCard, ModelCardData
from ruamel.yaml import YAMLError

from finetune.checkpoint_files import check_checkpoint_files
from finetune.errors import PipelineError
from finetune.evaluate.collapse import describe_constant
from finetune.params import DataParams, Params
from finetune.paths import EVALUATION_LOGS, Paths
from finetune.runtime import atomic_dir, markdown_table, yaml_reader
from finetune.tasks import GLUE_DATASETS, Task

CARD_TEMPLATE = Path(__file__).with_name("model_card.md.j2")
UPSTREAM_STAGES = ("download", "tokenize", "collate-check", "train", "evaluate")  # dvc.yaml's, in order
# What a run itself writes into git's view (DVC adds its outputs to the .gitignore files too): not a change of code.
PIPELINE_WRITES = ("dvc.lock", "metrics/", "dvclive/")

# The licenses of the base checkpoints this project names (their Hub cards); a card of another checkpoint has none.
KNOWN_LICENSES = {
    "sentence-transformers/all-MiniLM-L6-v2": "apache-2.0",
    "sentence-transformers/all-mpnet-base-v2": "apache-2.0",
    "bert-base-uncased": "apache-2.0",
    "google-bert/bert-base-uncased": "apache-2.0",
}

# Each GLUE task: the question the model answers, and the text it was trained on (the GLUE paper, Wang et al. 2018).
GLUE_ABOUT = {
    "cola": ("is the sentence grammatically acceptable English?", "sentences from books and articles on linguistics"),
    "sst2": ("is the sentence from a movie review positive or negative?", "sentences of movie reviews"),
    "mrpc": ("is sentence 2 a paraphrase of sentence 1?", "English sentence pairs from online news"),
    "qqp": ("are the two questions duplicates?", "question pairs from Quora"),
    "stsb": ("how similar in meaning are the two sentences, from 0 to 5?",
             "sentence pairs from news headlines, image and video captions and forums"),
    "mnli": ("does the premise entail the hypothesis, contradict it, or neither?",
             "sentence pairs from ten genres of written and spoken English"),
    "qnli": ("does the sentence answer the question?", "question and sentence pairs from Wikipedia (SQuAD)"),
    "rte": ("does sentence 1 entail sentence 2?", "sentence pairs from news and Wikipedia"),
    "wnli": ("does sentence 2 follow from sentence 1, its pronoun resolved?", "Winograd schema sentences from fiction"),
}


def read_json(path: Path) -> dict:
    """The JSON object in ``path``.

    Raises:
        PipelineError: ``path`` does not exist (a stage before the card stage has not run).
    """
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise PipelineError(f"{path}: not found; run the stages before the card stage first (dvc repro)") from None


def dataset_id(data: DataParams) -> str | None:
    """The dataset's Hub id (GLUE as ``nyu-mll/glue``) or folder as params.yaml names it; None for own files."""
    return GLUE_DATASETS[0] if data.dataset in GLUE_DATASETS else data.dataset


def dataset_fields(data: DataParams, dataset: dict, split: str) -> dict:
    """The dataset fields of an ``EvalResult`` of ``split`` (``dataset``: metrics/provenance.json's dataset record): for
    a Hub dataset or folder ``dataset_type`` (its id or folder), ``dataset_name``, ``dataset_config`` and
    ``dataset_revision`` (the Hub revision; None for a folder); for own files the split's file (train's when
    validation was carved from it) as ``dataset_type`` and its sha256 as ``dataset_revision``."""
    if data.files is not None:
        file = data.files.get(split, data.files["train"])
        carved = " (carved from train)" if split not in data.files else ""
        return {"dataset_type": file, "dataset_name": f"own data: {file}{carved}",
                "dataset_revision": dataset["files"].get(os.path.normpath(file))}
    name = f"GLUE {data.config.upper()}" if data.glue_task else f"{data.dataset} {data.config}"
    return {"dataset_type": dataset_id(data), "dataset_name": name, "dataset_config": data.config,
            "dataset_revision": dataset.get("revision")}


def has_metrics(scores: dict) -> bool:
    """Whether a split of metrics/eval.json has metrics (an unlabeled split has only ``examples``)."""
    return "collapsed" in scores


def eval_results(params: Params, task: Task, evaluation: dict, dataset: dict) -> list[EvalResult]:
    """One ``EvalResult`` per labeled split of ``evaluation`` (metrics/eval.json) and metric of ``task``, in that
    order; ``dataset`` is metrics/provenance.json's dataset record (``dataset_fields``)."""
    return [EvalResult(task_type="text-classification", task_name="Text Classification", metric_type=metric,
                       metric_name=metric, metric_value=scores[metric], dataset_split=split,
                       **dataset_fields(params.data, dataset, split))
            for split, scores in evaluation.items() if has_metrics(scores) for metric in task.metrics]


def card_data(params: Params, task: Task, evaluation: dict, dataset: dict) -> ModelCardData:
    """The card's YAML header: base model, dataset, license (``KNOWN_LICENSES``, else none), language ``en`` for
    GLUE (none for own data), the task's metrics and ``eval_results``."""
    checkpoint, data = params.model.checkpoint, params.data
    glue = data.glue_task is not None
    return ModelCardData(
        model_name=f"{Path(checkpoint).name}-{task.name}", base_model=checkpoint,
        license=KNOWN_LICENSES.get(checkpoint), language="en" if glue else None,
        datasets=[dataset_id(data)] if data.files is None else None, metrics=list(task.metrics),
        library_name="transformers", pipeline_tag="text-classification",
        tags=["text-classification", *(["glue", task.name] if glue else []), "dvc", "accelerate"],
        eval_results=eval_results(params, task, evaluation, dataset) or None)


def evaluation_table(task: Task, evaluation: dict) -> str:
    """metrics/eval.json as a Markdown table: a row per split with its examples, the task's metrics, loss, the
    constant baseline's main metric, the most predicted class and the collapse check."""
    main = task.metrics[0]
    header = ["split", "examples", *task.metrics, "loss", f"constant baseline ({main})", "most predicted", "collapsed"]
    rows = []
    for split, s in evaluation.items():
        if not has_metrics(s):
            rows.append([split, s["examples"], *["—"] * (len(header) - 3), "no labels"])
            continue
        most = s.get("most_predicted")  # none for regression
        most = f"{most['class']} ({most['share']:.1%})" if most else "—"
        rows.append([split, s["examples"], *(s[m] for m in task.metrics), s["loss"], s["baseline"][main], most,
                     "**yes**" if s["collapsed"] else "no"])
    return markdown_table(header, rows)


def collapse_notes(task: Task, evaluation: dict) -> list[dict]:
    """Per labeled split of metrics/eval.json, ``{"split", "text", "collapsed"}``: the model's main metric
    against the constant baseline's (``finetune.evaluate.collapse``) in words."""
    main, notes = task.metrics[0], []
    for split, s in evaluation.items():
        if not has_metrics(s):
            continue
        base, most = s["baseline"], s.get("most_predicted")
        text = f"{main} {s[main]} against {base[main]} for always predicting {describe_constant(base)}"
        if most:
            text += f"; the model predicts '{most['class']}' for {most['share']:.1%} of the rows"
        notes.append({"split": split, "text": text, "collapsed": bool(s["collapsed"])})
    return notes


def params_table(params: Params) -> str:
    """The run's params as a Markdown table ``param | value`` (``section.key``): every key of every section
    except the ``data`` keys that are null."""
    rows = []
    for section, values in params.model_dump().items():
        for key, value in values.items():
            if section != "data" or value is not None:
                rows.append([f"`{section}.{key}`", f"`{json.dumps(value)}`"])
    return markdown_table(["param", "value"], rows)


def training_table(train_logs: Path, train: dict) -> str | None:
    """The train stage's evaluation log as a Markdown table: a row per evaluation with the point, (the epoch,) train
    loss, validation loss, the validation metrics (4 decimals) and a kept mark (``train``: metrics/train.json's
    ``best_step`` or ``best_epoch``); None when there is no log. The log is DVCLive's
    ``<train_logs>/<EVALUATION_LOGS[...]>/plots/metrics/<name>.tsv`` (columns ``step``, the epoch or optimizer step,
    and ``<name>``), by step when that folder exists, else by epoch."""
    by_step = (train_logs / EVALUATION_LOGS["step"]).is_dir()
    folder = train_logs / EVALUATION_LOGS["step" if by_step else "epoch"]
    kept = train.get("best_step" if by_step else "best_epoch")
    columns: dict[str, dict[int, float]] = {}
    for tsv in sorted((folder / "plots" / "metrics").rglob("*.tsv")):
        name = tsv.relative_to(folder / "plots" / "metrics").with_suffix("").as_posix()  # e.g. validation/f1
        with tsv.open(newline="") as f:
            columns[name] = {int(row["step"]): float(row[tsv.stem]) for row in csv.DictReader(f, delimiter="\t")}
    if not columns:
        return None
    names = sorted(columns, key=lambda n: (n != "epoch", not n.startswith("train/"), n != "validation/loss", n))
    points = sorted({point for values in columns.values() for point in values})
    cell = lambda n, v: f"{v:.0f}" if n == "epoch" else f"{v:.4f}"  # noqa: E731
    rows = [[point, *(cell(n, columns[n][point]) if point in columns[n] else "—" for n in names),
             "✓" if point == kept else ""] for point in points]
    return markdown_table(["step" if by_step else "epoch", *(n.replace("/", " ") for n in names), "kept"], rows)


def md5_file(path: Path) -> str:
    """The md5 hex digest of ``path``'s bytes (what dvc.lock records for a file output, DVC 3)."""
    return hashlib.md5(path.read_bytes()).hexdigest()


def lock_hashes(root: Path) -> tuple[str | None, str]:
    """The outputs of ``UPSTREAM_STAGES`` in ``root/dvc.lock`` as a Markdown table (stage, output, md5; a folder's
    md5 ends in ``.dir``), and a sentence on whether dvc.lock's md5 of each metrics file matches the file read;
    ``(None, why)`` when dvc.lock is missing, unreadable or lacks a stage."""
    lock_file = root / "dvc.lock"
    try:
        stages = (yaml_reader().load(lock_file.read_text()) or {}).get("stages") or {}
    except FileNotFoundError:
        return None, "There is no dvc.lock: the card stage ran outside `dvc repro`, so no DVC hashes are recorded."
    except YAMLError as err:
        return None, f"dvc.lock could not be read ({str(err).splitlines()[0]}), so no DVC hashes are recorded."
    missing = [stage for stage in UPSTREAM_STAGES if stage not in stages]
    if missing:
        return None, f"dvc.lock has no entry for {', '.join(missing)}: no DVC hashes are recorded."
    rows, differ = [], []
    for stage in UPSTREAM_STAGES:
        for out in stages[stage].get("outs", []):
            rows.append([stage, f"`{out['path']}`", f"`{out.get('md5', '—')}`"])
            file = root / out["path"]
            if out["path"].startswith("metrics/") and file.is_file() and out.get("md5") != md5_file(file):
                differ.append(out["path"])
    note = (f"dvc.lock's md5 of {', '.join(differ)} differs from the file read: these hashes are of another run "
            "(write the card with `dvc repro`)." if differ else
            "dvc.lock's md5 of the metrics files matches the files the card was written from.")
    return markdown_table(["stage", "output", "md5"], rows), note


def git_state(root: Path) -> dict:
    """The commit the run's code came from and the files changed since: ``{"commit": <HEAD's sha, or "unknown">,
    "changed": [paths]}``; ``changed`` lists uncommitted and untracked paths except ``PIPELINE_WRITES`` and
    .gitignore files, and is None when git or a repository is not there."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, check=True).stdout

    try:
        commit, status = git("rev-parse", "HEAD").strip(), git("status", "--porcelain")
    except (OSError, subprocess.CalledProcessError):
        return {"commit": "unknown", "changed": None}
    changed = [path for path in (line[3:] for line in status.splitlines())
               if not path.startswith(PIPELINE_WRITES) and Path(path).name != ".gitignore"]
    return {"commit": commit, "changed": changed}


def model_card(params: Params, paths: Paths) -> ModelCard:
    """The card of ``paths.trained`` (header ``card_data``, body ``CARD_TEMPLATE``), from metrics/eval.json,
    train.json and provenance.json, DVCLive's log, dvc.lock and git (all under ``paths.root``).

    Raises:
        CheckpointError: ``paths.trained`` lacks config, weights or tokenizer, or task.json.
        PipelineError: a metrics file is missing (a stage before has not run).
    """
    check_checkpoint_files(paths.trained)
    task = Task.load(paths.trained)
    evaluation, train = read_json(paths.metrics / "eval.json"), read_json(paths.metrics / "train.json")
    provenance = read_json(paths.metrics / "provenance.json")
    dataset, checkpoint = provenance["dataset"], provenance["checkpoint"]
    lock_table, lock_note = lock_hashes(paths.root)
    tokenizer_config = paths.trained / "tokenizer_config.json"  # the truncation training used: its model_max_length
    max_length = (json.loads(tokenizer_config.read_text()).get("model_max_length") if tokenizer_config.is_file()
                  else None) or params.tokenize.max_length
    question, source = GLUE_ABOUT.get(params.data.glue_task or "", (None, None))
    context = {
        "params": params, "task": task, "glue": params.data.glue_task, "question": question, "source": source,
        "train_rows": dataset["splits"]["train"]["rows"], "max_length": max_length,
        "evaluation_table": evaluation_table(task, evaluation), "collapse_notes": collapse_notes(task, evaluation),
        "training_table": training_table(paths.train_logs, train), "train": train,
        "params_table": params_table(params), "git": git_state(paths.root),
        "lock_table": lock_table, "lock_note": lock_note, "dataset": dataset, "checkpoint": checkpoint,
        "dataset_files": markdown_table(["file", "sha256"], [[f"`{f}`", f"`{h}`"]
                                                             for f, h in dataset["files"].items()]),
        "weights": {f: h for f, h in checkpoint["files"].items() if f.endswith((".safetensors", ".bin"))},
    }
    return ModelCard.from_template(card_data(params, task, evaluation, dataset), template_path=str(CARD_TEMPLATE),
                                   **context)


def write_model_folder(trained: Path, out: Path, card: ModelCard) -> None:
    """Write ``out``: a copy of the model folder ``trained`` with ``card`` as README.md, atomically (on an
    error ``out`` is left as it was)."""
    with atomic_dir(out) as tmp:
        shutil.copytree(trained, tmp, dirs_exist_ok=True)
        card.save(tmp / "README.md")
