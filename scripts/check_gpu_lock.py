"""Check requirements/gpu.lock with pip's resolver, for the GPU machine, on any Linux x86_64 host.

Run from the repository root::

    python -m scripts.check_gpu_lock            # exit 1 unless the lock resolves to itself
    python -m scripts.check_gpu_lock --write    # re-resolve pyproject's pins and rewrite the lock

The lock is the GPU profile's environment: pyproject's dependencies and its `gpu` extra
(official vLLM, `ray[llm]`, faiss-gpu-cu12) with everything they pull in, fully pinned, for
CPython 3.11 on manylinux x86_64 (glibc 2.31 or newer). The check asks pip to resolve those
same top-level requirements for that target (`--platform`, `--python-version`, `--abi`,
wheels only) with the lock as constraints, in a dry run: nothing is installed, no GPU is
needed, and the wheels are not downloaded (pip reads their metadata: PEP 658 files where
the index serves them, HTTP range requests otherwise). It fails when the resolution is
impossible (the pins contradict one another or pyproject), when it adds a package the lock
does not pin, when the lock pins a package nothing needs, or when a pin is yanked.

pip reads nothing from this machine's pip configuration (find-links, extra indexes,
constraints: a local `torch==2.13.0+cpu` wheel would satisfy `torch==2.13.0`); it asks
`--index-url` (PyPI by default) only. pip evaluates environment markers for the host, so the
host must itself be Linux x86_64. What the check proves and what it does not:
docs/gpu-profile.md, "The GPU install".
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
LOCK = ROOT / "requirements" / "gpu.lock"
PYPROJECT = ROOT / "pyproject.toml"
EXTRA = "gpu"

INDEX_URL = "https://pypi.org/simple"
PYTHON_VERSION = "3.11"
ABI = "cp311"
IMPLEMENTATION = "cp"
# The newest glibc the lock may need: llguidance 1.7 (vLLM 0.29's pin) ships x86_64 wheels
# for manylinux_2_31 only; torch, vLLM and the CUDA libraries need 2.28.
GLIBC_MINOR = 31
PLATFORMS = (
    *(f"manylinux_2_{minor}_x86_64" for minor in range(GLIBC_MINOR, 4, -1)),
    "manylinux2014_x86_64",
    "manylinux2010_x86_64",
    "manylinux1_x86_64",
)
# pip evaluates markers (platform_machine == "x86_64" in vLLM's metadata) for the host.
HOST_MARKERS = {"sys_platform": "linux", "platform_machine": "x86_64"}
# What of the caller's PIP_* environment reaches pip: how to reach the index, not what to
# resolve against.
PIP_ENV_KEPT = frozenset(
    {
        "PIP_CERT",
        "PIP_CLIENT_CERT",
        "PIP_PROXY",
        "PIP_TRUSTED_HOST",
        "PIP_DEFAULT_TIMEOUT",
        "PIP_RETRIES",
        "PIP_CACHE_DIR",
        "PIP_NO_CACHE_DIR",
    }
)

HEADER = f"""\
# GPU profile (pyproject's dependencies + the `{EXTRA}` extra), fully pinned for
# CPython {PYTHON_VERSION} on manylinux x86_64, glibc 2.{GLIBC_MINOR}+, from PyPI.
# Written by pip's resolver (wheels only, dry run, no GPU): python -m scripts.check_gpu_lock --write
# `make gpu-lock-check` (part of `make test`) proves it still resolves to exactly these pins.
# Install on the GPU machine, in a fresh venv, from PyPI alone (an extra index or find-links
# could offer local builds, torch's +cu129 or +cpu, which a `torch==` pin also matches):
#   pip install --only-binary=:all: --index-url https://pypi.org/simple -r requirements/gpu.lock
#   pip install --no-deps -e .
# CUDA: torch and vLLM here are CUDA 13 builds; faiss-gpu-cu12 brings a CUDA 12 runtime
# beside them. What this proves and what it does not: docs/gpu-profile.md.
"""


class LockError(ValueError):
    """The lock file is not a list of exact pins."""


class ResolutionError(RuntimeError):
    """pip could not resolve the requirements (its own words in the message)."""


def read_lock(text: str) -> dict[str, str]:
    """The lock's pins, canonical name to version; every line must be `name==version`."""
    pins: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        try:
            requirement = Requirement(line)
        except InvalidRequirement as error:
            raise LockError(f"line {number}: {raw!r}: {error}") from error
        specifiers = list(requirement.specifier)
        if (
            requirement.extras
            or requirement.marker
            or requirement.url
            or len(specifiers) != 1
            or specifiers[0].operator != "=="
            or "*" in specifiers[0].version
        ):
            raise LockError(f"line {number}: {raw!r} is not an exact pin (name==version)")
        name = canonicalize_name(requirement.name)
        if name in pins:
            raise LockError(f"line {number}: {name} is pinned twice")
        pins[name] = specifiers[0].version
    return pins


def top_level_requirements(pyproject_text: str, extra: str = EXTRA) -> list[str]:
    """pyproject's runtime dependencies and the extra's, as written there."""
    project = tomllib.loads(pyproject_text)["project"]
    return [*project["dependencies"], *project["optional-dependencies"][extra]]


def pip_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The caller's environment without pip's configuration: no config files, and of the
    PIP_* variables only those that say how to reach the index."""
    env = {
        key: value
        for key, value in environ.items()
        if not key.startswith("PIP_") or key in PIP_ENV_KEPT
    }
    env["PIP_CONFIG_FILE"] = os.devnull
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def pip_command(
    python: str,
    requirements: Sequence[str],
    report: Path,
    *,
    constraints: Path | None,
    index_url: str = INDEX_URL,
    fast_deps: bool = True,
) -> list[str]:
    """pip's dry-run resolution of `requirements` for the lock's target, writing `report`."""
    command = [python, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet"]
    command += ["--only-binary=:all:", "--index-url", index_url, "--report", str(report)]
    command += ["--python-version", PYTHON_VERSION, "--implementation", IMPLEMENTATION]
    command += ["--abi", ABI]
    for platform in PLATFORMS:
        command += ["--platform", platform]
    if fast_deps:
        command += ["--use-feature=fast-deps"]
    if constraints is not None:
        command += ["-c", str(constraints)]
    # On the command line, not in a file: pip's conflict messages then name them.
    return [*command, *requirements]


def supports_fast_deps(python: str, env: Mapping[str, str]) -> bool:
    """Whether this pip still has `--use-feature=fast-deps` (metadata by HTTP range requests,
    for an index that serves no PEP 658 metadata files)."""
    probe = [python, "-m", "pip", "install", "--use-feature=fast-deps", "--help"]
    return subprocess.run(probe, env=dict(env), capture_output=True, text=True).returncode == 0


def resolve(
    requirements: Sequence[str],
    *,
    constraints: Path | None,
    python: str = sys.executable,
    index_url: str = INDEX_URL,
    environ: Mapping[str, str] | None = None,
    allow_downloads: bool = False,
) -> dict[str, Any]:
    """pip's installation report for `requirements` on the lock's target (nothing installed;
    nothing downloaded but metadata unless `allow_downloads`)."""
    env = pip_environment(os.environ if environ is None else environ)
    fast_deps = supports_fast_deps(python, env)
    if not fast_deps and not allow_downloads:
        # Without it, from an index that serves no PEP 658 metadata (as reached from here),
        # pip downloads every wheel to read its metadata: several GB of CUDA libraries.
        raise ResolutionError(
            "this pip has no --use-feature=fast-deps, so the dry run would download every "
            "wheel (several GB); pass --allow-downloads to do it anyway"
        )
    with tempfile.TemporaryDirectory(prefix="gpu-lock-") as folder:
        report = Path(folder) / "report.json"
        command = pip_command(
            python,
            requirements,
            report,
            constraints=constraints,
            index_url=index_url,
            fast_deps=fast_deps,
        )
        result = subprocess.run(command, env=env, capture_output=True, text=True)
        if result.returncode != 0:
            tail = "\n".join((result.stderr or result.stdout).strip().splitlines()[-20:])
            raise ResolutionError(f"pip exited {result.returncode}:\n{tail}")
        resolved: dict[str, Any] = json.loads(report.read_text())
        return resolved


def resolved_pins(report: Mapping[str, Any]) -> dict[str, str]:
    """Canonical name to version of everything pip would install."""
    return {
        canonicalize_name(item["metadata"]["name"]): item["metadata"]["version"]
        for item in report["install"]
    }


def compare(lock: Mapping[str, str], resolved: Mapping[str, str]) -> list[str]:
    """What the resolution adds to the lock, changes in it, or leaves of it unused."""
    problems = [
        f"adds {name}=={resolved[name]}: the lock does not pin it"
        for name in sorted(resolved.keys() - lock.keys())
    ]
    problems += [
        f"changes {name}: the lock pins {lock[name]}, pip resolves {resolved[name]}"
        for name in sorted(resolved.keys() & lock.keys())
        if resolved[name] != lock[name]
    ]
    problems += [
        f"unused {name}=={lock[name]}: the lock pins it, nothing requires it"
        for name in sorted(lock.keys() - resolved.keys())
    ]
    return problems


def report_problems(report: Mapping[str, Any]) -> list[str]:
    """A resolution that means nothing for the target (markers evaluated for another host),
    or that picks yanked releases."""
    environment = report.get("environment", {})
    problems = [
        f"pip evaluated markers with {key}={environment.get(key)!r}, not {value!r}: run the "
        "check on a Linux x86_64 host"
        for key, value in HOST_MARKERS.items()
        if environment.get(key) != value
    ]
    problems += [
        f"yanked: {item['metadata']['name']}=={item['metadata']['version']}"
        for item in report["install"]
        if item.get("is_yanked")
    ]
    return problems


@dataclass(frozen=True)
class CudaMix:
    """Which CUDA the resolved packages are built for, by their names and pins."""

    torch_toolkit: str | None  # torch's `cuda-toolkit==` pin (CUDA 13 builds on PyPI)
    runtimes: dict[str, str]  # nvidia-cuda-runtime* distributions and their versions
    by_major: dict[str, list[str]]  # "12" / "13": the -cu12 / -cu13 distributions

    def lines(self) -> list[str]:
        out = [f"torch's CUDA: cuda-toolkit {self.torch_toolkit or 'not pinned by torch'}"]
        out.append(
            "CUDA runtimes: "
            + ", ".join(f"{name} {version}" for name, version in sorted(self.runtimes.items()))
        )
        for major, names in sorted(self.by_major.items()):
            out.append(f"-cu{major} distributions: {', '.join(names)}")
        return out


def cuda_major_of(name: str) -> str | None:
    """ "12" for nixl-cu12, nvidia-cublas-cu12, faiss-gpu-cu12, ...; None for unsuffixed names."""
    for part in reversed(canonicalize_name(name).split("-")):
        if part.startswith("cu") and part[2:].isdigit():
            return part[2:]
    return None


def cuda_mix(pins: Mapping[str, str], torch_requires: Sequence[str] = ()) -> CudaMix:
    """The CUDA majors in a set of pins; `torch_requires` is torch's Requires-Dist."""
    toolkit = None
    for line in torch_requires:
        requirement = Requirement(line)
        if canonicalize_name(requirement.name) == "cuda-toolkit":
            toolkit = str(requirement.specifier)
    by_major: dict[str, list[str]] = {}
    for name in sorted(pins):
        major = cuda_major_of(name)
        if major is not None:
            by_major.setdefault(major, []).append(name)
    runtimes = {
        name: version
        for name, version in pins.items()
        if name == "nvidia-cuda-runtime" or name.startswith("nvidia-cuda-runtime-cu")
    }
    return CudaMix(toolkit, runtimes, by_major)


def torch_requires(report: Mapping[str, Any]) -> list[str]:
    for item in report["install"]:
        if canonicalize_name(item["metadata"]["name"]) == "torch":
            return list(item["metadata"].get("requires_dist", []))
    return []


def render_lock(pins: Mapping[str, str]) -> str:
    return HEADER + "".join(f"{name}=={pins[name]}\n" for name in sorted(pins))


def main(argv: list[str] | None = None) -> int:
    """Check the lock (or, with --write, rewrite it); return the process exit code."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="re-resolve and rewrite the lock")
    parser.add_argument("--lock", type=Path, default=LOCK, help="the lock file")
    parser.add_argument("--index-url", default=INDEX_URL, help="the package index pip asks")
    parser.add_argument(
        "--python", default=sys.executable, help="the interpreter whose pip resolves"
    )
    parser.add_argument(
        "--allow-downloads",
        action="store_true",
        help="where pip cannot read metadata alone, download every wheel (several GB)",
    )
    args = parser.parse_args(argv)
    requirements = top_level_requirements(PYPROJECT.read_text())
    target = f"CPython {PYTHON_VERSION}, manylinux_2_{GLIBC_MINOR} x86_64, {args.index_url}"
    started = time.monotonic()
    try:
        lock = {} if args.write else read_lock(args.lock.read_text())
        report = resolve(
            requirements,
            constraints=None if args.write else args.lock,
            python=args.python,
            index_url=args.index_url,
            allow_downloads=args.allow_downloads,
        )
    except (LockError, ResolutionError, OSError) as error:
        sys.stderr.write(f"{args.lock}: does not resolve for {target}\n{error}\n")
        return 1
    seconds = time.monotonic() - started
    resolved = resolved_pins(report)
    problems = report_problems(report)
    if not args.write:
        problems += compare(lock, resolved)
    elif not problems:
        args.lock.write_text(render_lock(resolved))
        lock = resolved
    if problems:
        sys.stderr.write(f"{args.lock}: pip's resolution for {target} differs from the lock:\n")
        sys.stderr.write("".join(f"  {problem}\n" for problem in problems))
        if not args.write:
            sys.stderr.write("re-resolve with `python -m scripts.check_gpu_lock --write`\n")
        return 1
    outcome = "written" if args.write else "resolves to itself: nothing added, changed or unused"
    print(
        f"{args.lock.relative_to(ROOT) if args.lock.is_relative_to(ROOT) else args.lock}: "
        f"{len(lock)} pins for {target} (pip {report.get('pip_version')}, {seconds:.0f} s), "
        f"{outcome}"
    )
    for line in cuda_mix(resolved, torch_requires(report)).lines():
        print(f"  {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
