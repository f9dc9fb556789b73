"""TLS end to end: ``train --tls`` (``train(..., tls=True)``) runs on a LocalCluster that speaks
TLS only, with certificates made for the run: scheduler, workers and the project's channels are
on tls://, and a client without the run's certificate, or a plain TCP one, is refused. Real
LocalCluster, real handshakes."""

from __future__ import annotations

import json
import os
import socket
import ssl
import subprocess
import sys
import time
from urllib.parse import urlsplit

import pytest
import xarray as xr
from distributed import Client

from tianji_dask.config import ConfigError, load_config
from tianji_dask.runtime.driver import train

# A client knocking from a process of its own, as a foreign client would: a Client that fails
# in the run's own process can linger as Dask's default client there and take over what the
# run's client deserialises, which is not what these refusals are about.
_KNOCK = """
import sys
from distributed import Client, Security
address, how = sys.argv[1], sys.argv[2]
security = Security.temporary() if how == "foreign" else None
try:
    Client(address, security=security, timeout="3s").close()
    print("CONNECTED")
except Exception as exc:
    print(f"{type(exc).__name__}: {exc}")
"""


def _refused(address: str, how: str = "none") -> str:
    """What a client connecting to ``address`` from another process gets (``how``: ``none``, no
    certificate; ``foreign``, a certificate of another authority); fails the test if it connects."""
    p = subprocess.run([sys.executable, "-c", _KNOCK, address, how], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and "CONNECTED" not in p.stdout, (address, how, p.stdout, p.stderr[-2000:])
    return p.stdout


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_a_tls_run_learns_on_tls_only_and_refuses_clients_without_its_certificate(h, tmp_path):
    # no stop rule fires while the clients knock (a run that ended first would refuse them for
    # another reason); the test stops it once it has learned
    cfg = load_config(
        "configs/cartpole_dqn.yaml", ["stop.target_return=null", "stop.max_env_steps=null", "stop.max_seconds=160"]
    )
    events: list[str] = []
    with h.ending(train(cfg, out=tmp_path / "run", tls=True, on_event=events.append)) as run:
        # README's recipe: the address once the cluster is up; the run goes on while clients knock
        address = run.wait_for_cluster()
        assert address == run.scheduler_address and address.startswith("tls://127.0.0.1:"), (address, events)
        assert f"scheduler: {address}" in events
        host_port = address.removeprefix("tls://")

        # no certificate at all: the client cannot even start a TLS connection
        assert "TLS expects a `ssl_context`" in _refused(address)
        # a certificate of another authority: the handshake fails
        assert "TLS certificate does not match" in _refused(address, "foreign")
        # plain TCP to the TLS port: the server resets the connection
        assert _refused(f"tcp://{host_port}").startswith("CommClosedError")
        # and at the socket level the server speaks TLS with a certificate no default trust accepts
        host, port = urlsplit(address).hostname, urlsplit(address).port
        context = ssl.create_default_context()
        with socket.create_connection((host, port), timeout=5) as sock, pytest.raises(ssl.SSLError):
            context.wrap_socket(sock, server_hostname=host).close()
        # the run's own certificate connects, and every worker listens on tls:// only
        with Client(address, security=run.security, timeout="10s") as client:
            client.wait_for_workers(2, timeout=60)  # the scheduler is up before its workers
            workers = list(client.scheduler_info(n_workers=-1)["workers"])
        assert workers and all(w.startswith("tls://127.0.0.1:") for w in workers), workers
        assert not run.done, (run.result, events)  # every refusal above came from the live run

        # the hosts train over their TLS channels: CartPole's random policy returns about 22
        while not run.done and not run.recorder.tally.return_mean_100 >= 100:
            time.sleep(0.2)
        learned = run.recorder.tally.return_mean_100
        run.stop()
        result = run.wait(timeout=60)
    assert result is not None and result.status == "stopped", (result, events)
    assert learned >= 100, (learned, result)
    with xr.open_dataset(result.run_dir / "metrics.nc", engine="netcdf4") as ds:
        assert ds.attrs["scheduler_address"] == address
        hosts = json.loads(ds.attrs["worker_addresses"])
    # the hosts, and so their channels (they answer on the workers' listeners), were on tls://
    assert hosts and set(hosts) <= set(workers), (hosts, workers)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "extra, message",
    [
        (["--serial"], "--tls makes the run's own LocalCluster speak TLS; with --serial it does not apply; drop --tls"),
        (["--scheduler", "tls://127.0.0.1:1"], "with --scheduler it does not apply (Dask's own TLS settings"),
    ],
    ids=["serial", "scheduler"],
)
def test_tls_where_it_cannot_apply_is_bad_input(h, tmp_path, extra, message):
    p = h.cli_here("train", h.CONFIG, "--tls", *extra, "--out", tmp_path / "out", cwd=tmp_path)
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert message in p.stderr and "Traceback" not in p.stderr, p.stderr
    assert os.listdir(tmp_path) == []


def test_tls_with_a_client_passed_in_is_refused_before_anything_starts(tmp_path):
    cfg = load_config("configs/cartpole_dqn.yaml")
    with pytest.raises(ConfigError, match="a client passed in keeps its own cluster's security"):
        train(cfg, client="tcp://127.0.0.1:1", out=tmp_path / "run", tls=True)
    assert not (tmp_path / "run").exists()
