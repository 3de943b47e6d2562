"""The layers point one way (README, Layout): checked from the source's import statements."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def imported_modules(path: Path) -> set[str]:
    """Dotted names of every module a module imports, at any depth of its code."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def imported_packages(path: Path) -> set[str]:
    """Top-level names of everything a module imports, at any depth of its code."""
    return {name.split(".")[0] for name in imported_modules(path)}


def modules(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


# The stages without Ray, in the order they may import each other: each only what is below.
STAGES_BOTTOM_UP = ("retrieval", "prepare", "corpus")
STAGE_PACKAGES = (*STAGES_BOTTOM_UP, "generation")


@pytest.mark.parametrize("path", modules("app"), ids=lambda p: p.name)
def test_the_http_layer_imports_no_ray_and_no_stage_implementation(path):
    imported = imported_packages(path)
    stage_modules = {m for m in imported_modules(path) if m.split(".")[0] in STAGE_PACKAGES}

    assert "ray" not in imported
    assert "deployments" not in imported
    if path.name == "config.py":
        # The config tree composes each stage's own settings (and the rewrite's prompt).
        assert stage_modules <= {f"{stage}.config" for stage in STAGE_PACKAGES} | {"prepare.prompt"}
    else:
        # The one exception: the registry of compression methods, whose names the API accepts.
        assert stage_modules <= {"prepare.methods"}


@pytest.mark.parametrize(
    "path", [p for package in ("pipeline", *STAGE_PACKAGES) for p in modules(package)],
    ids=lambda p: f"{p.parent.name}/{p.name}",
)  # fmt: skip
def test_stages_and_the_pipeline_import_no_ray_no_web_framework_and_no_app(path):
    imported = imported_packages(path)

    assert not imported & {"ray", "fastapi", "starlette", "deployments", "app"}


@pytest.mark.parametrize(
    "path",
    [p for package in ("app", "pipeline", *STAGE_PACKAGES, "bench", "scripts", "harness", "advisor")
     for p in modules(package)],
    ids=lambda p: f"{p.parent.name}/{p.name}",
)  # fmt: skip
def test_nothing_imports_the_ray_wiring(path):
    assert "deployments" not in imported_packages(path)


@pytest.mark.parametrize("path", modules("advisor"), ids=lambda p: p.name)
def test_the_advisor_imports_no_lab_no_service_no_ray_and_no_web_framework(path):
    # A user's tool of plain arithmetic: bench's labs and GPU check import it, never the reverse.
    imported = imported_packages(path)

    assert not imported & {"bench", "app", "deployments", "ray", "fastapi", "starlette"}


@pytest.mark.parametrize(
    "path",
    [p for package in ("app", "pipeline", *STAGE_PACKAGES, "deployments", "harness", "scripts",
                       "advisor", "monitoring")
     for p in modules(package)],
    ids=lambda p: f"{p.parent.name}/{p.name}",
)  # fmt: skip
def test_only_the_labs_import_the_labs(path):
    # bench is a lab of experiments: what users run or deploy depends on none of it.
    assert "bench" not in imported_packages(path)


@pytest.mark.parametrize("path", modules("harness"), ids=lambda p: p.name)
def test_the_service_harness_imports_no_benchmark(path):
    # Tests start services through it; a lab is not something a test should depend on.
    assert "bench" not in imported_packages(path)


@pytest.mark.parametrize(
    "path",
    [p for package in ("app", "pipeline", *STAGE_PACKAGES, "deployments")
     for p in modules(package)],
    ids=lambda p: f"{p.parent.name}/{p.name}",
)  # fmt: skip
def test_the_product_imports_neither_the_harness_nor_the_benchmarks(path):
    assert not imported_packages(path) & {"harness", "bench"}


@pytest.mark.parametrize(
    "path",
    [p for package in STAGES_BOTTOM_UP for p in modules(package)],
    ids=lambda p: f"{p.parent.name}/{p.name}",
)
def test_a_stage_imports_only_the_stages_below_it(path):
    above = STAGES_BOTTOM_UP[STAGES_BOTTOM_UP.index(path.parent.name) + 1 :]

    assert not imported_packages(path) & {*above, "generation"}
