"""The planner with GPUs, on synthetic profiles whose optimum is known by hand: where the learner
trains, where the actors' inference runs, how many threads step the envs, and the jobs that hold
them. PPO on Pong has replay ratio R = 1: TR_L samples/s consume TR_L env steps/s."""

from pathlib import Path

import numpy as np
import pytest
import xarray as xr
from conftest import CONFIG, cli_here

from tianji_dask.algos.registry import spec_for
from tianji_dask.config import load_config
from tianji_dask.deploy.planner import (
    Plan,
    PlanError,
    Profile,
    Resources,
    default_plan_path,
    load_plan,
    make_plan,
    save_plan,
)
from tianji_dask.deploy.slurm import job_scripts, plan_from_config
from tianji_dask.runtime.cluster.placement import place

PONG = CONFIG.parent / "pong_ppo.yaml"
THREADS = (1, 2, 4, 8, 15)


def pong(**over):
    return load_config(PONG, [f"{k}={v}" for k, v in over.items()], check_env=False, check_device=False)


def profile(*, cpu_actor=400, cpu_learner=500, gpu_learner=46_000.0, gpu_actor=lambda t: 1_000 * t):
    """CPU actors scale linearly at ``cpu_actor`` each, the CPU learner at ``cpu_learner`` per
    thread; on the GPU the learner trains ``gpu_learner`` samples/s and one actor produces
    ``gpu_actor(t)`` env steps/s with t env threads."""
    ks = (1, 2, 4, 8, 16)
    batch = spec_for(pong()).samples_per_update(pong())  # 64 envs x 128 steps
    return Profile(
        actors=ks,
        actor_env_steps_per_s=tuple(cpu_actor * k for k in ks),
        threads=(1, 2, 4, 8, 15),
        batch_sizes=(batch,),
        learner_samples_per_s=tuple((cpu_learner * t,) for t in (1, 2, 4, 8, 15)),
        gpu_learner_samples_per_s=(gpu_learner,) if gpu_learner else (),
        env_threads=THREADS if gpu_actor else (),
        gpu_actor_env_steps_per_s=tuple(gpu_actor(t) for t in THREADS) if gpu_actor else (),
    )


def test_one_gpu_takes_the_learner_and_the_inference_and_the_envs_get_the_other_cores():
    # GPU learner 46,000 env steps/s; one GPU actor 1,000 t: 15 threads on 16 cores produce 15,000,
    # more than 15 CPU actors (6,000): everything on the GPU, one job of 16 cores and the GPU.
    plan = make_plan(pong(), profile(), Resources(cores=16, gpus=1))
    assert (plan.learner_device, plan.actor_device, plan.actors, plan.env_threads) == ("cuda", "cuda", 1, 15)
    assert plan.bottleneck == "actors" and plan.gpus_used == 1 and plan.cores_used == 16
    assert plan.predicted["train_env_steps_per_s"] == pytest.approx(15_000)
    [job] = plan.jobs
    assert (job.kind, job.cores, job.processes, job.gpus) == ("group", 16, 2, 1)
    assert job.resources == {"tianji_learner": 1, "tianji_actor": 1, "tianji_group_0": 1}
    cfg = plan.apply(pong())
    assert (cfg.learner.device, cfg.actor.device, cfg.env.atari_threads, cfg.topology.actors) == ("cuda", "cuda", 15, 1)
    # the CPU alternative: one actor (max_policy_lag 1 x rollouts_per_update 1) at 400
    assert any("inference on the GPU: on 15 actor cores" in line and "CPU 400" in line for line in plan.explanation)


def test_inference_stays_on_the_cpu_when_cpu_actors_produce_more():
    # Rollouts may be 15 versions old: GPU actor 100 t (1,500 at 15 threads) against 15 CPU actors
    # at 400 (6,000): the learner on the GPU, 15 single-core actors with one env thread each, in
    # jobs of their own.
    cfg = pong(**{"algo.max_policy_lag": 15})
    plan = make_plan(cfg, profile(gpu_actor=lambda t: 100 * t), Resources(cores=16, gpus=1))
    assert (plan.learner_device, plan.actor_device, plan.actors, plan.env_threads) == ("cuda", "cpu", 15, 1)
    assert [(j.kind, j.cores, j.processes, j.gpus) for j in plan.jobs] == [("learner", 1, 1, 1), ("actors", 15, 15, 0)]
    assert any("inference on the CPU" in line and "6,000" in line for line in plan.explanation)


def test_ppo_groups_have_no_more_actors_than_rollouts_may_lag():
    # No GPU, a learner outrunning any actor count: with max_policy_lag 1 and one rollout an
    # iteration, a second actor would make every rollout two versions old, so 16 cores make
    # 8 groups of 1 actor + 1 learner thread rather than one group of 15 actors.
    prof = profile(cpu_learner=100_000)
    plan = make_plan(pong(), prof, Resources(cores=16))
    assert (plan.groups, plan.actors, plan.learner_threads) == (8, 1, 1)
    assert any("at most 1 actor(s) a group" in line for line in plan.explanation)
    lagging = make_plan(pong(**{"algo.max_policy_lag": 2, "algo.rollouts_per_update": 2}), prof, Resources(cores=16))
    assert lagging.actors == 4 and lagging.groups == 3  # 3 x (4 actors + 1 thread) = 15 cores


def test_env_threads_that_add_less_than_the_tie_leave_cores_idle():
    # 8 threads give 8,000 env steps/s, 15 give 8,100 (+1.25 %, within 2 %): 8 threads, 7 cores idle.
    curve = dict(zip(THREADS, (1_000, 2_000, 4_000, 8_000, 8_100)))
    plan = make_plan(pong(), profile(gpu_actor=curve.__getitem__), Resources(cores=16, gpus=1))
    assert (plan.actor_device, plan.env_threads, plan.cores_used) == ("cuda", 8, 9)
    assert any("7 core(s) of each group's 16 left idle" in line for line in plan.explanation)


def test_groups_that_use_a_gpu_are_as_many_as_the_gpus():
    # The GPU learner trains 8,000 samples/s: the bottleneck of a GPU actor with 15 threads. Each
    # GPU makes a group: 2 GPUs on 2 nodes of 16 cores give 2 groups, one a node.
    prof = profile(gpu_learner=8_000.0)
    one = make_plan(pong(), prof, Resources(cores=32, nodes=2, cores_per_node=16, gpus=2))
    assert (one.groups, one.gpus_used, one.learner_device) == (2, 2, "cuda")
    assert [(j.kind, j.node, j.gpus) for j in one.jobs] == [("group", 0, 1), ("group", 1, 1)]
    # One GPU for 32 cores: a second group would train on the CPU (500 t samples/s), so one group.
    single = make_plan(pong(), prof, Resources(cores=32, gpus=1))
    assert (single.groups, single.gpus_used) == (1, 1)
    # No GPU: the CPU learner and CPU actors, however slow.
    cpu = make_plan(pong(), prof, Resources(cores=16))
    assert (cpu.learner_device, cpu.actor_device, cpu.gpus_used) == ("cpu", "cpu", 0)
    assert cpu.apply(pong()).learner.device == "cpu"


@pytest.mark.parametrize("cores, gpus", [(64, 4), (128, 8)])
def test_a_node_of_several_gpus_gets_a_group_a_gpu_with_its_share_of_the_cores(cores, gpus):
    # One node of 16 cores a GPU (the 4- and 8-GPU machines): each GPU makes a group of 16 cores
    # (the learner's and 15 env threads of one GPU actor), each job tagged with its own group.
    plan = make_plan(pong(), profile(), Resources(cores=cores, gpus=gpus))
    assert (plan.groups, plan.gpus_used, plan.cores_used) == (gpus, gpus, cores)
    assert (plan.learner_device, plan.actor_device, plan.actors, plan.env_threads) == ("cuda", "cuda", 1, 15)
    assert plan.predicted["train_env_steps_per_s"] == pytest.approx(gpus * 15_000)
    assert [(j.kind, j.group, j.cores, j.gpus) for j in plan.jobs] == [("group", g, 16, 1) for g in range(gpus)]
    scripts = job_scripts(plan)
    assert [name for name, _ in scripts] == [f"tianji-run-g{g}-group" for g in range(gpus)]
    for g, (_, script) in enumerate(scripts):
        assert "#SBATCH --gres=gpu:1" in script and "#SBATCH --cpus-per-task=16" in script
        assert f"tianji_learner=1,tianji_actor=1,tianji_group_{g}=1" in script
    assert plan.apply(pong()).topology.groups == gpus


def test_a_gpu_plans_slurm_jobs_are_checked_and_shown_on_a_machine_without_a_gpu(tmp_path):
    """A login node has no GPU: ``train --slurm --check`` (the launcher's dry run) and
    ``job-script`` of a plan with GPUs pass there, since the jobs' nodes have them; a run on this
    machine's own LocalCluster is still refused before it starts."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    path = tmp_path / "plan.yaml"
    save_plan(make_plan(pong(), profile(), Resources(cores=128, gpus=8)), path)
    r = cli_here("train", str(PONG), "--slurm", "--plan", str(path), "--check")
    assert r.returncode == 0, r.stderr
    assert "8 group(s) of 1 actor(s) and 1 learner(s), learner on cuda, on Slurm in 8 job(s) of the plan" in r.stderr
    r = cli_here("job-script", str(PONG), "--plan", str(path))
    assert r.returncode == 0 and r.stdout.count("#SBATCH --gres=gpu:1") == 8, r.stderr
    r = cli_here("train", str(PONG), "--plan", str(path), "--check")
    assert r.returncode == 2 and "learner.device='cuda'" in r.stderr and "learner.device=cpu" in r.stderr


def test_gpus_without_gpu_measurements_or_uneven_over_nodes_are_refused():
    with pytest.raises(PlanError, match="no GPU measurements.*profile CONFIG --gpu"):
        make_plan(pong(), profile(gpu_learner=0.0, gpu_actor=None), Resources(cores=16, gpus=1))
    with pytest.raises(PlanError, match="--gpus 3 over --nodes 2: give a multiple"):
        Resources(cores=32, nodes=2, gpus=3)
    gpu_only = profile()
    gpu_only = Profile(
        actors=gpu_only.actors,
        actor_env_steps_per_s=gpu_only.actor_env_steps_per_s,
        threads=(),
        batch_sizes=gpu_only.batch_sizes,
        learner_samples_per_s=(),
        gpu_learner_samples_per_s=gpu_only.gpu_learner_samples_per_s,
        env_threads=gpu_only.env_threads,
        gpu_actor_env_steps_per_s=gpu_only.gpu_actor_env_steps_per_s,
    )
    assert make_plan(pong(), gpu_only, Resources(cores=16, gpus=1)).learner_device == "cuda"
    with pytest.raises(PlanError, match="no learner on the CPU.*plan with --gpus"):
        make_plan(pong(), gpu_only, Resources(cores=16))


def test_a_gpu_profile_reads_back_from_its_netcdf(tmp_path: Path):
    """The variable names the profile writes (tianji_dask.deploy.profiling) are those Profile reads."""
    cfg = pong()
    ds = xr.Dataset(
        {
            "actor_env_steps_per_s": ("actors", np.array([400.0, 800.0])),
            "learner_samples_per_s": (("threads", "batch_size"), np.array([[500.0]])),
            "message_bytes": ((), 1000),
            "replay_bytes_per_transition": ((), 0.0),
            "gpu_learner_samples_per_s": ("batch_size", np.array([46_000.0])),
            "gpu_actor_env_steps_per_s": ("env_threads", np.array([1_000.0, 2_000.0, 3_500.0])),
        },
        coords={"actors": [1, 2], "threads": [1], "batch_size": [8192], "env_threads": [1, 2, 4]},
        attrs={"algo": cfg.algo.name, "env_id": cfg.env.id},
    )
    ds.to_netcdf(tmp_path / "p.nc", engine="netcdf4")
    prof = Profile.load(tmp_path / "p.nc", cfg)
    assert prof.tr_l_gpu(8192) == 46_000 and prof.tr_a_gpu(3) == pytest.approx(2_750)
    assert prof.tr_a_gpu(16) == 3_500  # flat beyond what was measured
    cpu_only = ds.drop_vars(["gpu_learner_samples_per_s", "gpu_actor_env_steps_per_s", "env_threads"])
    cpu_only.to_netcdf(tmp_path / "cpu.nc", engine="netcdf4")
    assert not Profile.load(tmp_path / "cpu.nc", cfg).gpu_learner


def test_a_group_job_puts_the_learner_on_its_first_worker_and_the_actor_on_the_second():
    plan = make_plan(pong(), profile(), Resources(cores=16, gpus=1))
    tags = plan.jobs[0].resources
    workers = {
        "tcp://10.0.0.1:4002": {"name": "tianji-run-g0-group-1", "resources": tags},
        "tcp://10.0.0.1:4001": {"name": "tianji-run-g0-group-0", "resources": tags},
    }
    placed = place(workers, plan.apply(pong()).topology, "r", 0)
    assert placed.learners[0].worker == "tcp://10.0.0.1:4001"
    assert placed.actors[0].worker == "tcp://10.0.0.1:4002"


def test_gpu_jobs_ask_slurm_for_the_gpu():
    plan = make_plan(pong(), profile(), Resources(cores=16, gpus=1))
    [(name, script)] = job_scripts(plan)
    assert name == "tianji-run-g0-group"
    assert "#SBATCH --gres=gpu:1" in script and "--nworkers 2" in script
    assert "tianji_learner=1,tianji_actor=1,tianji_group_0=1" in script
    # the config's own topology: the learner's job and the actors' job each ask for a GPU
    scripts = dict(job_scripts(plan_from_config(pong())))
    assert all("--gres=gpu:1" in s for s in scripts.values()), scripts
    assert "--gres" not in dict(job_scripts(plan_from_config(load_config(CONFIG))))["tianji-run-g0-learner"]


def test_the_default_plan_file_names_the_gpus():
    assert default_plan_path("configs/pong_ppo.yaml", 16, 1).as_posix() == "runs/plans/pong_ppo-16cores-1gpus.yaml"


def test_the_pong_config_is_the_plan_its_stored_profile_gives_for_16_cores_and_a_gpu():
    """configs/pong_ppo.yaml is sized by a plan made on an H200 machine; planning again from that
    machine's profile gives the same plan, and the plan leaves the config as it is."""
    results = PONG.parent.parent / "benchmarks" / "results" / "plan_pong_ppo_h200_async"
    stored = load_plan(results / "plan.yaml")
    again = make_plan(pong(), Profile.load(results / "plan.profile.nc", pong()), Resources(cores=16, gpus=1))
    assert again.overrides() == stored.overrides()
    assert stored.apply(pong()) == pong()


def test_a_plan_written_before_plans_chose_devices_leaves_the_configs_devices():
    plan = make_plan(pong(), profile(), Resources(cores=16, gpus=1)).to_dict()
    for key in ("learner_device", "actor_device", "env_threads", "gpus_used"):
        plan.pop(key)
    for job in plan["jobs"]:
        job.pop("gpus")
    old = Plan.from_dict(plan)
    assert "learner.device" not in old.overrides() and "env.atari_threads" not in old.overrides()
    assert old.apply(pong()).learner.device == "cuda"  # the config's


def test_the_pong_dqn_config_is_the_plan_its_stored_profile_gives_among_batches_32_and_64():
    """configs/pong_dqn.yaml is sized by a plan made from an H200 machine's profile, which
    measured batches 32, 64 and 128; planning again among 32 and 64 gives the same plan (batch
    64, 5 CPU actors: the GPU learner is the bottleneck, and a GPU actor of as many cores would
    share its GPU), and the plan leaves the config as it is. Among 32 alone, the serial
    algorithm's batch comes back (train_freq 1, target sync every 1,000 updates, lr 1e-4, 3
    actors for the slower learner); among all three, batch 128 trains the most samples a second
    (the plan the config does not follow: it learned slower per env step)."""
    dqn_path = CONFIG.parent / "pong_dqn.yaml"
    dqn = load_config(dqn_path, check_env=False, check_device=False)
    results = CONFIG.parent.parent / "benchmarks" / "results" / "plan_pong_dqn_h200_20261129"
    profile_ = Profile.load(results / "plan.profile.nc", dqn)
    stored = load_plan(results / "plan.yaml")
    again = make_plan(dqn, profile_.with_batch_sizes([32, 64]), Resources(cores=16, gpus=1))
    assert again.overrides() == stored.overrides()
    assert (again.actors, again.actor_device, again.batch_size) == (5, "cpu", 64)
    assert stored.apply(dqn) == dqn
    serial = make_plan(dqn, profile_.with_batch_sizes([32]), Resources(cores=16, gpus=1))
    scaled = serial.overrides()
    assert (serial.actors, serial.batch_size) == (3, 32)
    assert (scaled["algo.train_freq"], scaled["algo.buffer_size"], scaled["algo.target_update_interval"]) == (
        1,
        50_000,
        1_000,
    )
    assert scaled["algo.lr"] == pytest.approx(1e-4, rel=1e-5)
    widest = make_plan(dqn, profile_, Resources(cores=16, gpus=1))
    assert widest.batch_size == 128 and widest.overrides()["algo.train_freq"] == 4
    with pytest.raises(PlanError, match="--batch-sizes 48: not in the profile, which measured 32,64,128"):
        profile_.with_batch_sizes([48])


def test_a_plan_from_a_stored_profile_chooses_among_the_batch_sizes_given(tmp_path):
    """``plan --profile P --batch-sizes ...`` plans among those of the profile's batch sizes; one
    the profile did not measure is refused before anything is written, naming those it did."""
    stored = CONFIG.parent.parent / "benchmarks" / "results" / "plan_pong_dqn_h200_20261129" / "plan.profile.nc"
    common = ["plan", str(CONFIG.parent / "pong_dqn.yaml"), "--cores", "16", "--gpus", "1", "--profile", str(stored)]
    r = cli_here(*common, "--batch-sizes", "32,64", "--out", str(tmp_path / "p.yaml"))
    assert r.returncode == 0, r.stderr
    assert load_plan(tmp_path / "p.yaml").batch_size == 64  # the faster of the two
    r = cli_here(*common, "--batch-sizes", "48", "--out", str(tmp_path / "q.yaml"))
    assert r.returncode == 2 and "--batch-sizes 48: not in the profile, which measured 32,64,128" in r.stderr
    assert not (tmp_path / "q.yaml").exists()
