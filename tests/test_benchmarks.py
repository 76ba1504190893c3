"""benchmarks/ stand apart from tests/: no benchmark imports a test module.

operator_scale.py needs the test control plane; it starts and stops it through
`python -m tests.cluster` (up --json says where it is), a process boundary, not an import.
"""

import ast
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def _imports(path: Path) -> set[str]:
    """Every module `path` imports, at its top or inside a function."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
    return names


def test_no_benchmark_imports_the_tests():
    modules = sorted(BENCHMARKS.glob("*.py"))
    assert any(p.name == "operator_scale.py" for p in modules)
    found = {
        path.name: sorted(m for m in _imports(path) if m.split(".")[0] == "tests")
        for path in modules
    }
    assert {name: tests for name, tests in found.items() if tests} == {}
