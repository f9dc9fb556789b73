"""Vectorised gymnasium environments for actors.

Every actor steps ``num_envs`` copies of one environment in a ``SyncVectorEnv``
with same-step autoreset: when an episode ends, the returned observation is
already the first one of the next episode and the true last observation is in
``info["final_obs"]``. That keeps each step's (obs, action, reward, next_obs)
transition complete without a wasted reset step.

Atari games (``env.kind: atari``) get the standard DeepMind preprocessing from either of two
backends, selected by ``env.atari_backend`` (:func:`make_atari_vector_env`); both return the
same thing: uint8 ``(4, 84, 84)`` frame stacks, the *raw* rewards and full-game episodes (all
lives), same-step autoreset. Reward clipping and episodic life are training signals only,
computed by :class:`AtariTrainingSignals` in the actor, so the returns the metrics record are
the unclipped full-game ones.

An actor holds its envs as :class:`EnvGroups` (:func:`make_env_groups`): one vector env, or
``env.step_groups`` of them that step while the policy acts for the next (section "Step groups").
"""

from __future__ import annotations

import contextlib
import difflib
import re
from collections.abc import Callable, Sequence
from typing import Any, Protocol, cast

import gymnasium as gym
import numpy as np


def make_vector_env(env_id: str, num_envs: int, seed: int) -> gym.vector.VectorEnv:
    """Build ``num_envs`` copies of ``env_id``, seeded ``seed, seed+1, ...`` on the first reset.

    The envs are not wrapped for episode statistics: :class:`EpisodeTracker` sums each episode's
    return and length from the steps' rewards and dones.
    """
    env = gym.vector.SyncVectorEnv(
        [lambda: gym.make(env_id) for _ in range(num_envs)],
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
    )
    env.reset(seed=seed)
    return env


def action_count(space: gym.Space) -> int:
    """The number of actions of a ``Discrete`` action space (one Q-value or logit each)."""
    if not isinstance(space, gym.spaces.Discrete):
        raise TypeError(f"a Discrete action space was expected, got {space}")
    return int(space.n)


class EpisodeTracker:
    """Accumulates per-env returns and lengths; hands out finished episodes.

    Call ``update(rewards, dones)`` after each vector step (``envs``: the envs the arrays' rows
    are, where only some stepped); ``drain()`` returns ``[[return, length, unix_time], ...]``
    finished since the previous drain.
    """

    def __init__(self, num_envs: int):
        self._returns = np.zeros(num_envs, dtype=np.float64)
        self._lengths = np.zeros(num_envs, dtype=np.int64)
        self._finished: list[list[float]] = []
        self.count = 0

    def update(self, rewards: np.ndarray, dones: np.ndarray, now: float, envs: np.ndarray | None = None) -> None:
        rows = np.arange(len(self._returns)) if envs is None else np.asarray(envs)
        self._returns[rows] += rewards
        self._lengths[rows] += 1
        if dones.any():
            ended = rows[dones]
            for i in ended:
                self._finished.append([float(self._returns[i]), int(self._lengths[i]), now])
            self.count += len(ended)
            self._returns[ended] = 0.0
            self._lengths[ended] = 0

    def drain(self) -> list[list[float]]:
        out, self._finished = self._finished, []
        return out


def next_observations(obs: np.ndarray, dones: np.ndarray, infos: dict) -> np.ndarray:
    """The true next observation of each env: ``final_obs`` where an episode just ended."""
    if not dones.any():
        return obs
    nxt = obs.copy()
    final = infos["final_obs"]
    for i in np.flatnonzero(dones):
        nxt[i] = final[i]
    return nxt


# --------------------------------------------------------------------------------------------
# Atari
# --------------------------------------------------------------------------------------------

#: The DeepMind preprocessing, identical for both backends.
ATARI_FRAME_STACK = 4
ATARI_SCREEN = 84
ATARI_OBS_SHAPE = (ATARI_FRAME_STACK, ATARI_SCREEN, ATARI_SCREEN)
ATARI_NOOP_MAX = 30
ATARI_FRAME_SKIP = 4
ATARI_MAX_FRAMES = 108_000  # 30 minutes of play at 60 Hz, as ALE's v5 envs
ATARI_BACKENDS = ("ale_vector", "gymnasium")
_ATARI_ID = re.compile(r"ALE/([A-Za-z0-9]+)-v5")


def atari_games() -> dict[str, str]:
    """``{game name as in ids: ROM}``, e.g. ``{"MsPacman": "ms_pacman", ...}``, as ale-py
    registers its ``ALE/<Game>-v5`` ids (the ROMs ship inside the ale-py wheel)."""
    from ale_py import roms

    return {rom.title().replace("_", ""): rom for rom in roms.get_all_rom_ids()}


def atari_rom(env_id: str) -> str:
    """The ale-py ROM of an ``ALE/<Game>-v5`` id (``ALE/MsPacman-v5`` -> ``ms_pacman``).

    Raises ValueError naming the fix for another form of id or an unknown game."""
    m = _ATARI_ID.fullmatch(env_id)
    games = atari_games()
    if m is not None and m.group(1) in games:
        return games[m.group(1)]
    m = re.fullmatch(r"(?:ALE/)?([A-Za-z0-9]+?)(?:NoFrameskip|Deterministic)?(?:-v\d+)?", env_id)
    game = m.group(1) if m else env_id
    by_lower = {g.lower(): g for g in games}
    if game.lower() in by_lower:
        close = [by_lower[game.lower()]]
    else:
        close = difflib.get_close_matches(game, list(games), n=3, cutoff=0.6)
    if close:
        hint = f"did you mean {' or '.join(f'ALE/{c}-v5' for c in close)}?"
    else:
        hint = (
            f"ale_py.roms.get_all_rom_ids() lists its {len(games)} games (ids as ALE/Pong-v5, "
            f"ALE/Breakout-v5, ...); a non-Atari gymnasium env needs env.kind=gym"
        )
    if _ATARI_ID.fullmatch(env_id) is None:
        hint += (
            " (Atari ids have the form ALE/<Game>-v5: frame skip, sticky actions and the rest "
            "of the preprocessing come from env.kind=atari, not from the id)"
        )
    raise ValueError(f"not an Atari game id of ale-py; {hint}")


def make_atari_vector_env(
    env_id: str, num_envs: int, backend: str = "ale_vector", threads: int = 1, batch_size: int = 0
) -> gym.vector.VectorEnv:
    """``num_envs`` copies of an Atari game with the DeepMind preprocessing.

    No-op reset (1 to 30 no-ops), frame skip 4 with max-pooling over the last 2 frames, 84x84
    grayscale, 4-frame stack zero-padded at reset; no sticky actions, no fire
    reset, episodes are full games cut at 108,000 frames. Rewards are raw and ``terminated``
    marks game over: clipping and episodic life are :class:`AtariTrainingSignals`' job.
    ``info["lives"]`` holds each env's lives, ``info["final_obs"]`` the last stack of an
    episode that just ended (same-step autoreset).

    ``backend``: ``ale_vector`` is ale-py's native ``AtariVectorEnv`` (C++, ``threads`` worker
    threads, the preprocessing built in); ``gymnasium`` is a ``SyncVectorEnv`` of
    ``AtariPreprocessing`` + ``FrameStackObservation`` (needs opencv). The caller's first
    ``reset(seed=s)`` seeds the envs ``s, s+1, ...``; it is left to the caller because a reset of
    many envs costs seconds at start-up.

    ``batch_size`` (``ale_vector`` only; 0: all envs) below ``num_envs`` makes the env
    asynchronous: ``reset`` and each ``recv`` return the first ``batch_size`` envs whose reset or
    step is done (``info["env_id"]``), and ``send`` gives exactly those envs their next actions.
    """
    rom = atari_rom(env_id)
    if backend == "ale_vector":
        env = _native_atari_class()(
            rom,
            num_envs,
            num_threads=threads,
            batch_size=batch_size,
            max_num_frames_per_episode=ATARI_MAX_FRAMES,
            repeat_action_probability=0.0,
            full_action_space=False,
            autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
            img_height=ATARI_SCREEN,
            img_width=ATARI_SCREEN,
            grayscale=True,
            stack_num=ATARI_FRAME_STACK,
            frameskip=ATARI_FRAME_SKIP,
            maxpool=True,
            noop_max=ATARI_NOOP_MAX,
            episodic_life=False,
            life_loss_info=False,
            reward_clipping=False,
            use_fire_reset=False,
        )
    elif batch_size:
        raise ValueError(f"an asynchronous batch needs the ale_vector backend, not {backend!r}")
    elif backend == "gymnasium":
        env = gym.vector.SyncVectorEnv(
            [lambda: _gymnasium_atari(env_id) for _ in range(num_envs)],
            autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
        )
    else:
        raise ValueError(f"unknown Atari backend {backend!r}; expected one of {ATARI_BACKENDS}")
    return env


def _native_atari_class():
    from ale_py.vector_env import AtariVectorEnv

    class NativeAtariVectorEnv(AtariVectorEnv):
        """ale-py's vector env taking any int seed: its seeds are C ints, spawned seeds 32 bits."""

        def reset(self, *, seed=None, options=None):
            if isinstance(seed, (int, np.integer)):
                seed = int(seed) % (2**31 - self.num_envs)
            return super().reset(seed=seed, options=options)

    return NativeAtariVectorEnv


def _gymnasium_atari(env_id: str, render_mode: str | None = None) -> gym.Env:
    import ale_py
    from gymnasium.wrappers import AtariPreprocessing, FrameStackObservation

    gym.register_envs(ale_py)
    env = gym.make(
        env_id,
        frameskip=1,
        repeat_action_probability=0.0,
        full_action_space=False,
        max_num_frames_per_episode=ATARI_MAX_FRAMES,
        render_mode=render_mode,
    )
    env = AtariPreprocessing(
        env,
        noop_max=ATARI_NOOP_MAX,
        frame_skip=ATARI_FRAME_SKIP,
        screen_size=ATARI_SCREEN,
        terminal_on_life_loss=False,
        grayscale_obs=True,
        scale_obs=False,
    )
    return FrameStackObservation(env, ATARI_FRAME_STACK, padding_type="zero")


def rendering_env(env_cfg) -> gym.Env:
    """One env of ``env_cfg`` whose ``render()`` returns its screen (RGB), its observations as the
    actors' envs give them (Atari: the same preprocessing through gymnasium's wrappers)."""
    if getattr(env_cfg, "kind", "gym") == "atari":
        return _gymnasium_atari(env_cfg.id, render_mode="rgb_array")
    return gym.make(env_cfg.id, render_mode="rgb_array")


def _vector_env(env_cfg, num_envs: int, seed: int, atari_threads: int) -> gym.vector.VectorEnv:
    if getattr(env_cfg, "kind", "gym") == "atari":
        return make_atari_vector_env(env_cfg.id, num_envs, env_cfg.atari_backend, atari_threads)
    return make_vector_env(env_cfg.id, num_envs, seed)


def make_env(env_cfg, seed: int) -> gym.vector.VectorEnv:
    """All of an actor's envs as one vector env, as ``env_cfg`` (the config's ``env`` section) says."""
    return _vector_env(env_cfg, env_cfg.num_envs, seed, env_cfg.atari_threads)


# --------------------------------------------------------------------------------------------
# Step groups: an actor's envs in groups, each group stepping while the policy chooses the next
# one's actions.
#
# ale-py's vector env steps in two calls: ``send(actions)`` starts its emulator threads and
# ``recv()`` waits for them. An actor of N envs in G groups chooses group 1's actions and sends
# them, chooses group 2's while group 1 steps, and so on, then receives every group: the
# emulators no longer stand idle while the policy runs. Group g holds the actor's envs
# ``[g N/G, (g+1) N/G)``, seeded as those envs of one vector env of N are, so the same actions
# give the same observations whatever G. Vector envs without ``send``/``recv`` (gymnasium's
# ``SyncVectorEnv``) step in each group's turn, without overlap. With one group it is the vector
# env itself, stepped as before.
# --------------------------------------------------------------------------------------------

StepResult = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]
Choice = tuple[np.ndarray, ...]  # (actions, anything else chosen with them, e.g. log-probs, values)


class SendRecv(Protocol):
    """A vector env that steps in two calls, as ale-py's ``AtariVectorEnv``."""

    def send(self, actions: np.ndarray) -> None: ...

    def recv(self) -> StepResult: ...


def _filler(ref: Any, n: int) -> Any:
    """What a group whose infos lack a key contributes: nothing happened to its ``n`` envs."""
    if isinstance(ref, dict):
        return {k: _filler(v, n) for k, v in ref.items()}
    ref = np.asarray(ref)
    if ref.dtype == object:
        return np.full(n, None, dtype=object)
    return np.zeros((n, *ref.shape[1:]), dtype=ref.dtype)


def merge_infos(parts: Sequence[dict[str, Any]], sizes: Sequence[int]) -> dict[str, Any]:
    """One vector info dict of the groups' infos, each key's arrays in group order. A key that
    only some groups report (``final_obs`` when an episode ended there) gets zeros, ``None`` or
    ``False`` for the other groups' envs; ``env_id`` is renumbered to the actor's env indices."""
    keys = list(dict.fromkeys(k for p in parts for k in p))
    out: dict[str, Any] = {}
    for k in keys:
        ref = next(p[k] for p in parts if k in p)
        values = [p[k] if k in p else _filler(ref, n) for p, n in zip(parts, sizes)]
        if isinstance(ref, dict):
            out[k] = merge_infos(values, sizes)
        else:
            arrays = [np.asarray(v) for v in values]
            if k == "env_id":
                arrays = [a + start for a, start in zip(arrays, np.cumsum([0, *sizes[:-1]]))]
            out[k] = np.concatenate(arrays)
    return out


class EnvGroups:
    """``num_envs`` envs as vector envs of equal size: ``reset``, ``step`` and ``close`` as one
    vector env, and :meth:`step_with`, which interleaves choosing and stepping."""

    def __init__(self, envs: Sequence[gym.vector.VectorEnv]):
        if not envs or len({e.num_envs for e in envs}) != 1:
            raise ValueError(f"env groups must be vector envs of one size, got sizes {[e.num_envs for e in envs]}")
        self.envs = list(envs)
        self.group_size = envs[0].num_envs
        self.num_envs = self.group_size * len(envs)
        self.single_observation_space = envs[0].single_observation_space
        self.single_action_space = envs[0].single_action_space
        self._split = self.overlaps and len(envs) > 1
        self._in_flight = False  # steps sent by send_all or recv_all and not yet received

    def envs_of(self, g: int) -> slice:
        """The positions of group ``g``'s envs among all of them."""
        return slice(g * self.group_size, (g + 1) * self.group_size)

    def reset(self, *, seed: int | None = None) -> tuple[np.ndarray, dict[str, Any]]:
        parts = [
            env.reset(seed=None if seed is None else seed + g * self.group_size) for g, env in enumerate(self.envs)
        ]
        if len(parts) == 1:
            return parts[0]
        return np.concatenate([p[0] for p in parts]), merge_infos([p[1] for p in parts], [self.group_size] * len(parts))

    def step(self, actions: np.ndarray) -> StepResult:
        return self.step_with(lambda g, obs: (actions[self.envs_of(g)],), None)[1]

    def step_with(
        self, choose: Callable[[int, np.ndarray | None], Choice], obs: np.ndarray | None
    ) -> tuple[Choice, StepResult]:
        """``choose(g, obs[group g])`` -> ``(actions, *more)`` for each group in turn, each group
        sent to its emulators as soon as its actions are chosen; returns every group's choices
        and step results, concatenated in env order."""
        if len(self.envs) == 1:
            choice = choose(0, obs)
            return choice, self.envs[0].step(choice[0])
        choices: list[Choice] = []
        results: list[StepResult] = []
        for g, env in enumerate(self.envs):
            choice = choose(g, None if obs is None else obs[self.envs_of(g)])
            choices.append(choice)
            if self._split:
                cast(SendRecv, env).send(choice[0])
            else:
                results.append(env.step(choice[0]))
        if self._split:
            results = [cast(SendRecv, env).recv() for env in self.envs]
        return _concatenated(choices), self._merged(results)

    @property
    def overlaps(self) -> bool:
        """Whether the groups step in two calls (:meth:`send_all`, :meth:`recv_all`)."""
        return hasattr(self.envs[0], "send") and hasattr(self.envs[0], "recv")

    def send_all(self, choose: Callable[[int, np.ndarray], Choice], obs: np.ndarray) -> Choice:
        """Choose each group's actions on its ``obs`` and send them; their results come with
        :meth:`recv_all`. Returns every group's choices, concatenated in env order."""
        choices = []
        for g, env in enumerate(self.envs):
            choice = choose(g, obs[self.envs_of(g)])
            cast(SendRecv, env).send(choice[0])
            choices.append(choice)
        self._in_flight = True
        return _concatenated(choices)

    def recv_all(self, choose: Callable[[int, np.ndarray], Choice] | None = None) -> tuple[StepResult, Choice | None]:
        """Each group's step result, in group order. With ``choose``, each group's next actions
        are chosen on its new observations and sent as soon as it is received, so its emulators
        step again while the other groups are received and the caller handles this step: returns
        those choices as :meth:`send_all` does. Without it, nothing steps on."""
        results: list[StepResult] = []
        choices: list[Choice] = []
        for g, env in enumerate(self.envs):
            result = cast(SendRecv, env).recv()
            results.append(result)
            if choose is not None:
                choice = choose(g, result[0])
                cast(SendRecv, env).send(choice[0])
                choices.append(choice)
        self._in_flight = choose is not None
        return self._merged(results), _concatenated(choices) if choices else None

    def _merged(self, results: list[StepResult]) -> StepResult:
        if len(results) == 1:
            return results[0]
        obs, rewards, terminated, truncated = (np.concatenate([r[i] for r in results]) for i in range(4))
        return (
            obs,
            rewards,
            terminated,
            truncated,
            merge_infos([r[4] for r in results], [self.group_size] * len(results)),
        )

    def close(self) -> None:
        if self._in_flight:  # the emulators finish the step they were sent before they close
            with contextlib.suppress(Exception):
                self.recv_all()
        for env in self.envs:
            env.close()


def _concatenated(choices: Sequence[Choice]) -> Choice:
    if len(choices) == 1:
        return choices[0]
    return tuple(np.concatenate(parts) for parts in zip(*choices))


def make_env_groups(env_cfg, seed: int) -> EnvGroups:
    """The actor's envs as ``env_cfg.step_groups`` vector envs of equal size
    (:class:`EnvGroups`), seeded as one vector env of ``num_envs`` would be, the ALE
    threads shared equally between them."""
    groups = env_cfg.step_groups
    n = env_cfg.num_envs // groups
    threads = max(1, env_cfg.atari_threads // groups)
    return EnvGroups([_vector_env(env_cfg, n, seed + g * n, threads) for g in range(groups)])


def observation_dtype(env_cfg) -> type:
    """Observations as actors store and send them: uint8 frames for Atari, float32 otherwise."""
    return np.uint8 if getattr(env_cfg, "kind", "gym") == "atari" else np.float32


class AtariTrainingSignals:
    """Reward clipping and episodic life, for training only.

    ``__call__(rewards, terminated, truncated, infos)`` after each vector step returns
    ``(rewards, terminated, dones)`` as the learner should see them: rewards clipped to their
    sign, and a lost life (``info["lives"]`` went down, the game goes on) counted as a
    termination. The env itself, and the episode statistics, keep the raw full-game view.
    ``lives_lost`` counts the life losses seen so far. Where only some envs stepped, ``envs``
    names the envs the arrays' rows are, and :meth:`start` records an env's lives as it begins.
    """

    def __init__(self, lives, clip_rewards: bool = True, episodic_life: bool = True):
        self.lives = np.asarray(lives, dtype=np.int64).copy()
        self.clip_rewards = clip_rewards
        self.episodic_life = episodic_life
        self.lives_lost = 0

    def start(self, envs: np.ndarray, lives: np.ndarray) -> None:
        self.lives[envs] = lives

    def __call__(self, rewards, terminated, truncated, infos, envs: np.ndarray | None = None):
        rows = slice(None) if envs is None else envs
        rewards = np.asarray(rewards)
        out = np.sign(rewards).astype(np.float32) if self.clip_rewards else rewards.astype(np.float32)
        lives = np.asarray(infos["lives"], dtype=np.int64)
        # with same-step autoreset a finished env already reports its new game's lives
        lost = (lives < self.lives[rows]) & ~(terminated | truncated)
        self.lives[rows] = lives
        self.lives_lost += int(lost.sum())
        if self.episodic_life:
            terminated = terminated | lost
        return out, terminated, terminated | truncated


def identity_training_signals(rewards, terminated, truncated, infos):
    """Non-Atari envs train on what the env returns."""
    return rewards, terminated, terminated | truncated


def training_signals(env_cfg, reset_infos: dict):
    """What an actor's learner trains on, from the infos of its env's reset: Atari clips rewards
    and ends an episode at each lost life (:class:`AtariTrainingSignals`), other envs train on what
    they return."""
    if env_cfg.kind == "atari":
        return AtariTrainingSignals(reset_infos["lives"])
    return identity_training_signals


def atari_spaces(env_cfg) -> tuple[gym.Space, gym.Space]:
    """(observation space, action space) of one env as actors will see it; builds and closes a
    one-env vector env of the configured backend. Raises with the fix when it cannot be built."""
    if env_cfg.atari_backend == "gymnasium":
        try:
            import cv2  # noqa: F401
        except ImportError:
            raise RuntimeError(
                "the gymnasium backend resizes frames with opencv, which is not installed: "
                "pip install opencv-python-headless, or use env.atari_backend=ale_vector"
            ) from None
    env = make_atari_vector_env(env_cfg.id, 1, env_cfg.atari_backend, 1)
    try:
        return env.single_observation_space, env.single_action_space
    finally:
        env.close()
