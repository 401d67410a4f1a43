"""The transfer set of distillation: unlabelled pairs the teacher labels (Turc et al. 2019,
https://arxiv.org/abs/1908.08962), made of train texts and their TF-IDF nearest neighbours or read from the user's
files, never holding a text of the validation or test split.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.neighbors import NearestNeighbors

from finetune.data.loading import load_files
from finetune.errors import DataError, ParamsError
from finetune.params import TransferParams
from finetune.tasks import Task

if TYPE_CHECKING:
    from datasets import Dataset, DatasetDict

log = logging.getLogger(__name__)


def neighbour_pairs(train: Dataset, text_columns: tuple[str, str], symmetric: bool, k: int, min_similarity: float,
                    max_similarity: float, held_out: set[str] = frozenset()) -> pd.DataFrame:
    """Pairs of train texts that are neighbours by TF-IDF cosine similarity, none of them a train pair.

    Args:
        symmetric: pool both columns as queries and candidates (MRPC, QQP, STS-B); else each text of the first
            column is paired with texts of the second (a premise with other premises' hypotheses).
        min_similarity, max_similarity: a pair's cosine similarity must lie in ``[min_similarity, max_similarity)``.
        held_out: texts no pair may hold (those of the validation and test splits).

    Returns:
        A frame with the two text columns and ``similarity`` (cosine, 0 to 1), queries in first-seen order, each
        query's neighbours most similar first (equally similar ones in first-seen order, on every machine).

    Raises:
        DataError: the split has fewer than two distinct texts to pair.
    """
    first, second = (list(train[column]) for column in text_columns)
    queries = [t for t in dict.fromkeys(first + second if symmetric else first) if t not in held_out]
    candidates = queries if symmetric else [t for t in dict.fromkeys(second) if t not in held_out]
    if len(candidates) < 2:
        raise DataError(f"distill.transfer: the train split has {len(candidates)} distinct texts in "
                        f"{text_columns[1]!r}; neighbour pairs need at least 2")
    known = set(zip(first, second)) | (set(zip(second, first)) if symmetric else set())
    vectorizer = TfidfVectorizer(sublinear_tf=True).fit(queries + candidates)
    search = NearestNeighbors(n_neighbors=min(4 * k + 1, len(candidates)), metric="cosine", algorithm="brute")
    search.fit(vectorizer.transform(candidates))
    distances, neighbours = search.kneighbors(vectorizer.transform(queries))
    rows, seen = [], set()
    for query, row_distances, row_neighbours in zip(queries, distances, neighbours):
        taken = 0
        # ties (texts that differ only in what the vectorizer drops, e.g. "<.DJI>" and ".DJI") in first-seen order:
        # kneighbors orders them differently on other machines
        order = np.lexsort((row_neighbours, np.round(row_distances, 9)))
        for distance, j in zip(row_distances[order], row_neighbours[order]):
            candidate, similarity = candidates[j], 1.0 - float(distance)
            key = frozenset((query, candidate)) if symmetric else (query, candidate)
            if taken == k or similarity < min_similarity:
                break  # neighbours come most similar first
            if candidate == query or similarity >= max_similarity or (query, candidate) in known or key in seen:
                continue
            seen.add(key)
            rows.append((query, candidate, round(similarity, 6)))
            taken += 1
    return pd.DataFrame(rows, columns=[*text_columns, "similarity"])


def file_pairs(files: list[str], train: Dataset, text_columns: tuple[str, ...],
               held_out: set[str] = frozenset()) -> pd.DataFrame:
    """The rows of the user's unlabelled ``files`` (any format of ``data.files``): their ``text_columns`` and
    ``source`` (the file), less rows with an empty or ``held_out`` text, repeats and rows the train split holds.

    Raises:
        DataError: a file is missing or unreadable, or lacks a text column; naming the file.
    """
    frames = []
    for file in files:
        frame = load_files({"transfer": file})["transfer"].to_pandas()
        missing = [c for c in text_columns if c not in frame.columns]
        if missing:
            raise DataError(f"{file}: no column {missing[0]!r} (distill.transfer.files; the task's text columns are "
                            f"{list(text_columns)}, found {list(frame.columns)})")
        frames.append(frame[list(text_columns)].assign(source=file))
    pairs = pd.concat(frames, ignore_index=True).dropna(subset=list(text_columns))
    pairs = pairs[(pairs[list(text_columns)].astype(str).apply(lambda texts: texts.str.strip()) != "").all(axis=1)]
    known = set(zip(*(train[c] for c in text_columns)))
    pairs = pairs[[tuple(row) not in known and not held_out.intersection(row)
                   for row in pairs[list(text_columns)].itertuples(index=False)]]
    return pairs.drop_duplicates(subset=list(text_columns)).reset_index(drop=True)


def make_transfer_set(p: TransferParams, raw: DatasetDict, task: Task) -> tuple[pd.DataFrame, dict]:
    """The transfer set ``distill.transfer`` asks for, from ``raw``'s train split or the user's files, without any
    text of the other splits, sampled down to ``max_pairs`` (seeded, kept rows in their first order).

    Returns:
        ``(pairs, description)``: a frame with the task's text columns (and ``similarity`` or ``source``), and what
        teacher.json records of it: the params, the pairs made before and after sampling, and how they were made.

    Raises:
        ParamsError: ``neighbours`` for a single-text task.
        DataError: see ``neighbour_pairs`` and ``file_pairs``.
    """
    columns = tuple(task.text_columns)
    train = raw["train"]
    held_out = {text for split, ds in raw.items() if split != "train" for c in columns for text in ds[c]}
    if p.kind == "neighbours":
        if len(columns) != 2:
            raise ParamsError(f"params.yaml: distill.transfer.kind: neighbours makes pairs, but task {task.name!r} "
                              f"has one text column {list(columns)}; use kind: files with your own unlabelled text")
        pairs = neighbour_pairs(train, columns, task.symmetric, p.k, p.min_similarity, p.max_similarity, held_out)
        how = (f"each train text paired with its {p.k} nearest train texts by TF-IDF cosine similarity in "
               f"[{p.min_similarity}, {p.max_similarity}) (train pairs, repeats and the {len(held_out)} texts of the "
               "other splits left out)")
    else:
        pairs = file_pairs(p.files, train, columns, held_out)
        how = f"the rows of {', '.join(p.files)} (empty, repeated, train and held-out rows dropped)"
    made = len(pairs)
    if p.max_pairs is not None and made > p.max_pairs:
        keep = np.sort(np.random.default_rng(p.seed).choice(made, size=p.max_pairs, replace=False))
        pairs = pairs.iloc[keep].reset_index(drop=True)
    if pairs.empty:
        raise DataError(f"distill.transfer: the {p.kind} transfer set is empty ({how})")
    log.info("Transfer set: %d pairs (%d made, max_pairs %s): %s", len(pairs), made, p.max_pairs, how)
    return pairs, {"params": p.model_dump(), "made": made, "rows": len(pairs), "how": how}

