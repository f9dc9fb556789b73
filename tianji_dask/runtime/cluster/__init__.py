"""The run's cluster and its life on the driver: the LocalCluster, the hosts by key, their
placement, supervision, re-creation and stopping."""
