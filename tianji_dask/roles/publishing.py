"""Publishing parameters from a learner to its actors."""

from __future__ import annotations

import logging

import numpy as np

from tianji_dask.channels.ports import Publisher
from tianji_dask.errors import ChannelError

logger = logging.getLogger("tianji_dask.learner")


def publish_params(
    publisher: Publisher, version: int, params: dict, consumed: int, dropped: np.ndarray | None = None
) -> bool:
    """Publish a version with the consumption count the actors pace themselves on (and, from an
    on-policy learner, ``dropped``: each actor's rollouts dropped unused, by actor id); False if
    it did not reach every subscriber.

    A subscriber that is gone (an actor that stopped or died) is reported by the return value,
    never raised: the learner keeps training, and the driver's
    heartbeat supervision decides what a lost actor means for the run. In a data-parallel
    group an exception here would also leave the other ranks waiting in an all-reduce.
    """
    try:
        payload = {"params": params, "consumed": consumed}
        if dropped is not None:
            payload["dropped"] = dropped
        publisher.publish(version, payload)
    except ChannelError as exc:
        logger.info("parameter version %d not delivered everywhere: %s", version, exc)
        return False
    return True
