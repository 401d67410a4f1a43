"""The evaluation phase: scoring a split (evaluation), the evaluate stage's predictions and metrics (predictions),
the collapse check (collapse) and the local GLUE metric module (glue_metric)."""
