"""The life of ``tools.serve``'s processes around LitServe's engine: draining on SIGTERM (``stop_on_signals``), a
model worker that outlives a SIGTERM sent to its process group (``outlive_sigterm``), an answer within a deadline
for every request (``Deadline``), and a port checked before start-up (``check_port``). Own code where LitServe has
none (docs/serving.md, "Serving over HTTP")."""

import asyncio
import json
import logging
import multiprocessing
import os
import signal
import socket
import threading

import litserve as ls

from finetune.errors import PipelineError

log = logging.getLogger("tools.serve")


def stop_on_signals(server: ls.LitServer) -> list[int]:
    """SIGTERM: the HTTP processes stop accepting and answer what they accepted (uvicorn's graceful shutdown, within
    ``Deadline``) while the model worker still runs; then LitServe stops the rest and ``run`` returns. SIGUSR1, from a
    model worker that can't load the model (``FormAPI.setup``): the same, then exit status 1. Before the HTTP
    processes start, nothing was accepted: everything stops at once. Own code, as LitServe drains only on Ctrl-C,
    and closes its response queues before its HTTP processes have answered.

    Returns:
        A list that holds the exit status once a signal came (empty until then).
    """
    main_pid, status = os.getpid(), []

    def drain() -> None:
        http = [p for p in multiprocessing.active_children() if p.name.startswith("LitServer-")]
        if not http:  # still starting: nothing was accepted
            for process in multiprocessing.active_children():
                process.kill()
            os._exit(status[0])
        for process in http:
            process.terminate()
        for process in http:
            process.join(timeout=60)
        for process in multiprocessing.active_children():  # nothing is left for the model workers to answer
            if process.name == "inference-worker":
                process.kill()
                process.join(timeout=5)
        log.info("Answered the accepted requests; stopping")
        server._shutdown_event.set()

    def on_signal(signum, frame) -> None:
        if os.getpid() != main_pid or status:  # a helper forked from this process, or already stopping
            return
        status.append(1 if signum == signal.SIGUSR1 else 0)
        log.info("%s: answering accepted requests, then stopping", signal.Signals(signum).name)
        threading.Thread(target=drain, name="drain", daemon=True).start()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGUSR1, on_signal)
    return status


def outlive_sigterm() -> None:
    """In a model worker: a SIGTERM sent to the whole process group (Ctrl-C's way, systemd's) leaves it running
    while its parent drains the HTTP processes, which then stops it; without its parent, it exits."""
    parent = os.getppid()
    signal.signal(signal.SIGTERM, lambda signum, frame: os._exit(0) if os.getppid() != parent else None)


def timed_out(timeout: float) -> str:
    """The 504's message, from ``Deadline`` or from LitServe's own timeout."""
    return (f"no answer from the model within {timeout:g} s (--timeout); the model worker is overloaded or "
            "restarting: retry")


class Deadline:
    """ASGI middleware: a ``/predict`` request not answered within ``timeout`` seconds (``--timeout``) gets a 504
    naming the limit, sent ``GRACE`` seconds later, so that LitServe's own timeout, kept by a live worker, answers
    first. Own code: LitServe restarts a model worker that died (``restart_workers``), but the requests that worker
    held are never answered."""

    GRACE = 1.0  # seconds after --timeout

    def __init__(self, app, timeout: float):
        self.app, self.timeout = app, timeout

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"] != "/predict":
            return await self.app(scope, receive, send)
        started = False

        async def tracked(message):
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            async with asyncio.timeout(self.timeout + self.GRACE):
                await self.app(scope, receive, tracked)
        except TimeoutError:
            if started:
                raise
            log.error("No answer within %g s (--timeout): the model worker is busy, or died and is restarting",
                      self.timeout)
            body = json.dumps({"error": timed_out(self.timeout)}).encode()
            await send({"type": "http.response.start", "status": 504,
                        "headers": [(b"content-type", b"application/json")]})
            await send({"type": "http.response.body", "body": body})


def check_port(host: str, port: int) -> None:
    """Raises PipelineError naming ``--port`` when ``host:port`` can't be listened on (in use, or not allowed)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        try:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
            probe.bind((host, port))
        except OSError as err:
            raise PipelineError(f"--port {port}: can't listen on {host}:{port} ({err.strerror}); stop what "
                                "listens there, or choose another --port") from None
