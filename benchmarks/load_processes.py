"""The servers of ``benchmarks.load`` as processes: started as subprocesses (each in its own process group) and ready
when ``GET /health`` answers, stopped with SIGTERM, and the CPU time each process of a server's tree spends, by its
role (psutil).

A LitServe server (``tools.serve``, the bare engine) is a tree: the process started (``main``, which launches the
rest and waits), the queue manager (forked first: ``multiprocessing.Manager``, which holds the request and response
queues, and with ``fast_queue`` the ZeroMQ broker), the model workers (spawned: ``multiprocessing.spawn`` in their
command line) and the HTTP processes (uvicorn, forked once the workers are ready). The baseline is one process,
``main``.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request

import psutil

HOST = "127.0.0.1"
ROLES = ("HTTP", "model worker", "queue manager", "main", "other", "load generator")


def check_free(port: int) -> None:
    """Raises SystemExit when something already listens on ``HOST:port``: it would answer in place of the server
    started there."""
    with socket.socket() as probe:
        if probe.connect_ex((HOST, port)) == 0:
            raise SystemExit(f"ERROR: something already listens on {HOST}:{port}; stop it, or choose another --port")


def start_server(command: list[str], port: int, timeout: float = 300) -> subprocess.Popen:
    """Start ``command`` (a server on ``port``) and wait for ``GET /health`` to answer 200.

    Raises:
        SystemExit: the port is taken, or the server exited or was not ready within ``timeout`` seconds; the end of
            its output.
    """
    check_free(port)
    # its output to a temp file (closed by stop_server), read if it fails to start: a pipe nobody reads would stall
    # a server that logs much (a 504 or a failed request logs a line each)
    output = tempfile.TemporaryFile("w+")
    process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, text=True,
                               start_new_session=True)  # its own process group: stop_server ends all of it
    process.output = output
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            output.seek(0)
            raise SystemExit(f"ERROR: {' '.join(command)} exited {process.returncode}:\n{output.read()[-3000:]}")
        try:
            with urllib.request.urlopen(f"http://{HOST}:{port}/health", timeout=1) as answer:
                if answer.status == 200:
                    return process
        except OSError:
            pass
        time.sleep(0.5)
    stop_server(process)
    raise SystemExit(f"ERROR: {' '.join(command)} not ready after {timeout} s")


def stop_server(process: subprocess.Popen, timeout: float = 30) -> int:
    """SIGTERM to the server, then its exit status (killed after 60 s); whatever is left of its process group is
    killed, and waited for up to ``timeout`` seconds, so its port is free for the next run."""
    process.send_signal(signal.SIGTERM)
    try:
        status = process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        status = process.wait()
    deadline = time.monotonic() + timeout
    try:
        os.killpg(process.pid, signal.SIGKILL)
        while time.monotonic() < deadline:
            os.killpg(process.pid, 0)  # raises once no process of the group is left
            time.sleep(0.1)
    except ProcessLookupError:
        pass
    if getattr(process, "output", None) is not None:  # start_server's temp file of its output
        process.output.close()
    return status


def roles(pid: int) -> dict[int, str]:
    """Each process of the tree under ``pid`` (the server started) by its role in ``ROLES``, and this process as
    the load generator."""
    root, command = psutil.Process(pid), {}
    for child in root.children(recursive=True):
        try:
            command[child.pid] = " ".join(child.cmdline())
        except psutil.Error:  # gone, or a zombie not yet reaped: it spends no more CPU
            continue
    children = [psutil.Process(child) for child in command]
    workers = [p for p in children if "multiprocessing.spawn" in command[p.pid]]
    first_worker = min((p.create_time() for p in workers), default=float("inf"))
    found = {pid: "main", os.getpid(): "load generator"}
    for p in children:
        if p in workers:
            found[p.pid] = "model worker"
        elif "resource_tracker" in command[p.pid] or command[p.pid] != " ".join(root.cmdline()):
            found[p.pid] = "other"
        else:  # forked from main: the queue manager before the workers, the HTTP processes after them
            found[p.pid] = "queue manager" if p.create_time() < first_worker else "HTTP"
    return found


def cpu_seconds(pids: dict[int, str]) -> dict[int, float]:
    """User and system CPU seconds each of ``pids`` has spent so far (a process gone is left out)."""
    spent = {}
    for pid in pids:
        try:
            times = psutil.Process(pid).cpu_times()
        except psutil.NoSuchProcess:
            continue
        spent[pid] = times.user + times.system
    return spent


def cpu_per_request(pids: dict[int, str], before: dict[int, float], after: dict[int, float],
                    requests: int) -> dict[str, float]:
    """CPU milliseconds per request of each role between ``before`` and ``after`` (``cpu_seconds``), the processes of
    a role summed, over ``requests`` answered; a role with no process is left out."""
    spent: dict[str, float] = {}
    for pid, role in pids.items():
        if pid in before and pid in after:
            spent[role] = spent.get(role, 0.0) + after[pid] - before[pid]
    return {role: round(seconds * 1e3 / max(requests, 1), 3) for role, seconds in spent.items()}
