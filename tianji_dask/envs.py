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
"""

from __future__ import annotations

import difflib
import re

import gymnasium as gym
import numpy as np

from tianji_dask.env_groups import EnvGroups


def make_vector_env(env_id: str, num_envs: int, seed: int) -> gym.vector.VectorEnv:
    """Build ``num_envs`` copies of ``env_id``, seeded ``seed, seed+1, ...`` on the first reset.

    Episode statistics (return and length of the full episode) are recorded by
    ``RecordEpisodeStatistics`` and reported by :class:`EpisodeTracker`.
    """
    env = gym.vector.SyncVectorEnv(
        [lambda: gym.make(env_id) for _ in range(num_envs)],
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
    )
    env.reset(seed=seed)
    return env


class EpisodeTracker:
    """Accumulates per-env returns and lengths; hands out finished episodes.

    Call ``update(rewards, dones)`` after each vector step; ``drain()`` returns
    ``[[return, length, unix_time], ...]`` finished since the previous drain.
    """

    def __init__(self, num_envs: int):
        self._returns = np.zeros(num_envs, dtype=np.float64)
        self._lengths = np.zeros(num_envs, dtype=np.int64)
        self._finished: list[list[float]] = []
        self.count = 0

    def update(self, rewards: np.ndarray, dones: np.ndarray, now: float) -> None:
        self._returns += rewards
        self._lengths += 1
        if dones.any():
            for i in np.flatnonzero(dones):
                self._finished.append([float(self._returns[i]), int(self._lengths[i]), now])
            self.count += int(dones.sum())
            self._returns[dones] = 0.0
            self._lengths[dones] = 0

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
    env_id: str, num_envs: int, seed: int, backend: str = "ale_vector", threads: int = 1
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
    ``AtariPreprocessing`` + ``FrameStackObservation`` (needs opencv). Envs are seeded
    ``seed, seed+1, ...`` on the first reset.
    """
    rom = atari_rom(env_id)
    if backend == "ale_vector":
        env = _native_atari_class()(
            rom,
            num_envs,
            num_threads=threads,
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
    elif backend == "gymnasium":
        env = gym.vector.SyncVectorEnv(
            [lambda: _gymnasium_atari(env_id) for _ in range(num_envs)],
            autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
        )
    else:
        raise ValueError(f"unknown Atari backend {backend!r}; expected one of {ATARI_BACKENDS}")
    env.reset(seed=seed)
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


def _gymnasium_atari(env_id: str) -> gym.Env:
    import ale_py
    from gymnasium.wrappers import AtariPreprocessing, FrameStackObservation

    gym.register_envs(ale_py)
    env = gym.make(
        env_id,
        frameskip=1,
        repeat_action_probability=0.0,
        full_action_space=False,
        max_num_frames_per_episode=ATARI_MAX_FRAMES,
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


def make_env(env_cfg, seed: int) -> gym.vector.VectorEnv:
    """The vector env an actor steps, as ``env_cfg`` (the config's ``env`` section) says."""
    if getattr(env_cfg, "kind", "gym") == "atari":
        return make_atari_vector_env(env_cfg.id, env_cfg.num_envs, seed, env_cfg.atari_backend, env_cfg.atari_threads)
    return make_vector_env(env_cfg.id, env_cfg.num_envs, seed)


def make_env_groups(env_cfg, seed: int) -> EnvGroups:
    """The actor's envs as ``env_cfg.step_groups`` vector envs of equal size
    (:mod:`tianji_dask.env_groups`), seeded as one vector env of ``num_envs`` would be, the ALE
    threads shared equally between them."""
    groups = env_cfg.step_groups
    n = env_cfg.num_envs // groups
    if getattr(env_cfg, "kind", "gym") == "atari":
        threads = max(1, env_cfg.atari_threads // groups)
        return EnvGroups(
            [make_atari_vector_env(env_cfg.id, n, seed + g * n, env_cfg.atari_backend, threads) for g in range(groups)]
        )
    return EnvGroups([make_vector_env(env_cfg.id, n, seed + g * n) for g in range(groups)])


def observation_dtype(env_cfg) -> type:
    """Observations as actors store and send them: uint8 frames for Atari, float32 otherwise."""
    return np.uint8 if getattr(env_cfg, "kind", "gym") == "atari" else np.float32


class AtariTrainingSignals:
    """Reward clipping and episodic life, for training only.

    ``__call__(rewards, terminated, truncated, infos)`` after each vector step returns
    ``(rewards, terminated, dones)`` as the learner should see them: rewards clipped to their
    sign, and a lost life (``info["lives"]`` went down, the game goes on) counted as a
    termination. The env itself, and the episode statistics, keep the raw full-game view.
    ``lives_lost`` counts the life losses seen so far.
    """

    def __init__(self, lives, clip_rewards: bool = True, episodic_life: bool = True):
        self.lives = np.asarray(lives, dtype=np.int64).copy()
        self.clip_rewards = clip_rewards
        self.episodic_life = episodic_life
        self.lives_lost = 0

    def __call__(self, rewards, terminated, truncated, infos):
        rewards = np.asarray(rewards)
        out = np.sign(rewards).astype(np.float32) if self.clip_rewards else rewards.astype(np.float32)
        lives = np.asarray(infos["lives"], dtype=np.int64)
        # with same-step autoreset a finished env already reports its new game's lives
        lost = (lives < self.lives) & ~(terminated | truncated)
        self.lives = lives.copy()
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


def atari_spaces(env_cfg) -> tuple[gym.spaces.Box, gym.spaces.Discrete]:
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
    env = make_atari_vector_env(env_cfg.id, 1, 0, env_cfg.atari_backend, 1)
    try:
        return env.single_observation_space, env.single_action_space
    finally:
        env.close()
