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


def field_error(error: dict, skip: int = 0) -> str:
    """One error of pydantic's ``ValidationError.errors()`` as ``a.b[1].c: message``: the field's path (``loc``
    without its first ``skip`` parts; ``<top level>`` where none is left) and pydantic's message without the
    ``Value error, `` it puts before a validator's own. A validator's message that starts with ``[`` or ``.`` names a
    field below the one it checked and goes on from its path (``inputs`` and ``[3].text_pair: missing``)."""
    path = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in error["loc"][skip:])
    message = error["msg"].removeprefix("Value error, ")
    if message.startswith(("[", ".")):
        return f"{path}{message}".lstrip(".")
    return f"{path.lstrip('.') or '<top level>'}: {message}"


def first_line(err: Exception, limit: int = 300) -> str:
    """``err`` in one line for a message: its type and the first line of its text, cut at ``limit`` characters
    (``OSError: Can't load tokenizer ...``)."""
    return f"{type(err).__name__}: {(str(err).strip().splitlines() or [''])[0][:limit]}"
