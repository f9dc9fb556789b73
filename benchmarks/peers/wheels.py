"""A peer's wheels for the GPU machine, which has Python 3.12 and no network: the peer and every
package it needs that the machine lacks, as cp312 manylinux x86_64 wheels, in folders of at most
one device call's share, with the script that installs them there.

    python benchmarks/peers/wheels.py sf --dest .whl-sf
    python benchmarks/peers/wheels.py rllib --dest .whl-rllib --split-mib 28 --call-mib 56

What the machine has is :data:`THERE` (the device docs' KINDS.md, "Python packages already
there"); what tianji-dask's own wheels bring (docs/benchmarks.md, "On the GPU machine") is
:data:`WITH_TIANJI`, left out unless ``--self-contained``. Each peer's :data:`PEERS` entry names its
roots and the dependencies it declares but never imports in a training run, left out with the
reason. Starting from the roots, each wheel is fetched with ``pip download --no-deps`` for cp312 on
manylinux x86_64 and its ``Requires-Dist`` (markers evaluated for that interpreter and the extras
asked for) followed. A package with no such wheel is fetched as its sdist with the wheels of its
``[build-system] requires`` that the machine lacks, and ``install.sh`` builds it there first (pip
wheel, no build isolation: the machine has setuptools, cython, a compiler). A file over
``--split-mib`` travels as ``split -b`` parts (``NAME.part-00``, ``-01``, ...) that ``install.sh``
joins with ``cat``.

Writes into ``--dest``: ``call-1/``, ``call-2/``, ... (each at most ``--call-mib``; each also holds
``install.sh``) and ``wheels.json`` (every file, its size and call, every requirement met by the
machine, by tianji-dask's wheels or skipped, and the requirements whose version the machine's
package does not meet, e.g. sample-factory's numpy<2.0 against the machine's 2.5: those are the
runner's to patch). On the machine, after every call's folder has been copied into one directory:
``sh DIR/install.sh [TARGET]`` (TARGET: /tmp/site), which refuses to start while a file is missing.
"""

from __future__ import annotations

import argparse
import email.parser
import json
import re
import shutil
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

MIB = 1 << 20

#: the device image's packages (KINDS.md, "Python packages already there", read 2026-11-17)
THERE_NAMES = """absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch
    build certifi charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings
    cuda-core cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet
    filelock flatbuffers flax fonttools formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx
    huggingface-hub humanize hypothesis idna imageio iniconfig interface-meta jax jax-cuda13-pjrt
    jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib kiwisolver lazy-loader lightning lightning-utilities
    linear-operator lineax llvmlite lxml markdown markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes
    mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind narwhals networkx ninja numba
    numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime
    nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse
    nvidia-cusparselt-cu13 nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx
    onnx-ir onnxruntime onnxscript opencv-python-headless optax opt-einsum opt-einsum-fx optimistix
    orbax-checkpoint packaging pandas pathspec patsy peft pillow pip pluggy portalocker prometheus-client
    propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments pyparsing pyproject-hooks pyre-extensions
    pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist python-dateutil
    pytorch-lightning pyyaml regex requests rich sacrebleu safetensors scikit-build-core scikit-image
    scikit-learn scipy seaborn sentencepiece sentence-transformers setuptools shellingham simplejson six
    sortedcontainers statsmodels sympy tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl
    tifffile tiktoken timm tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics
    torchvision tqdm transformers treescope triton typer typing-extensions typing-inspect urllib3 uvloop
    wadler-lindig werkzeug wheel wrapt xarray xxhash yarl zipp"""
THERE = frozenset(canonicalize_name(n) for n in THERE_NAMES.split())
#: versions of some of them, from KINDS.md's pip list row
THERE_VERSIONS = {"numpy": "2.5.2", "torch": "2.11.0", "huggingface-hub": "1.33.0", "triton": "3.6.0", "jax": "0.11.2"}
#: what tianji-dask's wheels bring (docs/benchmarks.md, "On the GPU machine", with MuJoCo)
WITH_TIANJI_NAMES = """ale-py dask distributed dask-jobqueue gymnasium farama-notifications netcdf4 cftime certifi
    pydantic pydantic-core annotated-types typing-inspection tornado tblib zict locket partd h5netcdf
    mujoco mujoco-core mujoco-studio glfw pyopengl"""
WITH_TIANJI = frozenset(canonicalize_name(n) for n in WITH_TIANJI_NAMES.split())


@dataclass(frozen=True)
class Peer:
    roots: tuple[str, ...]
    #: declared but not imported in a training run -> why it stays behind
    skip: dict[str, str] = field(default_factory=dict)


PEERS = {
    "sf": Peer(
        ("sample-factory==2.1.1",),
        {
            "wandb": "imported only with --with_wandb (sample_factory/utils/wandb_utils.py)",
            "pyglet": "declared 'gym dependency', imported nowhere in sample_factory",
            "opencv-python": "cv2 comes from the machine's opencv-python-headless",
        },
    ),
    "sb3": Peer(("stable-baselines3",)),
    "rllib": Peer(("ray[rllib]",)),
}

MANYLINUX = ("2_17", "2_24", "2_27", "2_28", "2_31", "2_34", "2_35")
PLATFORMS = [f"manylinux_{n}_x86_64" for n in MANYLINUX] + ["manylinux2014_x86_64", "manylinux1_x86_64"]
#: the machine's interpreter, for requirement markers
MARKERS = {
    "python_version": "3.12",
    "python_full_version": "3.12.3",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "os_name": "posix",
}


def binary_args() -> list[str]:
    args = ["--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp", "--abi", "cp312"]
    for platform in PLATFORMS:
        args += ["--platform", platform]
    return args


def pip_download(spec: str, dest: Path, pip_args: list[str]) -> Path | None:
    """The cp312 wheel of ``spec`` fetched into ``dest``, else its sdist; None if neither exists
    (pip's last words printed)."""
    name = canonicalize_name(Requirement(spec).name)
    said = ""
    for how in (binary_args(), ["--no-binary=:all:"]):
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", *how, *pip_args, "-d", str(dest), spec]
        done = subprocess.run(cmd, capture_output=True, text=True)
        found = [p for p in dest.iterdir() if dist_name(p) == name]
        if done.returncode == 0 and found:
            return max(found, key=lambda p: p.stat().st_mtime)
        said = done.stderr.strip().splitlines()[-1:] or [f"exit {done.returncode}, nothing saved"]
    print(f"wheels.py: {spec}: {said[0]}", file=sys.stderr)
    return None


def dist_name(path: Path) -> str:
    """The canonical project name of a wheel or sdist file name."""
    stem = path.name.split(".part-")[0]
    m = re.match(r"(.+?)-\d", stem)
    return canonicalize_name(m.group(1) if m else stem)


def dist_version(path: Path) -> Version:
    m = re.match(r".+?-(\d[^-]*?)(?:-|\.tar\.gz$|\.zip$)", path.name)
    if m is None:
        raise ValueError(f"{path.name}: no version in the file name")
    return Version(m.group(1))


def metadata(path: Path) -> email.message.Message:
    """A wheel's METADATA, or an sdist's PKG-INFO."""
    if path.suffix == ".whl":
        with zipfile.ZipFile(path) as z:
            name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
            text = z.read(name).decode()
    else:
        with tarfile.open(path) as t:
            member = min((m for m in t.getmembers() if m.name.endswith("/PKG-INFO")), key=lambda m: m.name.count("/"))
            text = t.extractfile(member).read().decode()  # type: ignore[union-attr]
    return email.parser.Parser().parsestr(text)


def requirements(path: Path, extras: set[str]) -> list[Requirement]:
    """The ``Requires-Dist`` of a distribution that apply on the machine with ``extras``."""
    out = []
    for line in metadata(path).get_all("Requires-Dist") or []:
        req = Requirement(line)
        if req.marker is None or any(req.marker.evaluate({**MARKERS, "extra": e}) for e in extras | {""}):
            out.append(req)
    return out


def build_requirements(sdist: Path) -> list[Requirement]:
    """An sdist's ``[build-system] requires`` (setuptools and wheel where it names none)."""
    with tarfile.open(sdist) as t:
        tops = [m for m in t.getmembers() if m.name.count("/") == 1 and m.name.endswith("/pyproject.toml")]
        if not tops:
            return [Requirement("setuptools"), Requirement("wheel")]
        data = tomllib.loads(t.extractfile(tops[0]).read().decode())  # type: ignore[union-attr]
    return [Requirement(r) for r in data.get("build-system", {}).get("requires", ["setuptools", "wheel"])]


@dataclass
class Fetched:
    files: dict[str, Path] = field(default_factory=dict)  # canonical name -> wheel or sdist
    extras: dict[str, set[str]] = field(default_factory=dict)
    there: dict[str, list[str]] = field(default_factory=dict)  # name -> the requirements it meets
    with_tianji: dict[str, list[str]] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    build_there: list[str] = field(default_factory=list)  # sdists install.sh builds
    unmet: list[str] = field(default_factory=list)  # requirements the file or the machine does not meet
    missing: list[str] = field(default_factory=list)  # no wheel, no sdist


def fetch_closure(peer: Peer, dest: Path, pip_args: list[str], self_contained: bool) -> Fetched:
    """Every file ``peer`` needs on the machine, its roots and their requirements, into ``dest``."""
    got = Fetched()
    todo = [(Requirement(r), "(root)") for r in peer.roots]
    while todo:
        req, parent = todo.pop(0)
        name = canonicalize_name(req.name)
        said = f"{parent} needs {req}"
        if name in THERE:
            got.there.setdefault(name, []).append(said)
            have = THERE_VERSIONS.get(name)
            if have and req.specifier and not req.specifier.contains(have, prereleases=True):
                got.unmet.append(f"{said}; the machine has {name} {have}")
            continue
        if name in WITH_TIANJI and not self_contained:
            got.with_tianji.setdefault(name, []).append(said)
            continue
        if name in peer.skip:
            got.skipped[name] = peer.skip[name]
            continue
        new_extras = set(req.extras) - got.extras.get(name, set())
        if name in got.files:
            if req.specifier and not req.specifier.contains(dist_version(got.files[name]), prereleases=True):
                got.unmet.append(f"{said}; fetched {got.files[name].name}")
            if not new_extras:
                continue
        else:
            bare = Requirement(str(req))
            bare.marker = None  # evaluated above for the machine; pip would evaluate it for this one
            path = pip_download(str(bare), dest, pip_args)
            if path is None:
                got.missing.append(said)
                continue
            got.files[name] = path
            if path.suffix != ".whl":
                got.build_there.append(path.name)
                todo += [(r, f"building {path.name}") for r in build_requirements(path)]
        got.extras[name] = got.extras.get(name, set()) | set(req.extras)
        todo += [(r, got.files[name].name) for r in requirements(got.files[name], got.extras[name])]
    return got


def split_file(path: Path, part_bytes: int) -> list[Path]:
    """``path`` as ``split -b part_bytes -d`` parts ``NAME.part-00``, ``-01``, ... (the file removed);
    a file that fits is left whole. ``cat NAME.part-* > NAME`` joins them."""
    if path.stat().st_size <= part_bytes:
        return [path]
    parts = []
    with path.open("rb") as f:
        while chunk := f.read(part_bytes):
            part = path.with_name(f"{path.name}.part-{len(parts):02d}")
            part.write_bytes(chunk)
            parts.append(part)
    path.unlink()
    return parts


def assign_calls(files: list[Path], call_bytes: int) -> list[list[Path]]:
    """The files in calls of at most ``call_bytes`` each, largest first into the first with room."""
    calls: list[list[Path]] = []
    room: list[int] = []
    for f in sorted(files, key=lambda p: -p.stat().st_size):
        size = f.stat().st_size
        if size > call_bytes:
            raise ValueError(f"{f.name} is {size / MIB:.1f} MiB, over one call's {call_bytes / MIB:.1f}")
        i = next((i for i, r in enumerate(room) if r >= size), None)
        if i is None:
            calls.append([])
            room.append(call_bytes)
            i = len(calls) - 1
        calls[i].append(f)
        room[i] -= size
    return calls


INSTALL = """#!/bin/sh
# Installs {peer}'s wheels into TARGET (default /tmp/site) on the GPU machine, from the directory this
# script is in, once every call's folder has been copied into it (wheels.py wrote it; wheels.json there).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
target=${{1:-/tmp/site}}
missing=""
has() {{ [ -e "$here/$1" ] || missing="$missing $1"; }}
{checks}
if [ -n "$missing" ]; then
    echo "install.sh: missing in $here:$missing (copy every call's folder here first)" >&2
    exit 2
fi
{join}
export PYTHONPATH="$target${{PYTHONPATH:+:$PYTHONPATH}}"
{build}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$target" "$here"/*.whl
echo "install.sh: {peer}'s wheels installed into $target"
"""


def install_script(peer: str, files: list[Path], build_there: list[str]) -> str:
    """install.sh for ``files`` (parts ``NAME.part-NN`` of a split file joined there, a file
    joined already counting as its parts) and the sdists it builds first."""
    parts: dict[str, list[str]] = {}
    for f in files:
        whole = f.name.split(".part-")[0]
        parts.setdefault(whole, []).append(f.name)
    checks, join = [], []
    for whole, names in sorted(parts.items()):
        if names == [whole]:
            checks.append(f"has {whole}")
            continue
        checks.append(f'[ -e "$here/{whole}" ] || {{ {"; ".join(f"has {n}" for n in sorted(names))}; }}')
        cat = f'cat "$here/{whole}".part-* > "$here/{whole}" && rm "$here/{whole}".part-*'
        join.append(f'[ -e "$here/{whole}" ] || {{ {cat}; }}')
    build = ""
    if build_there:  # its build requirements' wheels first, where the build can import them
        sdists = " ".join(f'"$here/{s}"' for s in build_there)
        build = (
            'python3 -m pip install -q --no-index --no-deps --no-cache-dir --upgrade --target "$target" "$here"/*.whl\n'
            f'python3 -m pip wheel -q --no-index --no-deps --no-build-isolation -w "$here" {sdists}'
        )
    return INSTALL.format(peer=peer, checks="\n".join(checks), join="\n".join(join), build=build)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("peer", choices=sorted(PEERS))
    p.add_argument("--dest", type=Path, required=True, help="a new or empty folder (e.g. .whl-sf, git-ignored)")
    p.add_argument("--split-mib", type=float, default=40.0, help="split files larger than this (MiB)")
    p.add_argument("--call-mib", type=float, default=56.0, help="one device call's share for wheels (MiB)")
    p.add_argument("--self-contained", action="store_true", help="also the packages tianji-dask's wheels bring")
    p.add_argument("--pip-arg", action="append", default=[], help="one more argument for pip download")
    args = p.parse_args(argv)
    if args.split_mib > args.call_mib:
        p.error(f"--split-mib {args.split_mib} over --call-mib {args.call_mib}: a part must fit one call")
    if args.dest.exists() and any(args.dest.iterdir()):
        p.error(f"--dest {args.dest}: not empty; give a new folder or remove it")
    staging = args.dest / "fetched"
    staging.mkdir(parents=True)
    got = fetch_closure(PEERS[args.peer], staging, args.pip_arg, args.self_contained)
    if got.missing:
        p.exit(1, "wheels.py: neither a cp312 wheel nor an sdist for: " + "; ".join(got.missing) + "\n")
    files, whole_split = [], []
    for path in sorted(got.files.values()):
        parts = split_file(path, int(args.split_mib * MIB))
        files += parts
        if len(parts) > 1:
            whole_split.append(path.name)
    calls = assign_calls(files, int(args.call_mib * MIB))
    script = install_script(args.peer, files, got.build_there)
    manifest: dict = {"peer": args.peer, "roots": list(PEERS[args.peer].roots), "calls": []}
    for i, call in enumerate(calls, start=1):
        folder = args.dest / f"call-{i}"
        folder.mkdir()
        for f in call:
            shutil.move(f, folder / f.name)
        (folder / "install.sh").write_text(script)
        size = sum((folder / f.name).stat().st_size for f in call)
        manifest["calls"].append({"folder": folder.name, "mib": round(size / MIB, 2), "files": [f.name for f in call]})
    staging.rmdir()
    manifest |= {
        "total_mib": round(sum(c["mib"] for c in manifest["calls"]), 2),
        "joined_on_the_machine": whole_split,
        "built_on_the_machine": got.build_there,
        "met_by_the_machine": got.there,
        "met_by_tianji_dask_wheels": got.with_tianji,
        "skipped": got.skipped,
        "unmet_versions": got.unmet,
    }
    (args.dest / "wheels.json").write_text(json.dumps(manifest, indent=2))
    for c in manifest["calls"]:
        print(f"{args.dest / c['folder']}: {c['mib']:.1f} MiB, {len(c['files'])} files")
    print(f"total {manifest['total_mib']:.1f} MiB; built there: {got.build_there or 'none'}")
    for line in got.unmet:
        print(f"version not met: {line}")
    for said in got.with_tianji.values():
        for line in said:
            if Requirement(line.rsplit(" needs ", 1)[1]).specifier:
                print(f"check against tianji-dask's wheels: {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
