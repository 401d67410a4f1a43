"""Stage 2, tokenize: sentence pairs to token ids with the checkpoint's tokenizer.

Writes data/tokenized/ (Arrow, DatasetDict.save_to_disk) and metrics/token_lengths.json (per split).
"""

from __future__ import annotations

from datasets import load_from_disk
from transformers import AutoTokenizer

from stages.common import (
    METRICS_DIR,
    PRETRAINED_DIR,
    RAW_DIR,
    TOKENIZED_DIR,
    atomic_dir,
    load_params,
    setup_logging,
    write_json,
)
from stages.data import length_stats, tokenize

log = setup_logging()


def main() -> None:
    params = load_params().tokenize
    tokenizer = AutoTokenizer.from_pretrained(PRETRAINED_DIR)
    max_length = params.max_length or tokenizer.model_max_length
    log.info("Tokenizing %s with %s (truncation at %d tokens)", RAW_DIR, type(tokenizer).__name__, max_length)
    tokenized = tokenize(load_from_disk(str(RAW_DIR)), tokenizer, max_length)
    with atomic_dir(TOKENIZED_DIR) as tmp:
        tokenized.save_to_disk(str(tmp))
    stats = {split: length_stats(ds, max_length) for split, ds in tokenized.items()}
    for split, s in stats.items():
        log.info("%s: %d examples, tokens mean %.1f, max %d, truncated %d", split, s["examples"], s["mean"], s["max"],
                 s["truncated"])
    write_json(METRICS_DIR / "token_lengths.json", stats)


if __name__ == "__main__":
    main()
