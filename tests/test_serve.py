"""tools.serve on a tiny fine-tuned model, served in a subprocess on a free loopback port: its answers equal
tools.predict's and, row by row, the evaluate stage's predictions (benchmarks.load's check), each bad request gets its
4xx naming the field or limit and the server goes on answering, concurrent requests are batched by the engine, SIGTERM
answers the requests in flight and exits 0, a model worker that dies is restarted while the requests it held get a
504, and a missing or incomplete model folder, a port in use or a bad flag stops start-up with one line."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pandas as pd
import psutil
import pytest

from benchmarks import load_client
from benchmarks.load_agreement import agreement
from finetune.evaluate.predictions import evaluate_model
from finetune.paths import Paths
from finetune.tasks import Task
from tests.helpers import REPO, free_port, project_env, reset_accelerate, tiny_params
from tools.predict import predict
from tools.serve import main as serve_main

PAIRS = [("The cat sat on the mat.", "A cat was sitting on the mat."),
         ("Shares fell sharply on Monday.", "The court rejected the appeal."), ("He won.", "He lost.")]
LIMITS = ["--max-examples", "4", "--max-body-bytes", "20000"]


@pytest.fixture(scope="module")
def model(tiny_finetuned) -> Path:
    return tiny_finetuned


def serve_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "tools.serve", *map(str, args)]


def start_server(model: Path, log: Path, *args) -> tuple[int, subprocess.Popen]:
    """``(port, process)`` of the server of ``model`` (pytorch form) with ``args``, once ``/health`` answers 200."""
    port = free_port()
    with log.open("w") as out:
        process = subprocess.Popen(serve_command("--form", "pytorch", "--model", model, "--port", port, *args),
                                   cwd=REPO, env=project_env(), stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True)  # its own process group: stop() ends all of it
    assert wait_ready(port, process), log.read_text()
    return port, process


def wait_ready(port: int, process: subprocess.Popen, seconds: float = 120) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and process.poll() is None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as answer:
                if answer.status == 200:
                    return True
        except OSError:
            time.sleep(0.3)
    return False


@pytest.fixture(scope="module")
def server(model, tmp_path_factory):
    """``(port, process, log file)`` of the server of ``model`` (pytorch form), batching up to 8 requests for up
    to 0.2 s, at debug level (it logs each batch's size)."""
    log = tmp_path_factory.mktemp("log") / "serve.log"
    port, process = start_server(model, log, "--max-batch-size", 8, "--batch-timeout", 0.2, "--log-level", "debug",
                                 *LIMITS)
    yield port, process, log
    stop(process)


def stop(process: subprocess.Popen) -> None:
    """Kill what is left of the server's process group (a killed server leaves its HTTP process and worker)."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()


def post(port: int, body, content_type: str = "application/json") -> tuple[int, dict]:
    """POST ``body`` (bytes as they are, else as JSON) to /predict: the status and the JSON answer."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/predict", data=data,
                                     headers={"Content-Type": content_type})
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"{}")


def as_inputs(pairs) -> list[dict]:
    return [{"text": a, "text_pair": b} for a, b in pairs]


@pytest.mark.e2e
def test_answers_equal_tools_predict_whatever_the_batching(server, model, tmp_path):
    port, _, _ = server
    file = tmp_path / "pairs.csv"
    pd.DataFrame(PAIRS, columns=["sentence1", "sentence2"]).to_csv(file, index=False)
    expected = predict(file, model)
    reset_accelerate()

    status, together = post(port, {"inputs": as_inputs(PAIRS)})
    assert status == 200, together
    with ThreadPoolExecutor(len(PAIRS)) as pool:  # one request each, batched by the engine
        alone = [answer["predictions"][0] for status, answer in
                 pool.map(lambda pair: post(port, {"inputs": as_inputs([pair])[0]}), PAIRS)]
    for answers in (together["predictions"], alone):
        assert [a["label"] for a in answers] == expected["prediction"].tolist()
        for name in ("not_equivalent", "equivalent"):
            got = [a["probabilities"][name] for a in answers]
            assert got == pytest.approx(expected[f"probability_{name}"].tolist(), abs=1e-5)


@pytest.mark.e2e
def test_served_answers_equal_the_evaluate_stages_predictions_row_by_row(server, model, tmp_path):
    # The evaluate stage on the served model, in a project beside the fixture's (fp32, as tiny_params train)
    project = tmp_path / "project"
    for name in ("data/raw", "data/tokenized", "models/trained"):
        (project / name).parent.mkdir(parents=True, exist_ok=True)
        (project / name).symlink_to(model.parents[1] / name)
    evaluate_model(tiny_params(evaluate={"splits": ["validation"]}), Paths(project))
    reset_accelerate()
    rows = load_client.validation_rows(project, Task.load(model))
    result = agreement(load_client.answers(server[0], rows), rows.evaluated)
    assert (result.same, result.rows, result.differing, result.met) == (21, 21, [], True)
    assert result.max_probability_diff <= 1e-5  # the same probabilities to 5 decimals, give or take the rounding


@pytest.mark.e2e
@pytest.mark.parametrize("body,status,message", [
    (b'{"inputs": {"text": "a"', 400, "body: not valid JSON"),
    ({}, 422, "inputs: Field required"),
    ({"inputs": {"text": "A cat."}}, 422, "inputs[0].text_pair: missing"),
    ({"inputs": [{"text": "A cat.", "text_pair": "A dog."}, {"text": "A cat.", "text_pair": 5}]}, 422,
     "inputs[1].text_pair: Input should be a valid string"),
    ({"inputs": {"text": "  ", "text_pair": "A dog."}}, 422, "inputs[0].text: empty text (empty or only whitespace)"),
    ({"inputs": as_inputs(PAIRS * 2)}, 422, "inputs: 6 examples; give one example or a list of 1 to 4 per request"),
    ({"inputs": []}, 422, "inputs: 0 examples"),
    ({"inputs": "A cat."}, 422, "inputs[0]: Input should be a valid dictionary"),
    ({"inputs": {"text": "A cat.", "text_pair": "A dog.", "label": 1}}, 422, "inputs[0].label: Extra inputs"),
    ({"inputs": {"text": "A cat.", "text_pair": "A dog."}, "model": "/etc"}, 422, "model: Extra inputs"),
    ({"inputs": {"text": "A cat. " * 5000, "text_pair": "A dog."}}, 413,
     "body: over the limit of 20000 bytes (--max-body-bytes)"),
])
def test_a_bad_request_gets_its_4xx_and_the_server_goes_on(server, body, status, message):
    port, _, _ = server
    got, answer = post(port, body)
    assert (got, message in answer.get("error", "")) == (status, True), answer
    assert post(port, {"inputs": as_inputs(PAIRS[:1])})[0] == 200


@pytest.mark.e2e
def test_a_body_not_sent_as_json_is_told_the_content_type(server):
    status, answer = post(server[0], {"inputs": as_inputs(PAIRS[:1])[0]}, content_type="text/plain")
    assert (status, answer["error"]) == (422, 'body: expected a JSON object such as {"inputs": ...}, sent as '
                                               "Content-Type: application/json"), answer


@pytest.mark.e2e
def test_an_over_long_text_is_truncated_not_refused(server):
    port, _, _ = server
    status, answer = post(port, {"inputs": {"text": "A cat sat. " * 1500, "text_pair": "A dog."}})
    assert status == 200 and len(answer["predictions"]) == 1, answer


@pytest.mark.e2e
def test_concurrent_requests_are_batched_by_the_engine(server):
    port, _, log = server
    with ThreadPoolExecutor(8) as pool:
        statuses = [status for status, _ in pool.map(lambda i: post(port, {"inputs": as_inputs(PAIRS[:1])}),
                                                     range(8))]
    assert statuses == [200] * 8
    sizes = [int(line.split("batch: ")[1].split()[0]) for line in log.read_text().splitlines() if "batch: " in line]
    assert max(sizes) > 1, sizes


@pytest.mark.e2e
def test_a_client_that_hangs_up_mid_request_leaves_the_server_answering(server):
    port = server[0]
    for partial in (b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 500"
                    b"\r\n\r\n{\"inputs\":", json_request(PAIRS[0])):
        with socket.create_connection(("127.0.0.1", port)) as client:
            client.sendall(partial)  # then gone, before the answer
    assert post(port, {"inputs": as_inputs(PAIRS[:1])})[0] == 200


def json_request(pair) -> bytes:
    body = json.dumps({"inputs": as_inputs([pair])[0]}).encode()
    return (b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: "
            + str(len(body)).encode() + b"\r\n\r\n" + body)


@pytest.mark.e2e
def test_sigterm_answers_the_requests_in_flight_and_exits_0(server):
    port, process, log = server
    with ThreadPoolExecutor(6) as pool:
        answers = [pool.submit(post, port, {"inputs": as_inputs(PAIRS)}) for _ in range(6)]
        time.sleep(0.1)  # accepted, waiting for their batch (--batch-timeout 0.2)
        process.send_signal(signal.SIGTERM)
        statuses = [answer.result()[0] for answer in answers]
    assert statuses == [200] * 6
    assert process.wait(timeout=60) == 0, log.read_text()[-3000:]


def model_worker(process: subprocess.Popen) -> psutil.Process:
    """The server's model worker: the child LitServe spawned (the HTTP process and the queue manager are forked)."""
    spawned = [child for child in psutil.Process(process.pid).children(recursive=True)
               if any("spawn_main" in part for part in child.cmdline())]
    assert len(spawned) == 1, spawned
    return spawned[0]


def answered_within(port: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if post(port, {"inputs": as_inputs(PAIRS[:1])})[0] == 200:
            return True
        time.sleep(0.5)
    return False


@pytest.mark.e2e
def test_a_dead_model_worker_is_restarted_and_a_model_gone_for_good_stops_the_server(model, tmp_path):
    copy = tmp_path / "model"
    shutil.copytree(model, copy)
    port, process = start_server(copy, tmp_path / "serve.log", "--timeout", 3, "--batch-timeout", 0.5)
    try:
        for _ in range(2):  # killed, restarted, killed again
            with ThreadPoolExecutor(3) as pool:
                held = [pool.submit(post, port, {"inputs": as_inputs(PAIRS[:1])}) for _ in range(3)]
                time.sleep(0.2)  # taken by the worker, waiting for its batch to fill
                model_worker(process).kill()
                begin = time.monotonic()
                answers = [answer.result() for answer in held]
            # each answered within the timeout: a 504 for what the dead worker held, or a 200 from its successor for
            # what was still queued; never an empty reply
            assert {status for status, _ in answers} <= {200, 504} and time.monotonic() - begin < 6, answers
            assert all("(--timeout); the model worker is overloaded or restarting" in answer["error"]
                       for status, answer in answers if status == 504), answers
            assert answered_within(port, 60), (tmp_path / "serve.log").read_text()[-3000:]
        shutil.rmtree(copy)  # loaded in memory: it still answers, until its worker has to load it again
        assert post(port, {"inputs": as_inputs(PAIRS[:1])})[0] == 200
        model_worker(process).kill()
        assert process.wait(timeout=60) == 1
        log = (tmp_path / "serve.log").read_text()
        assert f"{copy}: model folder not found; stopping the server" in log
    finally:
        stop(process)


def test_a_port_in_use_or_a_bad_flag_stops_start_up_with_one_line(model, capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(SystemExit) as exit_:
            serve_main(["--form", "pytorch", "--model", str(model), "--port", str(port)])
    assert str(exit_.value.code).startswith(f"ERROR: --port {port}: can't listen on 127.0.0.1:{port} (")
    assert str(exit_.value.code).endswith("choose another --port")
    for flag, value, error in [("--batch-timeout", "-1", "must be at least 0, got -1"),
                               ("--timeout", "soon", "'soon' is not a number of seconds"),
                               ("--port", "80", "must be at least 1024, got 80"),
                               ("--port", "70000", "must be at most 65535, got 70000")]:
        with pytest.raises(SystemExit):
            serve_main([flag, value])
        assert f"argument {flag}: {error}" in capsys.readouterr().err


def test_a_missing_or_incomplete_model_folder_stops_start_up_with_one_line(model, tmp_path):
    incomplete = tmp_path / "incomplete"
    shutil.copytree(model, incomplete)
    (incomplete / "model.safetensors").unlink()
    cases = [(["--form", "onnx-fp32", "--exported", tmp_path / "none"],
              f"ERROR: {tmp_path / 'none'}: no such folder of exported forms; make it with dvc repro export"),
             (["--form", "pytorch", "--model", incomplete], f"ERROR: {incomplete}: incomplete (")]
    for args, start in cases:  # in this process: the folder is checked before any server starts
        with pytest.raises(SystemExit) as exit_:
            serve_main([*map(str, args), "--port", str(free_port())])
        message = str(exit_.value.code)
        assert message.startswith(start) and "\n" not in message and "dvc repro" in message, message


def test_the_gpu_serves_the_pytorch_form_only_and_needs_a_gpu(model):
    import torch

    cases = [(["--form", "onnx-fp32"], "ERROR: --device cuda: serves the pytorch form only")]
    if not torch.cuda.is_available():
        cases.append((["--form", "pytorch", "--model", str(model)], "ERROR: --device cuda: torch "))
    for args, start in cases:  # checked before any model loads or server starts
        with pytest.raises(SystemExit) as exit_:
            serve_main([*args, "--device", "cuda", "--port", str(free_port())])
        assert str(exit_.value.code).startswith(start), exit_.value.code
