"""tianji-dask: TianJi-style distributed deep RL on Dask.

``tianji_dask.start(config, client)`` starts a run from a notebook or script on a cluster you
made and returns a handle with live progress (:mod:`tianji_dask.notebook`), and
``tianji_dask.resume(run_dir, client)`` continues a run in its own directory; the CLI is
``tianji-dask``. Importing this package stays light: ``start`` is loaded on first use.
"""


def __getattr__(name):
    if name in ("start", "resume", "NotebookRun", "Results"):
        from tianji_dask import notebook

        return getattr(notebook, name)
    raise AttributeError(f"module 'tianji_dask' has no attribute {name!r}")
