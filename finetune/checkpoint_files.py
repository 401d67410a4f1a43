"""What a checkpoint folder must hold, checked without torch or transformers: config.json, weights, tokenizer files,
and safetensors headers that cover their files. ``finetune.modeling.check_checkpoint`` has transformers read the
config, for the stages that load the model; the card stage, which only copies the folder, checks it here and so never
imports torch.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from safetensors import SafetensorError, safe_open

from finetune.errors import CheckpointError

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "tokenizer.model", "vocab.json")


def damaged(file: Path, why: object) -> CheckpointError:
    """The error for a checkpoint file that can't be read: ``<file>: cannot be read (<why>); the checkpoint is
    damaged: ...``, ``why`` on one line of at most 200 characters (a reader's error, or what is wrong)."""
    return CheckpointError(f"{file}: cannot be read ({' '.join(str(why).split())[:200]}); the checkpoint is damaged: "
                           "save or copy it again")


def check_checkpoint_files(checkpoint_dir: str | Path, need_weights: bool = True,
                           load_config: Callable[[Path], Any] | None = None) -> Any:
    """Check that a local checkpoint folder has a config.json, weights (``need_weights``) and a tokenizer, that
    ``load_config`` reads the config (default ``read_config``: a JSON object), and that each safetensors file's header
    covers the file (a copy or download cut short fails here; the tensors are not read). Returns what
    ``load_config`` returned: the one read of config.json.

    Raises:
        CheckpointError: naming the folder and the missing files, or the file that can't be read, its reader's
            error and what to do.
    """
    folder = Path(checkpoint_dir)
    if not folder.is_dir():
        raise CheckpointError(f"{folder}: checkpoint folder not found")
    if not (folder / "config.json").is_file():
        raise CheckpointError(f"{folder}: no config.json; not a transformers checkpoint folder")
    if need_weights and not any((folder / name).is_file() for name in WEIGHT_FILES):
        raise CheckpointError(f"{folder}: no model weights (one of {', '.join(WEIGHT_FILES)})")
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise CheckpointError(f"{folder}: no tokenizer files (one of {', '.join(TOKENIZER_FILES)}); "
                              "save the tokenizer with the model (tokenizer.save_pretrained)")
    config = (load_config or read_config)(folder)
    for file in sorted(folder.glob("*.safetensors")):
        try:
            with safe_open(file, "numpy"):  # the header only; numpy, so that torch is not imported
                pass
        except (SafetensorError, OSError) as err:
            raise damaged(file, err) from None
    return config


def read_config(folder: Path) -> dict:
    """``folder``/config.json's object.

    Raises:
        CheckpointError: the file is not UTF-8 JSON holding an object.
    """
    file = folder / "config.json"
    try:
        config = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise damaged(file, err) from None
    if not isinstance(config, dict):
        raise damaged(file, f"a JSON {type(config).__name__}, not an object")
    return config
