"""Before a run: the checks against the cluster, the profile and the plan sized from it, and
the Slurm jobs of a plan (tianji-dask's Dask settings are :mod:`tianji_dask.config.deployment`)."""
