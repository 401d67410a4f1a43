"""GLUE's metrics and those of own data, as an ``evaluate`` metric module loadable offline by path:
``evaluate.load("finetune/evaluate/glue_metric.py", config_name="mrpc")``. Per config (GLUE: Wang et al. 2018,
https://arxiv.org/abs/1804.07461, Table 1, as the Hub's ``glue`` metric): mrpc, qqp: accuracy and F1 of label 1;
stsb: Pearson and Spearman correlation; cola: Matthews correlation; sst2, mnli, qnli, rte, wnli: accuracy; binary:
accuracy and F1 of ``pos_label``; multiclass: accuracy and macro-F1; regression: Pearson, Spearman and MSE.
"""

import datasets
import evaluate
from scipy.stats import pearsonr, spearmanr
from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef, mean_squared_error

REGRESSION = ("stsb", "regression")
CONFIGS = ("cola", "sst2", "mrpc", "qqp", "stsb", "mnli", "qnli", "rte", "wnli", "binary", "multiclass", "regression")

_KWARGS_DESCRIPTION = """
Args:
    predictions: predicted class ids, or predicted scores for stsb / regression.
    references: gold class ids, or gold scores.
    pos_label: the class whose F1 is reported, for binary (default 1).
Returns:
    accuracy, f1, macro_f1, matthews_correlation, pearson, spearmanr, mse: those of the config, as floats.
"""


class GlueMetric(evaluate.Metric):
    """The metric of one config of ``CONFIGS``.

    Raises:
        KeyError: the config is not one of ``CONFIGS``.
    """

    def _info(self):
        if self.config_name not in CONFIGS:
            raise KeyError(f"unknown config {self.config_name!r}; use one of {CONFIGS}")
        dtype = "float32" if self.config_name in REGRESSION else "int64"
        return evaluate.MetricInfo(
            description="GLUE task metrics (Wang et al., 2018), and accuracy / F1 / correlations for own data.",
            citation="Wang et al., GLUE: A Multi-Task Benchmark and Analysis Platform for NLU, 2018",
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features({"predictions": datasets.Value(dtype), "references": datasets.Value(dtype)}),
        )

    def _compute(self, predictions, references, pos_label=1):
        name = self.config_name
        if name in REGRESSION:
            scores = {"pearson": _correlation(pearsonr, references, predictions),
                      "spearmanr": _correlation(spearmanr, references, predictions)}
            return {**scores, "mse": float(mean_squared_error(references, predictions))} if name == "regression" \
                else scores
        if name == "cola":
            return {"matthews_correlation": float(matthews_corrcoef(references, predictions))}
        accuracy = float(accuracy_score(references, predictions))
        if name in ("mrpc", "qqp", "binary"):
            label = pos_label if name == "binary" else 1
            return {"accuracy": accuracy,
                    "f1": float(f1_score(references, predictions, pos_label=label, zero_division=0.0))}
        if name == "multiclass":
            return {"accuracy": accuracy, "macro_f1": float(f1_score(references, predictions, average="macro",
                                                                     zero_division=0.0))}
        return {"accuracy": accuracy}


def _correlation(function, references, predictions) -> float:
    """``function``'s (``pearsonr`` or ``spearmanr``) coefficient of ``references`` and ``predictions``; 0.0
    where it is undefined (constant predictions or references), as scikit-learn's Matthews correlation.
    """
    if len(set(predictions)) < 2 or len(set(references)) < 2:
        return 0.0
    return float(function(references, predictions)[0])
