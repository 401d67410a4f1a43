"""sitecustomize for benchmarks/distill_screen_gpu.sh: DVCLive on a machine that has dvc's modules but not its git
layer (scmrepo and its git libraries are not carried). ``Live`` then skips finding a DVC repo, and only writes its
files, as it does inside a DVC stage with ``dvcyaml=None, save_dvc_exp=False`` (finetune/live.py)."""

try:
    from dvclive.live import Live

    Live._init_dvc = lambda self: setattr(self, "_dvc_file", self._init_dvc_file())
except ImportError:
    pass
