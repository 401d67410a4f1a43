"""The training phase: the loop (loop), what a run is built from: model, loaders, optimizer and schedule (run),
resuming (resume), per-epoch metrics and early stopping (metrics), DVCLive logs (live) and the search's trial hook
(trial)."""
