"""How a stage runs: logging, signals and expected errors; `accelerate launch` for a multi-process config; the
Accelerator and CPU threads; outputs written atomically; files hashed; YAML read as DVC reads it. What the hardware
decides (precision, the CPU's instructions) is in finetune/hardware.py."""

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
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML, YAMLError

from finetune.errors import ParamsError, PipelineError


def run_stage(main: Callable[[], Any]) -> None:
    """Run a stage's ``main()`` as a command: logging set up, SIGTERM unwinding like Ctrl-C, expected errors short.

    A ``PipelineError`` (bad params, data, checkpoint or batch) prints its message alone and exits 1; Ctrl-C
    (KeyboardInterrupt) prints one line and exits 130; any other exception is a bug and keeps its traceback. SIGTERM
    (what `kill`, job schedulers and `dvc queue kill` send) raises SystemExit, so the temp outputs of ``atomic_dir``
    and ``write_json`` are removed, not left behind.
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
    """Hand the stage ``module`` over to ``accelerate launch --config_file <accelerate_config> -m <module>`` when
    that config asks for more than this one process (several processes or machines, or a distributed type such as
    MULTI_GPU, DEEPSPEED or FSDP); return at once otherwise, and in the processes a launcher started.

    One process runs the stage as it is: starting it through `accelerate launch` would only cost another Python
    start that imports torch. The config's fields are accelerate's
    (https://huggingface.co/docs/accelerate/package_reference/cli#accelerate-launch).
    """
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
    """Set torch's intra-op CPU threads and return the number: ``num_threads``, or when None the CPUs this process
    may run on divided among the processes of this machine (``LOCAL_WORLD_SIZE``, set by torchrun/accelerate).

    `accelerate launch` exports OMP_NUM_THREADS=1 unless told otherwise, which on a CPU-only machine halves training
    speed with 2 cores; this undoes that for the default single process.
    """
    import torch

    if num_threads is None:
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        num_threads = max(1, cpus // int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    torch.set_num_threads(num_threads)
    return num_threads


def make_accelerator(**kwargs):
    """``accelerate.Accelerator(**kwargs)``, on CPU processes when torchrun started several and there is no GPU.

    accelerate's own multi-CPU path (``--cpu --num_processes N``) needs MPI's mpirun; without it, it starts one
    process. ``accelerate launch --multi_gpu --num_processes N`` (configs/accelerate/cpu_2proc.yaml) starts N
    processes with torchrun instead, and with ``cpu=True`` they join a gloo process group on the CPU.
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
    """A YAML 1.2 reader (and writer), as DVC reads and writes params.yaml: `dvc exp run -S` writes ``no`` and
    ``3e-5`` unquoted, which PyYAML's YAML 1.1 would read as False and as a string. ``load`` raises ruamel's
    ``YAMLError`` on text that is not YAML."""
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


@contextlib.contextmanager
def atomic_dir(path: str | Path) -> Iterator[Path]:
    """Yield an empty temp folder beside ``path``; on success it replaces ``path``, on error it is removed.

    So a stage killed or failing half-way never leaves a folder that looks finished. Temp folders that a killed
    (SIGKILL) earlier run left beside ``path`` are removed first.
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
