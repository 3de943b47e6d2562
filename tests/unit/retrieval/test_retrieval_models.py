"""retrieval.models: config model references to loadable paths, without a hub."""

from __future__ import annotations

import sys
import types
from pathlib import Path

from retrieval.models import resolve_model_reference


def test_python_package_reference_uses_the_module_model_path(monkeypatch, tmp_path):
    module = types.ModuleType("fake_model_package")
    module.get_model_path = lambda: tmp_path / "weights"  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "fake_model_package", module)

    assert resolve_model_reference("python-package:fake_model_package") == str(tmp_path / "weights")


def test_relative_path_that_exists_under_base_dir_becomes_absolute(tmp_path):
    (tmp_path / ".models" / "m").mkdir(parents=True)

    resolved = resolve_model_reference(".models/m", tmp_path)

    assert Path(resolved).is_absolute()
    assert Path(resolved) == (tmp_path / ".models" / "m").resolve()


def test_other_references_are_returned_unchanged(tmp_path):
    assert resolve_model_reference("org/model-name", tmp_path) == "org/model-name"
    assert resolve_model_reference(".models/absent", tmp_path) == ".models/absent"
    assert resolve_model_reference("/abs/path", tmp_path) == "/abs/path"
    assert resolve_model_reference(".models/m") == ".models/m"
