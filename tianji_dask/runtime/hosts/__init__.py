"""What runs on the workers: the Dask actors that host the roles, their loop thread, the
data-parallel learner groups and the gossip between groups."""
