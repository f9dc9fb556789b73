"""The planner on synthetic profiles whose optimum is known by hand.

The DQN CartPole config has replay ratio R = gradient_steps * batch / train_freq = 8 * 64 / 64 = 8,
so a learner consuming 8,000 samples/s stands for 1,000 env steps/s."""

import os

import pytest
import yaml
from conftest import CONFIG

from tianji_dask.config import ConfigError, load_config
from tianji_dask.deploy.planner import Plan, PlanError, Profile, Resources, default_plan_path, make_plan, profile_beside
from tianji_dask.deploy.profiling import default_profile_path


def dqn(**over):
    return load_config(CONFIG, [f"{k}={v}" for k, v in over.items()])


def profile(per_actor, learner, threads=(1, 2, 4, 8, 16), batch_sizes=(64,), **kw):
    """per_actor: env steps/s of one actor (actors scale linearly); learner(t, b) -> samples/s."""
    ks = (1, 2, 4, 8, 16)
    return Profile(
        actors=ks,
        actor_env_steps_per_s=tuple(per_actor * k for k in ks),
        threads=threads,
        batch_sizes=batch_sizes,
        learner_samples_per_s=tuple(tuple(learner(t, b) for b in batch_sizes) for t in threads),
        **kw,
    )


def test_replay_ratio_of_the_reference_config():
    assert dqn().algo.target_replay_ratio == 8


def test_training_bound_gives_the_learner_all_but_one_core():
    # TR_A = 10,000 k; TR_L = 8,000 T samples/s = 1,000 T env steps/s. On 10 cores one group of
    # 1 actor + 9 threads consumes 9,000 env steps/s; any split into groups does worse (2 x 4,000).
    plan = make_plan(dqn(), profile(10_000, lambda t, b: 8_000 * t), Resources(cores=10))
    assert (plan.groups, plan.actors, plan.learner_threads) == (1, 1, 9)
    assert plan.bottleneck == "learner"
    assert plan.predicted["train_env_steps_per_s"] == pytest.approx(9_000)
    assert plan.predicted["train_samples_per_s"] == pytest.approx(72_000)
    assert plan.cores_used == 10


def test_sampling_bound_gives_the_actors_all_but_one_core():
    # TR_A = 1,000 k; TR_L flat at 80,000 samples/s = 10,000 env steps/s: 9 actors + 1 thread.
    plan = make_plan(dqn(), profile(1_000, lambda t, b: 80_000), Resources(cores=10))
    assert (plan.groups, plan.actors, plan.learner_threads) == (1, 9, 1)
    assert plan.bottleneck == "actors"
    assert plan.predicted["train_env_steps_per_s"] == pytest.approx(9_000)
    assert any("10 actors would produce" in line for line in plan.explanation)


def test_a_learner_that_does_not_scale_is_replicated_in_groups():
    # TR_L flat at 8,000 samples/s = 1,000 env steps/s whatever the threads; one actor outruns it.
    # 8 cores: 4 groups of (1 actor + 1 thread) consume 4,000 env steps/s; one group only 1,000.
    plan = make_plan(dqn(), profile(10_000, lambda t, b: 8_000), Resources(cores=8))
    assert (plan.groups, plan.actors, plan.learner_threads) == (4, 1, 1)
    assert plan.predicted["train_env_steps_per_s"] == pytest.approx(4_000)
    assert [(j.kind, j.group, j.cores, j.processes) for j in plan.jobs[:2]] == [
        ("learner", 0, 1, 1),
        ("actors", 0, 1, 1),
    ]
    assert len(plan.jobs) == 8
    assert plan.jobs[3].resources == {"tianji_actor": 1, "tianji_group_1": 1}
    assert any("replicated groups" in line for line in plan.explanation)


def test_groups_never_straddle_nodes():
    # 2 nodes x 16 cores, training-bound with linear thread scaling: a single 32-core group would
    # win, but a group must fit on a node: 2 groups of 16 (2 actors + 14 threads: min(20,000, 14,000)).
    plan = make_plan(
        dqn(),
        profile(10_000, lambda t, b: 8_000 * t, threads=(1, 2, 4, 8, 16, 32)),
        Resources(cores=32, nodes=2, cores_per_node=16),
    )
    assert (plan.groups, plan.actors, plan.learner_threads) == (2, 2, 14)
    # on several nodes a group is one job (learner + actors): Slurm places jobs, never half a group
    assert [(j.kind, j.group, j.node, j.cores, j.processes, j.gpus) for j in plan.jobs] == [
        ("group", 0, 0, 16, 3, 0),
        ("group", 1, 1, 16, 3, 0),
    ]
    assert plan.jobs[1].resources == {"tianji_learner": 1, "tianji_actor": 1, "tianji_group_1": 1}


def test_a_larger_batch_keeps_the_serial_replay_ratio_and_staleness():
    # batch 128 doubles the samples/s of the learner; train_freq and buffer_size double with it,
    # so R = 8 * 128 / 128 = 8 and P = 128 / 200,000 = 64 / 100,000 stay the serial ones.
    plan = make_plan(dqn(), profile(10_000, lambda t, b: 8_000 * (b // 64), batch_sizes=(64, 128)), Resources(cores=2))
    assert plan.batch_size == 128
    cfg = dqn()
    planned = plan.apply(cfg)
    assert planned.algo.target_replay_ratio == cfg.algo.target_replay_ratio
    assert planned.algo.batch_size / planned.algo.buffer_size == cfg.algo.batch_size / cfg.algo.buffer_size
    # the target network synced every half as many (twice as large) updates: the same samples
    assert planned.algo.target_update_interval * 2 == cfg.algo.target_update_interval
    # Adam's usual rule by default: lr times sqrt(128 / 64), said in the explanation
    assert planned.algo.lr == pytest.approx(cfg.algo.lr * 2**0.5, rel=1e-5)
    assert any(f"lr {cfg.algo.lr:g} -> {planned.algo.lr:g} for batch 128" in line for line in plan.explanation)


@pytest.mark.parametrize(("scaling", "factor"), [("linear", 4.0), ("none", 1.0), ("sqrt", 2.0)])
def test_the_learning_rate_follows_the_batch_as_the_config_says(scaling, factor):
    cfg = dqn(**{"algo.lr_batch_scaling": scaling})
    plan = make_plan(cfg, profile(10_000, lambda t, b: 8_000 * (b // 64), batch_sizes=(64, 256)), Resources(cores=2))
    assert plan.batch_size == 256
    assert plan.apply(cfg).algo.lr == pytest.approx(cfg.algo.lr * factor, rel=1e-5)


def test_a_plan_that_keeps_the_batch_keeps_the_learning_rate():
    cfg = dqn(**{"algo.lr": 3e-4})
    plan = make_plan(cfg, profile(10_000, lambda t, b: 8_000, batch_sizes=(64, 128)), Resources(cores=2))
    assert plan.batch_size == 64 and plan.lr is None
    assert "algo.lr" not in plan.overrides() and "algo.target_update_interval" not in plan.overrides()
    assert plan.apply(cfg).algo.lr == 3e-4


def test_equal_throughputs_prefer_the_configs_batch_and_fewer_cores():
    plan = make_plan(dqn(), profile(10_000, lambda t, b: 8_000, batch_sizes=(64, 128)), Resources(cores=2))
    assert plan.batch_size == 64
    # actors flat beyond one (one actor already outruns the learner): 3 cores keep 1 group
    plan = make_plan(dqn(), profile(10_000, lambda t, b: 8_000), Resources(cores=3))
    assert plan.groups == 1 and plan.cores_used == 3


def test_too_few_cores_is_refused_with_the_arithmetic():
    with pytest.raises(PlanError, match=r"1 core\(s\).*1 actor core \+ 1 learner core = 2 cores"):
        make_plan(dqn(), profile(1_000, lambda t, b: 8_000), Resources(cores=1))
    with pytest.raises(PlanError, match="exceeds --nodes 2 x --cores-per-node 4 = 8"):
        Resources(cores=16, nodes=2, cores_per_node=4)


def test_replay_memory_that_does_not_fit_is_refused_with_the_arithmetic():
    # 100,000 transitions x 40,000 B = 4 GB of replay on a 2 GiB node
    prof = profile(1_000, lambda t, b: 8_000, replay_bytes_per_transition=40_000)
    with pytest.raises(PlanError, match=r"replay 100,000 x 40,000 B.*> 2.00 GiB"):
        make_plan(dqn(), prof, Resources(cores=4, memory_per_node=2 * 2**30))
    plan = make_plan(dqn(**{"algo.buffer_size": 10_000}), prof, Resources(cores=4, memory_per_node=2 * 2**30))
    assert plan.jobs[0].memory_bytes > 10_000 * 40_000


def test_plan_round_trips_through_yaml():
    plan = make_plan(dqn(), profile(10_000, lambda t, b: 8_000), Resources(cores=8))
    again = Plan.from_dict(yaml.safe_load(yaml.safe_dump(plan.to_dict())))
    assert again == plan


def test_ppo_consumption_uses_sample_reuse():
    cfg = load_config(CONFIG.parent / "cartpole_ppo.yaml")
    # PPO's R is sample_reuse (1): a learner training 1,200 env steps/s is the bottleneck of one
    # actor producing 9,000; on 4 cores two groups double the consumption.
    prof = profile(9_000, lambda t, b: 1_200, batch_sizes=(256,))
    plan = make_plan(cfg, prof, Resources(cores=4))
    assert (plan.groups, plan.actors, plan.learner_threads) == (2, 1, 1)
    assert plan.predicted["train_samples_per_s"] == pytest.approx(2_400)
    assert "algo.batch_size" not in plan.overrides()


def test_a_plan_applies_to_its_own_config_only():
    plan = make_plan(dqn(), profile(10_000, lambda t, b: 8_000), Resources(cores=8))
    cfg = plan.apply(dqn())
    assert (cfg.topology.groups, cfg.topology.actors, cfg.topology.learner_torch_threads) == (4, 1, 1)
    with pytest.raises(ConfigError, match="made for dqn on CartPole-v1.*Acrobot-v1"):
        plan.apply(dqn(**{"env.id": "Acrobot-v1"}))


def test_default_files_say_which_config_and_how_many_cores_or_where():
    plan = default_plan_path("configs/pong_ppo.yaml", 16)
    assert plan.as_posix() == "runs/plans/pong_ppo-16cores.yaml"
    assert profile_beside(plan).as_posix() == "runs/plans/pong_ppo-16cores.profile.nc"
    cores = len(os.sched_getaffinity(0))
    assert default_profile_path("configs/pong_ppo.yaml").as_posix() == f"runs/profiles/pong_ppo-{cores}cores.nc"
    for address in ("tls://10.0.0.5:8786", "tcp://10.0.0.5:8786", "10.0.0.5:8786"):
        assert default_profile_path("pong_ppo.yaml", address).as_posix() == "runs/profiles/pong_ppo-10.0.0.5-8786.nc"
