"""The training phase: the run as one object (recipe: ``FineTuneRecipe`` and ``train``), the optimizer and the
learning-rate schedule (optimization), resuming and checkpoints (resume), early stopping (early_stopping), the DVCLive
logs (live) and the search's trial hook (trial)."""
