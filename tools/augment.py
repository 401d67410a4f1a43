"""Augmented training pairs for distillation (issue 20): write a GLUE pair task as your own files, its train split
followed by perturbed copies of each train pair, and validation and test unchanged.

Each copy perturbs both texts with EDA's two operations that need no word list (Wei & Zou 2019, "EDA: Easy Data
Augmentation Techniques", arXiv:1901.11196): random deletion (each word dropped with probability ``--p-delete``,
one word always kept) and random swap (two random words exchanged, ``--swaps`` times). A copy keeps its pair's
label as the hard label, as EDA does; with ``distill.teacher`` set, the teacher stage scores every train row,
copies included, so the soft label is the teacher's view of the perturbed pair (TinyBERT's augmentation,
arXiv:1909.10351, replaces words by a masked LM's guesses instead, which this project has no offline model for).

    python -m tools.augment --config mrpc --out data/own/mrpc-eda
    dvc exp run -S 'data.files={train: data/own/mrpc-eda/train.parquet, ...}' ...   # the command it prints

Raises SystemExit naming the folder or config when the data can't be loaded or has no pair columns.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from datasets import concatenate_datasets

from finetune.errors import DataError
from finetune.loading import load_raw
from finetune.runtime import atomic_dir, write_json


def perturb(text: str, rng: random.Random, p_delete: float, swaps: int) -> str:
    """``text`` with each whitespace-separated word deleted with probability ``p_delete`` (at least one word
    kept), then two random words swapped ``swaps`` times (EDA's random deletion and random swap)."""
    words = text.split()
    if not words:
        return text
    kept = [w for w in words if rng.random() >= p_delete] or [rng.choice(words)]
    for _ in range(swaps if len(kept) > 1 else 0):
        i, j = rng.sample(range(len(kept)), 2)
        kept[i], kept[j] = kept[j], kept[i]
    return " ".join(kept)


def augment(source: str, config: str, out: Path, copies: int, p_delete: float, swaps: int, seed: int) -> dict:
    """Write ``out/{train,validation,test}.parquet``, the folder replaced atomically: train = the original rows,
    then ``copies`` perturbed copies of each (column ``augmented``: 0 original, 1 copy; a GLUE ``idx`` renumbered to
    stay unique); the other splits as they are. Returns the summary that is also written to ``out/augment.json``
    (source, config, method, settings, rows per split).

    Raises:
        SystemExit: ``source``/``config`` can't be loaded or its train split lacks sentence1/sentence2.
    """
    try:
        splits = load_raw(source, config)  # one-line errors, and no stale rows from datasets' cache
    except DataError as err:
        raise SystemExit(str(err)) from err
    train = splits["train"]
    if not {"sentence1", "sentence2"} <= set(train.column_names):
        raise SystemExit(f"{source} (config {config!r}): train has {train.column_names}, not a sentence1/sentence2 "
                         "pair task")
    rng = random.Random(seed)

    def copy(row: dict, n: int) -> dict:  # a GLUE idx must stay unique: copy n of row i gets i + n x rows
        return {"sentence1": perturb(row["sentence1"], rng, p_delete, swaps),
                "sentence2": perturb(row["sentence2"], rng, p_delete, swaps),
                **({"idx": row["idx"] + n * len(train)} if "idx" in row else {})}

    copied = [train.map(copy, fn_kwargs={"n": n + 1}, desc=f"copy {n + 1} of {copies}", load_from_cache_file=False)
              for n in range(copies)]
    flag = lambda ds, value: ds.add_column("augmented", [value] * len(ds))  # noqa: E731
    splits["train"] = concatenate_datasets([flag(train, 0), *(flag(ds, 1) for ds in copied)])
    summary = {"source": source, "config": config, "method": "EDA random deletion + random swap (arXiv:1901.11196)",
               "copies": copies, "p_delete": p_delete, "swaps": swaps, "seed": seed,
               "rows": {name: len(split) for name, split in splits.items()}}
    with atomic_dir(out) as tmp:  # a failure leaves no half-written folder
        for name, split in splits.items():
            split.to_parquet(tmp / f"{name}.parquet")
        write_json(tmp / "augment.json", summary)
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", default="../shared/datasets/glue", help="a Hub id or a folder laid out like it")
    parser.add_argument("--config", default="mrpc", help="a pair task with sentence1/sentence2 (mrpc, rte, stsb, wnli)")
    parser.add_argument("--out", type=Path, default=Path("data/own/mrpc-eda"))
    parser.add_argument("--copies", type=int, default=1, help="perturbed copies of each train pair")
    parser.add_argument("--p-delete", type=float, default=0.1, help="probability of deleting each word")
    parser.add_argument("--swaps", type=int, default=1, help="random swaps of two words per text")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    summary = augment(args.source, args.config, args.out, args.copies, args.p_delete, args.swaps, args.seed)
    print(json.dumps(summary["rows"]))
    files = ", ".join(f"{name}: {args.out}/{name}.parquet" for name in summary["rows"])
    print(f"dvc exp run -S 'data.dataset=null' -S 'data.config=null' -S 'data.files={{{files}}}' "
          f"-S 'data.text_columns=[sentence1, sentence2]' -S data.symmetric=true")


if __name__ == "__main__":
    main()
