"""Unit tests for tianji_dask.config: the shipped config, overrides, round trips, and error texts.

Every bad input must raise ConfigError (never a raw pydantic ValidationError or a YAML
traceback) whose message names the dotted field, the value given and what is allowed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from tianji_dask.config import (
    ConfigError,
    ExperimentConfig,
    apply_overrides,
    check_env,
    load_config,
    validate_config,
)
from tianji_dask.config.loading import default_config_path, parse_override, read_config_file

SHIPPED = Path(__file__).resolve().parents[1] / "configs" / "cartpole_dqn.yaml"


def write(tmp_path: Path, text: str, name: str = "exp.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def error_text(overrides=(), *, path: Path = SHIPPED, env: bool = False) -> str:
    """The message of the ConfigError that loading ``path`` with ``overrides`` raises."""
    with pytest.raises(ConfigError) as info:
        load_config(path, list(overrides), check_env=env)
    return str(info.value)


# --------------------------------------------------------------------------------------------
# The shipped config
# --------------------------------------------------------------------------------------------


def test_shipped_config_loads_with_documented_values():
    config = load_config(SHIPPED)  # builds CartPole once, checks the (cpu) device
    assert config.seed == 0
    assert (config.env.id, config.env.num_envs) == ("CartPole-v1", 8)
    algo = config.algo
    assert (algo.name, algo.gamma, algo.lr, algo.batch_size) == ("dqn", 0.99, 0.001, 64)
    assert (algo.buffer_size, algo.learning_starts) == (100_000, 1000)
    assert (algo.train_freq, algo.gradient_steps, algo.target_update_interval) == (64, 8, 250)
    assert (algo.exploration_initial_eps, algo.exploration_final_eps) == (1.0, 0.02)
    assert algo.exploration_steps == 8000 and algo.hidden_sizes == [64, 64]
    assert algo.n_step == 3
    assert (algo.max_grad_norm, algo.ratio_tolerance) == (10.0, 0.25)
    assert (config.topology.actors, config.topology.torch_threads) == (1, 1)
    assert (config.channel.chunk_steps, config.channel.capacity_mb) == (32, 16.0)
    assert config.channel.full_policy == "wait"
    assert (config.learner.publish_interval, config.learner.device) == (50, "cpu")
    assert (config.stop.target_return, config.stop.max_env_steps) == (300.0, 500_000)
    assert config.stop.max_seconds == 600
    assert (config.run.metrics_interval, config.run.heartbeat_timeout) == (0.5, 5.0)
    assert config.run.checkpoint is True
    assert (config.run.eval_every_env_steps, config.run.eval_episodes) == (0, 20)


def test_derived_values():
    config = load_config(SHIPPED, check_env=False)
    assert config.algo.target_replay_ratio == 8 * 64 / 64 == 8.0
    assert config.channel.capacity_bytes == 16_000_000
    config = load_config(SHIPPED, ["channel.capacity_mb=0.5"], check_env=False)
    assert config.channel.capacity_bytes == 500_000


def test_packaged_default_is_identical_to_configs_copy():
    assert default_config_path().is_file()
    assert default_config_path().read_bytes() == SHIPPED.read_bytes()


def test_model_defaults_match_shipped_file():
    # Sections left out of a file take the model defaults; they must agree with the shipped file.
    shipped = load_config(SHIPPED, check_env=False)
    minimal = {
        "env": {"id": "CartPole-v1"},
        "algo": {"name": "dqn"},
        "stop": shipped.stop.model_dump(),
    }
    assert validate_config(minimal) == shipped


def test_header_says_how_to_run():
    assert "tianji-dask train configs/cartpole_dqn.yaml" in SHIPPED.read_text()


def test_check_env_returns_spaces():
    observation_space, action_space = check_env(load_config(SHIPPED, check_env=False))
    assert action_space.n == 2 and observation_space.shape == (4,)


# --------------------------------------------------------------------------------------------
# Overrides
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, path, value",
    [
        ("algo.lr=1e-3", ["algo", "lr"], 0.001),  # YAML 1.1 would give the string "1e-3"
        ("algo.lr=2.5E-4", ["algo", "lr"], 0.00025),
        ("stop.target_return=null", ["stop", "target_return"], None),
        ("run.checkpoint=false", ["run", "checkpoint"], False),
        ("algo.hidden_sizes=[64,64]", ["algo", "hidden_sizes"], [64, 64]),
        ("env={id: Acrobot-v1, num_envs: 2}", ["env"], {"id": "Acrobot-v1", "num_envs": 2}),
        ("env.id=MountainCar-v0", ["env", "id"], "MountainCar-v0"),
        (" seed = 7", ["seed"], 7),
        ("learner.device=cuda:1", ["learner", "device"], "cuda:1"),
    ],
)
def test_parse_override(text, path, value):
    assert parse_override(text) == (path, value)


def test_apply_overrides_returns_new_dict_and_later_wins():
    data = read_config_file(SHIPPED)
    before = json.dumps(data, sort_keys=True)
    out = apply_overrides(data, ["algo.lr=0.1", "algo.lr=0.2", (["topology", "actors"], 3)])
    assert out["algo"]["lr"] == 0.2 and out["topology"]["actors"] == 3
    assert json.dumps(data, sort_keys=True) == before  # input untouched


def test_apply_overrides_sets_keys_the_file_leaves_out():
    data = {"env": {"id": "CartPole-v1"}, "algo": {"name": "dqn"}, "stop": None}
    out = apply_overrides(data, ["stop.max_seconds=10", "channel.full_policy=drop_oldest"])
    assert out["stop"] == {"max_seconds": 10}
    assert out["channel"] == {"full_policy": "drop_oldest"}
    assert validate_config(out).channel.full_policy == "drop_oldest"


def test_overrides_nested_lists_and_null():
    config = load_config(
        SHIPPED,
        [
            "algo.lr=1e-3",
            "algo.hidden_sizes=[64, 64]",
            "stop.target_return=null",
            "topology.actors=4",
            "learner.device=cpu",
        ],
        check_env=False,
    )
    assert config.algo.lr == 0.001
    assert config.algo.hidden_sizes == [64, 64]
    assert config.stop.target_return is None
    assert config.topology.actors == 4


@pytest.mark.parametrize("env_id", ["Acrobot-v1", "MountainCar-v0"])
def test_switching_env_id_validates(env_id):
    config = load_config(SHIPPED, [f"env.id={env_id}"])  # check_env builds it
    assert config.env.id == env_id


def test_setting_algo_name_is_allowed():
    assert load_config(SHIPPED, ["algo.name=dqn"], check_env=False).algo.name == "dqn"


def test_yaml_file_reads_exponent_floats(tmp_path):
    text = SHIPPED.read_text().replace("lr: 0.0023", "lr: 1e-3")
    assert load_config(write(tmp_path, text), check_env=False).algo.lr == 0.001


# --------------------------------------------------------------------------------------------
# Round trips
# --------------------------------------------------------------------------------------------


def test_model_dump_yaml_round_trips(tmp_path):
    config = load_config(SHIPPED, ["algo.lr=1e-5", "stop.max_seconds=null"], check_env=False)
    again = load_config(write(tmp_path, config.model_dump_yaml()), check_env=False)
    assert again == config
    assert again.model_dump_yaml() == config.model_dump_yaml()


def test_to_json_round_trips():
    config = load_config(SHIPPED, check_env=False)
    text = config.to_json()
    assert "\n" not in text
    assert validate_config(json.loads(text)) == config


# --------------------------------------------------------------------------------------------
# Bad inputs: each names the dotted field, the value and what is allowed
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides, expected",
    [
        pytest.param(
            ["algo.batch_size='64'"],
            ["algo.batch_size='64'", "valid integer"],
            id="string-for-int",
        ),
        pytest.param(["env.num_envs=true"], ["env.num_envs=true", "valid integer"], id="bool-for-int"),
        pytest.param(["algo.lr=-1e-3"], ["algo.lr=-0.001", "greater than 0"], id="negative-lr"),
        pytest.param(["algo.gamma=1.5"], ["algo.gamma=1.5", "less than or equal to 1"], id="gamma>1"),
        pytest.param(["algo.gamma=.nan"], ["algo.gamma=nan", "finite"], id="nan"),
        pytest.param(
            ["algo.exploration_final_eps=0.5", "algo.exploration_initial_eps=0.3"],
            ["algo.exploration_final_eps=0.5", "algo.exploration_initial_eps=0.3", "0 <= final <= initial <= 1"],
            id="final-eps>initial",
        ),
        pytest.param(
            ["algo.learning_starts=50"],
            [
                "algo.learning_starts=50 is below algo.batch_size=64: the first update needs at "
                "least one full batch; raise learning_starts to >= 64"
            ],
            id="learning_starts<batch",
        ),
        pytest.param(
            ["algo.learning_starts=200000"],
            ["algo.learning_starts=200000 is above algo.buffer_size=100000", "lower learning_starts to <= 100000"],
            id="learning_starts>buffer",
        ),
        pytest.param(
            ["algo.buffer_size=32", "algo.learning_starts=32"],
            ["algo.buffer_size=32 is below algo.batch_size=64", "raise buffer_size to >= 64"],
            id="buffer<batch",
        ),
        pytest.param(
            ["algo.name=a2c"],
            ["algo.name='a2c'", "not a known algorithm", "allowed names: 'dqn', 'ppo'"],
            id="unknown-algo",
        ),
        pytest.param(
            ["stop.target_return=null", "stop.max_env_steps=null", "stop.max_seconds=null"],
            ["stop:", "target_eval_return are all null", "never stop", "set at least one"],
            id="no-stop-criterion",
        ),
        pytest.param(
            ["stop.max_env_steps=500"],
            ["stop.max_env_steps=500 is below algo.learning_starts=1000", "before the first update"],
            id="stop-before-first-update",
        ),
        pytest.param(
            ["run.heartbeat_timeout=1.0"],
            ["run.heartbeat_timeout=1.0", "must be > 2 * run.metrics_interval = 2 * 0.5 = 1.0"],
            id="heartbeat-too-small",
        ),
        pytest.param(
            ["channel.full_policy=block"],
            ["channel.full_policy='block'", "'wait' or 'drop_oldest'"],
            id="full_policy",
        ),
        pytest.param(["channel.capacity_mb=0"], ["channel.capacity_mb=0", "greater than 0"], id="capacity"),
        pytest.param(
            ["algo.ratio_tolerance=1.0"],
            ["algo.ratio_tolerance=1.0", "less than 1"],
            id="ratio_tolerance",
        ),
        pytest.param(
            ["algo.hidden_sizes=[64, 0]"],
            ["algo.hidden_sizes[1]=0", "greater than 0"],
            id="hidden-size-zero",
        ),
        pytest.param(
            ["algo.hidden_sizes=[]"],
            ["algo.hidden_sizes=[]", "at least 1 item"],
            id="hidden-sizes-empty",
        ),
        pytest.param(
            ["learner.device=gpu"],
            ["learner.device='gpu'", "'cpu', 'cuda' or 'cuda:N'"],
            id="device-form",
        ),
        pytest.param(
            ["actor.device=cuda:x"],
            ["actor.device='cuda:x'", "'cpu', 'cuda' or 'cuda:N'"],
            id="actor-device-form",
        ),
        pytest.param(["env=5"], ["env=5", "must be a section"], id="section-not-mapping"),
        pytest.param(["seed=-1"], ["seed=-1", "greater than or equal to 0"], id="negative-seed"),
        pytest.param(
            ["run.eval_every_env_steps=-10"],
            ["run.eval_every_env_steps=-10", "greater than or equal to 0"],
            id="eval-every-negative",
        ),
        pytest.param(["run.eval_episodes=0"], ["run.eval_episodes=0", "greater than or equal to 1"], id="eval-none"),
        pytest.param(
            ["run.eval_every_env_steps=0", "stop.target_eval_return=450"],
            ["stop.target_eval_return=450.0", "run.eval_every_env_steps=0 makes none", "set run.eval_every_env_steps"],
            id="eval-target-without-evaluations",
        ),
    ],
)
def test_bad_values(overrides, expected):
    message = error_text(overrides)
    for fragment in expected:
        assert fragment in message, f"{fragment!r} not in:\n{message}"


@pytest.mark.parametrize(
    "override, expected",
    [
        pytest.param("algo.lr", ["--set 'algo.lr'", "no '='", "--set key.path=value"], id="no-equals"),
        pytest.param("=3", ["empty key", "--set key.path=value"], id="empty-key"),
        pytest.param("algo..lr=1", ["empty component", "'algo..lr'", "--set key.path=value"], id="empty-component"),
        pytest.param(
            "algo.lerning=1",
            [
                "unknown key 'algo.lerning'",
                "did you mean 'learning_starts'?",
                "valid keys at algo: name, gamma, n_step, lr, batch_size",
            ],
            id="unknown-nested-key",
        ),
        pytest.param(
            "trainer.lr=1",
            ["unknown key 'trainer'", "valid keys at the top level: seed, env, algo, topology"],
            id="unknown-top-level-key",
        ),
        pytest.param("algo.lr.x=1", ["algo.lr is a value, not a section"], id="below-a-value"),
        pytest.param("algo.hidden_sizes=[64", ["'[64' is not valid YAML", "line 1"], id="bad-yaml-value"),
    ],
)
def test_bad_overrides(override, expected):
    message = error_text([override])
    for fragment in expected:
        assert fragment in message, f"{fragment!r} not in:\n{message}"


def test_unknown_top_level_key_in_file(tmp_path):
    path = write(tmp_path, SHIPPED.read_text() + "\nfoo: 1\n")
    message = error_text(path=path)
    assert "foo=1: unknown key" in message
    assert "valid keys at the top level: seed, env, algo, topology, channel, learner, actor, stop, run" in message


def test_unknown_nested_key_in_file(tmp_path):
    text = SHIPPED.read_text().replace("  lr: 0.001", "  lr: 0.001\n  learning_rate: 0.1")
    message = error_text(path=write(tmp_path, text))
    assert "algo.learning_rate=0.1: unknown key" in message
    assert "valid keys at algo: name, gamma, n_step, lr," in message


PPO = SHIPPED.parent / "cartpole_ppo.yaml"


ALIAS_CASES = [  # config, override, what the message says
    (SHIPPED, "algo.learning_rate=3e-4", "'learning_rate' is called 'lr' here: --set algo.lr=0.0003"),
    (SHIPPED, "learning_rate=3e-4", "'learning_rate' is called 'algo.lr' here: --set algo.lr=0.0003"),
    (SHIPPED, "total_timesteps=100000", "is called 'stop.max_env_steps' here: --set stop.max_env_steps=100000"),
    (SHIPPED, "algo.target_network_frequency=500", "--set algo.target_update_interval=500"),
    (SHIPPED, "net_arch=[64, 64]", "--set 'algo.hidden_sizes=[64, 64]'"),
    (SHIPPED, "gamma=0.9", "'gamma' goes under algo here: --set algo.gamma=0.9"),
    (SHIPPED, "num_envs=4", "'num_envs' goes under env here: --set env.num_envs=4"),
    (PPO, "algo.n_steps=64", "'n_steps' is called 'rollout_steps' here: --set algo.rollout_steps=64"),
    (PPO, "algo.clip_range=0.1", "'clip_range' is called 'clip_coef' here: --set algo.clip_coef=0.1"),
    # DQN has no rollouts: SB3's PPO name gets no alias there, only the closest key
    (SHIPPED, "algo.n_steps=5", "(did you mean 'n_step'?)"),
]


@pytest.mark.parametrize("path, override, expected", ALIAS_CASES, ids=[f"{p.stem}:{o}" for p, o, _ in ALIAS_CASES])
def test_another_librarys_name_for_a_key_is_refused_with_the_name_here(path, override, expected):
    message = error_text([override], path=path)
    assert expected in message and "unknown key" in message, message
    assert "learning_starts" not in message.split("valid keys")[0], message


def test_an_alias_in_a_file_is_refused_with_the_name_here(tmp_path):
    text = SHIPPED.read_text().replace("  lr: 0.001", "  learning_rate: 0.1")
    message = error_text(path=write(tmp_path, text))
    assert "algo.learning_rate=0.1: unknown key ('learning_rate' is called 'lr' here: --set algo.lr=0.1)" in message


def test_every_alias_names_a_key_of_some_algorithm_and_is_no_key_itself():
    from tianji_dask.config.errors import ALIASES
    from tianji_dask.config.schema import ALGO_CONFIGS, section_model

    def keys(data):
        sections = [s for s, f in ExperimentConfig.model_fields.items() if section_model([s], data) is not None]
        return {f"{s}.{k}" for s in sections for k in section_model([s], data).model_fields}

    every = set().union(*(keys({"algo": {"name": name}}) for name in ALGO_CONFIGS))
    assert set(ALIASES.values()) <= every, sorted(set(ALIASES.values()) - every)
    assert not {k.rpartition(".")[2] for k in every} & set(ALIASES), "an alias is a key's own name somewhere"


def test_wrong_type_in_file(tmp_path):
    text = SHIPPED.read_text().replace("batch_size: 64", "batch_size: sixty-four")
    message = error_text(path=write(tmp_path, text))
    assert "algo.batch_size='sixty-four': Input should be a valid integer" in message


def test_several_problems_one_line_each(tmp_path):
    text = (
        SHIPPED.read_text()
        .replace("gamma: 0.99", "gamma: 2")
        .replace("num_envs: 8", "num_envs: 0")
        .replace("full_policy: wait", "full_policy: block")
    )
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, text), check_env=False)
    problems = info.value.problems
    assert len(problems) == 3
    assert [p.split("=")[0] for p in problems] == ["env.num_envs", "algo.gamma", "channel.full_policy"]
    assert str(info.value).splitlines()[0].endswith("(3 problems):")


def test_unknown_env_id_suggests_close_matches():
    message = error_text(["env.id=CartPol-v1"], env=True)
    assert "env.id='CartPol-v1'" in message and "no such gymnasium environment" in message
    assert "did you mean CartPole-v1" in message


def test_unknown_env_version_suggests_existing_one():
    assert "CartPole-v1" in error_text(["env.id=CartPole-v9"], env=True)


def test_dqn_refuses_continuous_actions_and_points_to_ppo():
    message = error_text(["env.id=Pendulum-v1"], env=True)
    assert "env.id='Pendulum-v1'" in message
    assert "action space is Box(" in message and "DQN needs a Discrete action space" in message
    assert "algo.name=ppo" in message and "configs/pendulum_ppo.yaml" in message


@pytest.mark.parametrize("env_id", ["Pendulum-v1", "MountainCarContinuous-v0", "CartPole-v1"])
def test_ppo_acts_in_discrete_and_box_action_spaces(env_id):
    discrete = env_id == "CartPole-v1"  # the config's gSDE explores Box actions only
    config = load_config("configs/pendulum_ppo.yaml", [f"env.id={env_id}", f"algo.use_sde={not discrete}"])
    assert check_env(config).action_space.shape == (() if discrete else (1,))


def test_yaml_syntax_error_names_line(tmp_path):
    path = write(tmp_path, "seed: 0\nenv:\n  id: [CartPole-v1\n  num_envs: 8\n")
    message = error_text(path=path)
    assert "invalid YAML" in message and str(path) in message
    assert "line 4" in message


def test_duplicate_yaml_key_names_both_lines(tmp_path):
    text = SHIPPED.read_text().replace("  lr: 0.001", "  lr: 0.001\n  lr: 0.1")
    message = error_text(path=write(tmp_path, text))
    line = text.splitlines().index("  lr: 0.001") + 1
    assert f"duplicate key 'lr' (first on line {line})" in message
    assert f"line {line + 1}" in message


def test_missing_file(tmp_path):
    message = error_text(path=tmp_path / "nope.yaml")
    assert "config file not found" in message and "nope.yaml" in message


def test_a_config_path_without_its_suffix_names_the_config_meant(tmp_path):
    (tmp_path / "configs").mkdir()
    for name in ("cartpole_dqn.yaml", "cartpole_ppo.yaml", "pong_dqn.yaml"):
        (tmp_path / "configs" / name).write_text(SHIPPED.read_text())
    message = error_text(path=tmp_path / "configs" / "cartpole")
    assert f"{tmp_path / 'configs' / 'cartpole'} is not a config file (no such file)" in message
    assert f"did you mean {tmp_path / 'configs' / 'cartpole_dqn.yaml'}?" in message
    assert str(tmp_path / "configs" / "pong_dqn.yaml") in message  # the list of configs there
    message = error_text(path=tmp_path / "configs" / "zzz.yaml")
    assert "did you mean" not in message and "give one of the configs:" in message, message


def test_a_directory_is_refused_with_its_configs_or_as_a_run_to_resume(tmp_path):
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "a.yaml").write_text(SHIPPED.read_text())
    message = error_text(path=tmp_path / "configs")
    assert "is a directory, not a config file; give one of its configs:" in message, message
    assert str(tmp_path / "configs" / "a.yaml") in message
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(SHIPPED.read_text())
    (run / "metrics.nc").write_bytes(b"")
    message = error_text(path=run)
    assert f"is a run directory, not a config file; to continue the run: tianji-dask train --resume {run}" in message


@pytest.mark.parametrize(
    "text, got", [("- a\n- b\n", "got a list"), ("", "got an empty file"), ("42\n", "got the single value 42")]
)
def test_top_level_not_a_mapping(tmp_path, text, got):
    message = error_text(path=write(tmp_path, text))
    assert "top level must be a mapping" in message and got in message


def test_validate_config_rejects_non_mapping():
    with pytest.raises(ConfigError, match="top level of the config must be a mapping"):
        validate_config(["env"])


def _fake_torch(available: bool, count: int) -> SimpleNamespace:
    cuda = SimpleNamespace(is_available=lambda: available, device_count=lambda: count)
    return SimpleNamespace(
        cuda=cuda, version=SimpleNamespace(cuda="12.4" if available else None), __version__="0.0-fake"
    )


def test_cuda_device_without_cuda(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", _fake_torch(available=False, count=0))
    message = error_text(["learner.device=cuda"])
    assert "learner.device='cuda'" in message
    assert "torch.cuda.is_available() is False" in message and "learner.device=cpu" in message
    # a saved config with a CUDA device still loads where no GPU is, when asked not to check
    assert load_config(SHIPPED, ["learner.device=cuda"], check_env=False, check_device=False)


def test_actor_cuda_device_on_this_cpu_only_torch_names_the_fix():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    message = error_text(["actor.device=cuda"])
    assert "actor.device='cuda'" in message and "use --set actor.device=cpu" in message


def test_cuda_index_beyond_device_count(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", _fake_torch(available=True, count=2))
    assert load_config(SHIPPED, ["learner.device=cuda:1"], check_env=False)
    message = error_text(["learner.device=cuda:3"])
    assert "learner.device='cuda:3'" in message and "cuda:0 to cuda:1" in message


def test_errors_are_config_errors_not_pydantic():
    from pydantic import ValidationError

    with pytest.raises(ConfigError) as info:
        validate_config({"env": {"id": "CartPole-v1"}})
    assert not isinstance(info.value, ValidationError)
    assert "algo: required but missing" in str(info.value)
    assert "stop: required but missing" in str(info.value)


def test_validating_needs_neither_gymnasium_ale_py_nor_torch():
    """A saved config reloads on any machine: importing the schema and loading (without the
    machine checks) an Atari config with a CUDA learner imports none of them."""
    pong = SHIPPED.with_name("pong_dqn.yaml")
    code = (
        "import sys\n"
        "import tianji_dask.config.schema\n"
        "from tianji_dask.config import load_config\n"
        f"cfg = load_config({str(pong)!r}, ['learner.device=cuda:1'], check_env=False, check_device=False)\n"
        "assert cfg.env.kind == 'atari'\n"
        "print(sorted(m for m in ('gymnasium', 'ale_py', 'torch') if m in sys.modules))\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[]"


def test_experiment_config_is_frozen():
    from pydantic import ValidationError

    config = load_config(SHIPPED, check_env=False)
    assert isinstance(config, ExperimentConfig)
    with pytest.raises(ValidationError, match="frozen"):
        config.seed = 1  # type: ignore[misc]


def test_algo_as_gives_the_algorithms_own_section_and_refuses_another():
    from tianji_dask.config.schema import DQNConfig, PPOConfig

    dqn = load_config(SHIPPED)
    assert dqn.algo_as(DQNConfig) is dqn.algo
    with pytest.raises(TypeError, match="a PPOConfig section was expected, but algo.name is 'dqn'"):
        dqn.algo_as(PPOConfig)
    ppo = load_config(SHIPPED.with_name("cartpole_ppo.yaml"))
    assert ppo.algo_as(PPOConfig) is ppo.algo


@pytest.mark.parametrize("precision", ["tf32", "bf16"])
def test_a_learner_precision_for_the_nature_cnn_is_refused_for_an_mlp(precision):
    """``algo.precision`` changes only the Nature CNN trunk: an MLP env is refused with the fix;
    an Atari config takes it, and fp32 is the default."""
    message = error_text([f"algo.precision={precision}"], path=Path("configs/cartpole_ppo.yaml"))
    assert f"algo.precision={precision}" in message and "env.kind=atari or algo.precision=fp32" in message
    assert load_config("configs/pong_ppo_small.yaml", [f"algo.precision={precision}"]).algo.precision == precision
    default = load_config("configs/pong_ppo_small.yaml").algo
    assert (default.precision, default.cuda_graph) == ("fp32", "iteration")


def test_compile_without_a_cpp_compiler_names_the_fix(monkeypatch, tmp_path):
    """``algo.compile`` on a CPU learner needs the C++ compiler inductor calls: with none on PATH
    the config is refused before any work, naming what to install and the way out."""
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CXX", raising=False)
    message = error_text(["algo.compile=true"])
    assert "algo.compile=true" in message and "C++ compiler" in message and "algo.compile=false" in message
    monkeypatch.setenv("CXX", sys.executable)  # any executable found: the check passes
    assert load_config(SHIPPED, ["algo.compile=true"], check_env=False).algo.compile
