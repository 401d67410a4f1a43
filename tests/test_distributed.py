"""The distributed path on CPU: with a 2-process accelerate config the train and evaluate stages hand themselves over
to `accelerate launch`; 2 processes train, and evaluate to the same metrics as one process on the same weights, also
when a split does not divide by the global batch. Two "machines" of one process each on loopback (gloo, 127.0.0.1,
a free port; tests/machines.py stands in for srun) train and evaluate exactly as the 2 processes of one machine,
only the main machine writes outputs, and a killed machine fails the stage within train.ddp_timeout."""

from __future__ import annotations

import json
import os
import shutil
import signal
import time

import pandas as pd
import psutil
import pytest
import yaml
from safetensors.torch import load_file

from finetune.errors import ParamsError, PipelineError
from finetune.evaluate.predictions import evaluate_model
from finetune.launch import launch_if_distributed, machines_from_env
from tests.helpers import REPO, make_project, project_env, python, run, start, tiny_params, write_params

CPU_2PROC = REPO / "configs" / "accelerate" / "cpu_2proc.yaml"


def params(accelerate_config=CPU_2PROC, **train):
    """The tests' params: validation has 21 rows, test 19: neither divides by the global batch of 2 processes x 4."""
    return tiny_params(train={"seed": 5, "batch_size": 4, "warmup_steps": 0, "num_threads": 1,
                              "accelerate_config": str(accelerate_config), **train},
                       evaluate={"batch_size": 4, "sort_by_length": True, "splits": ["validation", "test"]})


PARAMS = params()
MACHINES = "tests.machines"
OUTPUTS = {}  # the stages' output in the module's project


@pytest.fixture(scope="module")
def paths(tiny_raw, tiny_checkpoint, tmp_path_factory):
    """A project trained and evaluated by the stages' commands, by 2 processes of this machine (CPU_2PROC)."""
    paths = make_project(tmp_path_factory.mktemp("distributed") / "p", PARAMS, tiny_raw, tiny_checkpoint)
    OUTPUTS["train"] = run(python("-m", "stages.train"), paths.root)
    run(python("-m", "stages.evaluate"), paths.root)
    return paths


@pytest.mark.e2e  # the module's stages ran as subprocesses (accelerate launch)
def test_two_processes_train_with_a_shared_schedule(paths):
    assert "on 2 process(es)" in OUTPUTS["train"]
    metrics = json.loads((paths.root / "metrics" / "train.json").read_text())
    # 40 rows, 10 batches of 4, split over 2 processes: 5 optimizer steps an epoch, taken by both together
    assert (metrics["steps"], metrics["epochs"]) == (10, 2)
    assert metrics["train_samples"] == 2 * 10 * 4
    assert (paths.trained / "model.safetensors").is_file()


@pytest.mark.e2e  # the module's stages ran as subprocesses (accelerate launch)
def test_two_processes_evaluate_like_one(paths):
    two = json.loads((paths.root / "metrics" / "eval.json").read_text())
    two_predictions = {s: pd.read_csv(paths.predictions / f"{s}.csv") for s in ("validation", "test")}
    one = evaluate_model(PARAMS, paths)  # one process: this one

    for split, examples in (("validation", 21), ("test", 19)):
        assert two[split]["examples"] == one[split]["examples"] == examples  # each row counted once
        assert (two[split]["accuracy"], two[split]["f1"]) == (one[split]["accuracy"], one[split]["f1"])
        assert two[split]["loss"] == pytest.approx(one[split]["loss"], abs=1e-4)
        predictions = pd.read_csv(paths.predictions / f"{split}.csv")
        assert predictions["idx"].tolist() == list(range(examples))
        assert predictions["prediction"].tolist() == two_predictions[split]["prediction"].tolist()


def test_the_stages_hand_over_before_importing_torch():
    # The process that only starts `accelerate launch` imports no torch, transformers or datasets (about 4 s).
    code = ("import sys, stages.train, stages.evaluate; "
            "print(sorted(m for m in ('torch', 'transformers', 'datasets') if m in sys.modules))")
    assert run(python("-c", code), REPO).strip().splitlines()[-1] == "[]"


def one_process_per_machine(folder) -> str:
    """An accelerate config of one process on each machine (the machines: the launcher's environment)."""
    config = yaml.safe_load(CPU_2PROC.read_text()) | {"num_processes": 1}
    (folder / "one_per_machine.yaml").write_text(yaml.safe_dump(config))
    return str(folder / "one_per_machine.yaml")


@pytest.fixture(scope="module")
def two_machines(tiny_raw, tiny_checkpoint, tmp_path_factory):
    """Machine 0's project (where DVC would run) and machine 1's folder: a copy of params.yaml and data/, with
    models/ on the "shared filesystem" (a link to machine 0's: the pretrained checkpoint, the checkpoints for resume,
    and the trained model that evaluate reads)."""
    base = tmp_path_factory.mktemp("machines")
    main = make_project(base / "main", params(one_process_per_machine(base)), tiny_raw, tiny_checkpoint)
    other = base / "other"
    other.mkdir()
    shutil.copy(main.root / "params.yaml", other)
    shutil.copytree(main.root / "data", other / "data")
    (other / "models").symlink_to(main.root / "models")
    return main, other


@pytest.mark.e2e
def test_two_machines_train_and_evaluate_as_two_processes_of_one(paths, two_machines):
    main, other = two_machines
    env = project_env(FINETUNE_LAUNCHER=f"python -m {MACHINES} --folder {other}")
    output = run(python("-m", "stages.train"), main.root, env)
    run(python("-m", "stages.evaluate"), main.root, env)

    assert "on 2 process(es)" in output
    one, two = load_file(paths.trained / "model.safetensors"), load_file(main.trained / "model.safetensors")
    assert one.keys() == two.keys() and all((one[k] == two[k]).all() for k in one)
    train_one, train_two = (json.loads((p.metrics / "train.json").read_text()) for p in (paths, main))
    for key in ("steps", "epochs", "train_samples", "final_loss", "mean_loss", "best_validation_f1"):
        assert train_one[key] == train_two[key], key
    eval_one, eval_two = (json.loads((p.metrics / "eval.json").read_text()) for p in (paths, main))
    assert eval_one == eval_two
    # Only the main machine wrote its outputs: none in machine 1's folder but for the shared models/
    assert sorted(path.name for path in other.iterdir()) == ["data", "models", "params.yaml"]
    assert sorted(path.name for path in (other / "data").iterdir()) == ["raw", "tokenized"]


@pytest.mark.e2e
def test_a_killed_machine_fails_the_stage_within_the_timeout(two_machines):
    main, other = two_machines
    long_run = params(main.root.parent / "one_per_machine.yaml", epochs=200, resume=False, ddp_timeout=10)
    for folder in (main.root, other):
        write_params(folder, long_run)
    env = project_env(FINETUNE_LAUNCHER=f"python -m {MACHINES} --folder {other}")
    stage = start(python("-m", "stages.train"), main.root, env)
    lines = []
    for line in stage.stdout:  # until machine 0 trains
        lines.append(line)
        if "Training up to" in line:
            break
    time.sleep(2)
    killed = [p for p in psutil.process_iter(["cwd"]) if p.info["cwd"] == str(other)]
    assert killed, "machine 1's processes were not found"
    begin = time.monotonic()
    for process in killed:
        os.kill(process.pid, signal.SIGKILL)
    output, _ = stage.communicate(timeout=120)
    assert stage.returncode != 0
    assert time.monotonic() - begin < long_run.train.ddp_timeout + 60
    assert "Error" in output or "error" in output


def test_the_machines_come_from_the_launchers_environment():
    assert machines_from_env({}) is None and machines_from_env({"NNODES": "1"}) is None
    torchrun = machines_from_env({"NNODES": "2", "NODE_RANK": "1", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "6000"})
    assert (torchrun.count, torchrun.rank, torchrun.address, torchrun.port) == (2, 1, "10.0.0.1", 6000)
    slurm = machines_from_env({"SLURM_NNODES": "4", "SLURM_NODEID": "3", "MASTER_ADDR": "n1", "NNODES": "9"})
    assert (slurm.count, slurm.rank, slurm.address, slurm.port) == (4, 3, "n1", 29500)
    for env, named in (({"NNODES": "2", "MASTER_ADDR": "a"}, "NODE_RANK"), ({"NNODES": "2", "NODE_RANK": "0"},
                       "MASTER_ADDR"), ({"NNODES": "two"}, "NNODES='two'"),
                       ({"NNODES": "2", "NODE_RANK": "2", "MASTER_ADDR": "a"}, "NODE_RANK=2")):
        with pytest.raises(PipelineError, match=named):
            machines_from_env(env)


@pytest.mark.parametrize("text,message", [
    ("- num_processes: 2\n", "expected accelerate's settings (distributed_type, num_processes, ...), got a list"),
    ("", "expected accelerate's settings (distributed_type, num_processes, ...), got an empty file"),
    ("distributed_type: MULTI_GPU\nnum_processes: [2\n", "not valid YAML: "),
    ("distributed_type: 'NO'\nnum_processes: 0\n", "num_processes: 0 is not a whole number of at least 1"),
    ("distributed_type: MULTI_CPU\nnum_processes: 2\n", "MULTI_CPU with num_processes 2 needs MPI (mpirun_config: "
                                                         "mpirun_hostfile); without it accelerate starts one process"),
], ids=["a-list", "empty", "malformed", "zero-processes", "multi-cpu-without-mpi"])
def test_an_accelerate_config_that_cannot_be_used_is_one_line(tmp_path, text, message):
    config = tmp_path / "accelerate.yaml"
    config.write_text(text)
    with pytest.raises(ParamsError) as err:
        launch_if_distributed("stages.train", config)
    assert str(err.value).startswith(f"{config} (train.accelerate_config): {message}")
    assert "\n" not in str(err.value)
