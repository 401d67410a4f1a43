"""The pipeline's eight stages, in order: download, tokenize, collate_check, teacher, train, evaluate, card, export
(dvc.yaml runs each as ``python -m stages.<name>``; train and evaluate hand themselves over to ``accelerate launch``
when ``train.accelerate_config`` asks for more than one process)."""
