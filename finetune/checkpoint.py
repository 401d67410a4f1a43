"""What a checkpoint folder must hold before transformers loads it: a config, weights and a tokenizer."""

from __future__ import annotations

from pathlib import Path

from finetune.errors import CheckpointError

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "tokenizer.model", "vocab.json")


def check_checkpoint(checkpoint_dir: str | Path, need_weights: bool = True) -> None:
    """Check that a local checkpoint folder has a config, weights (``need_weights``) and a tokenizer.

    Raises:
        CheckpointError: naming the folder and the missing files, before transformers fails deep inside.
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
