"""Imported last in the fork server (:data:`tianji_dask.forked_workers.PRELOAD`): ``gc.freeze()``
moves every object the server's imports made into the collector's permanent generation, so that
no forked worker's garbage collections walk them (seconds of work over torch's and Dask's
objects) or copy the memory pages they share with the server."""

import gc

gc.freeze()
