"""No number of the docs is typed by hand (docs/numbers.md): every quote and generated block of the pages is what the
committed files give; no page, module docstring or ``--help`` text of tools/ and benchmarks/ states a measured-looking
number outside a quote, a generated block or code; a setting stated in words is its source's value. Fast: text, the
files at git HEAD and argument parsers, no model."""

from __future__ import annotations

import importlib
import json
import math
from pathlib import Path

import pytest
import yaml

from tests.doc_commands import MODULES, PAGES, ROOT, docstring, help_text
from tools import quotes, results_block
from tools.generated import BLOCK, GENERATORS, blocks
from tools.typed_numbers import SETTINGS, typed

HEAD = "HEAD" if quotes.read("params.yaml", "HEAD") is not None else None  # None: not a git checkout


def test_a_quote_is_rewritten_from_its_file_with_the_pages_format():
    page = ROOT / "docs" / "page.md"  # not written: quotes() reads the files the links name
    evaluation = json.loads((ROOT / "metrics/eval.json").read_text())
    text = ('F1 [0.1](../metrics/eval.json "/validation/f1"), [1,000](../metrics/train.json "/parameters"), '
            '[0](../metrics/eval.json "/validation/nothing"), [0](../metrics/none.json "/a"), '
            '[0](../metrics/eval.json "/validation")')
    rewritten, problems = quotes.quotes(page, text)
    parameters = json.loads((ROOT / "metrics/train.json").read_text())["parameters"]
    assert rewritten.startswith(f'F1 [{evaluation["validation"]["f1"]:.1f}](../metrics/eval.json "/validation/f1"), '
                                f'[{parameters:,}](../metrics/train.json "/parameters")')
    assert problems == [
        'docs/page.md: [0](../metrics/eval.json "/validation/nothing"): metrics/eval.json has no /validation/nothing',
        'docs/page.md: [0](../metrics/none.json "/a"): no file metrics/none.json',
        'docs/page.md: [0](../metrics/eval.json "/validation"): names a dict, not a value']


def test_expressions_fields_and_signs():
    page = ROOT / "docs" / "page.md"
    train = json.loads((ROOT / "metrics/train.json").read_text())
    value = quotes.evaluate(page, "../metrics/train.json",
                            "= {/train_seconds} / {../metrics/bf16/train.json#/train_seconds}")
    assert value == train["train_seconds"] / json.loads((ROOT / "metrics/bf16/train.json").read_text())["train_seconds"]
    report = ("# A report\n\n| server | clients | requests/s |\n|---|---|---|\n| tools.serve | 1 | 117.6 |\n"
              "| bare | 32 | 2.5x |\n")
    assert quotes.field(report, "@requests/s where server=engine or tools.serve, clients=1") == 117.6
    assert quotes.field(report, "@requests/s where server=ba*") == 2.5
    assert quotes.evaluate(page, "../metrics/sweeps/issue32-gpu/results.jsonl",
                           "= len([r for r in {} if like(r['run'], 'none-*')])") == 5
    assert quotes.evaluate(page, "../params.yaml", "/train/seed") == yaml.safe_load(
        (ROOT / "params.yaml").read_text())["train"]["seed"]
    for title in ("= __import__('os')", "= {/steps}.real", "= open('x')"):
        with pytest.raises(quotes.QuoteError):
            quotes.evaluate(page, "../metrics/train.json", title)
    assert [quotes.shown(v, like) for v, like in [(0.0013, "+0.0000"), (-0.0044, "−0.0000"), (-0.5, "-0.0"),
                                                  (1725, "1,000"),
                                                  (0.826, "0.0000"), ("bf16", "fp32"), (1.13e-05, "1e-5")]] == [
        "+0.0013", "−0.0044", "-0.5", "1,725", "0.8260", "bf16", "1.13e-05"]


def test_a_generated_block_is_rewritten_and_a_bad_one_named():
    page = ROOT / "docs" / "page.md"
    text = ("a\n<!-- generated: flagged ../metrics/export.json -->?<!-- end generated -->\n"
            "<!-- generated: sweep ../metrics/sweeps/round-1.json -->\nold\n<!-- end generated -->\n"
            "<!-- generated: nothing x -->?<!-- end generated -->")
    new, problems = blocks(page, text, HEAD)
    flagged, sweep, unknown = (m.group(3) for m in BLOCK.finditer(new))
    assert flagged != "?" and "\n" not in flagged and sweep.startswith("\n\n`metrics/sweeps/round-1.json`: ")
    assert "| configuration (params that differ) | seeds |" in sweep and unknown == "?"
    assert problems == ["docs/page.md: <!-- generated: nothing x -->: no generator 'nothing'; there are "
                        + ", ".join(GENERATORS)]


@pytest.mark.skipif(HEAD is None, reason="not a git checkout: the generated tables name commits")
def test_quotes_and_generated_blocks_are_what_the_committed_files_give():
    # Against the committed files, so that a `dvc repro` in the workspace breaks nothing.
    stale = [line for line in results_block.stale(HEAD) if "typed by hand" not in line]
    assert not stale, "\n".join(stale) + "\ncommit the result files, run `python -m tools.results_block`, commit"


@pytest.mark.skipif(HEAD is None, reason="not a git checkout")
def test_a_changed_metric_names_every_page_that_cites_it(monkeypatch):
    read = quotes.read

    def changed(name, rev=None):
        text = read(name, rev)
        if name != "metrics/eval.json":
            return text
        evaluation = json.loads(text)
        evaluation["validation"]["f1"] = round(evaluation["validation"]["f1"] - 0.0123, 4)
        return json.dumps(evaluation)

    before = set(results_block.stale(HEAD))
    if before:
        pytest.skip("the pages are stale already (test_quotes_and_generated_blocks_are_what_the_committed_files_give)")
    monkeypatch.setattr(quotes, "read", changed)
    citing = {str(p.relative_to(ROOT)) for p in PAGES if 'eval.json "/validation/f1"' in p.read_text()
              or "<!-- generated: committed-run -->" in p.read_text()}
    named = {line.split(":")[0] for line in results_block.stale(HEAD)}
    assert citing and named == citing


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_a_page_types_no_measured_number(page: Path):
    name = str(page.relative_to(ROOT))
    found = [f"{name}:{line}: {words!r}" for line, words in typed(page.read_text(), name)]
    assert not found, ("numbers typed by hand: quote the file, generate the block, or write a setting as code "
                       "(docs/numbers.md)\n" + "\n".join(found))


@pytest.mark.parametrize("module", MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_a_docstring_or_help_text_types_no_measured_number(module: Path):
    name = str(module.relative_to(ROOT))
    found = [f"{name} docstring line {line}: {words!r}"
             for line, words in typed(docstring(module), name, indented_code=True)]
    shown = help_text(module)
    found += [f"{name} --help line {line}: {words!r}" for line, words in typed(shown or "", name, indented_code=True)]
    assert not found, "docstrings and help texts name the files that hold the numbers:\n" + "\n".join(found)


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: f"{s[0]}: {s[1]}")
def test_a_setting_in_words_is_its_sources_value(setting):
    file, words, source, value = setting
    path = ROOT / file
    text = docstring(path) + (help_text(path) or "") if file.endswith(".py") else path.read_text()
    assert words in " ".join(text.split()), f"{file} no longer says {words!r}: drop it from SETTINGS"
    where, _, expression = source.partition(":")
    if where == "params.yaml":
        actual = quotes.pointed(yaml.safe_load((ROOT / "params.yaml").read_text()), expression)
    else:
        actual = eval(expression, vars(importlib.import_module(where)))  # SETTINGS' own expression
    assert math.isclose(actual, value), f"{file}: {words!r} but {source} is {actual}"


def test_the_rule_recognises_measured_numbers_and_allows_the_rest():
    text = ("a 70 % gain, 438 MB, 3.4x, 1.4 times, 12 ms, 0.8635, 0.56, 5,053 pairs, 0.81 ± 0.02, 2 seeds of 3, 7 rows "
            "apart, 85.6 samples/s\n| config | 0.8260 / 0.8786 | 88 |\n"
            "CPython 3.11, transformers < 4.58, torch 2.13.0, arXiv:1811.01088, 2018, port 8000, sst2, 3 epochs, "
            "`0.8635`, [0.8635](x.json \"/a\"), <!-- generated: g -->0.8635<!-- end generated -->\n```\n12 ms\n```")
    assert [words for _, words in typed(text)] == [
        "70 %", "438 MB", "3.4x", "1.4 times", "12 ms", "0.8635", "0.56", "5,053", "0.81", "± 0", "2 seeds of 3",
        "7 rows apart", "85.6 samples/s", "0.8260", "0.8786", "0.8260 / 0.8786", "88"]
    assert typed("Run it:\n\n    python -m x --timeout 30 s", indented_code=True) == []
