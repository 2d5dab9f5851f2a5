"""The component boundaries of design section 1, checked on every import statement.

- ``daemon/`` runs in every sandbox: it imports the standard library, its own
  modules and the contract only.
- ``sandman/contract.py`` uses the standard library only (it is frozen too).
- ``webhook/``, ``extender/`` and ``reaper/`` never import each other, the
  harness or the benchmarks.
- The library (SDK, pools, fleets, CLI core) never imports the harness, the
  benchmarks or a component; the CLI names those only as strings, imported
  when their command runs.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
COMPONENTS = ("webhook", "extender", "reaper")
# What the daemon may import besides the standard library: nothing. Its tree
# is Debian's interpreter plus the stdlib modules it reaches
# (harness/images/daemon_binary.py), so a third-party import would only fail
# inside a sandbox.
DAEMON_THIRD_PARTY: frozenset[str] = frozenset()


def _imports(path: Path) -> Iterator[tuple[int, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module


def _py_files(folder: str) -> list[Path]:
    return sorted(p for p in (ROOT / folder).rglob("*.py") if "__pycache__" not in p.parts)


def _violations(files: list[Path], allowed) -> list[str]:  # type: ignore[no-untyped-def]
    out = []
    for path in files:
        for line, module in _imports(path):
            if not allowed(module):
                where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
                out.append(f"{where}:{line} imports {module}")
    return out


def _top(module: str) -> str:
    return module.split(".")[0]


def _under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def test_daemon_imports_only_the_standard_library_itself_and_the_contract() -> None:
    def allowed(m: str) -> bool:
        if _top(m) in sys.stdlib_module_names or _top(m) in DAEMON_THIRD_PARTY:
            return True
        return m == "sandman" or _under(m, "sandman.daemon") or m == "sandman.contract"

    files = [p for p in _py_files("daemon") if "freeze" not in p.parts]
    assert files
    assert _violations(files, allowed) == []


def test_contract_uses_the_standard_library_only() -> None:
    def allowed(m: str) -> bool:
        return _top(m) in sys.stdlib_module_names

    assert _violations([ROOT / "sandman" / "contract.py"], allowed) == []


@pytest.mark.parametrize("component", COMPONENTS)
def test_components_do_not_import_each_other_or_the_harness(component: str) -> None:
    forbidden = [f"sandman.{c}" for c in COMPONENTS if c != component]
    forbidden += ["sandman.harness", "sandman.bench", "sandman.daemon", "sandman.cli"]

    def allowed(m: str) -> bool:
        return not any(_under(m, f) for f in forbidden)

    files = _py_files(component)
    assert files
    assert _violations(files, allowed) == []


def test_library_does_not_import_the_harness_benchmarks_or_components() -> None:
    forbidden = ["sandman.harness", "sandman.bench", "sandman.daemon"]
    forbidden += [f"sandman.{c}" for c in COMPONENTS]

    def allowed(m: str) -> bool:
        return not any(_under(m, f) for f in forbidden)

    files = _py_files("sandman")
    assert files
    assert _violations(files, allowed) == []


def test_the_checker_sees_a_violation(tmp_path: Path) -> None:
    # The rules above pass only because nothing breaks them, not because the
    # checker is blind: a file that imports the harness is reported.
    bad = tmp_path / "bad.py"
    bad.write_text("import os\nfrom sandman.harness.cluster import local\n")
    found = _violations([bad], lambda m: not _under(m, "sandman.harness"))
    assert len(found) == 1 and "sandman.harness.cluster" in found[0]
