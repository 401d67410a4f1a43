"""The errors a user can cause, each a ``PipelineError`` whose one-line message names the file, key, split, row or
rule; ``finetune.runtime.run_stage`` prints it alone and exits 1.
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
    """``distill.teacher`` or its logits in data/teacher do not fit the task or the train split (labels, task type,
    row count, or logits of another teacher or data); the message names the file and ``distill.teacher``."""


class ExportError(PipelineError, RuntimeError):
    """A served form that can't be made, loaded or trusted (exporter, runtime, unknown or absent form, fp32 logits
    off PyTorch's); the message names the form and the folder or params key."""
