"""A run while it goes on: the driver and its cluster, the hosts that run the roles' loops on
Dask workers, their placement, supervision and re-creation, and the workers' own set-up."""
