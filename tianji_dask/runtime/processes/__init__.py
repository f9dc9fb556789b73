"""The processes of a run and how they are set up: the fork server, the workers' signals and
preload, the client context, the CUDA MPS daemon, the evaluator process."""
