"""GLUE MRPC metric for the `evaluate` library, loadable offline with ``evaluate.load("finetune/mrpc_metric.py")``.

MRPC is scored by accuracy and by F1 of the positive class (1 = equivalent), as in the GLUE paper
(Wang et al., 2018, https://arxiv.org/abs/1804.07461) and the Hub's ``glue`` metric.
"""

import datasets
import evaluate
from sklearn.metrics import accuracy_score, f1_score

_DESCRIPTION = "Accuracy and F1 (positive class: 1 = equivalent) for GLUE MRPC paraphrase detection."
_KWARGS_DESCRIPTION = """
Args:
    predictions: predicted labels, 0 (not_equivalent) or 1 (equivalent).
    references: gold labels, 0 or 1.
Returns:
    accuracy: fraction of predictions equal to the references, in [0, 1].
    f1: harmonic mean of precision and recall of label 1, in [0, 1] (0 when no label 1 is predicted or present).
"""


class MrpcMetric(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation="Wang et al., GLUE, 2018",
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features({"predictions": datasets.Value("int64"), "references": datasets.Value("int64")}),
        )

    def _compute(self, predictions, references):
        return {
            "accuracy": float(accuracy_score(references, predictions)),
            "f1": float(f1_score(references, predictions, pos_label=1, zero_division=0.0)),
        }
