"""The evaluation phase: scoring a split (evaluation), the evaluate stage's predictions and metrics (predictions),
its DVCLive plots (plots), the collapse check (collapse) and the local GLUE metric module (glue_metric)."""
