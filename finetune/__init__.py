"""The library the pipeline's stages call: params, data, batches, model, training loop, resume, logs.

One module per concern; ``stages/`` holds the eight stage scripts, ``tools/`` the commands (predict, report, summarize,
tune, ...).
"""
