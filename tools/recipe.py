"""Per-task recipes: the `dvc exp run` that trains a GLUE task with the settings chosen for it.

Not a pipeline stage. A recipe is a partial params file, ``configs/tasks/<task>.yaml``, holding only what differs
from the committed ``params.yaml`` (the MRPC defaults); its comments say how it was chosen and what it scored. DVC
reads one params.yaml per project and `dvc exp run -S` takes key=value pairs, not a file, so this turns a recipe
into those pairs. `dvc exp run` in the workspace starts from whatever params the last experiment left there, so the
pairs are every key where "committed params.yaml + recipe" differs from the workspace's params.yaml: the run gets
exactly the recipe, whatever ran before.

    python -m tools.recipe rte                              # print the command
    python -m tools.recipe rte --run                        # run it (seed of the recipe)
    python -m tools.recipe rte --seeds 42 1 2 --queue --run # queue three seeds; then `dvc exp run --run-all`
    python -m tools.recipe metrics/search/rte/recipe.yaml   # the best configuration of a search (tools.tune)

Where each recipe came from: metrics/tasks/README.md, "Per-task recipes".
"""

from __future__ import annotations

import argparse
import io
import shlex
import subprocess
from pathlib import Path
from typing import Any

from finetune.errors import ParamsError
from finetune.overrides import validate_merged
from finetune.params import PARAMS_FILE
from finetune.runtime import read_yaml as read_any_yaml
from finetune.runtime import yaml_reader

RECIPES = Path("configs/tasks")


def read_yaml(text: str, source: str) -> dict:
    """``text`` as a mapping of params sections.

    Raises:
        ParamsError: not YAML, or not a mapping of sections to mappings; the message names ``source``.
    """
    raw = read_any_yaml(text, source) or {}
    if not isinstance(raw, dict) or not all(isinstance(v, dict) for v in raw.values()):
        raise ParamsError(f"{source}: expected sections (data, model, train, ...) of key: value pairs")
    return raw


def recipe_path(task: str, recipes: Path = RECIPES) -> Path:
    """``configs/tasks/<task>.yaml``, or ``task`` itself when it names a YAML file (a search's recipe.yaml)."""
    return Path(task) if task.endswith((".yaml", ".yml")) else recipes / f"{task}.yaml"


def load_recipe(task: str, recipes: Path = RECIPES) -> dict:
    """The recipe of ``task`` (``recipe_path``) as ``{"section": {"key": value}}``.

    Raises:
        ParamsError: no such recipe (the message lists those there), or it is not a params mapping.
    """
    path = recipe_path(task, recipes)
    if not path.is_file():
        known = sorted(p.stem for p in recipes.glob("*.yaml"))
        raise ParamsError(f"{path}: no recipe for {task!r}; recipes: {', '.join(known) or 'none'}")
    return read_yaml(path.read_text(), str(path))


COMMITTED = f"HEAD:{PARAMS_FILE}"  # the params a recipe changes, as messages name them


def committed_params() -> dict:
    """params.yaml as committed at HEAD (the defaults a recipe changes).

    Raises:
        ParamsError: not in a git repository, no commit yet, or HEAD has no params.yaml; with git's reason.
    """
    shown = subprocess.run(["git", "show", COMMITTED], capture_output=True, text=True)
    if shown.returncode != 0:
        reason = " ".join(shown.stderr.split()) or f"git exited {shown.returncode}"
        raise ParamsError(f"{COMMITTED}: cannot be read ({reason}); a recipe changes the committed params.yaml: run "
                          "it in the project's repository, with params.yaml committed")
    return read_yaml(shown.stdout, COMMITTED)


def flow(value: Any) -> str:
    """``value`` as DVC's ``-S`` parses it: YAML flow style on one line (``null``, ``true``, ``3e-05``)."""
    out = io.StringIO()
    yaml = yaml_reader()
    yaml.default_flow_style = True
    yaml.dump(value, out)
    return out.getvalue().strip().removesuffix("...").strip()


def set_params(recipe: dict, committed: dict, workspace: dict, source: str = "recipe") -> list[str]:
    """The ``key=value`` pairs that turn ``workspace`` params into ``committed`` params with ``recipe`` applied.

    Keys are compared whole at ``section.key`` (a mapping such as ``data.files`` is one value).

    Raises:
        ParamsError: the recipe's result is not valid params (an unknown key, a bad value; naming ``source``), or the
            recipe chooses a dataset while the committed params.yaml sets ``data.files`` (naming that key:
            ``validate_merged``); a mapping value would have to change into another mapping, which `-S` merges
            instead of replacing.
    """
    target = validate_merged(committed, recipe, COMMITTED, source)
    pairs = []
    for section, values in target.items():
        for key, value in values.items():
            now = workspace.get(section, {}).get(key)
            if value == now:
                continue
            if isinstance(value, dict) and isinstance(now, dict):
                raise ParamsError(f"{source}: {section}.{key}: -S would merge {value} into {now}; "
                                  f"set {section}.{key}: null in params.yaml first")
            pairs.append(f"{section}.{key}={flow(value)}")
    return pairs


def check_seeds(seeds: list[int] | None, params: dict, source: str) -> None:
    """Check each of ``seeds`` (a command's ``--seeds``) as ``train.seed`` of ``params`` (read from ``source``).

    Raises:
        ParamsError: naming ``--seeds`` and what ``train.seed`` allows.
    """
    for seed in seeds or []:
        validate_merged(params, {"train": {"seed": seed}}, source, "--seeds")


def commands(task: str, seeds: list[int] | None, queue: bool, name: str | None) -> list[list[str]]:
    """One `dvc exp run` argv per seed (the recipe's own seed when ``seeds`` is None).

    Raises:
        ParamsError: the recipe is missing or invalid, does not fit the committed params.yaml (``validate_merged``),
            or a seed is not a valid ``train.seed`` (naming ``--seeds``).
    """
    committed = committed_params()
    pairs = set_params(load_recipe(task), committed, read_yaml(Path(PARAMS_FILE).read_text(), PARAMS_FILE),
                       source=str(recipe_path(task)))
    check_seeds(seeds, committed, COMMITTED)
    path = recipe_path(task)
    # a search's metrics/search/<study>/recipe.yaml: <study>-best, apart from the hand recipe <task>-recipe
    run_name = name or (f"{path.parent.name}-best" if path.name == "recipe.yaml" else f"{path.stem}-recipe")
    runs = []
    for seed in seeds or [None]:
        argv = ["dvc", "exp", "run", *(["--queue"] if queue else [])]
        argv += ["-n", f"{run_name}-s{seed}" if seed is not None else run_name]
        for pair in pairs:
            if seed is None or not pair.startswith("train.seed="):
                argv += ["-S", pair]
        if seed is not None:
            argv += ["-S", f"train.seed={seed}"]
        runs.append(argv)
    return runs


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("task", help=f"a recipe in {RECIPES}/ "
                        f"({', '.join(sorted(p.stem for p in RECIPES.glob('*.yaml')))}), or a recipe file (a search's "
                        "metrics/search/<study>/recipe.yaml)")
    parser.add_argument("--seeds", type=int, nargs="+", help="one experiment per seed (default: the recipe's)")
    parser.add_argument("--queue", action="store_true", help="dvc exp run --queue (then: dvc exp run --run-all)")
    parser.add_argument("--name", help="experiment name (default <task>-recipe, or <study>-best for a search's "
                        "recipe.yaml; -s<seed> per seed)")
    parser.add_argument("--run", action="store_true", help="run the commands (default: print them)")
    args = parser.parse_args(argv)
    try:
        runs = commands(args.task, args.seeds, args.queue, args.name)
    except ParamsError as err:
        raise SystemExit(str(err)) from None
    for argv in runs:
        print(shlex.join(argv), flush=True)
        if args.run and (code := subprocess.run(argv).returncode):
            raise SystemExit(code)  # dvc has said why


if __name__ == "__main__":
    main()
