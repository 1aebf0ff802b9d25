"""The experiment scripts (experiments/) still compile, import and name what exists at HEAD.

They are H200 probes: none runs here. Three checks each, on CPU:
- it compiles (py_compile);
- every name it takes from impls/harness (``from impls... import x``, and ``module.attr`` of an
  imported impls/harness module) or from a sibling experiment exists now: a kernel package
  refactor that drops a private name a probe uses fails here, not on the GPU;
- it imports without running (the scripts keep their work under ``if __name__ == "__main__"``),
  except the few listed in RUNS_ON_IMPORT, whose top level needs a GPU.
A script that cannot be kept working is removed, and experiments/README.md says where git has it.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import py_compile
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
EXPERIMENTS = ROOT / "experiments"
SCRIPTS = sorted(EXPERIMENTS.glob("*.py"))
SIBLINGS = {p.stem for p in SCRIPTS}

#: Scripts whose module level does the GPU work (no main guard): compiled and name-checked only.
RUNS_ON_IMPORT = {
    "host_layers": "allocates CUDA tensors at import",
    "inductor_dump": "compiles and runs on CUDA at import",
    "inductor_forward_configs": "compiles and runs on CUDA at import",
    "triton_launch_overhead": "launches kernels at import",
    "tuner_stability": "tunes on CUDA at import",
}


def _module_of(name: str):
    return sys.modules[name] if name in sys.modules else importlib.import_module(name)


def _load_sibling(name: str):
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, EXPERIMENTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def _checked_root(name: str) -> bool:
    return name.split(".")[0] in ("impls", "harness")


def missing_names(path: Path) -> list[str]:
    """Names the script takes from impls/harness modules (or from a sibling experiment) that do
    not exist at HEAD."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    bound = {}  # local name -> module it stands for
    missing = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if _checked_root(alias.name):
                    module = _module_of(alias.name)
                    if alias.asname:
                        bound[alias.asname] = module
                elif alias.name in SIBLINGS and alias.name not in RUNS_ON_IMPORT:
                    bound[alias.asname or alias.name] = _load_sibling(alias.name)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if _checked_root(node.module):
                module = _module_of(node.module)
            elif node.module in SIBLINGS and node.module not in RUNS_ON_IMPORT:
                module = _load_sibling(node.module)
            else:
                continue
            for alias in node.names:
                if hasattr(module, alias.name):
                    value = getattr(module, alias.name)
                    if isinstance(value, type(sys)):
                        bound[alias.asname or alias.name] = value
                    continue
                try:
                    bound[alias.asname or alias.name] = _module_of(f"{node.module}.{alias.name}")
                except ImportError:
                    missing.append(f"{node.module}.{alias.name}")
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.ctx, ast.Load)
            and isinstance(node.value, ast.Name)
            and node.value.id in bound
            and not hasattr(bound[node.value.id], node.attr)
        ):
            missing.append(f"{bound[node.value.id].__name__}.{node.attr}")
    return sorted(set(missing))


@pytest.fixture(autouse=True)
def _experiments_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(EXPERIMENTS))  # as `python experiments/x.py` would have it
    monkeypatch.setattr(sys, "argv", ["experiment"])  # a few read their arguments at import


def test_there_are_experiments():
    assert len(SCRIPTS) > 50, f"expected the probe scripts in {EXPERIMENTS}"


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.stem)
def test_experiment_compiles(path, tmp_path):
    py_compile.compile(str(path), cfile=str(tmp_path / "x.pyc"), doraise=True)


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.stem)
def test_experiment_names_exist_at_head(path):
    assert missing_names(path) == [], f"{path.name} uses names that no longer exist"


def _nvidia_launcher_reason() -> str | None:
    try:
        from triton.backends.nvidia import driver
    except ImportError as error:
        return f"Triton's NVIDIA backend does not import: {error}"
    if not hasattr(driver, "make_launcher"):
        return "wraps triton.backends.nvidia.driver.make_launcher (Triton 3.6), not in this Triton"
    return None


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.stem)
def test_experiment_imports_without_running(path, monkeypatch):
    name = path.stem
    if name in RUNS_ON_IMPORT and not torch.cuda.is_available():
        pytest.skip(f"{name}: {RUNS_ON_IMPORT[name]}; compiled and name-checked only")
    if name in RUNS_ON_IMPORT:
        pytest.skip(f"{name}: {RUNS_ON_IMPORT[name]}: importing it would run the probe")
    if name == "cluster_scheduling_policy_ab":
        if reason := _nvidia_launcher_reason():
            pytest.skip(f"{name}: {reason}")
        from triton.backends.nvidia import driver

        # it wraps the launcher at import: put Triton's back when the test ends
        monkeypatch.setattr(driver, "make_launcher", driver.make_launcher)
    _load_sibling(name)


def test_the_check_rejects_a_removed_name(tmp_path):
    """Negative control: a script naming a private function the kernel package no longer has."""
    script = tmp_path / "stale_probe.py"
    script.write_text(
        "from impls.triton_rmsnorm import launch\n"
        "from impls.triton_rmsnorm.gluon_kernels import _publish_dot\n"
        "launch._backward_launch(1)\n"
    )
    assert missing_names(script) == [
        "impls.triton_rmsnorm.gluon_kernels._publish_dot",
        "impls.triton_rmsnorm.launch._backward_launch",
    ]
