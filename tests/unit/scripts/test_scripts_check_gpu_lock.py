"""scripts/check_gpu_lock.py and requirements/gpu.lock, without the network: the lock is exact
pins in the form the script writes, agrees with pyproject's pins, holds the CUDA mix
docs/gpu-profile.md describes, and the check's comparison and pip command do what they say.
The resolution itself needs PyPI: `make gpu-lock-check`.
"""

from __future__ import annotations

import itertools
import os
import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from scripts import check_gpu_lock as gl

LOCK_TEXT = gl.LOCK.read_text()
PINS = gl.read_lock(LOCK_TEXT)
DOC = gl.ROOT / "docs" / "gpu-profile.md"
# The lock's CUDA 12 distributions beside torch's CUDA 13, and who brings each (pip's
# resolution): faiss-gpu-cu12 and its runtime and cuBLAS (cuBLAS brings NVRTC); nixl 1.3.2,
# which ray[llm] pins, requires both nixl-cu12 and nixl-cu13 and imports the one that
# matches torch's CUDA; nvidia-cutlass-dsl 4.6.2 requires its cu12 libraries whatever the extra.
CUDA12 = [
    "faiss-gpu-cu12",
    "nixl-cu12",
    "nvidia-cublas-cu12",
    "nvidia-cuda-nvrtc-cu12",
    "nvidia-cuda-runtime-cu12",
    "nvidia-cutlass-dsl-libs-cu12",
]


def _section(text: str, title: str) -> str:
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    assert match, f"no section {title!r}"
    return match.group(1)


# --- the committed lock ------------------------------------------------------------------------


def test_the_lock_is_what_the_script_writes_from_its_pins():
    assert gl.render_lock(PINS) == LOCK_TEXT
    assert len(PINS) > 200


def test_no_pin_is_a_local_build():
    # torch==2.13.0 would also take 2.13.0+cpu or +cu129 from another index; the lock is PyPI's.
    assert [f"{name}=={v}" for name, v in PINS.items() if "+" in v] == []


def test_pyproject_and_the_lock_agree():
    requirements = [
        Requirement(line) for line in gl.top_level_requirements(gl.PYPROJECT.read_text())
    ]
    for requirement in requirements:
        name = canonicalize_name(requirement.name)
        assert name in PINS, f"{requirement} is not in the lock"
        assert requirement.specifier.contains(PINS[name], prereleases=True), (
            f"pyproject asks {requirement}, the lock pins {name}=={PINS[name]}"
        )
    extra = tomllib.loads(gl.PYPROJECT.read_text())["project"]["optional-dependencies"]["gpu"]
    gpu = {canonicalize_name(r.name): r for r in map(Requirement, extra)}
    assert set(gpu) == {"ray", "vllm", "faiss-gpu-cu12"}
    for name, requirement in gpu.items():
        (specifier,) = requirement.specifier
        assert specifier.operator == "==", f"the gpu extra leaves {name} unpinned"
        assert specifier.version == PINS[name]


def test_the_cuda_mix_is_the_documented_one():
    mix = gl.cuda_mix(PINS)
    assert mix.by_major["12"] == CUDA12
    assert set(mix.by_major) == {"12", "13"}
    assert PINS["cuda-toolkit"].startswith("13.")  # torch's CUDA, by its cuda-toolkit pin
    assert mix.runtimes["nvidia-cuda-runtime"].startswith("13.")
    assert mix.runtimes["nvidia-cuda-runtime-cu12"].startswith("12.")
    install = " ".join(_section(DOC.read_text(), "The GPU install").split())
    for name in [*CUDA12, "nixl-cu13"]:
        assert f"`{name}`" in install, f"docs/gpu-profile.md does not say why {name} is there"
    for name in ("torch", "vllm", "ray", "faiss-gpu-cu12", "cuda-toolkit"):
        assert f"{name} {PINS[name]}" in install, f"the doc's {name} is not the lock's"


# --- reading a lock ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "numpy>=2\n",
        "ray[llm]==2.60.0\n",
        "numpy==2.*\n",
        "numpy==2.3.5\nNumPy==2.3.5\n",
        "torch==2.13.0; sys_platform == 'linux'\n",
        "torch == \n",
    ],
)
def test_read_lock_takes_exact_pins_only(text):
    with pytest.raises(gl.LockError):
        gl.read_lock(text)


def test_read_lock_skips_comments_and_canonicalizes():
    assert gl.read_lock("# header\n\nPyYAML==6.0.4  # why\ndocstring_parser==0.18.0\n") == {
        "pyyaml": "6.0.4",
        "docstring-parser": "0.18.0",
    }


# --- the comparison ----------------------------------------------------------------------------


def test_compare_names_what_was_added_changed_and_left_unused():
    lock = {"torch": "2.13.0", "numpy": "2.3.5", "tomli": "2.0.1"}
    resolved = {"torch": "2.13.0+cpu", "numpy": "2.3.5", "six": "1.17.0"}
    assert gl.compare(lock, resolved) == [
        "adds six==1.17.0: the lock does not pin it",
        "changes torch: the lock pins 2.13.0, pip resolves 2.13.0+cpu",
        "unused tomli==2.0.1: the lock pins it, nothing requires it",
    ]
    assert gl.compare(lock, dict(lock)) == []


def _item(name, version, **extra):
    return {"metadata": {"name": name, "version": version}, **extra}


def test_a_report_for_another_host_or_with_a_yanked_pin_is_refused():
    report = {
        "environment": {"sys_platform": "darwin", "platform_machine": "arm64"},
        "install": [_item("Foo", "1.0", is_yanked=True), _item("bar", "2.0", is_yanked=False)],
    }
    problems = gl.report_problems(report)
    assert len(problems) == 3
    assert "sys_platform='darwin'" in problems[0]
    assert problems[2] == "yanked: Foo==1.0"
    assert gl.resolved_pins(report) == {"foo": "1.0", "bar": "2.0"}
    linux = {**report, "environment": gl.HOST_MARKERS, "install": report["install"][1:]}
    assert gl.report_problems(linux) == []


def test_cuda_majors_come_from_the_suffix():
    assert gl.cuda_major_of("faiss_gpu_cu12") == "12"
    assert gl.cuda_major_of("nvidia-cutlass-dsl-libs-cu13") == "13"
    assert gl.cuda_major_of("nvidia-cublas") is None
    assert gl.cuda_major_of("cupy") is None
    mix = gl.cuda_mix(
        {"torch": "2.13.0"}, ["cuda-toolkit[cublas]==13.0.3; platform_system == 'Linux'"]
    )
    assert mix.torch_toolkit == "==13.0.3"


# --- pip's invocation --------------------------------------------------------------------------


def test_pip_resolves_for_the_target_without_installing(tmp_path: Path):
    command = gl.pip_command(
        "/venv/bin/python", ["vllm==0.29.0"], tmp_path / "r.json", constraints=gl.LOCK
    )
    assert command[:4] == ["/venv/bin/python", "-m", "pip", "install"]
    for flag in (
        "--dry-run",
        "--ignore-installed",
        "--only-binary=:all:",
        "--use-feature=fast-deps",
    ):
        assert flag in command
    pairs = list(itertools.pairwise(command))
    assert ("--python-version", "3.11") in pairs and ("--abi", "cp311") in pairs
    assert ("--index-url", "https://pypi.org/simple") in pairs and ("-c", str(gl.LOCK)) in pairs
    platforms = [value for flag, value in pairs if flag == "--platform"]
    assert platforms[0] == "manylinux_2_31_x86_64" and "manylinux2014_x86_64" in platforms
    assert "manylinux_2_32_x86_64" not in platforms  # nothing newer than the lock promises
    assert command[-1] == "vllm==0.29.0"
    plain = gl.pip_command("py", ["x"], tmp_path / "r.json", constraints=None, fast_deps=False)
    assert "-c" not in plain and "--use-feature=fast-deps" not in plain


def test_pip_reads_no_local_configuration():
    env = gl.pip_environment(
        {
            "PATH": "/bin",
            "PIP_FIND_LINKS": "/opt/wheels",
            "PIP_EXTRA_INDEX_URL": "file:///x",
            "PIP_CONSTRAINT": "/etc/c.txt",
            "PIP_CERT": "/etc/ca.crt",
            "PIP_CONFIG_FILE": "/etc/p",
        }
    )
    assert env == {
        "PATH": "/bin",
        "PIP_CERT": "/etc/ca.crt",
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    }
