"""tools.serve on a tiny fine-tuned model, served in a subprocess on a free loopback port: its answers equal
tools.predict's and, truncated where the model was trained, the evaluate stage's, row by row (benchmarks.load's
check); each bad request gets its 4xx naming the field or limit, the requests batched with it get their answers, and
the server goes on answering; concurrent requests are batched by the engine, SIGTERM answers the requests in flight
and exits 0, a model worker that dies is restarted while the requests it held get a 504, and a missing or incomplete
model folder, a port in use or a bad flag stops start-up with one line."""

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

import litserve as ls
import pandas as pd
import psutil
import pytest
from litserve.loops import BatchedLoop

from benchmarks import load_client
from benchmarks.load_agreement import agreement
from finetune.evaluate.predictions import evaluate_model
from finetune.export.registry import open_form
from finetune.paths import Paths
from finetune.tasks import Task
from tests.helpers import REPO, free_port, project_env, reset_accelerate, tiny_params
from tools.predict import predict
from tools.serve import main as serve_main
from tools.serve_api import FormAPI, PredictRequest

PAIRS = [("The cat sat on the mat.", "A cat was sitting on the mat."),
         ("Shares fell sharply on Monday.", "The court rejected the appeal."), ("He won.", "He lost.")]
LIMITS = ["--max-examples", "4", "--max-body-bytes", "20000"]
ROUNDING = 1.01e-5  # one step of the 5 decimals answers are rounded to


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
    to 0.2 s, at debug level (it logs each batch's size), one model worker of one CPU thread, not restarted."""
    log = tmp_path_factory.mktemp("log") / "serve.log"
    port, process = start_server(model, log, "--max-batch-size", 8, "--batch-timeout", 0.2, "--log-level", "debug",
                                 "--num-threads", 1, "--no-restart-workers", *LIMITS)
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


def evaluated(model: Path, folder: Path) -> pd.DataFrame:
    """The evaluate stage's data/predictions/validation.csv of ``model`` (a tiny project's models/trained), written
    in a project at ``folder`` that links that project's data and model."""
    source, paths = Paths(model.parents[1]), Paths(folder)
    for link, target in ((paths.raw, source.raw), (paths.tokenized, source.tokenized), (paths.trained, model)):
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(target)
    evaluate_model(tiny_params(evaluate={"splits": ["validation"]}), paths)
    reset_accelerate()
    return pd.read_csv(paths.predictions / "validation.csv")


@pytest.mark.e2e
def test_served_and_predicted_answers_truncate_where_the_model_was_evaluated(server, model, tmp_path):
    # the model was trained and evaluated with tokenize.max_length 32, every other pair longer than that
    from transformers import AutoTokenizer

    port, _, _ = server
    expected = evaluated(model, tmp_path / "project")
    pairs = list(zip(expected["sentence1"], expected["sentence2"]))
    tokenizer = AutoTokenizer.from_pretrained(model)
    lengths = [len(ids) for ids in tokenizer(*map(list, zip(*pairs)))["input_ids"]]
    assert tokenizer.model_max_length == 32 and sum(n > 32 for n in lengths) >= 5, lengths  # the folder carries it
    file = tmp_path / "validation.csv"
    expected[["sentence1", "sentence2"]].to_csv(file, index=False)
    predicted = predict(file, model)
    with ThreadPoolExecutor(4) as pool:  # requests of up to 4 examples (--max-examples), batched by the engine
        answers = list(pool.map(lambda i: post(port, {"inputs": as_inputs(pairs[i:i + 4])}), range(0, len(pairs), 4)))
    assert {status for status, _ in answers} == {200}, answers
    served = pd.DataFrame([{"prediction": a["label"], **{f"probability_{k}": p for k, p in a["probabilities"].items()}}
                           for _, answer in answers for a in answer["predictions"]])
    columns = ["probability_not_equivalent", "probability_equivalent"]
    for got in (predicted, served):
        assert got["prediction"].tolist() == expected["prediction"].tolist()
        assert got[columns].to_numpy() == pytest.approx(expected[columns].to_numpy(), abs=ROUNDING)
    long = [i for i, n in enumerate(lengths) if n > 32]  # where truncation matters: at 512 tokens they differ
    untruncated = predict(file, model, max_length=512)
    assert (untruncated.loc[long, columns] - expected.loc[long, columns]).abs().to_numpy().max() > 0.01
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/info", timeout=10) as answer:
        settings = json.loads(answer.read())["model"]
    assert {k: settings[k] for k in ("max_length", "num_threads", "workers_per_device", "restart_workers")} == {
        "max_length": 32, "num_threads": 1, "workers_per_device": 1, "restart_workers": False}


@pytest.mark.e2e
def test_a_text_the_tokenizer_cant_take_is_a_422_and_its_batch_neighbours_are_answered(server):
    port, _, _ = server
    bad = {"inputs": {"text": "lone \ud83d surrogate", "text_pair": "A dog."}}  # valid JSON: "lone \ud83d ..."
    with ThreadPoolExecutor(4) as pool:  # within one --batch-timeout (0.2 s)
        answers = list(pool.map(lambda i: post(port, bad if i == 1 else {"inputs": as_inputs([PAIRS[i % 3]])}),
                                range(4)))
    assert answers[1] == (422, {"error": "inputs[0].text: not valid Unicode text (surrogates not allowed: "
                                         "'\\ud83d' at character 5)"}), answers[1]
    assert [status for i, (status, answer) in enumerate(answers) if i != 1 and answer["predictions"]] == [200] * 3


def test_a_request_the_model_fails_on_gets_its_error_and_the_others_their_answers(model, monkeypatch):
    api = FormAPI("pytorch", model, {}, pad_multiple=16, fill_rows=False, tokenizer_threads=False,
                  log_level="info", max_batch_size=8)
    api.predictor = open_form(model)
    good = api.decode_request(PredictRequest(inputs=as_inputs(PAIRS[:2])))
    past_the_check = [("A cat.", "A dog."), ("A cat.", "lone \ud83d surrogate")]  # what the HTTP process refuses
    outputs = [api.encode_response(o) for o in api.unbatch(api.predict(api.batch([good, past_the_check, good])))]
    assert outputs[0] == outputs[2] == {"predictions": api.score([good])[0]}
    assert outputs[1].status_code == 422
    assert json.loads(outputs[1].body)["error"].startswith("inputs[1].text_pair: the tokenizer can't take this text (")
    logits = api.predictor.logits

    def failing(rows, **options):  # a model that fails on one request's valid texts: a 500 for that one alone
        if ("Boom.", "Boom.") in rows:
            raise RuntimeError("out of memory")
        return logits(rows, **options)

    monkeypatch.setattr(api.predictor, "logits", failing)
    outputs = [api.encode_response(o) for o in api.predict([good, [("Boom.", "Boom.")]])]
    assert outputs[0] == {"predictions": api.score([good])[0]} and outputs[1].status_code == 500
    assert json.loads(outputs[1].body) == {"error": "the model failed on this request (RuntimeError: out of memory); "
                                                    "the server logged it"}


def test_one_request_a_batch_still_runs_the_batched_path(model):
    # --max-batch-size 1 (docs/serving.md's advice for onnx-int8): LitServe's default loop for it would hand predict
    # one request, not a list, and skip batch and unbatch; the servers keep the batched loop
    from benchmarks.load_bare import BareAPI

    for api in (FormAPI("pytorch", model, {}, pad_multiple=16, fill_rows=False, tokenizer_threads=False,
                        log_level="info", max_batch_size=1), BareAPI("pytorch", model, max_batch_size=1)):
        assert isinstance(ls.LitServer(api, accelerator="cpu").lit_api.loop, BatchedLoop)


@pytest.mark.e2e
def test_served_answers_equal_the_evaluate_stages_predictions_row_by_row(server, model, tmp_path):
    # The evaluate stage on the served model, in a project beside the fixture's (fp32, as tiny_params train)
    project = tmp_path / "project"
    evaluated(model, project)
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
        with ThreadPoolExecutor(3) as pool:  # killed, then restarted
            held = [pool.submit(post, port, {"inputs": as_inputs(PAIRS[:1])}) for _ in range(3)]
            time.sleep(0.2)  # taken by the worker, waiting for its batch to fill
            model_worker(process).kill()
            begin = time.monotonic()
            answers = [answer.result() for answer in held]
        # each answered within the timeout: a 504 naming --timeout's 3 s for what the dead worker held, or a 200 from
        # its successor for what was still queued; never an empty reply
        assert {status for status, _ in answers} <= {200, 504} and time.monotonic() - begin < 6, answers
        timed_out = [answer["error"] for status, answer in answers if status == 504]
        assert all(error.startswith("no answer from the model within 3 s (--timeout); the model worker is overloaded "
                                    "or restarting") for error in timed_out), answers
        assert answered_within(port, 60), (tmp_path / "serve.log").read_text()[-3000:]
        # the successor, killed in turn, is restarted too, and stops the server when its model is gone for good
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
    for args, error in [(["--max-length", "100000"], "ERROR: --max-length: 100000 is more than the model's 512 "
                                                       "positions (max_position_embeddings in its config.json)"),
                        (["--openvino-hint", "LATENCY"], "ERROR: --openvino-hint: for the openvino-* forms only, not "
                                                         "pytorch"),
                        (["--batch-timeout", "5", "--timeout", "2"], "ERROR: --batch-timeout 5: must be less than "
                                                                     "--timeout 2 (a request would time out while its "
                                                                     "batch fills)")]:
        with pytest.raises(SystemExit) as exit_:
            serve_main(["--form", "pytorch", "--model", str(model), "--port", str(free_port()), *args])
        assert str(exit_.value.code).startswith(error), exit_.value.code
    for flag, value, error in [("--batch-timeout", "-1", "must be at least 0, got -1"),
                               ("--timeout", "soon", "'soon' is not a number"),
                               ("--timeout", "0", "must be above 0, got 0"),
                               ("--port", "80", "must be at least 1024, got 80"),
                               ("--port", "70000", "must be at most 65535, got 70000")]:
        with pytest.raises(SystemExit):
            serve_main([flag, value])
        assert f"argument {flag}: {error}" in capsys.readouterr().err


def test_a_missing_or_incomplete_model_folder_stops_start_up_with_one_line(model, tmp_path):
    incomplete = tmp_path / "incomplete"
    shutil.copytree(model, incomplete)
    (incomplete / "model.safetensors").unlink()
    damaged = tmp_path / "damaged"  # a tokenizer.json of another shape: the tokenizers library's bare Exception
    shutil.copytree(model, damaged)
    (damaged / "tokenizer.json").write_text('{"version": "1.0"}')
    cases = [(["--form", "onnx-fp32", "--exported", tmp_path / "none"],
              f"ERROR: {tmp_path / 'none'}: no such folder of exported forms; make it with dvc repro export"),
             (["--form", "pytorch", "--model", incomplete], f"ERROR: {incomplete}: incomplete ("),
             (["--form", "pytorch", "--model", damaged], f"ERROR: {damaged}: incomplete ({damaged}: cannot load its "
                                                         "tokenizer: ")]
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
