"""A search space for ``tools.tune``: a YAML file of ``params.yaml`` keys and the values each may take.

    # configs/search/rte.yaml
    fixed:                         # set in every trial (partial params in dotted keys)
      data.config: rte
    space:                         # what the search chooses
      train.lr: {low: 1.0e-5, high: 2.0e-4, log: true}   # a float range, sampled on a log scale
      train.epochs: {low: 3, high: 6}                     # an int range (both ends ints), inclusive
      train.warmup_ratio: {low: 0.0, high: 0.1}           # a float range, linear
      train.batch_size: {choices: [8, 16, 32]}            # categorical
      train.scheduler: {choices: [linear, cosine]}

Ranges map to Optuna's ``suggest_float`` / ``suggest_int`` (``log``, ``step``) and choices to
``suggest_categorical`` (https://optuna.readthedocs.io/en/stable/reference/generated/optuna.trial.Trial.html).
Everything is checked before any trial runs: a key params.yaml lacks, an empty range, a log range through 0, a value
of the wrong type for its param (each end and choice is validated as params) stop with one line naming the file and
the key.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from finetune.errors import ParamsError
from finetune.overrides import validate_merged
from finetune.params import PARAMS_FILE, validate_params
from finetune.runtime import read_yaml

RANGE_FIELDS = {"low", "high", "log", "step"}


@dataclass(frozen=True)
class SearchSpace:
    """``fixed``: ``{"section.key": value}`` set in every trial; ``space``: ``{"section.key": spec}``, a spec being
    ``{"low", "high", "log"?, "step"?}`` or ``{"choices": [...]}``; ``source``: the file, for messages."""

    fixed: dict[str, Any]
    space: dict[str, dict]
    source: str

    def sample(self, trial) -> dict[str, Any]:
        """One configuration: ``{"section.key": value}`` of every key in ``space``, drawn by ``trial`` (an
        ``optuna.trial.Trial``; its sampler decides)."""
        values = {}
        for key, spec in self.space.items():
            if "choices" in spec:
                values[key] = trial.suggest_categorical(key, spec["choices"])
            elif is_int_range(spec):
                values[key] = trial.suggest_int(key, spec["low"], spec["high"], step=spec.get("step", 1),
                                                log=spec.get("log", False))
            else:
                values[key] = trial.suggest_float(key, float(spec["low"]), float(spec["high"]), step=spec.get("step"),
                                                  log=spec.get("log", False))
        return values


def with_fixed(params: dict, fixed: dict[str, Any]) -> dict[str, dict]:
    """A copy of ``params`` (params.yaml's sections) with the dotted keys of ``fixed`` set."""
    out = {section: dict(values) for section, values in params.items()}
    for section, values in nested(fixed).items():
        out[section].update(values)
    return out


def is_int_range(spec: dict) -> bool:
    return all(isinstance(spec[end], int) and not isinstance(spec[end], bool) for end in ("low", "high"))


def nested(values: dict[str, Any]) -> dict[str, dict]:
    """``{"train.lr": 1e-4}`` as params sections ``{"train": {"lr": 1e-4}}``."""
    out: dict[str, dict] = {}
    for key, value in values.items():
        section, name = key.split(".", 1)
        out.setdefault(section, {})[name] = value
    return out


def check_spec(key: str, spec: Any, where: str) -> None:
    """Raise ParamsError (naming ``where`` and ``key``) unless ``spec`` is a range or choices Optuna can sample."""
    if not isinstance(spec, dict):
        raise ParamsError(f"{where}: {key}: expected {{low: …, high: …}} or {{choices: […]}}, got {spec!r}")
    if "choices" in spec:
        if set(spec) != {"choices"} or not isinstance(spec["choices"], list) or not spec["choices"]:
            raise ParamsError(f"{where}: {key}: choices must be a non-empty list, alone (got {spec!r})")
        return
    if set(spec) - RANGE_FIELDS or not {"low", "high"} <= set(spec):
        raise ParamsError(f"{where}: {key}: a range has low, high and optionally log, step (got {spec!r})")
    low, high = spec["low"], spec["high"]
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (low, high)):
        raise ParamsError(f"{where}: {key}: low and high must be numbers (got {low!r}, {high!r})")
    if low >= high:
        raise ParamsError(f"{where}: {key}: empty range: low {low} is not below high {high}")
    if not isinstance(spec.get("log", False), bool):  # YAML 1.2 reads `log: no` as the text "no"
        raise ParamsError(f"{where}: {key}: log must be true or false (got {spec['log']!r})")
    step = spec.get("step")
    number = isinstance(step, (int, float)) and not isinstance(step, bool)
    if step is not None and not (number and 0 < step <= high - low):
        raise ParamsError(f"{where}: {key}: step must be a number above 0 and at most high - low ({high - low:g}) "
                          f"(got {step!r})")
    if spec.get("log") and low <= 0:
        raise ParamsError(f"{where}: {key}: a log range must stay above 0 (got low {low})")
    if spec.get("log") and spec.get("step") is not None:
        raise ParamsError(f"{where}: {key}: log and step cannot be combined (Optuna)")


def candidates(spec: dict) -> list[Any]:
    """The values of ``spec`` that are checked as params: both ends of a range, every choice."""
    if "choices" in spec:
        return spec["choices"]
    return [spec["low"], spec["high"]] if is_int_range(spec) else [float(spec["low"]), float(spec["high"])]


def load_space(path: str | Path, params: dict) -> SearchSpace:
    """Read and check the search space at ``path`` against ``params`` (params.yaml's content).

    Raises:
        ParamsError: one line naming ``path`` and the key: not a mapping of ``fixed``/``space``, a key params.yaml
            lacks (or a whole section), ``fixed`` choosing a dataset while params.yaml sets ``data.files`` (naming
            params.yaml's key, ``validate_merged``), a bad range or choice list (``check_spec``), or a value that is
            not valid params (e.g. ``train.scheduler: {choices: [linear, bogus]}``, ``train.batch_size: {low: 0.5,
            …}``).
    """
    where = str(path)
    if not Path(path).is_file():
        raise ParamsError(f"{where}: no such search space file")
    raw = read_yaml(Path(path).read_text(), where) or {}
    if not isinstance(raw, dict) or set(raw) - {"fixed", "space"} or not isinstance(raw.get("space"), dict) \
            or not isinstance(raw.get("fixed", {}) or {}, dict):
        raise ParamsError(f"{where}: expected a mapping with `space:` (and optionally `fixed:`) of params keys")
    fixed, space = raw.get("fixed") or {}, raw["space"]
    if not space:
        raise ParamsError(f"{where}: space: nothing to search")
    for key in [*fixed, *space]:
        section, _, name = str(key).partition(".")
        if not name or section not in params or not isinstance(params[section], dict) or name not in params[section]:
            raise ParamsError(f"{where}: {key}: not a key of params.yaml (write section.key, e.g. train.lr)")
        if key in fixed and key in space:
            raise ParamsError(f"{where}: {key}: both fixed and searched")
    base = validate_merged(params, nested(fixed), str(PARAMS_FILE), f"{where} (fixed)")
    for key, spec in space.items():
        check_spec(key, spec, where)
        section, name = key.split(".", 1)
        for value in candidates(spec):
            trial_params = {**base, section: {**base[section], name: value}}
            try:
                validate_params(trial_params, where)
            except ParamsError as err:
                raise ParamsError(f"{where}: {key}: {value!r} is not a valid value: "
                                  f"{str(err).splitlines()[0].split(': ', 1)[-1]}") from None
    return SearchSpace(fixed=fixed, space=space, source=where)
