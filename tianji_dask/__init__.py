"""tianji-dask: TianJi-style distributed deep RL on Dask.

The public API, loaded on first use so that importing this package stays light:

- ``tianji_dask.train(config, client=None, ...)``: start a run and get its handle at once
  (:func:`tianji_dask.runtime.driver.train`); ``tianji_dask.load_config(path, overrides)`` reads
  and checks an experiment config;
- ``tianji_dask.start(config, client)`` and ``tianji_dask.resume(run_dir, client)``: the same
  from a notebook, with live progress (:mod:`tianji_dask.notebook`);
- ``tianji_dask.open_run(path)``, ``tianji_dask.open_runs(paths)``: runs as xarray Datasets
  (:mod:`tianji_dask.results.analysis`); ``tianji_dask.load_checkpoint(directory)``;
- ``tianji_dask.evaluate(run_dir, episodes=20)``: the trained policy played without exploration,
  into ``eval.nc`` (:mod:`tianji_dask.results.evaluation`);
- ``tianji_dask.load_policy(run_dir)``: that policy in Python, ``policy.act(obs)`` for an env of
  your own (:mod:`tianji_dask.results.policy`);
- ``tianji_dask.sweep(config, ["seed=0,1,2"], parallel=2)``: a grid of runs, K at a time
  (:mod:`tianji_dask.runtime.sweep.runner`).

The command line is ``tianji-dask``.
"""

from importlib import import_module

_PUBLIC = {
    "train": "tianji_dask.runtime.driver",
    "load_config": "tianji_dask.config",
    "start": "tianji_dask.notebook",
    "resume": "tianji_dask.notebook",
    "NotebookRun": "tianji_dask.notebook",
    "Results": "tianji_dask.notebook",
    "open_run": "tianji_dask.results.analysis",
    "open_runs": "tianji_dask.results.analysis",
    "load_checkpoint": "tianji_dask.results.checkpoint",
    "evaluate": "tianji_dask.results.evaluation",
    "load_policy": "tianji_dask.results.policy",
    "sweep": "tianji_dask.runtime.sweep.runner",
}
__all__ = sorted(_PUBLIC)


def __getattr__(name):
    if name in _PUBLIC:
        return getattr(import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module 'tianji_dask' has no attribute {name!r}")
