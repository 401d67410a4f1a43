"""The evaluate stage's DVCLive plots, files only (``finetune.logs.open_live``)."""

from __future__ import annotations

from finetune.tasks import Task


def log_plots(live, split: str, task: Task, table) -> None:
    """Log a labeled split's plots: the confusion matrix, with two classes also the precision-recall and ROC curves
    of ``task.positive_label``; for regression, predicted against gold.

    Args:
        table: the split's predictions: ``label``, ``prediction`` and (classification) ``probability_<name>``.
    """
    if task.is_regression:
        points = [{"gold": float(g), "predicted": float(p)} for g, p in zip(table["label"], table["prediction"])]
        live.log_plot(f"{split}/scatter", points, x="gold", y="predicted", template="scatter",
                      title=f"{split}: predicted against gold score")
        return
    live.log_sklearn_plot("confusion_matrix", table["label"].astype(str).to_numpy(),
                          table["prediction"].astype(str).to_numpy(), name=f"{split}/confusion_matrix.json")
    if task.num_labels == 2:
        positive = task.label_names[task.positive_label]
        labels = (table["label"] == positive).astype(int).to_numpy()
        probability = table[f"probability_{positive}"].astype("float64").to_numpy()
        live.log_sklearn_plot("precision_recall", labels, probability, name=f"{split}/precision_recall.json",
                              drop_intermediate=True)
        live.log_sklearn_plot("roc", labels, probability, name=f"{split}/roc.json", drop_intermediate=True)
