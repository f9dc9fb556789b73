"""The per-worker channel service: owns the inboxes and answers ``tianji_channel`` handshakes.

Call protocol::

    client.register_plugin(ChannelPlugin())           # once, from the driver
    svc = ChannelService.current()                    # inside a task or actor on a worker
    inbox = svc.open_queue("traj", capacity_bytes=64 << 20)
    params = svc.open_latest("params")
    # tell the peers svc.address and the channel names; later:
    svc.close("traj")

Senders connect to the worker's own listener (``svc.address``), so the cluster's scheme and
TLS settings apply unchanged.  ``Server._handle_comm`` hands the comm to ``handle_comm`` after
the handshake message, and the handler keeps it for the life of the connection.
"""

from __future__ import annotations

import logging
import threading
import weakref

from distributed.comm import CommClosedError

from tianji_dask.errors import ChannelError

from .common import HANDLER_OP, LATEST_KIND, QUEUE_KIND, logger
from .latest_inbox import LatestInbox
from .queue_inbox import QueueInbox

_services: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_services_lock = threading.Lock()


class ChannelService:
    """Receiving side of all channels on one worker; get it with ``for_worker``/``current``."""

    def __init__(self, worker):
        # A weak reference: the registry is keyed weakly by the worker, so the service must
        # not keep the worker alive.
        self._worker = weakref.ref(worker)
        self._loop = worker.loop.asyncio_loop
        self._lock = threading.Lock()
        self._inboxes: dict[str, QueueInbox | LatestInbox] = {}

    @classmethod
    def for_worker(cls, worker) -> ChannelService:
        """The service installed on ``worker`` (created and its handler installed if missing)."""
        with _services_lock:
            service = _services.get(worker)
            if service is None:
                service = cls(worker)
                _services[worker] = service
            if worker.handlers.get(HANDLER_OP) != service.handle_comm:
                worker.handlers[HANDLER_OP] = service.handle_comm
            return service

    @classmethod
    def current(cls) -> ChannelService:
        """``for_worker(get_worker())``: call inside a task or actor method."""
        from distributed import get_worker

        return cls.for_worker(get_worker())

    @classmethod
    def installed(cls, worker) -> ChannelService | None:
        with _services_lock:
            return _services.get(worker)

    @property
    def address(self) -> str:
        """The worker's contact address: what senders and publishers connect to."""
        worker = self._worker()
        if worker is None:
            raise ChannelError("the worker of this channel service is gone")
        return worker.contact_address or worker.address

    def __repr__(self) -> str:
        return f"<ChannelService at {self.address} channels={sorted(self._inboxes)}>"

    def open_queue(self, name: str, capacity_bytes: int, *, replace: bool = False) -> QueueInbox:
        """Open the receiver side of a many-to-one queue called ``name`` on this worker.
        ``replace``: an inbox of that name still open is closed first (a re-created host's, whose
        predecessor was released before its loop could close it)."""
        if replace:
            self.close(name)
        with self._lock:
            self._check_free(name)
            inbox = QueueInbox(name, capacity_bytes, self._loop, self.address)
            self._inboxes[name] = inbox
        return inbox

    def open_latest(self, name: str, *, replace: bool = False) -> LatestInbox:
        """Open the receiver side of a topic subscription called ``name`` on this worker
        (``replace`` as for :meth:`open_queue`)."""
        if replace:
            self.close(name)
        with self._lock:
            self._check_free(name)
            inbox = LatestInbox(name, self._loop, self.address)
            self._inboxes[name] = inbox
        return inbox

    def close(self, name: str) -> None:
        """Close a channel: its connected senders get a ChannelError on their next push or
        publish.  Items still queued stay readable from the inbox object.  Idempotent."""
        with self._lock:
            inbox = self._inboxes.pop(name, None)
        if inbox is not None:
            inbox._close()

    def close_all(self) -> None:
        with self._lock:
            names = list(self._inboxes)
        for name in names:
            self.close(name)

    def _check_free(self, name: str) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"channel names are non-empty strings, got {name!r}")
        if name in self._inboxes:
            raise ValueError(f"channel {name!r} is already open on {self.address}")

    # ------------------------------------------------------------------ event loop
    async def handle_comm(self, comm, channel=None, sender=None, kind=None, owned=False, capacity=0, **extra) -> None:
        """``worker.handlers["tianji_channel"]``: validate the handshake, then serve the comm
        until the peer leaves.  Never raises into the worker; always closes the comm.
        ``owned``, ``capacity``: a queue sender's offer to go on in a socket the inbox owns and
        its own capacity (``QueueInbox.serve``)."""
        problem = None
        inbox = None
        not_open = False
        if not isinstance(channel, str) or not channel:
            problem = f"handshake without a 'channel' name (got {channel!r})"
        elif kind not in (QUEUE_KIND, LATEST_KIND):
            problem = f"handshake for channel {channel!r} with unknown kind {kind!r}"
        elif not isinstance(sender, str) or not sender:
            problem = f"handshake for channel {channel!r} without a 'sender' id"
        else:
            inbox = self._inboxes.get(channel)
            wanted = QueueInbox if kind == QUEUE_KIND else LatestInbox
            if inbox is None:
                not_open = True
                problem = f"no open channel {channel!r} on {self.address} (open: {sorted(self._inboxes)})"
            elif not isinstance(inbox, wanted):
                problem = f"channel {channel!r} on {self.address} is not a {kind!r} channel"
        try:
            if problem is None:
                assert inbox is not None  # else a problem was named above
                try:
                    if isinstance(inbox, QueueInbox):
                        told = capacity if isinstance(capacity, int) and capacity > 0 else 0
                        await inbox.serve(comm, sender, owned=owned is True, capacity=told)
                    else:
                        await inbox.serve(comm, sender)
                except ChannelError as exc:  # closed between lookup and serve
                    problem = str(exc)
            if problem is not None:
                # the sender gets the reason as a ChannelError; a channel already closed here is
                # the normal end of a run (gossip peers stop one after the other), not a warning
                level = logging.INFO if not_open else logging.WARNING
                logger.log(level, "tianji channel connection from %s refused: %s", comm.peer_address, problem)
                await comm.write({"error": problem})
                await comm.close()
        except (CommClosedError, OSError):
            pass
        except Exception:  # noqa: BLE001 - logged: one bad connection must not stop the service
            logger.exception("tianji channel %r: connection from %s failed", channel, comm.peer_address)
        finally:
            if not comm.closed():
                comm.abort()
