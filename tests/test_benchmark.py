"""The benchmark's project way runs the stages themselves (tokenize, train, evaluate) with validated overrides."""

from __future__ import annotations

import json

import pytest

from tests.helpers import make_project, python, run, tiny_params


@pytest.fixture(scope="module")
def project(tiny_raw, tiny_checkpoint, tmp_path_factory):
    """A project with data/raw and models/pretrained, what the benchmark reads (`dvc repro download`)."""
    return make_project(tmp_path_factory.mktemp("benchmark") / "p", tiny_params(), tiny_raw, tiny_checkpoint).root


def test_the_project_way_trains_and_evaluates_through_the_stages(project):
    overrides = json.dumps({"train": {"batch_size": 4}})
    out = run(python("-m", "benchmarks.benchmark", "--way", "project", "--max-steps", "3", "--overrides", overrides),
              project)
    result = json.loads(out.strip().splitlines()[-1])
    assert result["steps"] == 3 and result["samples"] == 12  # 3 optimizer steps of the overridden batch of 4
    assert 0 <= result["accuracy"] <= 1 and 0 <= result["f1"] <= 1
    assert result["settings"]["batch_size"] == 4 and result["peak_rss_mb"] > 0


def test_a_misspelt_override_is_named(project):
    out = run(python("-m", "benchmarks.benchmark", "--way", "project", "--overrides", '{"train": {"batch_sise": 4}}'),
              project, ok=False)
    assert "benchmark overrides: train.batch_sise: Extra inputs are not permitted" in out
