"""The experiment config's schema: one pydantic model per section, machine-independent.

The models check types, ranges and cross-field arithmetic only, so a config saved in a run
directory validates anywhere; checks against this machine (the env, the device) are
:mod:`tianji_dask.config.machine`'s. This module imports neither gymnasium, ale-py nor torch.

A validator that finds a problem raises :func:`problem` with lines that already name their
fields and values; :mod:`tianji_dask.config.errors` shows them as they are.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal, TypeVar, get_args

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

#: The pydantic error type of :func:`problem`.
PROBLEM = "config_problem"


def problem(*lines: str) -> PydanticCustomError:
    """An error whose lines already name their fields and values; shown as they are."""
    return PydanticCustomError(PROBLEM, "{text}", {"text": "\n".join(lines)})


Precision = Literal["fp32", "tf32", "bf16"]


def precision_field(heads: str) -> Any:
    """The ``algo.precision`` field of an algorithm whose Nature CNN feeds ``heads``."""
    return Field(
        "fp32",
        description="how the learner's Nature CNN trunk (convolutions and 512-unit layer, forward "
        "and backward) computes (env.kind atari only): 'fp32' float32 on frames as they come (on "
        "CUDA cuDNN's convolutions use TF32 by default); 'tf32' on channels-last frames, and on "
        "CUDA TF32 matmuls too (torch.backends.cuda.matmul.allow_tf32, for the learner's "
        f"process); 'bf16' on channels-last frames under bfloat16 autocast. The {heads}, the "
        "loss, the gradients and Adam stay float32, and actors infer in float32",
    )


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
        description="gymnasium id (Box observations; Discrete actions, or for PPO a 1-D Box: Gaussian "
        "policy), e.g. CartPole-v1, Pendulum-v1; "
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
        1,
        ge=1,
        description="kind=atari, ale_vector only: C++ threads stepping one actor's envs, shared "
        "equally by its step groups",
    )
    step_groups: int = Field(
        1,
        ge=1,
        description="the actor's envs step in this many equal groups, each group's emulators "
        "stepping while the policy chooses the next group's actions (PPO actors; overlapped with "
        "atari_backend=ale_vector, other envs step the groups in turn); num_envs must be a multiple",
    )
    async_batch: int = Field(
        0,
        ge=0,
        description="kind=atari, ale_vector, PPO only: the actor takes the first async_batch envs "
        "whose step is done, chooses their next actions and sends them while the other envs go on "
        "stepping (ale-py's batch_size), so no emulator waits for the policy; each env fills its "
        "own rows of a rollout; 0 steps all num_envs together",
    )

    @property
    def frame_stacks(self) -> bool:
        """Observations are stacks of uint8 frames (``kind: atari``): replays keep each frame once,
        actors send each new frame once, and the networks are CNNs."""
        return self.kind == "atari"

    @property
    def stepping_threads(self) -> bool:
        """One actor's envs step on ``atari_threads`` native threads (ale-py's vector env), so
        an actor process can use several cores; other envs step on the actor's one thread."""
        return self.kind == "atari" and self.atari_backend == "ale_vector"

    @model_validator(mode="after")
    def _check_step_groups(self) -> EnvConfig:
        if self.num_envs % self.step_groups:
            raise problem(
                f"env.num_envs={self.num_envs} does not split into env.step_groups={self.step_groups} "
                f"equal groups: make num_envs a multiple of step_groups"
            )
        return self

    @model_validator(mode="after")
    def _check_async_batch(self) -> EnvConfig:
        if not self.async_batch:
            return self
        if not self.stepping_threads:
            raise problem(
                f"env.async_batch={self.async_batch} needs ale-py's vector env (env.kind=atari, "
                f"env.atari_backend=ale_vector), not kind={self.kind!r}, backend={self.atari_backend!r}: "
                "set env.async_batch=0"
            )
        if self.async_batch >= self.num_envs:
            raise problem(
                f"env.async_batch={self.async_batch} must be below env.num_envs={self.num_envs} (the other "
                f"envs step while a batch is chosen for): e.g. env.async_batch={max(1, self.num_envs // 2)}"
            )
        if self.step_groups != 1:
            raise problem(
                f"env.async_batch={self.async_batch} and env.step_groups={self.step_groups} are two ways "
                "to overlap the emulators with the policy: keep one (env.step_groups=1)"
            )
        return self

    @model_validator(mode="after")
    def _check_kind_fits_id(self) -> EnvConfig:
        # Whether an atari id names a game of ale-py is a machine check (check_env).
        if self.kind == "gym" and self.id.startswith("ALE/"):
            raise problem(
                f"env.id={self.id!r} is an Atari game: set env.kind=atari for the DeepMind "
                f"preprocessing and the Nature CNN"
            )
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
    lr_batch_scaling: Literal["sqrt", "linear", "none"] = Field(
        "sqrt",
        description="how a plan that changes batch_size from B to B' changes lr: times sqrt(B'/B) "
        "(the usual rule for Adam), times B'/B, or not at all",
    )
    buffer_size: int = Field(100_000, ge=1, description="replay capacity in transitions")
    learning_starts: int = Field(1000, ge=0, description="transitions in replay memory before updates start")
    train_freq: int = Field(64, ge=1, description="serial reference: env steps (transitions) between training rounds")
    gradient_steps: int = Field(8, ge=1, description="serial reference: updates per training round")
    target_update_interval: int = Field(250, ge=1, description="learner updates between target-network syncs")
    exploration_initial_eps: float = Field(1.0, ge=0, le=1, description="epsilon at step 0")
    exploration_final_eps: float = Field(0.02, ge=0, le=1, description="epsilon after exploration_steps")
    exploration_steps: int = Field(8000, ge=1, description="env steps (all actors together) of linear epsilon decay")
    exploration: Literal["linear", "per_env"] = Field(
        "linear",
        description="linear: one epsilon for every env, decaying with env steps (exploration_*_eps, "
        "exploration_steps); per_env: Ape-X's fixed epsilon per env, eps_k = "
        "per_env_eps_base ** (1 + per_env_eps_alpha * k / (N - 1)) over all N envs of the run",
    )
    per_env_eps_base: float = Field(0.4, gt=0, lt=1, description="Ape-X's epsilon base (exploration: per_env)")
    per_env_eps_alpha: float = Field(7.0, ge=0, description="Ape-X's epsilon exponent spread (exploration: per_env)")
    dueling: bool = Field(
        False, description="dueling Q-network: Q = V + A - mean(A) from a value and an advantage stream"
    )
    replay_device: Literal["cpu", "learner"] = Field(
        "cpu",
        description="where the replay keeps its frames: cpu (host memory), or learner (the learner's "
        "device, learner.device: batches gathered there, no host copy; env.kind=atari only)",
    )
    replay: Literal["uniform", "prioritized"] = Field(
        "uniform",
        description="uniform: every stored transition equally likely; prioritized: proportional "
        "to (|TD error| + priority_eps) ** priority_alpha, the loss weighted by importance "
        "weights with exponent priority_beta annealed to 1 (Schaul et al. 2016, Ape-X)",
    )
    priority_alpha: float = Field(0.6, ge=0, le=1, description="how much priorities count (replay: prioritized)")
    priority_beta: float = Field(
        0.4, ge=0, le=1, description="importance-weight exponent at the start (replay: prioritized)"
    )
    priority_beta_steps: int = Field(
        1_000_000, ge=1, description="transitions a buffer receives while priority_beta anneals to 1"
    )
    priority_eps: float = Field(1e-6, gt=0, description="added to |TD error|: no transition's probability is 0")
    hidden_sizes: list[PositiveInt] = Field(
        default_factory=lambda: [64, 64],
        min_length=1,
        description="widths of the Q-network's hidden layers",
    )
    max_grad_norm: float = Field(10.0, gt=0, description="gradient clipping norm")
    precision: Precision = precision_field("Q head")
    updates_per_graph: int = Field(
        1,
        ge=1,
        description="a learner that draws its batches on its device (replay_device: learner, "
        "uniform replay, one learner a group, relaxed mode): updates per CUDA graph launch, each "
        "on its own batch drawn inside the graph; a launch never spans a target sync or a "
        "publication, so the updates are those made one at a time (on a CPU learner they run in "
        "turn). Other learners draw each batch on the host between updates, one an update",
    )
    compile: bool = Field(
        False,
        description="torch.compile the learner's loss (forward and backward) and its clipped Adam "
        "step, fusing their many small kernels (on CUDA inside the update's CUDA graph). The "
        "learner compiles after its first parameters are out, while the actors fill the replay: "
        "tens of seconds the first time on a machine, a few once inductor's cache (per user, "
        "TORCHINDUCTOR_CACHE_DIR, kept between runs) holds the kernels. Needs a C++ compiler on "
        "a CPU learner and Triton on a CUDA one",
    )
    ratio_tolerance: float | None = Field(
        0.25,
        ge=0,
        lt=1,
        description="relative band around target_replay_ratio outside which the balance "
        "controller slows the faster side, on the counts since the start: its width in env steps "
        "grows with the run, so a window of the run may stray further. 0 holds the ratio to the "
        "controller's quanta alone (a chunk per actor, a publication's samples) at any moment; "
        "null turns the controller off (nothing ever waits)",
    )

    @property
    def target_replay_ratio(self) -> float:
        """Samples consumed by updates per sample produced, as in the serial algorithm.

        ``gradient_steps * batch_size / train_freq``: every ``train_freq`` env steps the serial
        algorithm runs ``gradient_steps`` updates of ``batch_size`` samples each.
        """
        return self.gradient_steps * self.batch_size / self.train_freq

    def action_space_problem(self, env_id: str, action_space: Any) -> str | None:
        """Why DQN cannot act in the env's (gymnasium) action space, as one line naming the env
        and the fix; None when it can (a ``Discrete`` space)."""
        from gymnasium import spaces

        if isinstance(action_space, spaces.Discrete):
            return None
        return (
            f"env.id={env_id!r}: action space is {action_space}, but DQN needs a Discrete action "
            f"space (e.g. CartPole-v1, Acrobot-v1, MountainCar-v0); for continuous actions use PPO, "
            f"algo.name=ppo (e.g. configs/pendulum_ppo.yaml)"
        )

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
            raise problem(*problems)
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
    rollouts_ahead: int = Field(
        1,
        ge=1,
        description="with ratio_tolerance: rollouts an actor may make beyond its share of the "
        "versions so far, the sampling that overlaps the learner's iteration (each one a "
        "version stale when trained on)",
    )
    staleness_correction: Literal["none", "decoupled"] = Field(
        "none",
        description="'decoupled': clip the policy ratio against the learner's own policy at the "
        "start of each iteration and weight by its probability ratio to the policy that acted "
        "(truncated at behaviour_weight_max), as decoupled PPO (Hilton et al. 2021); 'none': "
        "clip against the policy that acted, as synchronous PPO does",
    )
    behaviour_weight_max: float = Field(
        2.0, gt=0, description="with staleness_correction 'decoupled': the largest weight a sample gets"
    )
    normalize_observations: bool = Field(
        True,
        description="Box actions: the policy sees observations normalised with running statistics "
        "and clipped to +-10 (cleanrl's NormalizeObservation); false: as the env gives them",
    )
    normalize_rewards: bool = Field(
        True,
        description="Box actions: train on rewards scaled by the running std of the discounted return "
        "and clipped to +-10 (cleanrl's NormalizeReward); false: as the env gives them",
    )
    use_sde: bool = Field(
        False,
        description="Box actions: explore with generalized state-dependent exploration (gSDE, Raffin "
        "et al. 2022; stable-baselines3's use_sde): the noise is the policy's last hidden features "
        "times a random matrix drawn every sde_sample_freq steps, with a learned std per feature and "
        "action dimension; false: a state-independent log-std per action dimension",
    )
    sde_sample_freq: int = Field(
        -1,
        ge=-1,
        description="with use_sde: env steps between draws of the exploration matrices (one per env); "
        "-1 = once a rollout",
    )
    log_std_init: float = Field(
        0.0,
        description="Box actions: the initial log-std (per action dimension; with use_sde per "
        "feature and action dimension)",
    )
    cuda_graph: Literal["iteration", "minibatch"] = Field(
        "iteration",
        description="a learner on CUDA replays 'iteration': the whole iteration (proximal log-probs, "
        "every epoch's minibatches, gathered on the device by the epochs' permutations uploaded "
        "with the batch) as one CUDA graph, one launch and one read of the stats; 'minibatch': one "
        "graph per minibatch step, its inputs gathered and copied in from Python (the path before). "
        "Same results; a data-parallel learner (a hook between backward and step) runs eagerly "
        "either way, and a CPU learner runs the iteration's code eagerly",
    )
    precision: Precision = precision_field("policy and value heads")

    @model_validator(mode="after")
    def _check_sde_sample_freq(self) -> PPOConfig:
        if self.sde_sample_freq == 0:
            raise problem(
                "algo.sde_sample_freq=0: give the env steps between draws of the exploration "
                "matrices (1 or more), or -1 for one draw a rollout"
            )
        if self.rollouts_ahead != 1 and self.ratio_tolerance is None:
            raise problem(
                f"algo.rollouts_ahead={self.rollouts_ahead} is a limit of the balance controller, which "
                "algo.ratio_tolerance=null turns off: set algo.ratio_tolerance (e.g. 0.01) or leave "
                "algo.rollouts_ahead at 1"
            )
        return self

    @property
    def target_replay_ratio(self) -> float:
        """Samples consumed per sample produced: each rollout is used ``sample_reuse`` times."""
        return float(self.sample_reuse)

    @property
    def learning_starts(self) -> int:
        return 0

    def action_space_problem(self, env_id: str, action_space: Any) -> str | None:
        """Why PPO cannot act in the env's (gymnasium) action space, as one line naming the env
        and the fix; None when it can: a ``Discrete`` space gets the categorical policy, a
        one-dimensional ``Box`` the diagonal Gaussian one (:mod:`tianji_dask.algos.ppo.gaussian`)."""
        from gymnasium import spaces

        if isinstance(action_space, spaces.Discrete):
            if self.use_sde:
                return (
                    f"env.id={env_id!r}: action space is {action_space}, but algo.use_sde (gSDE) "
                    "explores continuous (Box) actions; drop algo.use_sde for this env"
                )
            return None
        if isinstance(action_space, spaces.Box) and len(action_space.shape) == 1:
            return None
        return (
            f"env.id={env_id!r}: action space is {action_space}, but PPO acts in a Discrete action "
            f"space (categorical policy) or a one-dimensional Box (Gaussian policy), e.g. CartPole-v1 "
            f"or Pendulum-v1; register an env that wraps it into one of those (env.id='module:Id' imports the "
            f"module that registers it)"
        )


#: The algorithms' config sections, the one list of them: a new algorithm's section joins this
#: union (pydantic picks the section by its ``name``; ``algos.registry`` maps the same names to
#: the algorithms' specs).
AlgoConfig = DQNConfig | PPOConfig
#: Algorithm name -> config model.
ALGO_CONFIGS: dict[str, type[AlgoConfig]] = {
    get_args(model.model_fields["name"].annotation)[0]: model for model in get_args(AlgoConfig)
}
AlgoT = TypeVar("AlgoT", bound=AlgoConfig)


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
            raise problem(
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
            raise problem(
                f"channel.capacity_mb={self.capacity_mb} is {self.capacity_mb} * 1e6 = "
                f"{self.capacity_mb * 1e6:g} bytes, below one byte; raise capacity_mb"
            )
        return self


_DEVICE_RE = re.compile(r"cpu|cuda|cuda:\d+")


def _device_form(value: str) -> str:
    if not _DEVICE_RE.fullmatch(value):
        raise ValueError("must be 'cpu', 'cuda' or 'cuda:N' (N a device index)")
    return value


class LearnerConfig(_Section):
    """The learner host: where it computes and how often it publishes parameters."""

    publish_interval: int = Field(50, ge=1, description="learner updates between parameter publications")
    device: str = Field("cpu", description="'cpu', 'cuda' or 'cuda:N'")

    _check_device_form = field_validator("device")(_device_form)


class ActorConfig(_Section):
    """The actor hosts: where their policy's inference runs."""

    device: str = Field(
        "cpu",
        description="'cpu', 'cuda' or 'cuda:N': where each actor runs its policy network "
        "(actor processes share the GPU; the env still steps on the actor's CPU cores)",
    )

    _check_device_form = field_validator("device")(_device_form)


class StopConfig(_Section):
    """When the run stops: the first criterion reached wins; at least one must be set."""

    target_return: float | None = Field(None, description="mean return over the last 100 episodes; null = no target")
    max_env_steps: int | None = Field(None, ge=1, description="env steps (all actors together); null = no limit")
    max_seconds: float | None = Field(None, gt=0, description="wall-clock seconds; null = no limit")
    target_eval_return: float | None = Field(
        None,
        description="mean return of an evaluation of the policy without exploration (run.eval_every_env_steps); "
        "null = no target",
    )

    @model_validator(mode="after")
    def _check_some_criterion(self) -> StopConfig:
        if all(v is None for v in (self.target_return, self.max_env_steps, self.max_seconds, self.target_eval_return)):
            raise problem(
                "stop: target_return, max_env_steps, max_seconds and target_eval_return are all null, so the run "
                "would never stop; set at least one (e.g. --set stop.max_seconds=600)"
            )
        return self


class RunConfig(_Section):
    """Run supervision: metric cadence, liveness, restarts and checkpoints."""

    metrics_interval: float = Field(0.5, gt=0, description="seconds between metric rows / heartbeats")
    heartbeat_timeout: float = Field(
        5.0, gt=0, description="seconds without a heartbeat before a host is declared lost"
    )
    checkpoint: bool = Field(True, description="write checkpoints into the run directory")
    tensorboard: bool = Field(
        False,
        description="also write each metrics row as TensorBoard scalars into <run dir>/tensorboard while the "
        "run goes (tensorboard --logdir runs/); needs pip install 'tianji-dask[tensorboard]'",
    )
    eval_every_env_steps: int = Field(
        0,
        ge=0,
        description="env steps (all actors) between evaluations of the learner's current policy without "
        "exploration, as tianji-dask eval plays it, in a process of the driver's own (0: no evaluation); each "
        "mean return goes into metrics.nc (eval_return_mean) and the best policy into <run dir>/checkpoint_best",
    )
    eval_episodes: int = Field(20, ge=1, description="episodes played by each evaluation of run.eval_every_env_steps")
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
    max_restarts: int = Field(
        3,
        ge=0,
        description="hosts lost with their worker (a killed process, a cancelled job) are "
        "re-created, at most this many times within restart_window_s; one more fails the run "
        "(0: any lost host fails it)",
    )
    restart_window_s: float = Field(
        600.0, gt=0, description="the window over which max_restarts counts re-created hosts"
    )
    snapshot_interval: float = Field(
        5.0,
        ge=0,
        description="seconds between copies of each group's learner state kept in the driver's "
        "memory, which a learner re-created after its worker was lost continues from (0: none; "
        "it then starts again from its first parameters)",
    )
    replay_snapshot_mb: float = Field(
        512.0,
        ge=0,
        description="MB (10^6 bytes) of a buffer's filled replay up to which it is copied with "
        "each learner snapshot (after the first copy only the transitions added since) and kept "
        "in the driver's memory, so that a buffer re-created after its worker was lost starts "
        "with it; a fuller replay is not kept and the re-created buffer starts empty, as with 0",
    )

    @model_validator(mode="after")
    def _check_heartbeat(self) -> RunConfig:
        limit = 2 * self.metrics_interval
        if self.heartbeat_timeout <= limit:
            raise problem(
                f"run.heartbeat_timeout={self.heartbeat_timeout} must be > 2 * "
                f"run.metrics_interval = 2 * {self.metrics_interval} = {limit}: hosts send a "
                f"heartbeat every metrics_interval, so a shorter timeout declares healthy hosts "
                f"lost after one late beat; raise heartbeat_timeout above {limit} or lower "
                f"metrics_interval"
            )
        return self


class ExperimentConfig(_Section):
    """One experiment: env, algorithm, topology, channel, learner, stop rule and run settings.

    Build it with :func:`~tianji_dask.config.load_config` (YAML plus overrides) or
    :func:`~tianji_dask.config.validate_config` (a dict); both raise
    :class:`~tianji_dask.config.ConfigError`. All seeds derive from ``seed`` through
    ``numpy.random.SeedSequence(seed).spawn``, one per host and env.
    """

    seed: int = Field(0, ge=0, description="root seed; every other seed is spawned from it")
    env: EnvConfig
    algo: Annotated[AlgoConfig, Field(discriminator="name")]
    topology: TopologyConfig = Field(default_factory=TopologyConfig)
    channel: ChannelConfig = Field(default_factory=ChannelConfig)
    learner: LearnerConfig = Field(default_factory=LearnerConfig)
    actor: ActorConfig = Field(default_factory=ActorConfig)
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
                raise problem(f"algo.name is missing; allowed names: {allowed}")
            name = value["name"]
            if not isinstance(name, str) or name not in ALGO_CONFIGS:
                raise problem(f"algo.name={name!r} is not a known algorithm; allowed names: {allowed}")
        return value

    @model_validator(mode="after")
    def _check_cross_sections(self) -> ExperimentConfig:
        if self.stop.target_eval_return is not None and not self.run.eval_every_env_steps:
            raise problem(
                f"stop.target_eval_return={self.stop.target_eval_return} stops the run on an evaluation, and "
                "run.eval_every_env_steps=0 makes none: set run.eval_every_env_steps (e.g. 10000) or "
                "stop.target_eval_return=null"
            )
        steps = self.stop.max_env_steps
        if steps is not None and steps < self.algo.learning_starts:
            raise problem(
                f"stop.max_env_steps={steps} is below algo.learning_starts="
                f"{self.algo.learning_starts}: the run would stop before the first update; "
                f"raise max_env_steps or lower learning_starts"
            )
        precision = getattr(self.algo, "precision", "fp32")
        if precision != "fp32" and not self.env.frame_stacks:
            raise problem(
                f"algo.precision={precision} applies to the Nature CNN trunk, and "
                f"env.kind={self.env.kind!r} trains an MLP: set env.kind=atari or algo.precision=fp32"
            )
        if self.env.async_batch and self.algo.name != "ppo":
            raise problem(
                f"env.async_batch={self.env.async_batch} is for PPO's actors, which fill each env's rows "
                f"of a rollout; algo.name={self.algo.name!r} steps all envs together: set env.async_batch=0"
            )
        if getattr(self.algo, "replay_device", "cpu") == "learner" and not self.env.frame_stacks:
            raise problem(
                "algo.replay_device=learner keeps a frame replay on the learner's device, and "
                f"env.kind={self.env.kind!r} has no frames: set env.kind=atari or algo.replay_device=cpu"
            )
        return self

    def algo_as(self, kind: type[AlgoT]) -> AlgoT:
        """The ``algo`` section as the algorithm's own section type (an algorithm's code reads its
        fields through this, so the type checker knows them); ``TypeError`` if it is another."""
        if not isinstance(self.algo, kind):
            raise TypeError(f"a {kind.__name__} section was expected, but algo.name is {self.algo.name!r}")
        return self.algo

    def model_dump_yaml(self) -> str:
        """The resolved config (defaults filled in) as YAML; :func:`~tianji_dask.config.load_config` reads it back."""
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)

    def to_json(self) -> str:
        """The resolved config as one compact JSON string (e.g. for NetCDF attrs)."""
        return self.model_dump_json()


def section_model(path: Sequence[str], data: Mapping[str, Any] | None) -> type[BaseModel] | None:
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
