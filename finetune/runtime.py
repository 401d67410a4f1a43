"""How a stage runs: logging, signals and expected errors; ``accelerate launch`` for a multi-process config; the
Accelerator and CPU threads; atomic writes; file hashes; YAML 1.2 as DVC reads it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import signal
import sys
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator
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


LAUNCHED = "FINETUNE_ACCELERATE_LAUNCHED"  # set in the processes `accelerate launch` started for a stage


def launch_if_distributed(module: str, accelerate_config: str | Path) -> None:
    """Replace this process with ``accelerate launch --config_file <accelerate_config> -m <module>`` when the
    config asks for several processes or machines or a distributed type; return otherwise and in launched processes
    (https://huggingface.co/docs/accelerate/package_reference/cli#accelerate-launch)."""
    config = yaml_reader().load(Path(accelerate_config).read_text()) or {}
    distributed = str(config.get("distributed_type", "NO")).upper() != "NO" or \
        int(config.get("num_processes") or 1) > 1 or int(config.get("num_machines") or 1) > 1
    if not distributed or os.environ.get(LAUNCHED) or "LOCAL_RANK" in os.environ:  # LOCAL_RANK: started by torchrun
        return
    os.environ[LAUNCHED] = "1"
    sys.stdout.flush(), sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, "-m", "accelerate.commands.launch", "--quiet", "--config_file",
                              str(accelerate_config), "-m", module])


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
    import torch

    if num_threads is None:
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        num_threads = max(1, cpus // int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    torch.set_num_threads(num_threads)
    return num_threads


def make_accelerator(**kwargs):
    """``accelerate.Accelerator(**kwargs)``, on the CPU (a gloo process group) when torchrun started several
    processes and there is no GPU (configs/accelerate/cpu_2proc.yaml; accelerate's own multi-CPU path needs MPI).
    """
    import torch
    from accelerate import Accelerator

    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    return Accelerator(cpu=world_size > 1 and not torch.cuda.is_available(), **kwargs)


def peak_memory_mb() -> float:
    """Peak resident set size of this process so far, in MiB (Linux ``ru_maxrss`` is in KiB)."""
    import resource

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
        ParamsError: ``text`` is not YAML; the message names ``source``.
    """
    try:
        return yaml_reader().load(text)
    except YAMLError as err:
        raise ParamsError(f"{source}: not valid YAML: {err}") from None


def write_json(path: str | Path, obj: Any) -> None:
    """Write ``obj`` as indented JSON, atomically: a temp file in the same folder, then a rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(obj, f, indent=2, sort_keys=False)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def markdown_table(header: list[str], rows: Iterable[Iterable[Any]]) -> str:
    """``rows`` under ``header`` as a GitHub Markdown table of ``str()`` cells, ending in a newline.

    Raises:
        ValueError: a row has another number of cells than the header.
    """
    import pandas as pd

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
