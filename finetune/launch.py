"""How the train and evaluate stages hand themselves over to ``accelerate launch`` when ``train.accelerate_config``
asks for several processes, on this machine or on several (configs/accelerate/README.md, "Several machines").

Several machines: DVC runs on one, and the stage's command starts the others' processes through the launcher named
by ``FINETUNE_LAUNCHER`` (e.g. ``srun --ntasks-per-node=1 --kill-on-bad-exit=1``), which waits for them. Each
machine's count, rank and the main machine's address and port come from the launcher's environment, never from a
tracked file edited per machine; the tracked accelerate config says what every machine shares (distributed type,
processes per machine, mixed precision).
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from finetune.errors import ParamsError, PipelineError
from finetune.runtime import read_yaml

LAUNCHED = "FINETUNE_ACCELERATE_LAUNCHED"  # set in the processes `accelerate launch` started for a stage
LAUNCHER = "FINETUNE_LAUNCHER"  # a command that runs the stage's command once on every machine and waits for them
ON_MACHINE = "FINETUNE_ON_MACHINE"  # set in the commands the launcher started (they don't hand over to it again)
DEFAULT_PORT = 29500  # torchrun's default --master-port


@dataclass(frozen=True)
class Machines:
    """The machines of a run: ``count`` of them, this one's ``rank`` (0: the main machine, where DVC runs), and the
    main machine's ``address`` and ``port`` that every machine reaches."""

    count: int
    rank: int
    address: str
    port: int


def machines_from_env(env: dict[str, str] | None = None) -> Machines | None:
    """The machines from the launcher's environment, in SLURM's names (``SLURM_NNODES``, ``SLURM_NODEID``, the main
    address from ``MASTER_ADDR`` or else the first host of ``SLURM_JOB_NODELIST``) or torchrun's flags as variables
    (``NNODES``, ``NODE_RANK``, ``MASTER_ADDR``); the port from ``MASTER_PORT`` (default 29500). None on one machine.

    Raises:
        PipelineError: a machine count above 1 without this machine's rank or the main address, or a value that is
            not a number, naming the variable.
    """
    env = os.environ if env is None else env
    names = ("SLURM_NNODES", "SLURM_NODEID") if "SLURM_NNODES" in env else ("NNODES", "NODE_RANK")
    count = _number(env, names[0], 1)
    if count <= 1:
        return None
    if names[1] not in env:
        raise PipelineError(f"{names[0]}={count} machines, but {names[1]} (this machine's rank) is not set")
    address = env.get("MASTER_ADDR") or (_first_slurm_host(env) if names[0] == "SLURM_NNODES" else None)
    if not address:
        raise PipelineError(f"{names[0]}={count} machines, but MASTER_ADDR (the main machine's address) is not set")
    machines = Machines(count, _number(env, names[1], 0), address, _number(env, "MASTER_PORT", DEFAULT_PORT))
    if not 0 <= machines.rank < count:
        raise PipelineError(f"{names[1]}={machines.rank}: not a rank of {count} machines (0 to {count - 1})")
    return machines


def _number(env, name: str, default: int) -> int:
    try:
        return int(env.get(name, default))
    except ValueError:
        raise PipelineError(f"{name}={env[name]!r}: not a number") from None


def _first_slurm_host(env) -> str | None:
    """The first host of ``SLURM_JOB_NODELIST`` (``scontrol show hostnames``), or None without it or scontrol."""
    if "SLURM_JOB_NODELIST" not in env or not shutil.which("scontrol"):
        return None
    hosts = subprocess.run(["scontrol", "show", "hostnames", env["SLURM_JOB_NODELIST"]], capture_output=True,
                           text=True, check=False).stdout.split()
    return hosts[0] if hosts else None


def launch_if_distributed(module: str, accelerate_config: str | Path) -> None:
    """Replace this process with ``accelerate launch --config_file <accelerate_config> -m <module>`` when the
    config asks for a distributed type or several processes; return otherwise and in launched processes
    (https://huggingface.co/docs/accelerate/package_reference/cli#accelerate-launch). With ``FINETUNE_LAUNCHER``
    set, first replace it with ``<launcher> python -m <module>``, which runs this on every machine; there each hands
    over with the machines of ``machines_from_env`` (``--num_machines``, ``--machine_rank``, ``--main_process_ip``,
    ``--main_process_port``, and ``--num_processes``: the config's per machine times the machines).

    Raises:
        ParamsError: the config can't be used (``read_accelerate_config``).
        PipelineError: several machines with a config of one process or one naming ``num_machines`` itself; or
            ``machines_from_env``'s errors.
    """
    config = read_accelerate_config(accelerate_config)
    per_machine = config.get("num_processes", 1)
    distributed = config.get("distributed_type", "NO") != "NO" or per_machine > 1
    if os.environ.get(LAUNCHED) or "LOCAL_RANK" in os.environ:  # LOCAL_RANK: started by torchrun
        return
    if not distributed:
        if machines := machines_from_env():
            raise PipelineError(f"{accelerate_config}: one process, but the launcher's environment has "
                                f"{machines.count} machines: choose a distributed config, e.g. "
                                "configs/accelerate/multi_node.yaml (train.accelerate_config)")
        return
    launcher = os.environ.get(LAUNCHER)
    if launcher and not os.environ.get(ON_MACHINE):
        os.environ[ON_MACHINE] = "1"
        _exec([*shlex.split(launcher), sys.executable, "-m", module])
    command = [sys.executable, "-m", "accelerate.commands.launch", "--quiet", "--config_file", str(accelerate_config)]
    machines = machines_from_env()
    if machines:
        if int(config.get("num_machines") or 1) > 1:
            raise PipelineError(f"{accelerate_config}: num_machines is set, but the machines come from the "
                                "launcher's environment (SLURM_NNODES or NNODES): remove num_machines, machine_rank, "
                                "main_process_ip and main_process_port from it")
        command += ["--num_machines", str(machines.count), "--machine_rank", str(machines.rank),
                    "--main_process_ip", machines.address, "--main_process_port", str(machines.port),
                    "--num_processes", str(machines.count * per_machine)]
    os.environ[LAUNCHED] = "1"
    _exec([*command, "-m", module])


def read_accelerate_config(path: str | Path) -> dict:
    """The accelerate config at ``path`` (``train.accelerate_config``), checked for what this hand-over reads:
    ``distributed_type`` upper-cased (default ``NO``) and ``num_processes`` (default 1).

    Raises:
        ParamsError: naming the file and ``train.accelerate_config``: not YAML, empty or not a mapping,
            ``num_processes`` not a whole number of at least 1, or ``MULTI_CPU`` over several processes without
            MPI's ``mpirun_config: {mpirun_hostfile}`` (accelerate would start one process).
    """
    where = f"{path} (train.accelerate_config)"
    config = read_yaml(Path(path).read_text(), where)
    if not isinstance(config, dict) or not config:
        got = "an empty file" if config is None or config == {} else f"a {type(config).__name__}"
        raise ParamsError(f"{where}: expected accelerate's settings (distributed_type, num_processes, ...), got {got}; "
                          "see configs/accelerate/ for examples")
    processes = config.get("num_processes", 1)
    if isinstance(processes, bool) or not isinstance(processes, int) or processes < 1:
        raise ParamsError(f"{where}: num_processes: {processes!r} is not a whole number of at least 1")
    kind = str(config.get("distributed_type", "NO")).upper()
    mpi = config.get("mpirun_config") or {}
    if kind == "MULTI_CPU" and processes > 1 and not (isinstance(mpi, dict) and mpi.get("mpirun_hostfile")):
        raise ParamsError(f"{where}: MULTI_CPU with num_processes {processes} needs MPI (mpirun_config: "
                          "mpirun_hostfile); without it "
                          "accelerate starts one process. For several CPU processes use "
                          "configs/accelerate/cpu_2proc.yaml (torchrun, gloo)")
    return {**config, "distributed_type": kind, "num_processes": processes}


def _exec(command: list[str]) -> None:
    sys.stdout.flush(), sys.stderr.flush()
    os.execvp(command[0], command)
