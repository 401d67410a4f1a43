"""The test toolkit: tiny data, a tiny random BERT with the real tokenizer, a tiny random model of each encoder
family with a tokenizer of its class trained on MRPC, tiny params taken from params.yaml, a tiny-project builder, a
Hub-layout writer and one subprocess runner. Fixtures in conftest.py wrap them."""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from datasets import ClassLabel, Dataset, DatasetDict, Features, Value

from finetune.params import Params, validate_params
from finetune.paths import Paths
from tests.machines import free_port  # noqa: F401  (a helper of the tests; kept light for the launcher stand-in)

if TYPE_CHECKING:
    import pandas as pd

REPO = Path(__file__).resolve().parents[1]

# What a clone holds that the pipeline needs to run (everything else is generated).
PROJECT_CODE = ["stages", "finetune", "tools", "configs", "dvc.yaml", ".dvcignore", ".gitignore", ".dvc/config",
                ".dvc/.gitignore", ".dvc/plots", "data/own/README.md", "models/own/README.md"]

# The tiny settings on top of params.yaml: a few fast steps of a 2-layer model, fp32, last epoch kept. Any key not
# named here (a new param too) comes from params.yaml.
TINY = {
    "tokenize": {"max_length": 128},
    "train": {"seed": 7, "epochs": 2, "batch_size": 8, "lr": 1e-3, "max_grad_norm": 1.0, "scheduler": "linear",
              "warmup_steps": 2, "warmup_ratio": 0.0, "keep_best": False, "mixed_precision": "no", "log_every": 2,
              "group_by_length": False, "adamw_impl": "default",
              "accelerate_config": str(REPO / "configs/accelerate/default.yaml")},
    "evaluate": {"batch_size": 8, "sort_by_length": False},
    "export": {"forms": []},  # each served form costs a repro seconds; tests/test_export.py and one e2e test make them
}

FEATURES = Features({
    "sentence1": Value("string"),
    "sentence2": Value("string"),
    "label": ClassLabel(names=["not_equivalent", "equivalent"]),
    "idx": Value("int32"),
})
SUBJECTS = ["The company", "The minister", "Shares of the bank", "The court", "Police", "The team", "Analysts",
            "The city"]
EVENTS = ["reported higher profits on Tuesday", "rejected the appeal last week", "fell sharply after the announcement",
          "said the plan would cost millions", "arrested two men near the station", "won the final in extra time"]


def make_split(n: int, seed: int, labeled: bool = True) -> Dataset:
    """``n`` sentence pairs: label 1 rephrases the same fact, label 0 pairs two different facts."""
    rng = random.Random(seed)
    rows = {"sentence1": [], "sentence2": [], "label": [], "idx": []}
    for i in range(n):
        subject, event = rng.choice(SUBJECTS), rng.choice(EVENTS)
        label = int(rng.random() < 0.6)
        other = event if label else rng.choice([e for e in EVENTS if e != event])
        rows["sentence1"].append(f"{subject} {event}.")
        rows["sentence2"].append(f"According to officials, {subject.lower()} {other}." if i % 3
                                 else f"{subject} {other}!")
        rows["label"].append(label if labeled else -1)
        rows["idx"].append(i)
    features = FEATURES if labeled else Features({**FEATURES, "label": Value("int64")})
    return Dataset.from_dict(rows, features=features)


LONG_TAIL = ("and the statement was read out to reporters waiting outside the building late on Wednesday evening, "
             "a spokesman said.")


def lengthened(raw: DatasetDict) -> DatasetDict:
    """``raw`` with ``LONG_TAIL`` added to the second text of every other row: those pairs run past 32 tokens."""
    def longer(row: dict, i: int) -> dict:
        return {"sentence2": f"{row['sentence2'][:-1]}, {LONG_TAIL}" if i % 2 else row["sentence2"]}

    return DatasetDict({split: ds.map(longer, with_indices=True) for split, ds in raw.items()})


def make_raw(train: int = 40, validation: int = 21, test: int = 19, seed: int = 0) -> DatasetDict:
    """A tiny MRPC-like dataset: splits of the given sizes."""
    return DatasetDict({"train": make_split(train, seed), "validation": make_split(validation, seed + 1),
                        "test": make_split(test, seed + 2)})


def make_checkpoint(folder: Path, tokenizer, **config) -> Path:
    """A random 2-layer BERT (hidden 32, no head) saved with the real tokenizer into ``folder``, like a Hub checkpoint.

    ``config``: BertConfig overrides (e.g. ``hidden_dropout_prob=0.0``).
    """
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    settings = dict(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                    intermediate_size=64, max_position_embeddings=512)
    BertModel(BertConfig(**{**settings, **config})).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def byte_level_bpe(first: str, last: str, **special_tokens: str):
    """An untrained byte-level BPE tokenizer (``PreTrainedTokenizerFast``, GPT-2's pre-tokenizer, no
    ``token_type_ids``) that frames a text as ``first A last`` and a pair as ``first A last B last``, with
    ``special_tokens`` (``cls_token="[CLS]"``, ...): the layout of ModernBERT's tokenizer (``[CLS]``, ``[SEP]``) and
    of EuroBERT's (Llama 3's ``<|begin_of_text|>``, ``<|end_of_text|>``), whose files are on the Hub only."""
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{first} $A {last}", pair=f"{first} $A {last} $B:1 {last}:1", special_tokens=[(first, 0), (last, 1)])
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, model_input_names=["input_ids",
                                                                                               "attention_mask"],
                                                **special_tokens)


# The encoder families that work: per model type, the tokenizer's class (trained here on MRPC sentences, from the
# class's empty pipeline or from ``base``, where the family's own files are on the Hub only) and the config settings
# a family names its own way, on top of TINY_ENCODER. docs/any-task.md and the README list these model types.
FAMILIES = {
    "bert": {"tokenizer": "BertTokenizer", "config": {}},
    "roberta": {"tokenizer": "RobertaTokenizer", "config": {}},
    "distilbert": {"tokenizer": "DistilBertTokenizer", "config": {"hidden_dim": 64}},
    "electra": {"tokenizer": "ElectraTokenizer", "config": {"embedding_size": 16}},  # projected to hidden_size
    "deberta-v2": {"tokenizer": "DebertaV2Tokenizer",  # relative attention as in DeBERTa-v3
                   "config": {"relative_attention": True, "position_buckets": 16, "pos_att_type": ["p2c", "c2p"],
                              "norm_rel_ebd": "layer_norm"}},
    "mpnet": {"tokenizer": "MPNetTokenizer", "config": {}},
    "modernbert": {"tokenizer": "PreTrainedTokenizerFast", "config": {},  # a full and a sliding-window layer
                   "base": lambda: byte_level_bpe("[CLS]", "[SEP]", cls_token="[CLS]", sep_token="[SEP]",
                                                  pad_token="[PAD]", mask_token="[MASK]", unk_token="[UNK]")},
    "eurobert": {"tokenizer": "PreTrainedTokenizerFast", "config": {"num_key_value_heads": 2, "head_dim": 16},
                 "base": lambda: byte_level_bpe("<|begin_of_text|>", "<|end_of_text|>", bos_token="<|begin_of_text|>",
                                                eos_token="<|end_of_text|>", pad_token="<|end_of_text|>",
                                                mask_token="<|mask|>")},
    "gte": {"tokenizer": "XLMRobertaTokenizer", "config": {}},
    "nomic_bert": {"tokenizer": "BertTokenizer", "config": {"head_dim": 16}},
    "jina_embeddings_v3": {"tokenizer": "XLMRobertaTokenizer", "config": {}},
}
TINY_ENCODER = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                    max_position_embeddings=514)


def mrpc_sentences(rows: int = 300) -> list[str]:
    """Both sentences of the first ``rows`` rows of MRPC's train split from the local copy (params.yaml
    data.local_copy), or of the tiny made-up data when there is no local copy."""
    import pandas as pd

    local_copy = yaml.safe_load((REPO / "params.yaml").read_text())["data"]["local_copy"]
    file = REPO / local_copy / "mrpc" / "train-00000-of-00001.parquet" if local_copy else None
    df = pd.read_parquet(file).head(rows) if file and file.is_file() else make_split(rows, seed=0).to_pandas()
    return [*df["sentence1"], *df["sentence2"]]


def make_family_checkpoint(folder: Path, family: str, vocab_size: int = 400,
                           layers: int = TINY_ENCODER["num_hidden_layers"]) -> Path:
    """A random ``family`` encoder of ``layers`` layers (hidden 32, no head) saved with a tokenizer of the family's
    class, trained on MRPC sentences (``vocab_size`` tokens, the family's special tokens, at most 128 tokens), into
    ``folder``. The config's special token ids (``pad_token_id``, ``cls_token_id``, ...) are the tokenizer's, None
    where it has no such token."""
    import torch
    import transformers

    settings = FAMILIES[family]
    base = settings["base"]() if "base" in settings else getattr(transformers, settings["tokenizer"])()
    tokenizer = base.train_new_from_iterator(mrpc_sentences(), vocab_size=vocab_size)
    tokenizer.model_max_length = 128
    special = {key: getattr(tokenizer, key, None) for key in transformers.AutoConfig.for_model(family).to_dict()
               if key.endswith("_token_id")}
    torch.manual_seed(0)
    config = transformers.AutoConfig.for_model(family, vocab_size=len(tokenizer), **special,
                                               **{**TINY_ENCODER, "num_hidden_layers": layers}, **settings["config"])
    transformers.AutoModel.from_config(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def force_one_class(model, winner: int):
    """``model`` (a BERT classifier, ``.classifier`` its linear head) made to predict class ``winner`` for every row: a
    zero head whose bias puts ``winner`` 20 logits ahead. Returns ``model``."""
    import torch

    with torch.no_grad():
        model.classifier.weight.zero_()
        model.classifier.bias.copy_(20.0 * torch.nn.functional.one_hot(torch.tensor(winner), model.num_labels))
    return model


def save_collapsed_model(paths: Paths, task, winner: int) -> Path:
    """A "fine-tuned" model of ``task`` that predicts class ``winner`` for every row (``force_one_class`` of a new
    head on ``paths.pretrained``), saved with the tokenizer and task.json to ``paths.trained`` as the train
    stage saves one."""
    from transformers import AutoTokenizer

    from finetune.modeling import load_classifier

    force_one_class(load_classifier(paths.pretrained, task), winner).save_pretrained(paths.trained)
    AutoTokenizer.from_pretrained(paths.pretrained).save_pretrained(paths.trained)
    task.save(paths.trained)
    return paths.trained


def squeeze(text: str) -> str:
    """``text`` with runs of spaces as one: Markdown tables compared cell by cell, whatever their padding."""
    return re.sub(r" {2,}", " ", text)


def tiny_params(**overrides: dict[str, Any]) -> Params:
    """params.yaml with the ``TINY`` settings and then ``overrides`` (``train={"epochs": 3}``), validated."""
    raw = yaml.safe_load((REPO / "params.yaml").read_text())
    for changes in (TINY, overrides):
        for section, values in changes.items():
            raw[section].update(values)
    return validate_params(raw, "tiny params")


def write_params(root: Path, params: Params) -> None:
    """``params`` as ``root/params.yaml``."""
    (root / "params.yaml").write_text(yaml.safe_dump(params.model_dump(), sort_keys=False))


def make_project(root: Path, params: Params, raw: DatasetDict | None = None, checkpoint: Path | None = None,
                 code: bool = False, task=None) -> Paths:
    """A project folder at ``root``: params.yaml; with ``raw`` (prepared, of ``task``: default MRPC) and
    ``checkpoint`` the inputs of the train stage (data/raw, models/pretrained, and data/tokenized by the tokenize
    stage's own ``tokenize_splits``, each with task.json); with ``code`` the project's code, configs, dvc.yaml,
    data/own and models/own, for running stages and DVC commands in it."""
    from finetune.data.tokenized import tokenize_splits
    from finetune.tasks import glue_task

    root.mkdir(parents=True, exist_ok=True)
    paths = Paths(root)
    if raw is not None:
        task = task or glue_task("mrpc")
        raw.save_to_disk(str(paths.raw))
        task.save(paths.raw)
        shutil.copytree(checkpoint, paths.pretrained)
        tokenize_splits(params, paths)
    for name in PROJECT_CODE if code else []:
        src, dst = REPO / name, root / name
        if src.is_dir():
            shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)
    write_params(root, params)
    return paths


def write_hub_folder(root: Path, splits: dict | None, config: str = "mrpc", more: dict | None = None) -> Path:
    """``root`` laid out like the Hub repo nyu-mll/glue: ``<config>/<split>-00000-of-00001.parquet`` and a README.md
    whose ``configs:`` header lists the splits. ``splits`` maps a split to a DataFrame or Dataset (written as
    parquet), bytes (the file's raw content) or None (listed in the README, no file). ``{}``: an empty folder;
    None: no folder at all. ``more``: other configs, ``{config: splits}``, in the same folder.
    """
    if splits is None:
        return root
    root.mkdir(parents=True)
    if not splits:
        return root
    header = ["---", "configs:"]
    for name, config_splits in {config: splits, **(more or {})}.items():
        (root / name).mkdir()
        for split, data in config_splits.items():
            file = root / name / f"{split}-00000-of-00001.parquet"
            if isinstance(data, bytes):
                file.write_bytes(data)
            elif isinstance(data, Dataset):
                data.to_parquet(str(file))
            elif data is not None:
                data.to_parquet(file, index=False)
        header += [f"- config_name: {name}", "  data_files:"]
        header += [f"  - split: {split}\n    path: {name}/{split}-*" for split in config_splits]
    (root / "README.md").write_text("\n".join([*header, "---", "", "Test data."]))
    return root


MOODS = {"negative": ["awful", "dull", "terrible"], "neutral": ["ordinary", "average", "plain"],
         "positive": ["wonderful", "brilliant", "delightful"]}


def own_frame(kind: str, n: int, seed: int) -> pd.DataFrame:
    """``n`` rows of the user's own data, as a DataFrame. ``kind``:

    - ``single-3``: one ``text`` column, string labels negative / neutral / positive (``mood``);
    - ``pair-2``: ``question`` and ``answer``, string labels yes / no (``verdict``);
    - ``pair-regression``: ``sentence1`` and ``sentence2``, a float ``score`` in [0, 5].
    """
    import pandas as pd

    rng = random.Random(seed)
    if kind == "single-3":
        moods = [rng.choice(sorted(MOODS)) for _ in range(n)]
        return pd.DataFrame({"text": [f"{rng.choice(SUBJECTS)} was {rng.choice(MOODS[m])} today." for m in moods],
                             "mood": moods})
    if kind == "pair-2":
        same = [rng.random() < 0.5 for _ in range(n)]
        events = [(rng.choice(EVENTS), rng.choice(EVENTS)) for _ in range(n)]
        return pd.DataFrame({"question": [f"Who {a}?" for a, _ in events],
                             "answer": [f"The team {a if s else b}." for s, (a, b) in zip(same, events)],
                             "verdict": ["yes" if s else "no" for s in same]})
    if kind == "pair-regression":
        rows = [(rng.choice(EVENTS), rng.choice(EVENTS)) for _ in range(n)]
        return pd.DataFrame({"sentence1": [f"Police {a}." for a, _ in rows],
                             "sentence2": [f"Police {b}." for _, b in rows],
                             "score": [5.0 if a == b else round(rng.uniform(0, 3), 2) for a, b in rows]})
    raise ValueError(kind)


def write_own_file(df: pd.DataFrame, file: Path) -> Path:
    """``df`` written as ``file`` in the format its suffix names (csv, tsv, json, jsonl, parquet)."""
    file.parent.mkdir(parents=True, exist_ok=True)
    suffix = file.suffix
    if suffix in (".csv", ".tsv"):
        df.to_csv(file, index=False, sep="," if suffix == ".csv" else "\t")
    elif suffix in (".json", ".jsonl"):
        df.to_json(file, orient="records", lines=suffix == ".jsonl")
    else:
        df.to_parquet(file, index=False)
    return file


def project_env(**extra: str) -> dict:
    """The environment of a command run in a test project: offline, this venv's python and dvc first on PATH,
    the repository importable, git identity set, no DVC usage analytics (a background process after each `dvc`
    command, about 0.5 s of CPU each)."""
    return {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
            "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "DVC_NO_ANALYTICS": "1",
            "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com", "GIT_COMMITTER_NAME": "t",
            "GIT_COMMITTER_EMAIL": "t@example.com", **extra}


def start(cmd: list[str], cwd: Path, env: dict | None = None) -> subprocess.Popen:
    """Start ``cmd`` in ``cwd`` (output and errors together, as text) with the default SIGINT disposition.

    A shell starts background jobs with SIGINT ignored, and Python then installs no KeyboardInterrupt handler:
    the command gets the disposition a terminal gives it, whatever started pytest.
    """
    return subprocess.Popen(cmd, cwd=cwd, env=env or project_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def run(cmd: list[str], cwd: Path, env: dict | None = None, ok: bool = True, timeout: float = 600) -> str:
    """Run ``cmd`` to its end; return its output. With ``ok`` (default) a non-zero exit fails the test with the
    command and the end of its output; with ``ok=False`` a zero exit does."""
    process = start(cmd, cwd, env)
    output, _ = process.communicate(timeout=timeout)
    if ok:
        assert process.returncode == 0, f"{' '.join(cmd)} failed ({process.returncode}):\n{output[-4000:]}"
    else:
        assert process.returncode != 0, f"{' '.join(cmd)} succeeded, expected a failure:\n{output[-4000:]}"
    return output


STAGES_AT_ONCE = """import sys
from importlib import import_module

from accelerate.state import AcceleratorState

from finetune.runtime import run_stage

for name in sys.argv[1:]:
    run_stage(import_module("stages." + name.replace("-", "_")).main)
    AcceleratorState._reset_state(reset_partial_state=True)
"""


def run_stages_at_once(root: Path, stages: list[str]) -> str:
    """The pipeline's ``stages`` (dvc.yaml names, in its order) run in ``root`` by their own ``main`` in ONE Python
    process, then recorded by `dvc commit` (dvc.lock, the cache, the run-cache, the outputs' .gitignore) as if
    `dvc repro` had run them: a test's baseline for a few seconds of work instead of one torch import per stage
    (about 5 s each). For set-ups only: tests/test_pipeline_e2e.py runs the real `dvc repro`. Returns the output."""
    out = run(python("-c", STAGES_AT_ONCE, *stages), root)
    return out + run(dvc("commit", "--force", *stages), root)


def launch(module: str, config: Path, cwd: Path, timeout: float = 300) -> str:
    """``accelerate launch --config_file config -m module`` in ``cwd`` to its end; returns its output."""
    return run(python("-m", "accelerate.commands.launch", "--config_file", str(config), "-m", module), cwd,
               timeout=timeout)


def python(*args: str) -> list[str]:
    """A command line running this interpreter: ``python(-m, stages.train)``."""
    return [sys.executable, *args]


def dvc(*args: str) -> list[str]:
    """A command line running this venv's DVC."""
    return [str(Path(sys.executable).parent / "dvc"), *args]


def exp_show(root: Path) -> dict[str, dict]:
    """``dvc exp show --json`` as {experiment name or rev: its data} for every commit and experiment with metrics."""
    runs = {}
    for commit in json.loads(run(dvc("exp", "show", "--json"), root)):
        entries = [commit] + [rev for group in commit.get("experiments") or [] for rev in group["revs"]]
        for entry in entries:
            if entry["data"] and entry["data"].get("metrics"):
                runs[entry.get("name") or entry["rev"]] = entry["data"]
    return runs


def interrupt_and_resume(params: Params, paths: Paths, monkeypatch, step: int = 7,
                         between: Callable[[], None] | None = None) -> dict:
    """Train in this process, interrupted (KeyboardInterrupt) when optimizer step ``step`` is logged, check that
    nothing looks finished, call ``between`` (if any), then train again (a resume); returns the second run's
    metrics."""
    from finetune.train import recipe as training

    log_step = training.TrainLog.log_step

    def stop(self, at, *args):
        if at == step:
            raise KeyboardInterrupt
        return log_step(self, at, *args)

    monkeypatch.setattr(training.TrainLog, "log_step", stop)
    try:
        training.train(params, paths)
        raise AssertionError(f"the run ended before step {step}")
    except KeyboardInterrupt:
        pass
    assert not paths.trained.exists()
    monkeypatch.setattr(training.TrainLog, "log_step", log_step)
    reset_accelerate()
    if between is not None:
        between()
    return training.train(params, paths)


def reset_accelerate() -> None:
    """Accelerate keeps one AcceleratorState per process; forget it so the next Accelerator may differ."""
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)
