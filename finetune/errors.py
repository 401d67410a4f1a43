"""The errors a user can cause: bad params, an unreachable source, a bad checkpoint folder, bad data, a bad batch,
a teacher that does not fit the task.

Each is a ``PipelineError`` whose message names the file, key, split, row or rule. A stage run through
``finetune.runtime.run_stage`` prints that message alone and exits 1; any other exception is a bug and keeps its
traceback.
"""


class PipelineError(Exception):
    """An expected error: its message says what is wrong and where, in one line."""


class ParamsError(PipelineError, ValueError):
    """params.yaml is missing, unreadable or invalid; the message names the file and the key."""


class SourceError(PipelineError, RuntimeError):
    """No source of a dataset or checkpoint could be reached; the message names every place tried."""


class CheckpointError(PipelineError, ValueError):
    """A checkpoint folder that can't be used: no config, no weights, no tokenizer, or a head of the wrong size."""


class DataError(PipelineError, ValueError):
    """The dataset breaks a rule; the message names the folder, the split, the row (idx) and the rule."""


class CollateError(PipelineError, AssertionError):
    """A batch breaks a rule; the message names the split, the batch index and the rule."""


class TeacherError(PipelineError, ValueError):
    """The teacher of knowledge distillation (``distill.teacher``, its logits in data/teacher) does not fit the task or
    the train split: other labels, regression against classification, another row count, or logits of another
    teacher or data; the message names data/teacher/teacher.json and ``distill.teacher``."""


class ExportError(PipelineError, RuntimeError):
    """A served form of the model that can't be made, loaded or trusted: an exporter that can't handle the model's
    family, a missing ONNX Runtime, an unknown or absent form, or an fp32 export whose logits differ from PyTorch's;
    the message names the form and the folder or params key."""
