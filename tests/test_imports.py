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

#: Layers from the bottom; a module may import its own layer and the ones below. Everything not listed is the
#: base layer: math (paths, objectives, likelihood, sampling, targets, ...), models, data, evaluation.
LAYERS = ["tcsm.builders", "tcsm.train", "tcsm.recipes", "tcsm.demos", "tcsm.cli"]

#: A post-training method folder (tcsm.posttrain.<method>) holds every layer of its method: its `builder` module
#: is in the builders layer, its `recipe` module in the recipes layer, and everything else is base-layer math.
METHOD_LAYERS = {"builder": "tcsm.builders", "recipe": "tcsm.recipes"}


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
    parts = name.split(".")
    if parts[:2] == ["tcsm", "posttrain"] and len(parts) >= 4 and parts[3] in METHOD_LAYERS:
        name = METHOD_LAYERS[parts[3]]
    for i, prefix in enumerate(LAYERS, start=1):
        if name == prefix or name.startswith(prefix + "."):
            return i
    return 0


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
    """Math modules, models and data never import the build layer, the trainer, recipes, demos or the CLI; the build
    layer never imports the trainer; and so on up (LAYERS)."""
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


def test_method_folders_are_layered_too():
    """The rule above sees inside a method folder: its losses and objective (base layer) never import its builder
    or recipe, and its builder never imports its recipe."""
    assert _layer("tcsm.posttrain.dre.losses") == 0
    assert _layer("tcsm.posttrain.dre.builder") == _layer("tcsm.builders.models") == 1
    assert _layer("tcsm.posttrain.preference.recipe") == LAYERS.index("tcsm.recipes") + 1
    methods = sorted(p.name for p in (PACKAGE / "posttrain").iterdir() if (p / "__init__.py").is_file())
    assert methods == ["distill", "dre", "preference", "reward", "sft"], methods
    for method in methods:
        for path in (PACKAGE / "posttrain" / method).glob("*.py"):
            name = _module_name(path)
            for module, _, line in _imports(path):
                if module.startswith("tcsm.") and _layer(module) > _layer(name):
                    raise AssertionError(f"{name}:{line} imports {module} from a higher layer")


def test_benchmarks_never_import_the_cli():
    offenders = [
        f"{p.name}:{line}"
        for p in sorted((ROOT / "benchmarks").glob("*.py"))
        for module, _, line in _imports(p)
        if module == "tcsm.cli" or module.startswith("tcsm.cli.")
    ]
    assert not offenders, offenders


@pytest.mark.parametrize("script", sorted((ROOT / "benchmarks").glob("*.py")), ids=lambda p: p.name)
def test_benchmark_scripts_start(script):
    """Every benchmark script parses its arguments (--help exits 0): none can rot unnoticed."""
    done = subprocess.run(
        [sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=120, cwd=ROOT, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
