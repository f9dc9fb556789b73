"""The peer runners of benchmarks/peers/ (Sample Factory's APPO, stable-baselines3's PPO), their
time-to-target record, the wheels helper that carries them to the GPU machine, and
benchmarks/peers_race.py end to end, on small tasks through the code paths the races take.

A runner runs in its peer's own interpreter: ``$TIANJI_PEER_PYTHON_SF`` / ``$TIANJI_PEER_PYTHON_SB3``,
default the one running the tests. Where that interpreter cannot import the peer, its tests are
skipped, saying how to make one (CI does not install the peers)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import zipfile
from functools import cache
from pathlib import Path

import pytest
from conftest import ROOT

BENCH = ROOT / "benchmarks"
PEERS = BENCH / "peers"
sys.path[:0] = [str(BENCH), str(PEERS)]  # the scripts import their neighbours, as when run
import peers_race  # noqa: E402 - on the path just above
import time_to_target_record as record_module  # noqa: E402
import wheels  # noqa: E402

MAKE = {
    "sf": "python3 -m venv .venv-sf && .venv-sf/bin/pip install torch==2.13.0 sample-factory==2.1.1 gymnasium ale-py",
    "sb3": "python3 -m venv .venv-sb3 && .venv-sb3/bin/pip install torch==2.13.0 stable-baselines3",
}
MODULE = {"sf": "sample_factory", "sb3": "stable_baselines3"}


def peer_python(peer: str) -> str:
    return os.environ.get(f"TIANJI_PEER_PYTHON_{peer.upper()}", sys.executable)


@cache
def importable(peer: str) -> bool:
    python = peer_python(peer)
    if not Path(python).is_file():
        return False
    return subprocess.run([python, "-c", f"import {MODULE[peer]}"], capture_output=True).returncode == 0


def needs(peer: str):
    return pytest.mark.skipif(
        not importable(peer),
        reason=f"{peer_python(peer)} cannot import {MODULE[peer]}: make an environment ({MAKE[peer]}) "
        f"and point TIANJI_PEER_PYTHON_{peer.upper()} at its python",
    )


def run_runner(peer: str, script: str, *args: str, timeout: float = 240) -> dict:
    """The runner's final record; its whole output in the assertion message if it fails."""
    cmd = [peer_python(peer), "-u", str(PEERS / script), *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    assert done.returncode == 0 and lines, f"exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return json.loads(lines[-1])


def check_record(rec: dict) -> None:
    """What every record holds, consistently."""
    assert rec["episodes"] == len(rec["curve"]) > 0
    times = [c[0] for c in rec["curve"]]
    assert times == sorted(times) and times[-1] <= rec["wall_s"]
    assert rec["env_steps"] > 0 and rec["env_steps_per_s"] == pytest.approx(rec["env_steps"] / rec["wall_s"])
    assert rec["return_mean_100"] == pytest.approx(rec["curve"][-1][2])
    if rec["reached"]:
        assert rec["seconds_to_target"] <= rec["wall_s"] and rec["env_steps_to_target"] <= rec["env_steps"]
        assert rec["best_return_mean_100"] >= rec["target"]
    else:
        assert rec["seconds_to_target"] is None and rec["env_steps_to_target"] is None


# --- the record -----------------------------------------------------------------------------------


def test_the_target_counts_only_a_full_window_and_the_first_time_it_is_reached():
    t = record_module.TimeToTarget(0.0, target=10.0, max_seconds=1e9)
    for i in range(99):
        t.episode(50.0, env_steps=i)  # a mean of 50, but under 100 episodes
    assert not t.reached and t.best is None
    t.episode(50.0, env_steps=99)
    assert t.reached and t.env_steps_to_target == 99
    first = t.seconds_to_target
    for i in range(200):
        t.episode(0.0, env_steps=100 + i)
    rec = t.record(env_steps=300)
    assert (rec["seconds_to_target"], rec["env_steps_to_target"], rec["best_return_mean_100"]) == (first, 99, 50.0)
    assert rec["return_mean_100"] == 0.0 and rec["episodes"] == 300 and len(rec["curve"]) == 300


def test_a_missed_target_records_the_best_window_and_the_cap():
    t = record_module.TimeToTarget(0.0, target=18.0, max_seconds=600.0)
    for r in [-21.0] * 50 + [10.0] * 100 + [5.0] * 10:
        t.episode(r, env_steps=1)
    rec = t.record(env_steps=1000, system="x")
    assert rec["reached"] is False and rec["seconds_to_target"] is None
    assert rec["best_return_mean_100"] == 10.0 and rec["max_seconds"] == 600.0 and rec["system"] == "x"


# --- Sample Factory -----------------------------------------------------------------------------


@needs("sf")
def test_sf_appo_reaches_a_small_cartpole_target_with_its_mujoco_settings():
    rec = run_runner("sf", "sf_appo.py", "--env", "CartPole-v1", "--target", "25", "--max-seconds", "60",
                     "--workers", "2", "--device", "cpu")  # fmt: skip
    check_record(rec)
    assert rec["reached"], f"CartPole's 100-episode mean never reached 25: best {rec['best_return_mean_100']}"
    assert rec["settings_name"] == "mujoco" and "mujoco_params.py" in rec["settings_source"]
    assert rec["settings"]["num_workers"] == 2 and rec["settings"]["rollout"] == 64  # the file's, but the workers
    assert rec["sf_env_steps"] == rec["env_steps"] and rec["frames_per_env_step"] == 1 and rec["status"] == 0


@needs("sf")
def test_sf_appo_sizes_synchronous_settings_to_the_workers_as_sample_factory_requires():
    """The published synchronous files are sized for 8 workers; with 16 Sample Factory refuses to
    start unless an iteration trains on a whole number of rollouts: the minibatches double, and
    nothing else of the settings changes (asynchronous settings stay as they are)."""
    code = (
        "import json, sys; sys.path.insert(0, sys.argv[1]); import sf_appo\n"
        "out = {f'{s} {w}': sf_appo.fit_to_workers(sf_appo.published_settings(s), w)\n"
        "       for s in ('atari', 'mujoco', 'atari_faster') for w in (8, 16, 12)}\n"
        "out['published'] = {s: sf_appo.published_settings(s) for s in ('atari', 'mujoco', 'atari_faster')}\n"
        "print(json.dumps(out))"
    )
    cmd = [peer_python("sf"), "-c", code, str(BENCH / "peers")]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    published = got.pop("published")
    for key, fitted in got.items():
        settings, workers = key.split()
        s = published[settings]
        rollout = int(workers) * s["num_envs_per_worker"] * s["rollout"]
        if not s["async_rl"]:
            assert (fitted["batch_size"] * fitted["num_batches_per_epoch"]) % rollout == 0, (key, fitted)
        changed = {k for k in fitted if fitted[k] != s.get(k)}
        assert changed <= {"num_batches_per_epoch"}, (key, changed)
    assert got["atari 8"] == published["atari"] and got["mujoco 8"] == published["mujoco"]
    assert got["atari 16"]["num_batches_per_epoch"] == got["mujoco 16"]["num_batches_per_epoch"] == 8
    assert got["atari_faster 16"] == published["atari_faster"]


@needs("sf")
def test_sf_appo_stops_at_its_budget_of_env_steps_on_pendulum():
    rec = run_runner("sf", "sf_appo.py", "--env", "Pendulum-v1", "--max-env-steps", "4096", "--max-seconds", "90",
                     "--workers", "2", "--device", "cpu")  # fmt: skip
    check_record(rec)
    assert rec["env_steps"] >= 4096 and rec["wall_s"] < 90
    assert rec["target"] is None and rec["reached"] is False
    assert all(-2000 < c[2] <= 0 for c in rec["curve"])  # Pendulum's returns: whole 200-step episodes


@needs("sf")
@pytest.mark.slow
def test_sf_appo_plays_pong_with_its_atari_settings_and_counts_env_steps_as_tianji_dask():
    """The Pong race's code path: SF's Atari envs (gymnasium 1's wrappers, ale-py's ids), full-game
    returns from RecordEpisodeStatistics, Sample Factory's frames divided back into policy steps."""
    rec = run_runner("sf", "sf_appo.py", "--env", "atari_pong", "--target", "18", "--max-seconds", "40",
                     "--workers", "2", "--device", "cpu")  # fmt: skip
    check_record(rec)
    assert rec["settings_name"] == "atari" and rec["settings"]["env_frameskip"] == 4
    assert rec["frames_per_env_step"] == 4 and rec["sf_env_steps"] == 4 * rec["env_steps"]
    assert all(-21 <= c[2] <= 21 for c in rec["curve"]), "not full-game Pong returns"
    assert not rec["reached"]


@needs("sf")
def test_sf_appo_refuses_an_env_it_cannot_make_before_it_starts():
    cmd = [peer_python("sf"), str(PEERS / "sf_appo.py"), "--env", "NoSuchEnv-v0", "--device", "cpu"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--env NoSuchEnv-v0: the env cannot be made here" in done.stderr


# --- stable-baselines3 --------------------------------------------------------------------------


@needs("sb3")
def test_sb3_ppo_records_pendulum_as_the_other_runners():
    rec = run_runner("sb3", "ppo_sb3.py", "--env", "Pendulum-v1", "--target", "-1500", "--max-seconds", "30",
                     "--threads", "1")  # fmt: skip
    check_record(rec)
    assert rec["reached"] and rec["hyperparameters"]["n_steps"] == 1024


@needs("sb3")
@pytest.mark.slow
def test_sb3_ppo_plays_pong_with_the_zoos_atari_entry():
    rec = run_runner("sb3", "ppo_sb3.py", "--env", "PongNoFrameskip-v4", "--target", "18", "--max-seconds", "30",
                     "--threads", "2")  # fmt: skip
    check_record(rec)
    assert rec["hyperparameters"]["learning_rate"] == "lin_0.00025" and rec["hyperparameters"]["n_envs"] == 8
    assert all(-21 <= c[2] <= 21 for c in rec["curve"]), "not full-game Pong returns"


# --- wheels.py ----------------------------------------------------------------------------------


def fake_wheel(folder: Path, name: str, version: str, requires: list[str], size: int = 0) -> Path:
    """A pure-Python wheel pip installs: one module ``<name>_mod.py`` (padded to ``size`` bytes)."""
    dist = f"{name.replace('-', '_')}-{version}"
    module = f"{name.replace('-', '_')}_mod.py"
    path = folder / f"{dist}-py3-none-any.whl"
    meta = "".join(f"Requires-Dist: {r}\n" for r in requires)
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(module, "X = 1\n" + "#" * size)
        z.writestr(f"{dist}.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n{meta}")
        z.writestr(
            f"{dist}.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        z.writestr(f"{dist}.dist-info/RECORD", "")
    return path


def test_wheels_follows_requirements_leaves_what_is_there_and_splits_and_joins_a_large_file(tmp_path, monkeypatch):
    index = tmp_path / "index"
    index.mkdir()
    fake_wheel(index, "peerpkg", "1.0", ["helper>=2", "numpy<2.0", "gymnasium", "unused", "extra-dep; extra == 'x'"])
    big = fake_wheel(index, "helper", "2.1", ["tiny", "win-only; sys_platform == 'win32'"], size=3 << 20)
    fake_wheel(index, "tiny", "0.1", [])
    fake_wheel(index, "extra-dep", "1.0", [])
    monkeypatch.setattr(wheels, "PEERS", {"fake": wheels.Peer(("peerpkg[x]",), {"unused": "never imported"})})
    dest = tmp_path / "whl"
    argv = ["fake", "--dest", str(dest), "--split-mib", "1", "--call-mib", "2.5", "--pip-arg=--no-index"]
    assert wheels.main([*argv, f"--pip-arg=--find-links={index}"]) == 0

    manifest = json.loads((dest / "wheels.json").read_text())
    files = [f for c in manifest["calls"] for f in c["files"]]
    parts = sorted(f for f in files if f.startswith(big.name))
    assert parts == [f"{big.name}.part-0{i}" for i in range(4)]  # 3 MiB and a little, in parts of 1 MiB
    assert {f for f in files if ".part-" not in f} == {
        "peerpkg-1.0-py3-none-any.whl",
        "tiny-0.1-py3-none-any.whl",
        "extra_dep-1.0-py3-none-any.whl",
    }
    assert all(c["mib"] <= 2.5 for c in manifest["calls"]) and len(manifest["calls"]) == 2
    assert "numpy" in manifest["met_by_the_machine"] and "gymnasium" in manifest["met_by_tianji_dask_wheels"]
    assert manifest["skipped"] == {"unused": "never imported"}
    assert manifest["unmet_versions"] == ["peerpkg-1.0-py3-none-any.whl needs numpy<2.0; the machine has numpy 2.5.2"]

    machine = tmp_path / "gpu-whl"  # on the machine: every call's folder copied into one
    machine.mkdir()
    for c in manifest["calls"][:1]:
        for f in (dest / c["folder"]).iterdir():
            (machine / f.name).write_bytes(f.read_bytes())
    bin_dir = tmp_path / "bin"  # install.sh runs python3: this interpreter, which has pip
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(sys.executable)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    target = tmp_path / "site"
    half = subprocess.run(["sh", str(machine / "install.sh"), str(target)], capture_output=True, text=True, env=env)
    assert half.returncode == 2 and "missing in" in half.stderr and "copy every call's folder" in half.stderr
    for f in (dest / manifest["calls"][1]["folder"]).iterdir():
        (machine / f.name).write_bytes(f.read_bytes())
    done = subprocess.run(["sh", str(machine / "install.sh"), str(target)], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    assert (machine / big.name).read_bytes() == big.read_bytes()  # joined whole
    assert {"peerpkg_mod.py", "helper_mod.py", "tiny_mod.py", "extra_dep_mod.py"} <= {p.name for p in target.iterdir()}


def test_wheels_refuses_a_part_larger_than_a_call_and_a_folder_in_use(tmp_path, capsys):
    with pytest.raises(SystemExit):
        wheels.main(["sf", "--dest", str(tmp_path / "a"), "--split-mib", "60", "--call-mib", "56"])
    assert "a part must fit one call" in capsys.readouterr().err
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "x").write_text("")
    with pytest.raises(SystemExit):
        wheels.main(["sf", "--dest", str(tmp_path / "b")])
    assert "not empty" in capsys.readouterr().err


# --- peers_race.py ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv, said",
    [
        (["pong"], "give at least one --peer: sb3, sf race pong"),
        (["pong", "--peer", "nope"], "--peer nope: 'nope' is not one of sb3, sf"),
        (["cartpole", "--peer", "sf=/nowhere/bin/python"], "--peer sf: interpreter /nowhere/bin/python not found"),
        (["cartpole", "--peer", "sf", "--peer-arg", "sb3=--x"], "--peer-arg sb3=--x: 'sb3' is not one of sf"),
    ],
)
def test_the_race_refuses_bad_peers_before_any_run(argv, said, tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        peers_race.main([*argv, "--out", str(tmp_path)])
    assert stop.value.code == 2 and said in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_a_peer_killed_in_its_shutdown_keeps_the_record_it_printed_as_it_stopped(tmp_path):
    rec = record_module.TimeToTarget(0.0, target=None, max_seconds=1.0).record(env_steps=10)
    rec["curve"] = [[0.5, 10, -1.0]]
    hangs = tmp_path / "hangs.py"
    hangs.write_text(f"import json, time\nprint(json.dumps({rec!r}), flush=True)\ntime.sleep(600)\n")
    t0 = time.monotonic()
    row = peers_race.run_peer("sf", [sys.executable, str(hangs)], 3, tmp_path / "sf.log", timeout=3.0)
    assert time.monotonic() - t0 < 30
    assert row["killed"] == "still running 3 s after its start: killed" and "error" not in row
    assert (row["seed"], row["env_steps"], row["curve"]["return"]) == (3, 10, [-1.0])
    silent = tmp_path / "silent.py"
    silent.write_text("import time\ntime.sleep(600)\n")
    row = peers_race.run_peer("sf", [sys.executable, str(silent)], 3, tmp_path / "sf2.log", timeout=2.0)
    assert row == {"system": "sf", "seed": 3, "error": "still running 2 s after its start: killed"}


@needs("sf")
@pytest.mark.slow
@pytest.mark.integration
def test_a_cartpole_race_of_tianji_dask_and_sf_writes_its_json_netcdf_and_plot(tmp_path, monkeypatch):
    import xarray as xr

    monkeypatch.setenv("TIANJI_PEER_PYTHON_SF", peer_python("sf"))
    monkeypatch.chdir(ROOT)
    argv = ["cartpole", "--peer", "sf", "--seeds", "0", "--target", "30", "--max-seconds", "90", "--workers", "2"]
    rc = peers_race.main([*argv, "--dir", str(tmp_path / "race")])
    race = tmp_path / "race"
    saved = json.loads((race / "peers.json").read_text())
    assert rc == 0, saved["runs"]
    summary = saved["summary"]
    for system in ("tianji", "sf"):
        assert summary[system]["runs"] == 1 and summary[system]["reached"] == 1, summary[system]
        assert 0 < summary[system]["median_time_to_target_s"] <= 90
    assert "mujoco_params.py" in summary["sf"]["settings_source"]
    assert summary["fastest_peer"] == "sf"
    ratio = summary["tianji"]["median_time_to_target_s"] / summary["sf"]["median_time_to_target_s"]
    assert summary["ratio_median_time_to_target_s_to_fastest_peer"] == pytest.approx(ratio)
    assert [(r["system"], r["seed"]) for r in saved["runs"]] == [("tianji", 0), ("sf", 0)]
    with xr.open_dataset(race / "peers.nc", engine="netcdf4") as ds:
        assert list(ds.system.values) == ["tianji", "sf"] and list(ds.seed.values) == [0]
        for name in [*ds.data_vars, *ds.coords]:
            assert {"long_name", "units"} <= set(ds[name].attrs), name
        assert float(ds.time_to_target_s.sel(system="sf", seed=0)) == pytest.approx(
            summary["sf"]["median_time_to_target_s"]
        )
    png = (race / "return.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 10_000

    # a second call adds a seed (its runs stand-ins here): the first one's runs are kept, the order alternates
    monkeypatch.setattr(peers_race, "run_tianji", lambda seed, *_: {"system": "tianji", "seed": seed, "error": "-"})
    monkeypatch.setattr(
        peers_race, "run_peer", lambda name, cmd, seed, *_: {"system": name, "seed": seed, "error": "-"}
    )
    with pytest.raises(SystemExit, match="holds a race already: add --continue"):
        peers_race.main([*argv, "--dir", str(race)])
    peers_race.main([*argv[:4], "1", *argv[5:], "--dir", str(race), "--continue"])
    runs = json.loads((race / "peers.json").read_text())["runs"]
    assert [(r["system"], r["seed"]) for r in runs] == [("tianji", 0), ("sf", 0), ("sf", 1), ("tianji", 1)]
