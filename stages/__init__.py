"""The pipeline's seven stages, in order: download, tokenize, collate_check, teacher, train, evaluate, card (dvc.yaml
runs each as ``python -m stages.<name>``; train and evaluate under ``accelerate launch``)."""
