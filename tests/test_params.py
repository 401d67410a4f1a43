"""params.yaml is read and validated in one place; bad values stop a stage with the key named."""

import copy

import pytest
import yaml

from finetune.errors import ParamsError
from finetune.params import load_params
from tests.helpers import REPO

GOOD = yaml.safe_load((REPO / "params.yaml").read_text())


def test_committed_params_hold_the_chosen_defaults():
    p = load_params(REPO / "params.yaml")
    assert p.model.checkpoint == "sentence-transformers/all-MiniLM-L6-v2"
    # Chosen on validation by the sweep (metrics/sweeps/README.md).
    assert (p.train.epochs, p.train.batch_size, p.train.lr, p.train.warmup_ratio, p.train.weight_decay) == (
        3, 16, 1e-4, 0.06, 0.01)
    # metric_for_best null: the task's main metric, F1 for MRPC.
    assert (p.train.scheduler, p.train.seed, p.train.metric_for_best, p.train.keep_best) == ("cosine", 42, None, True)
    assert (p.train.group_by_length, p.train.adamw_impl, p.train.mixed_precision, p.train.torch_compile) == (
        True, "fused", "auto", False)
    assert (p.data.dataset, p.data.config) == ("nyu-mll/glue", "mrpc")
    assert p.evaluate.splits == ["validation", "test"]


def test_auto_mixed_precision_follows_the_hardware():
    import torch

    from finetune.hardware import resolve_mixed_precision

    for choice in ("no", "fp16", "bf16"):
        assert resolve_mixed_precision(choice) == choice
    if not torch.cuda.is_available():
        flags = set(open("/proc/cpuinfo").read().split())
        expected = "bf16" if {"avx512_bf16", "amx_bf16"} & flags else "no"
        assert resolve_mixed_precision("auto") == expected


@pytest.fixture
def cpuinfo(monkeypatch, tmp_path):
    """A file that finetune.hardware reads in place of /proc/cpuinfo: write the fields to fake a CPU."""
    from finetune import hardware

    fake = tmp_path / "cpuinfo"
    real_path = hardware.Path
    monkeypatch.setattr(hardware, "Path", lambda p: fake if p == "/proc/cpuinfo" else real_path(p))
    return fake


def test_the_device_names_the_cpu_and_its_bf16_instructions(cpuinfo):
    import torch

    from finetune import hardware

    cpuinfo.write_text("model name\t: AMD EPYC\nflags\t\t: fpu avx2 avx512f avx512_bf16\n")
    assert hardware.describe_device("cpu").startswith("cpu: AMD EPYC, ")
    assert hardware.describe_device("cpu").endswith(" threads, avx512_bf16")
    cpuinfo.write_text("model name\t: Intel Xeon\nflags\t\t: fpu avx2\n")
    assert hardware.describe_device("cpu").endswith(" threads, no bf16 instructions")
    assert hardware.cpu_bf16_flags() == []
    if not torch.cuda.is_available():
        assert hardware.resolve_mixed_precision("auto") == "no"  # auto is fp32 on such a CPU


@pytest.mark.parametrize("flags,precision,capability,expected", [
    ("avx2 fma avx512f avx512bw avx512vl avx512dq avx512_bf16 amx_bf16 amx_tile", "bf16", "AVX512",
     "AMX-BF16 (oneDNN)"),
    ("avx2 fma avx512f avx512bw avx512vl avx512dq avx512_bf16", "bf16", "AVX512", "AVX512-BF16 (oneDNN)"),
    ("avx2 fma avx512f avx512bw avx512vl avx512dq", "bf16", "AVX512",
     "bf16 converted to fp32 on AVX512 (no bf16 instructions)"),
    ("avx2 fma", "bf16", "AVX2", "bf16 converted to fp32 on AVX2 (no bf16 instructions)"),
    ("avx2 fma avx512f avx512bw avx512vl avx512dq avx512_bf16", "no", "AVX512", "AVX512 (MKL sgemm)"),
    ("avx2 fma", "no", "AVX2", "AVX2 (MKL sgemm)"),
], ids=["amx", "avx512-bf16", "avx512-emulated", "avx2-emulated", "fp32-avx512", "fp32-avx2"])
def test_the_matmul_instructions_follow_precision_flags_and_torchs_capability(flags, precision, capability, expected):
    from finetune.hardware import matmul_isa

    assert matmul_isa(precision, set(flags.split()), capability) == expected


def test_the_fp32_matmul_names_what_torch_dispatches_to():
    import torch

    from finetune.hardware import matmul_isa

    # read from torch, not guessed from the flags: the same instruction set as numerics' vector_kernels
    assert matmul_isa("no", set()) == f"{torch.backends.cpu.get_cpu_capability()} (MKL sgemm)"


def test_numerics_records_vendor_model_threads_and_instructions(cpuinfo):
    import torch

    from finetune import hardware

    first = ("processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 143\n"
             "model name\t: Intel(R) Xeon(R) Platinum 8481C\nflags\t\t: fpu avx2 fma avx512f avx512bw avx512vl "
             "avx512dq avx512_bf16 amx_bf16 amx_tile\n")
    cpuinfo.write_text(first + "\n" + first.replace("processor\t: 0", "processor\t: 1"))
    assert hardware.numerics("cpu", "bf16") == {
        "processor": "cpu", "vendor": "GenuineIntel", "model": "Intel(R) Xeon(R) Platinum 8481C", "family": "6",
        "model_number": "143", "threads": torch.get_num_threads(), "precision": "bf16", "matmul": "AMX-BF16 (oneDNN)",
        "vector_kernels": torch.backends.cpu.get_cpu_capability(), "torch": torch.__version__}
    cpuinfo.write_text("")  # no /proc/cpuinfo fields (another OS): unknown, not an error
    assert hardware.numerics("cpu", "no")["vendor"] == "unknown" and hardware.cpu_model() == "unknown CPU"


def _with(changes: dict):
    """The committed params with ``{"section.key": value}`` changes (``DELETE``: remove the key)."""
    params = copy.deepcopy(GOOD)
    for key, value in changes.items():
        *parents, last = key.split(".")
        node = params
        for part in parents:
            node = node[part]
        if value is DELETE:
            del node[last]
        else:
            node[last] = value
    return params


DELETE = object()

# (changes to the committed params.yaml, the message after "<file>: ")
BAD = [
    ({"train.lr": -1.0}, "train.lr: Input should be greater than 0"),
    ({"train.lr": "fast"}, "train.lr: Input should be a valid number"),
    ({"train.batch_size": 0}, "train.batch_size: Input should be greater than or equal to 1"),
    ({"train.batch_size": "8"}, "train.batch_size: Input should be a valid integer"),
    ({"train.epochs": 2.5}, "train.epochs: Input should be a valid integer"),
    ({"train.epochs": DELETE}, "train.epochs: Field required"),
    ({"train.scheduler": "cosinus"}, "train.scheduler: Input should be 'linear', 'cosine', 'cosine_with_restarts', "
                                     "'polynomial', 'constant', 'constant_with_warmup', 'inverse_sqrt', "
                                     "'cosine_with_min_lr', 'cosine_warmup_with_min_lr' or 'warmup_stable_decay'"),
    ({"train.scheduler_kwargs": {"num_warmup_steps": 5}},
     "train.scheduler_kwargs: num_warmup_steps: set by the loop (from train.warmup_steps or warmup_ratio and the run's "
     "length)"),
    ({"train.scheduler_kwargs": [2]}, "train.scheduler_kwargs: Input should be a valid dictionary"),
    ({"train.scheduler_kwargs": DELETE}, "train.scheduler_kwargs: Field required"),
    ({"train.mixed_precision": "fp8"}, "train.mixed_precision: Input should be 'auto', 'no', 'fp16' or 'bf16'"),
    ({"train.warmup_steps": -5}, "train.warmup_steps: Input should be greater than or equal to 0"),
    ({"train.warmup_ratio": 1.0}, "train.warmup_ratio: Input should be less than 1"),
    ({"train.gradient_accumulation_steps": 0},
     "train.gradient_accumulation_steps: Input should be greater than or equal to 1"),
    ({"train.max_grad_norm": 0}, "train.max_grad_norm: Input should be greater than 0"),
    ({"train.max_grad_norm": -1.0}, "train.max_grad_norm: Input should be greater than 0"),
    ({"train.metric_for_best": ""}, "train.metric_for_best: String should have at least 1 character"),
    ({"data.config": "mrcp"}, "data: config: 'mrcp' is not a GLUE task; GLUE's are cola, sst2, mrpc, "
                              "qqp, stsb, mnli, qnli, rte, wnli"),
    ({"data.text_columns": ["s1"]}, "data: GLUE task 'mrpc' defines its columns, labels and metric; set "
                                    "text_columns to null"),
    ({"data.files": {"train": "data/own/train.csv"}},
     "data: files and dataset/config are both set: own files need dataset: null and config: null"),
    ({"data.files": {"train": "elsewhere/train.csv"}, "data.dataset": None, "data.config": None,
      "data.text_columns": ["text"]},
     "data: files.train: 'elsewhere/train.csv' is not under data/own/; put your files there"),
    ({"data.files": {"validation": "data/own/v.csv"}, "data.dataset": None, "data.config": None},
     "data: files: no train file (got splits ['validation'])"),
    ({"data.files": {"train": "data/own/t.csv"}, "data.dataset": None, "data.config": None},
     "data: text_columns: own files need the text column(s)"),
    ({"data.text_columns": ["a", "b", "c"]}, "data.text_columns: List should have at most 2 items"),
    ({"data.validation_fraction": 1.5}, "data.validation_fraction: Input should be less than 1"),
    ({"train.keep_best": "true"}, "train.keep_best: Input should be a valid boolean"),
    ({"train.early_stopping_patience": 0}, "train.early_stopping_patience: Input should be greater than or equal to 1"),
    ({"train.early_stopping_threshold": -0.1},
     "train.early_stopping_threshold: Input should be greater than or equal to 0"),
    ({"train.resume": DELETE}, "train.resume: Field required"),
    ({"train.accelerate_config": ""}, "train.accelerate_config: String should have at least 1 character"),
    ({"train.learning_rate": 1e-4}, "train.learning_rate: Extra inputs are not permitted"),
    ({"evaluate.splits": []}, "evaluate.splits: List should have at least 1 item"),
    ({"evaluate.splits": ["test", "test"]}, "evaluate.splits: 'test' is listed twice; list each once"),
    ({"data.positive_label": 1},
     "data.positive_label: Input should be a valid string (got 1); quote it for the text: '1'"),
    ({"evaluate.splits": ["train"]},
     "evaluate.splits[0]: Input should be 'validation', 'test', 'validation_mismatched' or 'test_mismatched'"),
    ({"data.max_samples": 0}, "data.max_samples: Input should be greater than or equal to 1"),
    ({"model.checkpoint": ""}, "model.checkpoint: String should have at least 1 character"),
    ({"model.pooling": "max"}, "model.pooling: Input should be 'cls' or 'mean' (got 'max')"),
    ({"model.reinit_head": True}, "model.reinit_head: Extra inputs are not permitted"),
    ({"tokenize.max_length": 4}, "tokenize.max_length: Input should be greater than or equal to 8"),
    ({"train.group_by_length": "yes"}, "train.group_by_length: Input should be a valid boolean"),
    ({"train.adamw_impl": "apex"}, "train.adamw_impl: Input should be 'default', 'foreach' or 'fused'"),
    ({"train.num_threads": 0}, "train.num_threads: Input should be greater than or equal to 1"),
    ({"evaluate.sort_by_length": DELETE}, "evaluate.sort_by_length: Field required"),
    ({"surprise": {}}, "surprise: Extra inputs are not permitted"),
    # Rules across keys (TrainParams' model_validator): pydantic names the section, not a key.
    ({"train.epochs": None, "train.max_steps": None},
     "train: epochs and max_steps are both null: set epochs (a positive int) or max_steps"),
    ({"train.warmup_steps": 10, "train.warmup_ratio": 0.1},
     "train: warmup_steps (10) and warmup_ratio (0.1) are both set: set one, the other to 0"),
    ({"train.accelerate_config": "configs/accelerate/nowhere.yaml"},
     "train: accelerate_config: file 'configs/accelerate/nowhere.yaml' not found"),
]


def _id(changes: dict) -> str:
    return ",".join(f"{k}={'DELETE' if v is DELETE else repr(v)}" for k, v in changes.items())[:60]


@pytest.mark.parametrize("changes,message", BAD, ids=[_id(changes) for changes, _ in BAD])
def test_bad_params_name_the_file_and_key(tmp_path, monkeypatch, changes, message):
    monkeypatch.chdir(REPO)  # train.accelerate_config is relative to the working directory
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(_with(changes)))
    with pytest.raises(ParamsError) as err:
        load_params(path)
    assert f"{path}: {message}" in str(err.value)


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(ParamsError, match="not found"):
        load_params(tmp_path / "params.yaml")
    (tmp_path / "bad.yaml").write_text("train: [unclosed")
    with pytest.raises(ParamsError, match=r"bad.yaml: not valid YAML: expected ',' or '\]', but got '<stream end>' "
                                          r"\(line 1, column 17\)$"):
        load_params(tmp_path / "bad.yaml")
    (tmp_path / "folder.yaml").mkdir()
    with pytest.raises(ParamsError, match=r"folder.yaml: cannot be read \(IsADirectoryError: Is a directory\)$"):
        load_params(tmp_path / "folder.yaml")


def test_params_written_by_dvc_exp_run_are_read_as_yaml_1_2(tmp_path):
    # `dvc exp run -S train.lr=3e-5 -S train.mixed_precision=no` writes both unquoted (ruamel.yaml, YAML 1.2);
    # YAML 1.1 would read a string and the boolean False.
    path = tmp_path / "params.yaml"
    text = (REPO / "params.yaml").read_text().replace("lr: 1.0e-4", "lr: 3e-5")
    path.write_text(text.replace("mixed_precision: auto", "mixed_precision: no"))
    params = load_params(path)
    assert (params.train.lr, params.train.mixed_precision) == (3e-5, "no")
    # The same file rewritten by a YAML 1.1 tool holds `mixed_precision: false`: still 'no'.
    path.write_text(text.replace("mixed_precision: auto", "mixed_precision: false"))
    assert load_params(path).train.mixed_precision == "no"


def test_overrides_are_validated_like_params_yaml():
    from finetune.overrides import with_overrides

    params = load_params(REPO / "params.yaml")
    assert with_overrides(params, {"train": {"lr": 3e-5}}).train.lr == 3e-5
    with pytest.raises(ParamsError, match=r"^benchmark: train.batch_sise: Extra inputs are not permitted"):
        with_overrides(params, {"train": {"batch_sise": 8}}, source="benchmark")


def test_set_param_merges_a_mapping_and_a_null_split_drops_one(tmp_path, monkeypatch):
    # What `dvc exp run -S` does to params.yaml (dvc.utils.hydra.apply_overrides): a mapping is merged into the one
    # there, so a split it does not name stays; `data.files.test=null` (or Hydra's `~data.files.test`) drops it.
    from dvc.utils.hydra import apply_overrides

    monkeypatch.chdir(REPO)  # train.accelerate_config is relative to the working directory
    old = {"train": "data/own/a/train.csv", "validation": "data/own/a/dev.csv", "test": "data/own/a/test.csv"}
    own = _with({"data.dataset": None, "data.config": None, "data.text_columns": ["text"], "data.files": old})
    path = tmp_path / "params.yaml"
    switch = "data.files={train: data/own/b/train.csv, validation: data/own/b/dev.csv}"
    for more, test in (([], "data/own/a/test.csv"), (["data.files.test=null"], None), (["~data.files.test"], None)):
        path.write_text(yaml.safe_dump(own))
        apply_overrides(path, [switch, *more])
        files = load_params(path).data.files
        assert files == {"train": "data/own/b/train.csv", "validation": "data/own/b/dev.csv",
                         **({"test": test} if test else {})}, more
    own["data"]["files"] = {**old, "train": None}
    path.write_text(yaml.safe_dump(own))
    with pytest.raises(ParamsError, match=r"data: files: no train file \(got splits \['test', 'validation'\]\)"):
        load_params(path)


def test_the_schedulers_are_those_transformers_steps_without_a_metric():
    # a transformers bump that adds or renames a scheduler fails here: SCHEDULERS follows SchedulerType
    from typing import get_args

    from transformers import SchedulerType

    from finetune.params import SCHEDULERS
    from finetune.train.optimization import METRIC_SCHEDULERS

    assert get_args(SCHEDULERS) == tuple(s.value for s in SchedulerType if s not in METRIC_SCHEDULERS)
