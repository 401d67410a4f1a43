"""The pipeline's six stages, in order: download, tokenize, collate_check, train, evaluate, card (dvc.yaml runs
each as ``python -m stages.<name>``; train and evaluate under ``accelerate launch``)."""
