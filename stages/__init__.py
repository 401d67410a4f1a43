"""The pipeline's five stages, in order: download, tokenize, collate_check, train, evaluate (dvc.yaml runs each
as ``python -m stages.<name>``; train and evaluate under ``accelerate launch``)."""
