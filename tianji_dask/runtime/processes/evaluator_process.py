"""The evaluator process of a run that evaluates itself while it trains
(``training_evaluation.TrainingEvaluations`` starts it: ``python -m
tianji_dask.runtime.processes.evaluator_process FD_IN FD_OUT``).

Protocol, over two pipes of ``multiprocessing.connection`` messages: first ``(config JSON,
episodes, seed)``; then each message is a learner state packed by ``pack_state``, answered by
``("ok", mean, std)`` of the episodes :func:`~tianji_dask.results.evaluation.play_state` played,
or ``("error", why)``; None, or the driver's end of the pipe closing, ends the process.
"""

from __future__ import annotations

import os
import sys

NICENESS = 10  # the run's own hosts, on the same machine, come first


def main(argv: list[str]) -> None:
    os.nice(NICENESS)  # before the imports, which take seconds of CPU
    import json
    from multiprocessing.connection import Connection

    import torch

    from tianji_dask.config import validate_config
    from tianji_dask.results.checkpoint import unpack_state
    from tianji_dask.results.evaluation import play_state

    torch.set_num_threads(1)
    states, answers = Connection(int(argv[0]), writable=False), Connection(int(argv[1]), readable=False)
    try:
        cfg_json, episodes, seed = states.recv()
    except EOFError:
        return
    cfg = validate_config(json.loads(cfg_json))
    while True:
        try:
            packed = states.recv()
        except EOFError:
            return
        if packed is None:
            return
        try:
            _, returns, _, _ = play_state(cfg, unpack_state(packed), episodes, seed=seed)
            answers.send(("ok", float(returns.mean()), float(returns.std())))
        except Exception as exc:  # noqa: BLE001 - the driver reports it and the run goes on
            answers.send(("error", repr(exc)))


if __name__ == "__main__":
    main(sys.argv[1:])
