"""Many runs of one config at once: the grid, the manifest, the runner and its progress view."""
