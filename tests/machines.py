"""A stand-in for ``srun`` in the tests (``FINETUNE_LAUNCHER``, finetune/launch.py): runs a command once per
"machine" on this one, machine 0 in the current folder and machine r in the r-th ``--folder``, each with torchrun's
flags as variables (``NNODES``, ``NODE_RANK``, ``MASTER_ADDR=127.0.0.1``, ``MASTER_PORT``: a free port), waits for
all and exits with the first non-zero status. Like plain ``srun``, it does not stop the others when one fails: the
engine's timeout does (``train.ddp_timeout``).

    FINETUNE_LAUNCHER="python -m tests.machines --folder ../machine-1" python -m stages.train
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on (the tests' servers, databases and machines take it)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--folder", action="append", default=[], help="the next machine's working folder")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    folders = [os.getcwd(), *args.folder]
    port = str(free_port())
    processes = [subprocess.Popen(args.command, cwd=folder, env={**os.environ, "NNODES": str(len(folders)),
                                                                 "NODE_RANK": str(rank), "MASTER_ADDR": "127.0.0.1",
                                                                 "MASTER_PORT": port})
                 for rank, folder in enumerate(folders)]
    statuses = [process.wait() for process in processes]
    sys.exit(next((status for status in statuses if status), 0))


if __name__ == "__main__":
    main()
