"""The balance controller's formulas in docs/architecture.md are the code's: each one, read from
the page as written, gives the same answer as the method it names on a grid of counts. A change
to the controller that forgets the page, or an edit of the page that gets the formula wrong,
fails here."""

from __future__ import annotations

import itertools
import math
import re
from types import CodeType, SimpleNamespace

import pytest
from conftest import ROOT

from tianji_dask.algos.dqn.actor import DQNActorRole
from tianji_dask.algos.dqn.learner import DQNLearnerRole
from tianji_dask.algos.ppo.pacing import rollouts_per_version

DOC = ROOT / "docs" / "architecture.md"


def formula_after(label: str) -> CodeType:
    """The first formula (a code span with a comparison or a ``max``) after ``label`` on the
    page, compiled as a Python expression."""
    text = DOC.read_text(encoding="utf-8")
    at = text.find(label)
    assert at >= 0, f"docs/architecture.md no longer says {label!r}"
    spans = re.findall(r"`([^`]+)`", text[at:])
    formula = next((s for s in spans if re.search(r"[<>=]|max\(", s)), None)
    assert formula, f"docs/architecture.md has no formula after {label!r}"
    return compile(formula.replace(" x ", " * "), str(DOC), "eval")


def evaluate(formula: CodeType, **names: float) -> float | bool:
    return eval(formula, {"__builtins__": {}, "max": max, "floor": math.floor}, names)


def test_the_actors_pause_condition_on_the_page_is_ahead_of_learner():
    formula = formula_after("**An actor pauses**")
    # steps of 100 cross each threshold: a term left out or added on either side shows
    grid = itertools.product(range(0, 8_000, 100), [1, 4], [1, 2, 3], [0, 20_000], [0.1, 0.25])
    for env_steps, actors, learners, consumed, tol in grid:
        R, learning_starts, chunk = 8.0, 1_000, 32 * 8
        actor = SimpleNamespace(
            algo=SimpleNamespace(ratio_tolerance=tol, learning_starts=learning_starts, target_replay_ratio=R),
            cfg=SimpleNamespace(topology=SimpleNamespace(learners=learners)),
            writer=SimpleNamespace(chunk_len=chunk),
            n_actors=actors,
            learner_consumed=consumed,
            balanced_env_steps=env_steps,
        )
        page = evaluate(
            formula,
            env_steps=env_steps,
            A=actors,
            L=learners,
            learning_starts=learning_starts,
            chunk=chunk,
            consumed=consumed,
            R=R,
            tol=tol,
        )
        assert page == DQNActorRole.ahead_of_learner(actor), (formula, env_steps, actors, learners, consumed, tol)


@pytest.mark.parametrize("restored", [0, 600, 5_000])
def test_the_learners_pause_condition_on_the_page_is_ahead_of_actors(restored):
    formula = formula_after("**A learner pauses**")
    grid = itertools.product(range(0, 40_000, 500), range(0, 6_000, 250), [0.1, 0.25])
    for samples, received, tol in grid:
        R, learning_starts, publish_interval, batch_size = 8.0, 1_000, 50, 64
        learner = SimpleNamespace(
            algo=SimpleNamespace(
                ratio_tolerance=tol, learning_starts=learning_starts, target_replay_ratio=R, batch_size=batch_size
            ),
            buffer=SimpleNamespace(received=received, restored=restored),
            cfg=SimpleNamespace(learner=SimpleNamespace(publish_interval=publish_interval)),
            counters=SimpleNamespace(samples=samples),
        )
        page = evaluate(
            formula,
            samples=samples,
            received=received,
            learning_starts=max(learning_starts - restored, 0),  # "less what a restored replay holds"
            R=R,
            tol=tol,
            publish_interval=publish_interval,
            batch_size=batch_size,
        )
        assert page == DQNLearnerRole.ahead_of_actors(learner), (formula, samples, received, restored, tol)


def test_the_ppo_actors_rollouts_per_version_on_the_page_are_its_credit_per_version():
    formula = formula_after("each new version gives an actor credit for")
    for per_update, actors, learners, reuse, tol in itertools.product([1, 4], [1, 3, 8], [1, 2], [1, 8], [0.1, 0.5]):
        page = evaluate(formula, rollouts_per_update=per_update, A=actors, L=learners, sample_reuse=reuse, tol=tol)
        code = rollouts_per_version(per_update, learners, actors, reuse, tol)
        assert page == code, (formula, per_update, actors, learners, reuse, tol)
