"""What every benchmark reads and the check that the workspace holds it: GLUE MRPC (the course's task) in data/raw,
with params.yaml's data section, and its checkpoint in models/pretrained (`dvc repro download`)."""

from __future__ import annotations

from finetune.errors import ParamsError
from finetune.params import load_params
from finetune.paths import Paths
from finetune.tasks import TASK_FILE, Task

RAW_DIR, PRETRAINED_DIR = Paths().raw, Paths().pretrained


def check_workspace() -> str | None:
    """Why this workspace can't be benchmarked, in one line, or None: every way trains and scores GLUE MRPC (the
    course's task), from data/raw and with params.yaml's data section, so both must be MRPC's."""
    try:
        data = load_params().data
    except ParamsError as err:
        return str(err).splitlines()[0]
    where = f"data.files {data.files}" if data.files else f"data.dataset {data.dataset!r}, config {data.config!r}"
    restore = ("restore params.yaml's data section (`git checkout params.yaml`, or `dvc exp apply` of an MRPC "
               "experiment), then `dvc repro download`")
    if data.glue_task != "mrpc":
        return f"the benchmark runs on GLUE MRPC, but params.yaml's data is {where}: {restore}"
    if not (RAW_DIR / TASK_FILE).is_file():
        return f"{RAW_DIR}/task.json not found: run `dvc repro download` first"
    raw_task = Task.load(RAW_DIR).name
    if raw_task != "mrpc":
        return f"the benchmark runs on GLUE MRPC, but {RAW_DIR} holds task {raw_task!r}: run `dvc repro download`"
    return None
