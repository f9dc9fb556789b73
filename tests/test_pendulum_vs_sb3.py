"""benchmarks/pendulum_vs_sb3.py finds stable-baselines3's interpreter by argument, by
TIANJI_SB3_PYTHON, or in the checkout's .venv-sb3, and says how to make one before any run."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from conftest import script_module

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "pendulum_vs_sb3.py"
sys.path.append(str(SCRIPT.parent))  # the script imports vs_single beside it, as when run
pendulum_vs_sb3 = script_module(SCRIPT)


@pytest.mark.parametrize("how", ["variable", "argument"])
def test_a_missing_sb3_interpreter_is_refused_with_the_commands_that_make_one(how, tmp_path, monkeypatch, capsys):
    missing = tmp_path / "nowhere" / "bin" / "python"
    args = ["--seeds", "0", "--out", str(tmp_path / "out")]
    if how == "variable":
        monkeypatch.setenv("TIANJI_SB3_PYTHON", str(missing))
    else:
        monkeypatch.delenv("TIANJI_SB3_PYTHON", raising=False)
        args += ["--sb3-python", str(missing)]
    with pytest.raises(SystemExit) as stop:
        pendulum_vs_sb3.main(args)
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert f"--sb3-python {missing}: not found" in err
    assert "python3 -m venv .venv-sb3 && .venv-sb3/bin/pip install torch==2.13.0 stable-baselines3" in err
    assert not (tmp_path / "out").exists()  # refused before anything is written


def test_the_default_interpreter_is_the_checkouts_venv_sb3(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("TIANJI_SB3_PYTHON", raising=False)
    monkeypatch.setattr(pendulum_vs_sb3, "ROOT", tmp_path)  # a checkout without .venv-sb3
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "pendulum_ppo.yaml").write_text("")
    with pytest.raises(SystemExit):
        pendulum_vs_sb3.main(["--seeds", "0", "--out", str(tmp_path / "out")])
    assert f"--sb3-python {tmp_path / '.venv-sb3' / 'bin' / 'python'}: not found" in capsys.readouterr().err
