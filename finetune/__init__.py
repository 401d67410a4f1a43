"""The library the pipeline's stages call: params, data, batches, model, training loop, resume, logs.

One module per concern; ``stages/`` holds the five stage scripts, ``tools/`` the report and summary commands.
"""
