"""How a stage runs: logging, signals and expected errors; the Accelerator and CPU threads; atomic writes and
whether a file can be written; file hashes; YAML 1.2 as DVC reads it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import resource
import shutil
import signal
import sys
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML, YAMLError

from finetune.errors import ParamsError, PipelineError


def run_stage(main: Callable[[], Any]) -> None:
    """Run a stage's ``main()`` as a command: logging set up, SIGTERM raising ``SystemExit`` (so ``atomic_dir``
    and ``write_json`` remove their temp outputs), expected errors printed alone.

    Raises:
        SystemExit: ``ERROR: <message>`` (status 1) on a ``PipelineError``, 130 on Ctrl-C, 128 + 15 on SIGTERM; any
            other exception goes on with its traceback.
    """
    setup_logging()
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _raise_system_exit)
    try:
        main()
    except PipelineError as err:
        sys.exit(f"ERROR: {err}")
    except KeyboardInterrupt:
        print(f"{INTERRUPTED}: outputs are written whole or not at all, so nothing half-written is left",
              file=sys.stderr)
        sys.exit(130)


INTERRUPTED = "interrupted (Ctrl-C)"


def setup_logging() -> None:
    """Log to stderr with time, level and logger name; quiet the HTTP and lock libraries."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("httpx", "httpcore", "urllib3", "filelock"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def _raise_system_exit(signum, frame):
    raise SystemExit(128 + signum)


def set_cpu_threads(num_threads: int | None) -> int:
    """Set and return torch's intra-op CPU threads: ``num_threads``, or when None the CPUs this process may run on
    divided among this machine's processes (``LOCAL_WORLD_SIZE``), in place of ``accelerate launch``'s 1."""
    import torch  # heavy: every stage imports this module before the hand-over to accelerate launch

    if num_threads is None:
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        num_threads = max(1, cpus // int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    torch.set_num_threads(num_threads)
    return num_threads


def make_accelerator(ddp_timeout: int | None = None, **kwargs):
    """``accelerate.Accelerator(**kwargs)``, on the CPU (a gloo process group) when torchrun started several
    processes and there is no GPU (configs/accelerate/cpu_2proc.yaml; accelerate's own multi-CPU path needs MPI).
    ``ddp_timeout``: seconds a collective waits for the other processes before it raises (torch.distributed's
    ``timeout``), so a lost process or machine fails the stage instead of hanging it.
    """
    # heavy: every stage imports this module before the hand-over to accelerate launch
    import torch
    from accelerate import Accelerator
    from accelerate.utils import InitProcessGroupKwargs

    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    handlers = [InitProcessGroupKwargs(timeout=timedelta(seconds=ddp_timeout))] if ddp_timeout else []
    return Accelerator(cpu=world_size > 1 and not torch.cuda.is_available(), kwargs_handlers=handlers, **kwargs)


def peak_memory_mb() -> float:
    """Peak resident set size of this process so far, in MiB (Linux ``ru_maxrss`` is in KiB)."""
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def sha256_file(path: Path) -> str:
    """sha256 hex digest of a file, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def yaml_reader() -> YAML:
    """A YAML 1.2 reader and writer, as DVC reads and writes params.yaml (unquoted ``no`` and ``3e-5`` are a
    string and a float, not YAML 1.1's False and a string); ``load`` raises ruamel's ``YAMLError`` on text that is not
    YAML.
    """
    return YAML(typ="safe", pure=True)


def read_yaml(text: str, source: str) -> Any:
    """``text`` read with ``yaml_reader``.

    Raises:
        ParamsError: ``text`` is not YAML; one line naming ``source``, the problem and its line and column.
    """
    try:
        return yaml_reader().load(text)
    except YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        reason = getattr(err, "problem", None) or " ".join(str(err).split())
        raise ParamsError(f"{source}: not valid YAML: {reason}{where}") from None


def write_json(path: str | Path, obj: Any) -> None:
    """Write ``obj`` as indented JSON, atomically (``write_bytes``)."""
    write_text(path, json.dumps(obj, indent=2, sort_keys=False) + "\n")


def write_text(path: str | Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path``, atomically (``write_bytes``)."""
    write_bytes(path, text.encode())


def write_bytes(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` whole or not at all: a temp file in the same folder (made if needed), then a
    rename; the temp file is removed on any error."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def unwritable(file: Path) -> str | None:
    """Why a file can't be written at ``file`` (a folder; a folder that can't be made or written in), or None. Makes
    the file's folder."""
    if file.is_dir():
        return "is a folder; name a file in it"
    probe = file.with_name(f".{file.name}.tmp")
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
        probe.touch()
        probe.unlink()
    except OSError as err:
        return f"cannot write there: {type(err).__name__}: {' '.join(str(err).split())}"
    return None


def markdown_table(header: list[str], rows: Iterable[Iterable[Any]]) -> str:
    """``rows`` under ``header`` as a GitHub Markdown table of ``str()`` cells, ending in a newline.

    Raises:
        ValueError: a row has another number of cells than the header.
    """
    import pandas as pd  # heavy: every stage imports this module; only reports make tables

    cells = [[str(cell) for cell in row] for row in rows]
    return pd.DataFrame(cells, columns=header).to_markdown(index=False, disable_numparse=True) + "\n"


@contextlib.contextmanager
def atomic_dir(path: str | Path) -> Iterator[Path]:
    """Yield an empty temp folder beside ``path`` that replaces ``path`` on success and is removed on error;
    temp folders that a killed earlier run left beside ``path`` are removed first.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    for stale in path.parent.glob(f".{path.name}.*.tmp"):
        shutil.rmtree(stale, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp"))
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if path.exists():
        shutil.rmtree(path)
    os.replace(tmp, path)
