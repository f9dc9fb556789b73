"""A run while it goes on, by who runs the code: here the driver's side (the ``Run`` handle, its
loop and writers, its checks before it starts, the serial reference); ``cluster/`` the run's
cluster and its life (placement, supervision, re-creation); ``hosts/`` what runs on the workers;
``processes/`` how the run's processes are set up; ``sweep/`` many runs at once."""
