"""Inference: a model folder of any form opened once (``predictor.Predictor.open``), rows scored in their order,
logits turned into answers; ``runtimes`` loads each served form's runtime. Evaluation, the teacher, the export
stage's parity and timing, ``tools.predict``, ``tools.serve`` and the serving benchmarks all go through ``Predictor``.
"""
