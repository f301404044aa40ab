"""The mutation-testing tool (scripts/mutants.py, docs/testing.md): its list still matches the code, and one run
kills a planted bug, lets a harmless edit survive, and never touches the user's files."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def mutants():
    spec = importlib.util.spec_from_file_location("tcsm_mutants", ROOT / "scripts" / "mutants.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


def test_every_pattern_is_found_exactly_once(mutants):
    """A pattern that moved or changed fails here, so the list never silently tests nothing."""
    assert mutants.check(mutants.MUTANTS, ROOT) == []
    assert 150 <= len(mutants.MUTANTS) <= 250
    bad = mutants.Mutant("x", "src/tcsm/paths/schedules.py", "return", "yield", "ambiguous")
    assert "found" in mutants.check([bad], ROOT)[0]  # "return" occurs many times


def test_module_tests_follow_the_layout(mutants):
    """A module's tests are found from the layout: its own tests/<folder>/test_<module>.py first, then its folder."""
    tests = mutants.module_tests("src/tcsm/paths/schedules.py")
    assert tests[0] == "tests/paths/test_paths.py" or "tests/paths/test_schedules.py" in tests
    assert all((ROOT / t).is_file() for t in tests)
    assert mutants.module_tests("src/tcsm/posttrain/dre/losses.py")[0] == "tests/posttrain/dre/test_losses.py"


def test_one_run_kills_a_bug_and_keeps_the_users_files(mutants, tmp_path, monkeypatch):
    """Two mutants in parallel copies: κ_t with * for / fails its test (killed); a docstring edit passes
    (survived). The working tree's file is byte-for-byte unchanged and the summary counts both."""
    file = "src/tcsm/paths/schedules.py"
    test = ("tests/paths/test_paths.py::test_linear_and_loglinear_closed_forms",)
    before = hashlib.sha256((ROOT / file).read_bytes()).hexdigest()
    bug = mutants.Mutant(
        "bug", file, "return self.alpha_dot(t) / denom", "return self.alpha_dot(t) * denom", "κ wrong", test
    )
    harmless = mutants.Mutant("doc", file, '"""α_t = t, κ_t', '"""α_t = t (linear), κ_t', "docstring", test)
    monkeypatch.setattr(mutants, "MUTANTS", [bug, harmless])
    out = tmp_path / "r.json"
    rc = mutants.main(["-j", "2", "--no-baseline", "--timeout", "120", "--json", str(out)])
    assert rc == 1  # a non-equivalent survivor
    report = json.loads(out.read_text())
    status = {r["id"]: r["status"] for r in report["results"]}
    assert status == {"bug": "killed", "doc": "survived"}
    killed = next(r for r in report["results"] if r["id"] == "bug")
    assert killed["detail"].endswith("test_linear_and_loglinear_closed_forms")
    assert report["summary"]["kill_rate"] == 0.5 and report["summary"]["survivors"] == ["doc"]
    assert hashlib.sha256((ROOT / file).read_bytes()).hexdigest() == before
