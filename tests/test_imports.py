"""The package's import structure (DESIGN.md "Layers"): no import cycles, no upward imports, and no import that
names something that does not exist — including imports inside functions, which only run on some code paths,
and the imports of the benchmark scripts, which the rest of the suite never runs."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
PACKAGE = SRC / "tcsm"

#: The folders of src/tcsm from the bottom layer up (DESIGN.md "Layers"): a module may import its own folder and the
#: folders before it, never one after it. No module is assigned a layer by its file name.
LAYERS = [
    "core",  # Batch, protocols, errors, the typed evaluation result, progress
    "storage",  # atomic files, checkpoints, readers of older saved runs
    "paths",  # sources, schedules, t draws, bound integrands
    "models",  # networks
    "data",  # every data kind
    "rewards",  # reward functions of token sequences, shared by the post-training methods
    "sampling",  # samplers
    "targets",  # what p_{1|t} to match
    "objectives",  # losses, divergences, weightings, the composed objective
    "evaluation",  # likelihood bounds and the other evaluators
    "posttrain",  # each post-training method's math
    "builders",  # configs and checkpoints -> objects
    "train",  # the one Trainer
    "recipes",  # post-training recipes: schema, registry entries, run config, report
    "demos",
    "cli",
]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _is_package(name: str) -> bool:
    return (SRC / Path(*name.split(".")) / "__init__.py").is_file()


def _exists(name: str) -> bool:
    rel = Path(*name.split("."))
    return (SRC / rel).with_suffix(".py").is_file() or (SRC / rel / "__init__.py").is_file()


def _imports(path: Path) -> list[tuple[str, str | None, int]]:
    """(module, imported name or None, line) of every `tcsm` import in a file, at any depth."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out += [(a.name, None, node.lineno) for a in node.names if a.name.split(".")[0] == "tcsm"]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "tcsm":
            out += [(node.module, a.name, node.lineno) for a in node.names]
    return out


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = _module_name(path)
        edges = graph.setdefault(name, set())
        for module, attr, _ in _imports(path):
            target = f"{module}.{attr}" if attr and _exists(f"{module}.{attr}") else module
            if target != name:
                edges.add(target)
    return graph


def _layer(name: str) -> int:
    """The rank of a module's top folder in LAYERS; the package root (lazy exports) is below everything."""
    parts = name.split(".")
    if len(parts) < 2:
        return -1
    assert parts[1] in LAYERS, f"{name} is in no layer: add its folder to LAYERS"
    return LAYERS.index(parts[1])


def test_every_folder_is_a_layer():
    """`ls src/tcsm` is the architecture: every entry is a layer's folder (or data: configs), none a loose module."""
    entries = sorted(p.name for p in PACKAGE.iterdir() if p.name != "__pycache__")
    loose = [e for e in entries if e.endswith(".py") and e != "__init__.py"]
    assert not loose, f"loose modules at the top of src/tcsm: {loose}"
    folders = {e for e in entries if (PACKAGE / e / "__init__.py").is_file()}
    assert folders == set(LAYERS), sorted(folders ^ set(LAYERS))


def test_no_import_cycles():
    """Tarjan's strongly connected components of the module graph (lazy imports included) are all singletons."""
    graph = _graph()
    graph.pop("tcsm", None)  # the top-level package resolves its exports lazily (PEP 562), after import
    index, low, stack, on, cycles = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10000))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert not cycles, f"import cycles: {cycles}"


def test_no_upward_imports():
    """No module imports a folder above its own (LAYERS): math, models and data never import the build layer, the
    trainer, recipes, demos or the CLI; the build layer never imports the trainer; and so on up."""
    bad = []
    for name, edges in _graph().items():
        if name == "tcsm":
            continue
        for target in edges:
            if _layer(target) > _layer(name):
                bad.append(f"{name} imports {target}")
    assert not bad, "upward imports:\n" + "\n".join(sorted(bad))


def _python_files():
    for base in ("src", "tests", "benchmarks", "scripts"):
        yield from sorted((ROOT / base).rglob("*.py"))


@pytest.mark.parametrize("path", list(_python_files()), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_tcsm_import_resolves(path):
    """Each `from tcsm.x import y` names a module that exists and a y it defines (an import inside a function fails
    only when that function runs, so a move elsewhere can break it silently)."""
    missing = []
    for module, attr, line in _imports(path):
        try:
            mod = importlib.import_module(module)
        except ImportError as e:
            missing.append(f"line {line}: {module}: {e}")
            continue
        if attr and attr != "*" and not hasattr(mod, attr) and not _exists(f"{module}.{attr}"):
            missing.append(f"line {line}: {module} has no {attr!r}")
    assert not missing, "\n".join(missing)


def test_method_math_is_below_its_recipe():
    """A method's math (tcsm.posttrain.<m>) sits below the builders, the trainer and its recipe (tcsm.recipes.<m>),
    and every method has both."""
    methods = sorted(p.name for p in (PACKAGE / "posttrain").iterdir() if (p / "__init__.py").is_file())
    recipes = sorted(p.name for p in (PACKAGE / "recipes").iterdir() if (p / "__init__.py").is_file())
    assert methods == recipes == ["distill", "dre", "fewstep", "preference", "reward", "rl", "sft"], (methods, recipes)
    assert _layer("tcsm.posttrain.dre.losses") < _layer("tcsm.builders.models") < _layer("tcsm.recipes.dre")


def test_benchmarks_never_import_the_cli():
    offenders = [
        f"{p.name}:{line}"
        for p in sorted((ROOT / "benchmarks").glob("*.py"))
        for module, _, line in _imports(p)
        if module == "tcsm.cli" or module.startswith("tcsm.cli.")
    ]
    assert not offenders, offenders


#: runs a benchmark script with --help after stopping the clocks a measurement reads (torch imported first: its import
#: reads them), so a script that times anything before parsing its arguments fails instead of measuring
HELP_ONLY = """
import os, runpy, sys, time
import torch

def measured(*args, **kwargs):
    raise RuntimeError("the script read a clock before parsing --help: it measures when asked for help")

for name in ("perf_counter", "perf_counter_ns", "process_time", "process_time_ns"):
    setattr(time, name, measured)
script = sys.argv[1]
sys.argv, sys.path[0] = [script, "--help"], os.path.dirname(os.path.abspath(script))
runpy.run_path(script, run_name="__main__")
"""


@pytest.mark.parametrize("script", sorted((ROOT / "benchmarks").glob("*.py")), ids=lambda p: p.name)
def test_benchmark_scripts_start(script):
    """Every benchmark script parses its arguments (--help exits 0) before it measures anything: none can rot
    unnoticed, and asking one for help never starts a measurement."""
    done = subprocess.run(
        [sys.executable, "-c", HELP_ONLY, str(script)], capture_output=True, text=True, timeout=120, cwd=ROOT,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage:" in done.stdout, f"{script.name} --help printed no usage: it does not parse its arguments"


def test_no_method_imports_another_methods_package():
    """A post-training method (its math in posttrain/<m>/, its recipe in recipes/<m>/) imports only its own packages
    and shared folders: what two methods share (rewards, pairs data, samplers) lives in a shared folder, so one
    method can change without another noticing."""
    methods = {p.name for p in (PACKAGE / "posttrain").iterdir() if (p / "__init__.py").is_file()}
    bad = []
    for name, edges in _graph().items():
        parts = name.split(".")
        if len(parts) < 3 or parts[1] not in ("posttrain", "recipes") or parts[2] not in methods:
            continue
        for target in edges:
            other = target.split(".")
            if len(other) > 2 and other[1] in ("posttrain", "recipes") and other[2] in methods and other[2] != parts[2]:
                bad.append(f"{name} imports {target}")
    assert not bad, "methods importing another method:\n" + "\n".join(sorted(bad))
