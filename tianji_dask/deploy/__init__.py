"""Before a run: the checks against the cluster, the profile and the plan sized from it, the
Slurm jobs of a plan, and tianji-dask's Dask settings."""
