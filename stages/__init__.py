"""The pipeline's stages, one module each (run as ``python -m stages.<name>``), and the code they share."""
