"""Checks made before a run starts, so that bad input is refused with the fix before any work:
a scheduler address where nothing listens, and a plan that needs more than the machine or
cluster has."""

from __future__ import annotations

import socket

CONNECT_TIMEOUT_S = 10.0  # the same as the Client's own timeout in tianji-dask train
WHAT_TO_CHECK = ("Check that the scheduler is started (`dask scheduler` prints the address it listens at, "
                 "e.g. tcp://10.0.0.5:8786) and that --scheduler gives that host and port. "
                 "Nothing was started or written.")


class SchedulerUnreachable(ValueError):
    """Nothing answers at the scheduler address; the message names the address and what to check."""


def check_scheduler_listens(address: str, timeout: float = CONNECT_TIMEOUT_S) -> None:
    """Raise :class:`SchedulerUnreachable` when a TCP connection to ``address`` (``tcp://``,
    ``tls://`` or a bare ``host:port``) fails. A refused connection fails at once, where the
    Client would retry it until its timeout. Other transports are left to the Client."""
    from distributed.comm.addressing import parse_address

    scheme, location = parse_address(address)
    if scheme not in ("tcp", "tls"):
        return
    host, port = _host_port(address, location)
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            if scheme == "tls":
                _tls_handshake(sock, host, address)
    except ConnectionRefusedError:
        raise SchedulerUnreachable(f"--scheduler {address}: nothing listens there (connection refused). "
                                   f"{WHAT_TO_CHECK}") from None
    except TimeoutError:
        raise SchedulerUnreachable(f"--scheduler {address}: no answer within {timeout:g} s. {WHAT_TO_CHECK} "
                                   "A firewall between here and there may drop the connection.") from None
    except OSError as exc:  # the host's name does not resolve, no route to it, a failed TLS handshake
        raise SchedulerUnreachable(f"--scheduler {address}: cannot connect ({exc}). {WHAT_TO_CHECK}") from None


def _host_port(address: str, location: str) -> tuple[str, int]:
    from distributed.comm.addressing import parse_host_port

    try:
        return parse_host_port(location)
    except ValueError as exc:
        raise SchedulerUnreachable(f"--scheduler {address}: {exc}; give HOST:PORT, e.g. tcp://127.0.0.1:8786 "
                                   "(`dask scheduler` prints its address)") from None


def _tls_handshake(sock: socket.socket, host: str, address: str) -> None:
    """Complete the TLS handshake the scheduler expects, with Dask's own TLS settings (a bare
    TCP connection would make it log a failed handshake)."""
    from distributed.security import Security

    context = Security().get_connection_args("client").get("ssl_context")
    if context is None:
        raise SchedulerUnreachable(
            f"--scheduler {address}: tls:// needs certificates in Dask's config (distributed.comm.tls.ca-file, "
            "distributed.comm.tls.client.cert and distributed.comm.tls.client.key); none are set. "
            "Nothing was started or written.")
    with context.wrap_socket(sock, server_hostname=host):
        pass
