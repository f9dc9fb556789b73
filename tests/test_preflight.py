"""The checks before a run starts, against real sockets: a scheduler address where nothing
listens is refused at once with what to check; one that listens is let through to the Client."""

from __future__ import annotations

import socket
import time

import pytest
from conftest import CONFIG, ROOT, cli

from tianji_dask.deploy.preflight import SchedulerUnreachable, check_scheduler_listens


@pytest.fixture
def closed_port() -> int:
    """A port of 127.0.0.1 that was just free: bound, read back, closed."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def listening_port():
    """A port that accepts connections and never answers (the kernel completes the connect)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


@pytest.mark.parametrize("form", ["tcp://127.0.0.1:{}", "tls://127.0.0.1:{}", "127.0.0.1:{}"])
def test_a_closed_port_is_refused_at_once(closed_port, form):
    address = form.format(closed_port)
    start = time.monotonic()
    with pytest.raises(SchedulerUnreachable) as refused:
        check_scheduler_listens(address)
    assert time.monotonic() - start < 1.0
    message = str(refused.value)
    assert f"--scheduler {address}: nothing listens there (connection refused)" in message
    assert "dask scheduler" in message and "host and port" in message


def test_a_listening_port_is_let_through(listening_port):
    check_scheduler_listens(f"tcp://127.0.0.1:{listening_port}")
    check_scheduler_listens(f"127.0.0.1:{listening_port}")


def test_tls_without_certificates_in_the_config_is_refused(listening_port):
    with pytest.raises(SchedulerUnreachable, match=r"tls:// needs certificates in Dask's config"):
        check_scheduler_listens(f"tls://127.0.0.1:{listening_port}")


@pytest.mark.parametrize(
    "address, message",
    [
        ("127.0.0.1", "missing port number"),
        ("tcp://no-such-host.invalid:8786", "cannot connect"),
    ],
)
def test_an_address_without_a_port_or_a_host_is_refused(address, message):
    with pytest.raises(SchedulerUnreachable, match=message):
        check_scheduler_listens(address)


@pytest.mark.slow  # the CLI in a subprocess
@pytest.mark.parametrize("command", [["train"], ["profile"]])
def test_the_cli_exits_2_naming_the_address(closed_port, tmp_path, command):
    address = f"tcp://127.0.0.1:{closed_port}"
    res = cli(*command, str(CONFIG), "--scheduler", address, "--out", str(tmp_path / "out"), cwd=ROOT)
    assert res.returncode == 2, res.stderr
    assert f"--scheduler {address}: nothing listens there" in res.stderr and "Traceback" not in res.stderr
    assert not (tmp_path / "out").exists()
