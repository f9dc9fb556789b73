"""Hosts on a worker's second GPU: each host's thread has its own GPU as its current CUDA device,
and a CUDA graph made for a module on GPU 1 is captured and replayed there, whatever the thread's
current device. Two groups on one LocalCluster of a 2-GPU machine each compute on their own GPU.
The GPU tests need two GPUs (the device machine's 2-GPU kind)."""

from __future__ import annotations

import subprocess
import threading
import time

import pytest
import torch

from tianji_dask.algos.executor import GraphedStep
from tianji_dask.config import load_config
from tianji_dask.devices import bind_thread
from tianji_dask.runtime.driver import train

two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")


def test_binding_a_thread_to_the_cpu_or_to_cuda_without_an_index_touches_no_gpu():
    bind_thread("cpu")
    bind_thread("cuda")  # the current device stays: nothing to bind to (and no CUDA call here)
    with pytest.raises(ValueError, match="needs a CUDA device"):
        GraphedStep(lambda inputs: inputs["x"], lambda: None, device="cpu")


@two_gpus
def test_a_graph_for_a_module_on_gpu_1_is_captured_there_from_a_thread_on_gpu_0():
    torch.manual_seed(0)
    net = torch.nn.Linear(8, 4).to("cuda:1")
    x = torch.randn(16, 8, device="cuda:1")
    seen: dict = {}

    def work():
        torch.cuda.set_device(0)
        step = GraphedStep(lambda inputs: net(inputs["x"]).sum(1), lambda: None, device="cuda:1")
        outs = [step({"x": x}).clone() for _ in range(4)]  # two eager calls, the capture, a replay
        torch.cuda.synchronize(1)
        seen.update(outs=outs, stream=step.stream.device, current=torch.cuda.current_device())

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    assert seen["stream"] == torch.device("cuda", 1) and seen["current"] == 0
    expected = net(x).sum(1)
    for out in seen["outs"]:
        assert out.device == torch.device("cuda", 1)
        torch.testing.assert_close(out, expected)


@two_gpus
@pytest.mark.timeout(300)
def test_two_groups_on_one_cluster_each_compute_on_their_own_gpu(tmp_path):
    """PPO CartPole, two groups, inference and training on CUDA: group g's learner and actor take
    GPU g (``devices.device_of_slot``), capture their graphs there, and the run ends as asked."""
    cfg = load_config(
        "configs/cartpole_ppo.yaml",
        [
            "topology.groups=2",
            "learner.device=cuda",
            "actor.device=cuda",
            "stop.target_return=null",
            "stop.max_env_steps=40000",
            "stop.max_seconds=200",
        ],
    )
    run = train(cfg, out=tmp_path / "run")
    busy: set[str] = set()
    while not run.done and len(busy) < 2:
        apps = subprocess.run(
            ["nvidia-smi", "--query-compute-apps=gpu_bus_id", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout.split()
        busy |= set(apps)
        time.sleep(0.5)
    result = run.wait(timeout=280)
    assert result is not None and result.error is None, result and result.error
    assert result.status == "max_env_steps", result.status
    assert len(busy) == 2, f"processes of the run on GPUs {busy}: each group should have its own"
