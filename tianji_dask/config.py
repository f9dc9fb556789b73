"""Typed, validated experiment config: one pydantic model per concern, loaded from YAML.

An experiment is described by one YAML file (``configs/cartpole_dqn.yaml`` is the reference)
plus ``--set key.path=value`` overrides from the command line::

    config = load_config("configs/cartpole_dqn.yaml", ["algo.lr=1e-3", "topology.actors=4"])
    config.algo.target_replay_ratio        # derived values are properties
    text = config.model_dump_yaml()        # the resolved config; load_config reads it back

Every problem is reported as a :class:`ConfigError` whose message is ready for a user: one line
per problem, naming the dotted field, the value given and what is allowed. Pydantic's
``ValidationError`` and YAML tracebacks never escape this module's functions.

Two kinds of checks, kept apart:

* schema checks (types, ranges, cross-field arithmetic) run in pydantic validation; they are
  fast and machine-independent, so a config saved in a run directory always reloads;
* checks against this machine (:func:`check_env` builds the env once, :func:`check_device`
  looks for the CUDA device) are slower or depend on where they run; :func:`load_config` runs
  both by default and each can be switched off.

Deployment settings (cluster address, Slurm resources) are not here: they live in the ``tianji``
dask-config namespace and the user's ``jobqueue.yaml``.
"""

from __future__ import annotations

import copy
import difflib
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, NamedTuple

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import PydanticCustomError

__all__ = [
    "ALGO_CONFIGS",
    "ChannelConfig",
    "ConfigError",
    "DQNConfig",
    "PPOConfig",
    "EnvConfig",
    "EnvSpaces",
    "ExperimentConfig",
    "LearnerConfig",
    "RunConfig",
    "StopConfig",
    "TopologyConfig",
    "apply_overrides",
    "check_device",
    "check_env",
    "default_config_path",
    "load_config",
    "parse_override",
    "read_config_file",
    "validate_config",
]

OVERRIDE_FORM = "--set key.path=value (for example --set algo.lr=1e-3)"


class ConfigError(ValueError):
    """A bad experiment config; ``str(error)`` is ready to show to a user.

    ``problems`` holds one line per problem, each naming the dotted field, the value given and
    what is allowed; the message is an optional header line followed by those lines.
    """

    def __init__(self, problems: str | Sequence[str], header: str | None = None) -> None:
        self.problems: list[str] = [problems] if isinstance(problems, str) else list(problems)
        self.header = header
        lines = ([header] if header else []) + [f"  {p}" if header else p for p in self.problems]
        super().__init__("\n".join(lines))


# --------------------------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------------------------


def _problem(*lines: str) -> PydanticCustomError:
    """An error whose lines already name their fields and values; shown as they are."""
    return PydanticCustomError("config_problem", "{text}", {"text": "\n".join(lines)})


class _Section(BaseModel):
    # strict: YAML already types its values, so "64" (a string) for an int or true for a count is
    # a mistake to report, not to coerce. Floats still accept ints (lr: 1 is fine).
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


PositiveInt = Annotated[int, Field(gt=0)]


class EnvConfig(_Section):
    """Which gymnasium environment each actor runs, and how many copies (vectorised).

    ``kind: atari`` runs an ALE game with the DeepMind preprocessing (uint8 84x84 4-frame stacks,
    Nature CNN networks); see :func:`tianji_dask.envs.make_atari_vector_env`.
    """

    id: str = Field(
        min_length=1,
        description="gymnasium id (Discrete actions, Box observations), e.g. CartPole-v1; "
        "'module:Id' imports the module first; with kind=atari an ALE/<Game>-v5 id, e.g. ALE/Pong-v5",
    )
    num_envs: int = Field(8, ge=1, description="envs per actor, stepped as one vector env")
    kind: Literal["gym", "atari"] = Field(
        "gym",
        description="gym: gymnasium.make(id) as it is, float32 observations, MLP networks; "
        "atari: DeepMind preprocessing (no-op reset <= 30, frame skip 4 with max-pool, 84x84 gray, "
        "4-frame stack, uint8; episodic life and reward clipping for training only, full-game "
        "returns recorded) and Nature CNN networks",
    )
    atari_backend: Literal["ale_vector", "gymnasium"] = Field(
        "ale_vector",
        description="kind=atari only: ale_vector = ale-py's native C++ AtariVectorEnv (faster); "
        "gymnasium = SyncVectorEnv of gymnasium's AtariPreprocessing wrappers (needs opencv)",
    )
    atari_threads: int = Field(
        1, ge=1, description="kind=atari, ale_vector only: C++ threads stepping one actor's envs"
    )

    @property
    def frame_stacks(self) -> bool:
        """Observations are stacks of uint8 frames (``kind: atari``): replays keep each frame once,
        actors send each new frame once, and the networks are CNNs."""
        return self.kind == "atari"

    @model_validator(mode="after")
    def _check_atari_id(self) -> EnvConfig:
        if self.kind == "gym" and self.id.startswith("ALE/"):
            raise _problem(
                f"env.id={self.id!r} is an Atari game: set env.kind=atari for the DeepMind "
                f"preprocessing and the Nature CNN"
            )
        if self.kind == "atari":
            try:
                from tianji_dask.envs import atari_rom

                atari_rom(self.id)
            except ImportError as exc:
                raise _problem(f"env.kind=atari needs ale-py ({exc}); pip install 'ale-py>=0.12'") from None
            except ValueError as exc:
                raise _problem(f"env.id={self.id!r} (env.kind=atari): {exc}") from None
        return self


class DQNConfig(_Section):
    """DQN hyperparameters, named as in the serial reference algorithm (SB3/cleanrl style).

    ``train_freq`` and ``gradient_steps`` describe the serial algorithm; the distributed run
    keeps their ratio (:attr:`target_replay_ratio`) rather than the literal schedule.
    """

    name: Literal["dqn"] = Field(description="algorithm name; selects this section's schema")
    gamma: float = Field(0.99, gt=0, le=1, description="discount factor")
    n_step: int = Field(3, ge=1, le=20, description="n-step returns computed by the actors (1 = plain one-step DQN)")
    lr: float = Field(0.001, gt=0, description="optimizer learning rate")
    batch_size: int = Field(64, ge=1, description="transitions per update")
    buffer_size: int = Field(100_000, ge=1, description="replay capacity in transitions")
    learning_starts: int = Field(1000, ge=0, description="transitions in replay memory before updates start")
    train_freq: int = Field(64, ge=1, description="serial reference: env steps (transitions) between training rounds")
    gradient_steps: int = Field(8, ge=1, description="serial reference: updates per training round")
    target_update_interval: int = Field(250, ge=1, description="learner updates between target-network syncs")
    exploration_initial_eps: float = Field(1.0, ge=0, le=1, description="epsilon at step 0")
    exploration_final_eps: float = Field(0.02, ge=0, le=1, description="epsilon after exploration_steps")
    exploration_steps: int = Field(8000, ge=1, description="env steps (all actors together) of linear epsilon decay")
    hidden_sizes: list[PositiveInt] = Field(
        default_factory=lambda: [64, 64],
        min_length=1,
        description="widths of the Q-network's hidden layers",
    )
    max_grad_norm: float = Field(10.0, gt=0, description="gradient clipping norm")
    ratio_tolerance: float | None = Field(
        0.25,
        gt=0,
        lt=1,
        description="relative band around target_replay_ratio outside which the balance "
        "controller slows the faster side; null turns the controller off (nothing ever waits)",
    )

    @property
    def target_replay_ratio(self) -> float:
        """Samples consumed by updates per sample produced, as in the serial algorithm.

        ``gradient_steps * batch_size / train_freq``: every ``train_freq`` env steps the serial
        algorithm runs ``gradient_steps`` updates of ``batch_size`` samples each.
        """
        return self.gradient_steps * self.batch_size / self.train_freq

    @model_validator(mode="after")
    def _check_cross_fields(self) -> DQNConfig:
        problems = []
        if self.buffer_size < self.batch_size:
            problems.append(
                f"algo.buffer_size={self.buffer_size} is below algo.batch_size={self.batch_size}: "
                f"the replay memory must hold at least one batch; raise buffer_size to "
                f">= {self.batch_size}"
            )
        if self.learning_starts < self.batch_size:
            problems.append(
                f"algo.learning_starts={self.learning_starts} is below "
                f"algo.batch_size={self.batch_size}: the first update needs at least one full "
                f"batch; raise learning_starts to >= {self.batch_size}"
            )
        if self.learning_starts > self.buffer_size:
            problems.append(
                f"algo.learning_starts={self.learning_starts} is above "
                f"algo.buffer_size={self.buffer_size}: the replay memory can never hold that "
                f"many transitions, so updates would never start; lower learning_starts to "
                f"<= {self.buffer_size} or raise buffer_size"
            )
        if self.exploration_final_eps > self.exploration_initial_eps:
            problems.append(
                f"algo.exploration_final_eps={self.exploration_final_eps} is above "
                f"algo.exploration_initial_eps={self.exploration_initial_eps}: epsilon decays "
                f"from initial to final, so 0 <= final <= initial <= 1 is required"
            )
        if problems:
            raise _problem(*problems)
        return self


class PPOConfig(_Section):
    """PPO hyperparameters (clipped surrogate, GAE, value loss, entropy bonus), cleanrl/SB3 names.

    The sample distribution is ``sample_reuse``: in how many learner iterations one rollout may
    be used. 1 is the paper's "New" setting (each sample consumed once, 1:1), 8 its "Staleness"
    setting (1:8). Rollouts more than ``max_policy_lag`` versions behind the learner are dropped
    (and counted) instead of trained on.
    """

    name: Literal["ppo"] = Field(description="algorithm name; selects this section's schema")
    gamma: float = Field(0.98, gt=0, le=1, description="discount factor")
    gae_lambda: float = Field(0.8, ge=0, le=1, description="GAE lambda")
    lr: float = Field(0.001, gt=0, description="Adam learning rate")
    lr_anneal_steps: int | None = Field(
        100_000,
        ge=1,
        description="lr decays linearly to 5 % over this many env steps of training, counted as "
        "the serial algorithm would (learner iterations x rollout size x learners / sample_reuse, "
        "not what the actors produced); null = constant",
    )
    rollout_steps: int = Field(32, ge=1, description="env steps per env in one rollout (one push)")
    rollouts_per_update: int = Field(1, ge=1, description="rollouts in one learner iteration's batch")
    epochs: int = Field(20, ge=1, description="passes over the batch per learner iteration")
    minibatches: int = Field(1, ge=1, description="minibatches per epoch")
    clip_coef: float = Field(0.2, gt=0, description="PPO ratio clip")
    vf_coef: float = Field(0.5, ge=0, description="value-loss coefficient")
    ent_coef: float = Field(0.0, ge=0, description="entropy-bonus coefficient")
    max_grad_norm: float = Field(0.5, gt=0, description="gradient clipping norm")
    normalize_advantages: bool = Field(True, description="normalise advantages per minibatch")
    hidden_sizes: list[PositiveInt] = Field(
        default_factory=lambda: [64, 64], min_length=1, description="hidden widths of actor and critic"
    )
    max_policy_lag: int = Field(
        1, ge=0, description="rollouts more than this many versions behind are dropped and counted"
    )
    sample_reuse: int = Field(
        1, ge=1, description="learner iterations one rollout may be used in (1 = New 1:1, 8 = Staleness 1:8)"
    )
    ratio_tolerance: float | None = Field(
        None,
        gt=0,
        lt=1,
        description="band around sample_reuse outside which the balance controller slows the "
        "faster side; null (default) = off: nothing waits, stale rollouts are dropped",
    )

    @property
    def target_replay_ratio(self) -> float:
        """Samples consumed per sample produced: each rollout is used ``sample_reuse`` times."""
        return float(self.sample_reuse)

    @property
    def learning_starts(self) -> int:
        return 0


#: Algorithm name -> config model.
ALGO_CONFIGS: dict[str, type[_Section]] = {"dqn": DQNConfig, "ppo": PPOConfig}


class TopologyConfig(_Section):
    """How many hosts of each role, and the threads each may use.

    A group is ``actors`` actors plus ``learners`` data-parallel learners, each learner with its
    own buffer in its process; the group's actors are split across those buffers. ``groups``
    replicates the whole group; groups average their parameters every ``sync_interval_s``.
    """

    mode: Literal["relaxed", "synchronous"] = Field(
        "relaxed",
        description="relaxed: TianJi's relaxed assignment dependencies (nothing waits); "
        "synchronous: Gorila-style ablation, an actor waits for newer parameters after each push "
        "and the learner waits for fresh data before each update",
    )
    actors: int = Field(1, ge=1, description="actor hosts per group")
    learners: int = Field(1, ge=1, description="data-parallel learners per group (gradients averaged every update)")
    groups: int = Field(1, ge=1, description="replicated training groups")
    sync_interval_s: float = Field(
        1.0, gt=0, description="seconds between a group's parameter-averaging (gossip) rounds"
    )
    torch_threads: int = Field(1, ge=1, description="torch/OpenMP threads per host")
    learner_threads: int | None = Field(
        None,
        ge=1,
        description="torch threads of each learner's process (it hosts the buffer "
        "too); null = torch_threads. The planner sizes it",
    )

    @property
    def learner_torch_threads(self) -> int:
        return self.learner_threads or self.torch_threads

    @model_validator(mode="after")
    def _check_actors_per_learner(self) -> TopologyConfig:
        if self.actors < self.learners:
            raise _problem(
                f"topology.actors={self.actors} is below topology.learners={self.learners}: every "
                f"learner's buffer is fed by at least one actor of its group; raise actors to "
                f">= {self.learners} or lower learners"
            )
        return self


class ChannelConfig(_Section):
    """The trajectory channel from actors to the buffer (credit flow control)."""

    chunk_steps: int = Field(32, ge=1, description="vector-env steps per trajectory chunk an actor pushes")
    capacity_mb: float = Field(16.0, gt=0, description="credit window per sender, in MB (10^6 bytes)")
    full_policy: Literal["wait", "drop_oldest"] = Field(
        "wait", description="what a sender does when its credit is used up"
    )

    @property
    def capacity_bytes(self) -> int:
        """The credit window per sender in bytes: ``int(capacity_mb * 1e6)``."""
        return int(self.capacity_mb * 1e6)

    @model_validator(mode="after")
    def _check_capacity(self) -> ChannelConfig:
        if self.capacity_bytes < 1:
            raise _problem(
                f"channel.capacity_mb={self.capacity_mb} is {self.capacity_mb} * 1e6 = "
                f"{self.capacity_mb * 1e6:g} bytes, below one byte; raise capacity_mb"
            )
        return self


_DEVICE_RE = re.compile(r"cpu|cuda|cuda:\d+")


class LearnerConfig(_Section):
    """The learner host: where it computes and how often it publishes parameters."""

    publish_interval: int = Field(50, ge=1, description="learner updates between parameter publications")
    device: str = Field("cpu", description="'cpu', 'cuda' or 'cuda:N'")

    @field_validator("device")
    @classmethod
    def _check_device_form(cls, value: str) -> str:
        if not _DEVICE_RE.fullmatch(value):
            raise ValueError("must be 'cpu', 'cuda' or 'cuda:N' (N a device index)")
        return value


class StopConfig(_Section):
    """When the run stops: the first criterion reached wins; at least one must be set."""

    target_return: float | None = Field(None, description="mean return over the last 100 episodes; null = no target")
    max_env_steps: int | None = Field(None, ge=1, description="env steps (all actors together); null = no limit")
    max_seconds: float | None = Field(None, gt=0, description="wall-clock seconds; null = no limit")

    @model_validator(mode="after")
    def _check_some_criterion(self) -> StopConfig:
        if self.target_return is None and self.max_env_steps is None and self.max_seconds is None:
            raise _problem(
                "stop: target_return, max_env_steps and max_seconds are all null, so the run "
                "would never stop; set at least one (e.g. --set stop.max_seconds=600)"
            )
        return self


class RunConfig(_Section):
    """Run supervision: metric cadence, liveness and checkpoints."""

    metrics_interval: float = Field(0.5, gt=0, description="seconds between metric rows / heartbeats")
    heartbeat_timeout: float = Field(
        5.0, gt=0, description="seconds without a heartbeat before a host is declared lost"
    )
    checkpoint: bool = Field(True, description="write checkpoints into the run directory")
    checkpoint_interval: float = Field(
        600.0,
        ge=0,
        description="seconds between checkpoints while the run goes on (0: only at "
        "its end); each replaces the last only once it is whole, so a crash keeps the newest",
    )
    save_interval: float = Field(
        60.0,
        ge=0,
        description="seconds between writes of metrics.nc and episodes.nc while the "
        "run goes on (0: only at its end); a crash or a lost machine keeps what was written",
    )

    @model_validator(mode="after")
    def _check_heartbeat(self) -> RunConfig:
        limit = 2 * self.metrics_interval
        if self.heartbeat_timeout <= limit:
            raise _problem(
                f"run.heartbeat_timeout={self.heartbeat_timeout} must be > 2 * "
                f"run.metrics_interval = 2 * {self.metrics_interval} = {limit}: hosts send a "
                f"heartbeat every metrics_interval, so a shorter timeout declares healthy hosts "
                f"lost after one late beat; raise heartbeat_timeout above {limit} or lower "
                f"metrics_interval"
            )
        return self


class ExperimentConfig(_Section):
    """One experiment: env, algorithm, topology, channel, learner, stop rule and run settings.

    Build it with :func:`load_config` (YAML plus overrides) or :func:`validate_config` (a dict);
    both raise :class:`ConfigError`. All seeds derive from ``seed`` through
    ``numpy.random.SeedSequence(seed).spawn``, one per host and env.
    """

    seed: int = Field(0, ge=0, description="root seed; every other seed is spawned from it")
    env: EnvConfig
    algo: Annotated[DQNConfig | PPOConfig, Field(discriminator="name")]
    topology: TopologyConfig = Field(default_factory=TopologyConfig)
    channel: ChannelConfig = Field(default_factory=ChannelConfig)
    learner: LearnerConfig = Field(default_factory=LearnerConfig)
    stop: StopConfig
    run: RunConfig = Field(default_factory=RunConfig)

    @field_validator("algo", mode="before")
    @classmethod
    def _check_algo_name(cls, value: Any) -> Any:
        # Checked before the section's own schema so an unknown name gets one clear line instead
        # of one "unknown key" line per field of the named algorithm.
        if isinstance(value, Mapping):
            allowed = ", ".join(repr(n) for n in ALGO_CONFIGS)
            if "name" not in value:
                raise _problem(f"algo.name is missing; allowed names: {allowed}")
            name = value["name"]
            if not isinstance(name, str) or name not in ALGO_CONFIGS:
                raise _problem(f"algo.name={name!r} is not a known algorithm; allowed names: {allowed}")
        return value

    @model_validator(mode="after")
    def _check_cross_sections(self) -> ExperimentConfig:
        steps = self.stop.max_env_steps
        if steps is not None and steps < self.algo.learning_starts:
            raise _problem(
                f"stop.max_env_steps={steps} is below algo.learning_starts="
                f"{self.algo.learning_starts}: the run would stop before the first update; "
                f"raise max_env_steps or lower learning_starts"
            )
        return self

    def model_dump_yaml(self) -> str:
        """The resolved config (defaults filled in) as YAML; :func:`load_config` reads it back."""
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)

    def to_json(self) -> str:
        """The resolved config as one compact JSON string (e.g. for NetCDF attrs)."""
        return self.model_dump_json()


# --------------------------------------------------------------------------------------------
# Turning pydantic errors into user lines
# --------------------------------------------------------------------------------------------


def _section_model(path: Sequence[str], data: Mapping[str, Any] | None) -> type[BaseModel] | None:
    """The model that holds the keys at ``path`` (keys from the top level), or None.

    ``data`` is the raw config, needed to pick the algo model by ``algo.name``. None means the
    schema there is unknown (an unknown algo name) or ``path`` leads to a value, not a section.
    """
    model: type[BaseModel] = ExperimentConfig
    for key in path:
        if model is ExperimentConfig and key == "algo":
            algo = data.get("algo") if isinstance(data, Mapping) else None
            name = algo.get("name") if isinstance(algo, Mapping) else None
            found = ALGO_CONFIGS.get(name) if isinstance(name, str) else None
            if found is None:
                return None
            model = found
            continue
        field = model.model_fields.get(key)
        annotation = field.annotation if field else None
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return None
        model = annotation
    return model


def _show(value: Any) -> str:
    """A value as the user wrote it in YAML: true/false/null, quoted strings, numbers."""
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    return repr(value)


def _dotted(loc: Sequence[str | int]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _unknown_key_text(parent: Sequence[str], key: str, data: Mapping[str, Any] | None) -> str:
    """' (did you mean ...?); valid keys at <parent>: ...' for an unknown key under parent."""
    model = _section_model(parent, data)
    if model is None:
        return ""
    valid = list(model.model_fields)
    close = difflib.get_close_matches(key, valid, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"{hint}; valid keys at {'.'.join(parent) or 'the top level'}: {', '.join(valid)}"


def _error_lines(exc: ValidationError, data: Mapping[str, Any] | None) -> list[str]:
    lines: list[str] = []
    for err in exc.errors(include_url=False):
        loc = list(err["loc"])
        # A discriminated union (once PPO exists) puts the tag in the location: algo.dqn.lr.
        if len(loc) > 1 and loc[0] == "algo" and loc[1] in ALGO_CONFIGS:
            del loc[1]
        path, kind, value = _dotted(loc), err["type"], err.get("input")
        if kind == "config_problem":  # raised by our validators, already names its fields
            lines.extend(err["msg"].splitlines())
        elif kind == "extra_forbidden":
            hint = _unknown_key_text([str(p) for p in loc[:-1]], str(loc[-1]), data)
            lines.append(f"{path}={_show(value)}: unknown key{hint}")
        elif kind == "missing":
            lines.append(f"{path}: required but missing; add it to the config")
        elif kind in ("model_type", "model_attributes_type", "dict_type"):
            lines.append(f"{path}={_show(value)}: must be a section (a mapping of keys)")
        else:
            lines.append(f"{path}={_show(value)}: {err['msg'].removeprefix('Value error, ')}")
    return lines


def validate_config(data: Mapping[str, Any], source: str | None = None) -> ExperimentConfig:
    """Validate a raw config mapping into an :class:`ExperimentConfig`.

    Raises :class:`ConfigError` listing every problem found, one line each; ``source`` (e.g. the
    file name) goes into the header line. Does not build the env (see :func:`check_env`).
    """
    if not isinstance(data, Mapping):
        raise ConfigError(
            f"the top level of the config must be a mapping of sections "
            f"({', '.join(ExperimentConfig.model_fields)}), got {type(data).__name__}",
            header=f"invalid config {source}:" if source else None,
        )
    try:
        return ExperimentConfig.model_validate(data)
    except ValidationError as exc:
        lines = _error_lines(exc, data)
        noun = "problem" if len(lines) == 1 else "problems"
        where = f" {source}" if source else ""
        raise ConfigError(lines, header=f"invalid config{where} ({len(lines)} {noun}):") from None


# --------------------------------------------------------------------------------------------
# YAML and overrides
# --------------------------------------------------------------------------------------------


class _YamlLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that reads ``1e-3`` as a float and rejects duplicate keys.

    PyYAML follows YAML 1.1, where ``1e-3`` (no dot) is the *string* "1e-3"; and it keeps the last
    of two equal keys silently. Both are config footguns.
    """

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # "<<: *base" may be overridden
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                duplicate = key in seen
            except TypeError:  # unhashable key: SafeLoader reports it
                continue
            if duplicate:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"duplicate key {key!r} (first on line {seen[key]})",
                    key_node.start_mark,
                )
            seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)


_YamlLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def _yaml_load(text: str) -> Any:
    return yaml.load(text, Loader=_YamlLoader)


def _yaml_error_text(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc)
    context = getattr(exc, "context", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
    return f"{where}{problem}" + (f" ({context})" if context else "")


_KEY_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def parse_override(text: str) -> tuple[list[str], Any]:
    """Split ``"algo.lr=1e-3"`` into ``(["algo", "lr"], 0.001)``.

    The value is read as YAML (``null``, ``true``, ``[64, 64]``, ``{id: Acrobot-v1}`` work;
    ``1e-3`` is a float). A missing ``=``, an empty key or an empty path component raises
    :class:`ConfigError` showing the expected form ``--set key.path=value``.
    """
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep:
        raise ConfigError(f"--set {text!r}: no '=' found; expected {OVERRIDE_FORM}")
    if not key:
        raise ConfigError(f"--set {text!r}: empty key before '='; expected {OVERRIDE_FORM}")
    path = key.split(".")
    for part in path:
        if not part:
            raise ConfigError(f"--set {text!r}: empty component in key {key!r}; expected {OVERRIDE_FORM}")
        if not _KEY_RE.fullmatch(part):
            raise ConfigError(
                f"--set {text!r}: {part!r} is not a valid key name (letters, digits, _); expected {OVERRIDE_FORM}"
            )
    try:
        value = _yaml_load(raw)
    except yaml.YAMLError as exc:
        raise ConfigError(
            f"--set {text!r}: the value {raw!r} is not valid YAML ({_yaml_error_text(exc)}); "
            f"quote strings and lists in the shell, e.g. --set 'algo.hidden_sizes=[64, 64]'"
        ) from None
    return path, value


def apply_overrides(data: Mapping[str, Any], overrides: Iterable[str | tuple[Sequence[str], Any]]) -> dict[str, Any]:
    """Return a copy of ``data`` with each override set, in order (later ones win).

    Each override is a ``"key.path=value"`` string (see :func:`parse_override`) or a parsed
    ``(path, value)`` pair. Keys are checked against the schema, not against ``data``, so a key
    the file leaves at its default can be set; an unknown key raises :class:`ConfigError` listing
    the valid keys at that level. Setting ``algo.name`` is allowed and selects the schema that
    later ``algo.*`` keys are checked against (the section's other keys are kept as they are).
    A whole section can be set at once: ``--set 'env={id: Acrobot-v1, num_envs: 4}'``.
    Values are not validated here; :func:`validate_config` does that.
    """
    result: dict[str, Any] = copy.deepcopy(dict(data))
    for item in overrides:
        if isinstance(item, str):
            path, value = parse_override(item)
            shown = f"--set {item}"
        else:
            path, value = list(item[0]), item[1]
            shown = f"--set {'.'.join(path)}={value!r}"
        node = result
        for depth, key in enumerate(path):
            parent, here = path[:depth], ".".join(path[: depth + 1])
            model = _section_model(parent, result)
            if model is not None and key not in model.model_fields:
                raise ConfigError(f"{shown}: unknown key {here!r}{_unknown_key_text(parent, key, result)}")
            if depth == len(path) - 1:
                node[key] = copy.deepcopy(value)
                break
            # model None: below an unknown algo name, where keys cannot be checked (validate_config
            # reports the name); "algo" itself is a section whatever its name.
            leaf = _section_model(path[: depth + 1], result) is None
            if model is not None and here != "algo" and leaf:
                raise ConfigError(f"{shown}: {here} is a value, not a section; set it whole, e.g. --set {here}=<value>")
            if node.get(key) is None:  # an absent or empty (``stop:``) section
                node[key] = {}
            if not isinstance(node[key], dict):
                raise ConfigError(
                    f"{shown}: {here}={node[key]!r} in the config is not a section of keys; "
                    f"fix the file or set the section whole"
                )
            node = node[key]
    return result


# --------------------------------------------------------------------------------------------
# Checks against this machine
# --------------------------------------------------------------------------------------------


class EnvSpaces(NamedTuple):
    """The spaces of the configured env, as :func:`check_env` found them."""

    observation_space: Any  # gymnasium.spaces.Box
    action_space: Any  # gymnasium.spaces.Discrete


def check_env(config: ExperimentConfig) -> EnvSpaces:
    """Build ``config.env.id`` once with ``gymnasium.make``, close it, and return its spaces.

    Raises :class:`ConfigError` when the id is unknown (with close matches from the gymnasium
    registry), the env fails to build (e.g. a missing optional dependency), or its spaces are not
    a ``Discrete`` action space and a ``Box`` observation space.
    """
    import gymnasium
    from gymnasium import spaces

    env_id = config.env.id
    if config.env.kind == "atari":  # the preprocessed spaces: uint8 (4, 84, 84), the game's actions
        from tianji_dask.envs import atari_spaces

        try:
            return EnvSpaces(*atari_spaces(config.env))
        except Exception as exc:
            raise ConfigError(
                f"env.id={env_id!r} (env.kind=atari, env.atari_backend={config.env.atari_backend!r}): {exc}"
            ) from exc
    try:
        env = gymnasium.make(env_id)
    except gymnasium.error.UnregisteredEnv as exc:
        ids = list(gymnasium.envs.registry)
        close = difflib.get_close_matches(env_id, ids, n=3, cutoff=0.6)
        # gymnasium's own text helps when nothing is close (e.g. "install the package for ale_py")
        hint = f"did you mean {', '.join(close)}?" if close else f"{exc} (gymnasium.envs.registry)"
        raise ConfigError(f"env.id={env_id!r}: no such gymnasium environment; {hint}") from None
    except Exception as exc:
        raise ConfigError(f"env.id={env_id!r}: gymnasium.make failed: {type(exc).__name__}: {exc}") from exc
    try:
        action_space, observation_space = env.action_space, env.observation_space
    finally:
        env.close()
    problems = []
    if not isinstance(action_space, spaces.Discrete):
        problems.append(
            f"env.id={env_id!r}: action space is {action_space}, but DQN needs a Discrete "
            f"action space (e.g. CartPole-v1, Acrobot-v1, MountainCar-v0)"
        )
    if not isinstance(observation_space, spaces.Box):
        problems.append(
            f"env.id={env_id!r}: observation space is {observation_space}, but a Box observation space is needed"
        )
    if problems:
        raise ConfigError(problems)
    return EnvSpaces(observation_space, action_space)


def check_device(config: ExperimentConfig) -> None:
    """Check that ``config.learner.device`` exists on *this* machine.

    Only meaningful where the learner will run (or on an identical node); a driver on a login
    node without a GPU should skip it (``load_config(..., check_device=False)``). Imports torch
    only when the device is a CUDA one.
    """
    device = config.learner.device
    if device == "cpu":
        return
    try:
        import torch
    except ImportError as exc:
        raise ConfigError(f"learner.device={device!r}: torch cannot be imported ({exc})") from None
    if not torch.cuda.is_available():
        raise ConfigError(
            f"learner.device={device!r}: torch.cuda.is_available() is False on this machine "
            f"(torch {torch.__version__}, CUDA build: {torch.version.cuda}); "
            f"use --set learner.device=cpu or run where a GPU is visible"
        )
    if ":" in device:
        index, count = int(device.split(":")[1]), torch.cuda.device_count()
        if index >= count:
            raise ConfigError(
                f"learner.device={device!r}: this machine has {count} CUDA device(s), cuda:0 to cuda:{count - 1}"
            )


# --------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------


def default_config_path() -> Path:
    """The packaged default config (CartPole DQN), a copy of ``configs/cartpole_dqn.yaml``."""
    return Path(__file__).with_name("defaults") / "cartpole_dqn.yaml"


def read_config_file(path: str | Path) -> dict[str, Any]:
    """Read a YAML config file into a dict; every failure is a :class:`ConfigError`."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(
            f"config file not found: {path} (resolved to {path.absolute()}); the packaged "
            f"default is {default_config_path()}"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read config file {path}: {exc}") from None
    try:
        data = _yaml_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: invalid YAML at {_yaml_error_text(exc)}") from None
    if not isinstance(data, dict):
        got = "an empty file" if data is None else "a list" if isinstance(data, list) else f"the single value {data!r}"
        raise ConfigError(
            f"{path}: the top level must be a mapping of sections "
            f"({', '.join(ExperimentConfig.model_fields)}), got {got}"
        )
    return data


def load_config(
    path: str | Path,
    overrides: Sequence[str] = (),
    *,
    check_env: bool = True,
    check_device: bool = True,
) -> ExperimentConfig:
    """Read a YAML config, apply ``--set`` overrides, validate, and check it against this machine.

    Steps: :func:`read_config_file`, :func:`apply_overrides`, :func:`validate_config`, then
    (unless switched off) :func:`check_env` (builds the env once) and :func:`check_device`.
    Raises :class:`ConfigError` for any problem; nothing else escapes for bad input.
    """
    data = apply_overrides(read_config_file(path), overrides)
    source = str(path) + "".join(f" --set {o}" for o in overrides)
    config = validate_config(data, source=source)
    if check_env:
        _check_env(config)
    if check_device:
        _check_device(config)
    return config


# load_config's keyword arguments shadow these names inside it.
_check_env, _check_device = check_env, check_device
