"""The tools: the seed summary groups experiments that differ only in their seed (mean, sample std, values); the
plots grid lays out every plot; a command with nothing to report, or a bad output path, leaves what was written."""

import pandas as pd
import pytest

from tests.helpers import dvc, run, squeeze
from tools.summarize import compare_to, main_metric, markdown, metric_columns, summarize


def test_seeds_of_one_configuration_are_summarised_together():
    df = pd.DataFrame({
        "train.lr": [1e-4, 1e-4, 1e-4, 2e-4],
        "train.seed": [42, 1, 2, 42],
        "train.epochs": [3, 3, 3, 3],
        "validation.accuracy": [0.80, 0.82, 0.84, 0.79],
        "validation.f1": [0.86, 0.87, 0.88, 0.90],
        "best_epoch": [3, 2, 3, 3],
    }, index=pd.Index(["a-42", "a-1", "a-2", "b-42"], name="Experiment"))
    configurations, varying = summarize(df)
    assert varying == ["train.lr"]  # epochs is the same everywhere, seed is never a configuration key
    best, other = configurations  # best mean validation F1 first
    assert best["params"] == {"train.lr": 2e-4} and best["n"] == 1 and best["validation.f1"]["std"] is None
    assert other["seeds"] == [42, 1, 2] and other["experiments"] == ["a-42", "a-1", "a-2"]
    assert other["validation.accuracy"]["mean"] == pytest.approx(0.82)
    assert other["validation.accuracy"]["std"] == pytest.approx(0.02)  # sample std (n - 1)
    table = squeeze(markdown(configurations, varying, metric_columns(df)))
    assert "| 0.0001 | 3 | 42,1,2 | 0.8200 ± 0.0200 | 0.8700 ± 0.0100 | 2.7 ± 0.6 |" in table


def test_the_old_distill_block_of_train_json_does_not_split_seeds():
    # The i20-a* runs wrote train.json's block as `distill`: dvc exp show gives the names only train.json has
    # bare, like params; the colliding ones come as "params.yaml:distill.alpha" (kept) and "metrics/train.json:...".
    df = pd.DataFrame({"distill.alpha": [0.9, 0.9], "metrics/train.json:distill.alpha": [0.9, 0.9],
                       "distill.final_hard_loss": [0.31, 0.29], "distill.final_soft_loss": [0.05, 0.06],
                       "distill.teacher_model_type": ["mpnet", "mpnet"], "train.seed": [42, 1],
                       "validation.f1": [0.87, 0.88]}, index=pd.Index(["i20-s42", "i20-s1"], name="Experiment"))
    configurations, varying = summarize(df)
    assert varying == [] and len(configurations) == 1 and configurations[0]["n"] == 2


def test_the_plots_grid_places_every_plot():
    from tools.plots_png import grid_svg

    plot = '<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}"></svg>'
    svg = grid_svg([plot.format(w=100, h=50), plot.format(w=80, h=60), plot.format(w=120, h=40)], columns=2, gap=10)
    assert 'width="210.0" height="110.0"' in svg  # columns 120 + 80 wide, rows 60 + 40 high, gaps of 10
    assert svg.count("<g transform") == 3 and 'translate(130.0,0.0)' in svg and 'translate(0.0,70.0)' in svg


def test_seeds_of_another_task_are_summarised_by_its_own_metrics():
    df = pd.DataFrame({"train.lr": [1e-4, 1e-4, 3e-5], "train.seed": [42, 1, 42],
                       "validation.loss": [0.6, 0.7, 0.5], "validation.pearson": [0.80, 0.84, 0.86],
                       "validation.spearmanr": [0.79, 0.83, 0.85], "validation.examples": [1500] * 3},
                      index=pd.Index(["a-42", "a-1", "b-42"], name="Experiment"))
    assert metric_columns(df) == ["validation.pearson", "validation.spearmanr", "best_epoch", "best_step", "epochs",
                                  "pruned", "train_seconds", "wall_seconds"]
    best, other = summarize(df)[0]  # best mean validation Pearson first: STS-B has no F1
    assert best["params"] == {"train.lr": 3e-5} and other["validation.pearson"]["mean"] == pytest.approx(0.82)


def test_a_configuration_is_compared_to_the_baseline_by_the_standard_error_of_the_difference():
    df = pd.DataFrame({"model.pooling": ["cls"] * 3 + ["mean"] * 3, "train.seed": [42, 1, 2] * 2,
                       "validation.f1": [0.86, 0.87, 0.88, 0.89, 0.90, 0.91]},
                      index=pd.Index(["d-42", "d-1", "d-2", "m-42", "m-1", "m-2"], name="Experiment"))
    assert main_metric(["validation.accuracy", "validation.f1"]) == "validation.f1"
    configurations, varying = summarize(df, ["validation.f1"])
    compare_to(configurations, "d-*", "validation.f1")
    mean, default = configurations
    assert default["vs_baseline"]["diff"] == 0 and not default["vs_baseline"]["wins"]
    assert mean["vs_baseline"]["diff"] == pytest.approx(0.03)
    assert mean["vs_baseline"]["se"] == pytest.approx((0.01 ** 2 / 3 * 2) ** 0.5, abs=1e-4)
    assert mean["vs_baseline"]["wins"]
    table = squeeze(markdown(configurations, varying, ["validation.f1"]))
    assert "| mean | 3 | 42,1,2 | 0.9000 ± 0.0100 | +0.0300 (SE 0.0082) |" in table
    with pytest.raises(SystemExit, match="--baseline 'x-\\*': no summarised experiment matches"):
        compare_to(configurations, "x-*", "validation.f1")


def test_metrics_no_experiment_has_are_left_out():
    # dvc exp show lists every metric of every experiment it reads (an STS-B run's Pearson beside MRPC runs).
    df = pd.DataFrame({"validation.f1": [0.87, 0.88], "validation.pearson": ["None", None],
                       "validation.loss": [0.3, 0.4]}, index=["a", "b"])
    assert metric_columns(df)[:1] == ["validation.f1"] and "validation.pearson" not in metric_columns(df)
    # Nor eval.json's collapse check (finetune/evaluate/collapse.py): its baseline, most predicted class and flag.
    check = {"validation.baseline.f1": [0.81, 0.81], "validation.baseline.class": ["equivalent"] * 2,
             "validation.most_predicted.share": [0.7, 0.8], "validation.collapsed": [False, True]}
    assert metric_columns(df.assign(**check))[:2] == ["validation.f1", "best_epoch"]


# Nothing written is lost to a command that did nothing, and a bad output path is one line.

def test_summarize_refuses_a_folder_as_out_or_md_before_reading_experiments(tmp_path, monkeypatch):
    import tools.summarize

    monkeypatch.setattr(tools.summarize, "load_experiments", lambda *a: pytest.fail("read experiments"))
    for option in ("--out", "--md"):
        with pytest.raises(SystemExit, match=f"^ERROR: {option} {tmp_path}: is a folder; name a file in it$"):
            tools.summarize.main(["--match", "*", option, str(tmp_path)])


@pytest.mark.parametrize("commit", [False, True], ids=["not-a-repository", "before-the-first-commit"])
def test_report_outside_a_repository_with_a_commit_is_one_line(tmp_path, monkeypatch, commit):
    import subprocess

    from tools.report import ReportError, write_report

    monkeypatch.chdir(tmp_path)
    if commit:
        subprocess.run(["git", "init", "-q"], check=True)
    with pytest.raises(ReportError, match=f"^{tmp_path}: not a git repository with a commit; tools.report compares "
                                          "revisions"):
        write_report(out_dir=tmp_path / "report")
    assert not (tmp_path / "report").exists()


def test_report_of_an_unknown_revision_is_one_line(tmp_path, monkeypatch):
    from tools.report import ReportError, write_report

    monkeypatch.chdir(tmp_path)
    for cmd in (["git", "init", "-q"], dvc("init", "-q"), ["git", "commit", "-qm", "dvc init"]):
        run(cmd, tmp_path)
    with pytest.raises(ReportError, match="unknown Git revision 'no-such-rev'") as err:
        write_report(base="no-such-rev", out_dir=tmp_path / "report")
    assert "Traceback" not in str(err.value)
    assert not (tmp_path / "report").exists()


def test_results_block_leaves_a_block_without_its_files_alone(tmp_path, monkeypatch, capsys):
    from tools import results_block

    page = tmp_path / "docs" / "results.md"
    page.parent.mkdir()
    page.write_text("# Results\n\n<!-- generated: flagged ../metrics/export.json -->kept<!-- end generated -->\n"
                    '[0.5](../metrics/eval.json "/validation/f1")\n')
    before = page.read_text()
    monkeypatch.setattr(results_block, "pages", lambda: [page])
    assert results_block.main([]) == 1
    assert page.read_text() == before
    assert capsys.readouterr().err.splitlines() == [
        f"{page}: <!-- generated: flagged ../metrics/export.json -->: no file {tmp_path}/metrics/export.json",
        f'{page}: [0.5](../metrics/eval.json "/validation/f1"): no file {tmp_path}/metrics/eval.json']


def test_plots_png_without_plots_leaves_the_png_alone(tmp_path, monkeypatch):
    import tools.plots_png
    from finetune.errors import PipelineError

    png = tmp_path / "plots.png"
    png.write_bytes(b"the committed grid")
    monkeypatch.setattr(tools.plots_png, "dvc", lambda *args: '{"data": {}}')
    with pytest.raises(PipelineError, match=f"no plot has data in the workspace .*; {png} is left as it is"):
        tools.plots_png.main(["--out", str(png)])
    assert png.read_bytes() == b"the committed grid"


def test_the_plots_grid_has_no_more_columns_than_plots():
    from tools.plots_png import grid_svg

    plot = '<svg xmlns="http://www.w3.org/2000/svg" width="100" height="50"></svg>'
    assert 'width="216.0" height="50.0"' in grid_svg([plot, plot], columns=5)


def test_exp_shows_text_cells_are_values_and_multiclass_ranks_by_macro_f1():
    from tools.summarize import typed

    # dvc.api.exp_show gives every cell as text: a bool param, the pruned flag and a missing metric
    df = typed(pd.DataFrame({"train.keep_best": ["False", "False", "True"], "train.seed": [42, 1, 42],
                             "pruned": ["False", "True", "False"], "validation.accuracy": [0.6, 0.7, 0.8],
                             "validation.macro_f1": [0.5, 0.6, 0.4], "wall_seconds": ["None"] * 3},
                            index=pd.Index(["a-42", "a-1", "b-42"], name="Experiment")))
    metrics = metric_columns(df)
    assert main_metric(metrics) == "validation.macro_f1"
    configurations, varying = summarize(df, metrics)
    assert varying == ["train.keep_best"] and [c["params"] for c in configurations] == [
        {"train.keep_best": False}, {"train.keep_best": True}]  # best mean macro F1 first: 0.55 against 0.4
    assert configurations[0]["pruned"] == {"mean": 0.5, "std": 0.7071, "values": [0, 1]}
    assert "wall_seconds" not in configurations[0]  # no number: left out, not NaN


def test_an_experiment_name_under_two_commits_is_summarised_once_from_the_newest(monkeypatch, caplog):
    import tools.summarize

    # dvc.api.exp_show's rows: each commit (newest first), then its experiments
    shown = [{"typ": "baseline", "rev": "workspace", "Experiment": None},
             {"typ": "baseline", "rev": "main", "Experiment": None},
             {"typ": "branch_commit", "rev": "aaa", "Experiment": "s-1", "State": "Success", "validation.f1": 0.8},
             {"typ": "baseline", "rev": "1f2e3d4", "Experiment": None},
             {"typ": "branch_commit", "rev": "bbb", "Experiment": "s-1", "State": "Success", "validation.f1": 0.6},
             {"typ": "branch_commit", "rev": "ccc", "Experiment": "s-7", "State": "Success", "validation.f1": 0.7}]
    monkeypatch.setattr(tools.summarize.dvc.api, "exp_show", lambda **kwargs: shown)
    df = tools.summarize.load_experiments(["s-*"])
    assert df["validation.f1"].to_dict() == {"s-1": 0.8, "s-7": 0.7} and "baseline" not in df.columns
    assert "s-1: also an experiment of 1f2e3d4 (older); the one of main is summarised" in caplog.text
