"""Imported last in the fork server (:data:`tianji_dask.runtime.processes.fork_server.PRELOAD`): ``gc.freeze()``
moves every object the server's imports made into the collector's permanent generation, so that
no forked worker's full collections walk torch's and Dask's objects again, nor copy the memory
pages that hold them, which the worker shares with the server. Then it says the server is ready:
it creates the file that ``TIANJI_FORK_SERVER_READY`` names (the driver waits for it)."""

import gc
import os

gc.freeze()

_ready = os.environ.get("TIANJI_FORK_SERVER_READY")
if _ready:
    with open(_ready, "w"):
        pass
