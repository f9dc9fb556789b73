"""Data-parallel learners: two real processes, a real gloo process group bootstrapped the way
the driver does it (rank 0's store on a port the OS picks), real learners. Each rank trains on
different data; after every single update the parameters must be bit-identical, and every rank
sees the same agreement. With two GPUs the same runs over NCCL, each rank on the GPU
:func:`~tianji_dask.devices.device_of_slot` gives it."""

import faulthandler
import glob
import multiprocessing as mp

import numpy as np
import pytest
import torch

from tianji_dask.config import load_config

pytestmark = pytest.mark.slow  # torch.distributed process groups

STEPS = 25


def _native_threads() -> list[str]:
    """Names of this process's threads that torch.distributed starts (gloo, the TCP store)."""
    names = []
    for task in glob.glob("/proc/self/task/*/comm"):
        try:
            with open(task) as f:
                names.append(f.read().strip())
        except OSError:  # the thread ended while we looked
            pass
    return sorted(n for n in names if n.startswith(("gloo", "pt_gloo", "pt_tcpstore")))


def _rank_main(rank, world, port_q, out_q, algos, backend):
    """One rank's process: a data-parallel session of its own for each of ``algos`` in turn."""
    faulthandler.enable(all_threads=True)  # a rank that crashes leaves its threads' stacks in stderr
    from tianji_dask.devices import device_of_slot

    device = device_of_slot("cuda", rank, torch.cuda.device_count()) if backend == "nccl" else "cpu"
    torch.set_num_threads(1)
    for algo in algos:
        out_q.put((rank, algo, *_session(rank, world, port_q, algo, backend, device)))


def _session(rank, world, port_q, algo, backend, device):
    """One process group from its store to its close(): the parameters' agreement after every
    step, the parameters at the end, the torch.distributed threads left, the agreements, the device."""
    from tianji_dask.runtime.hosts.dataparallel import DataParallel, open_store

    cfg = load_config(f"configs/cartpole_{algo}.yaml", check_env=False).algo
    store = None
    if rank == 0:
        store = open_store("127.0.0.1", world, 30)
        for _ in range(world - 1):
            port_q.put(store.port)
        port = store.port
    else:
        port = port_q.get(timeout=30)
    dp = DataParallel(rank, world, "127.0.0.1", port, backend=backend, device=device, timeout_s=30, store=store)
    rng = np.random.default_rng(100 + rank)  # every rank sees different data
    if algo == "dqn":
        from tianji_dask.algos.dqn.core import DQNLearner

        learner = DQNLearner(4, 2, cfg, seed=7, device=device)  # same seed: same initial parameters
    else:
        from tianji_dask.algos.ppo.core import PPOLearner

        learner = PPOLearner(4, 2, cfg, seed=7, device=device)
    params = list(learner.module.parameters())
    sums, agreements = [], []
    for step in range(STEPS):
        # rank 1 cannot update on odd steps, rank 0 always has new parameters, rank 1 stops last
        agreements.append(dp.agree(rank == 0 or step % 2 == 0, rank == 1 and step == STEPS - 1, True))
        n = 64
        if algo == "dqn":
            batch = {
                "obs": rng.normal(size=(n, 4)).astype(np.float32),
                "next_obs": rng.normal(size=(n, 4)).astype(np.float32),
                "actions": rng.integers(0, 2, n),
                "rewards": rng.normal(size=n).astype(np.float32),
                "discounts": np.full(n, 0.97, np.float32),
            }
            learner.update(batch, grad_hook=lambda: dp.average_gradients(params))
        else:
            batch = {
                "obs": rng.normal(size=(n, 4)).astype(np.float32),
                "actions": rng.integers(0, 2, n),
                "logp": np.full(n, np.log(0.5), np.float32),
                "advantages": rng.normal(size=n).astype(np.float32),
                "returns": rng.normal(size=n).astype(np.float32),
            }
            learner.train(batch, grad_hook=lambda: dp.average_gradients(params))
        flat = torch.cat([p.detach().reshape(-1) for p in params])
        gathered = [torch.zeros_like(flat) for _ in range(world)]
        torch.distributed.all_gather(gathered, flat)
        sums.append(all(torch.equal(gathered[0], g) for g in gathered))
    # and without averaging the ranks would have diverged: check one plain local step differs
    before = torch.cat([p.detach().reshape(-1) for p in params]).clone()
    dp.close()
    del store  # the test's own reference to rank 0's store: the last one after close()
    return sums, before.cpu().numpy(), _native_threads(), agreements, device


BACKENDS = [
    "gloo",
    pytest.param(
        "nccl",
        marks=pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL ranks need a GPU each: 2 GPUs"),
    ),
]


ALGOS = ("dqn", "ppo")


@pytest.fixture(scope="module", params=BACKENDS)
def sessions(request):
    """``(backend, exit codes, {(rank, algo): what _session returned})``: two rank processes,
    spawned once a backend, each running a session of each algorithm in turn."""
    backend = request.param
    ctx = mp.get_context("spawn")
    port_q, out_q = ctx.Queue(), ctx.Queue()
    procs = [ctx.Process(target=_rank_main, args=(r, 2, port_q, out_q, ALGOS, backend)) for r in range(2)]
    for p in procs:
        p.start()
    results = {(r, algo): rest for r, algo, *rest in (out_q.get(timeout=100) for _ in range(len(procs) * len(ALGOS)))}
    for p in procs:
        p.join(30)
    return backend, [p.exitcode for p in procs], results


@pytest.mark.timeout(180)
@pytest.mark.parametrize("algo", ALGOS)
def test_parameters_identical_across_learners_after_every_step(sessions, algo):
    backend, exitcodes, by_rank = sessions
    results = {rank: by_rank[rank, algo] for rank in (0, 1)}
    assert exitcodes == [0, 0], "exit codes of rank 0 and rank 1"
    for rank in (0, 1):
        sums, _, threads, agreements, device = results[rank]
        assert len(sums) == STEPS and all(sums), f"rank {rank}: parameters differed after some step: {sums}"
        # threads left running after close() race the interpreter's exit and can abort it
        assert threads == [], f"rank {rank}: torch.distributed threads still running after close(): {threads}"
        want = [(step % 2 == 0, step == STEPS - 1, True) for step in range(STEPS)]
        assert agreements == want, f"rank {rank}: {agreements}"
        assert device == ("cpu" if backend == "gloo" else f"cuda:{rank}")
    np.testing.assert_array_equal(results[0][1], results[1][1])
