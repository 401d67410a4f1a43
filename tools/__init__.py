"""Commands that are not pipeline stages: report (a pull request's params, metrics and plots against its base),
summarize (mean ± std over the seeds of DVC experiments), plots_png (every plot of dvc.yaml in one PNG)."""
