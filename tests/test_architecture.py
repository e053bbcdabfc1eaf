"""The seams stay where docs/architecture.md puts them: no import cycles, the dependency direction,
and docs that describe the project (not who built it)."""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {
    "ranksight": "ranksight",
    "ranksight.agent": "agent",
    "ranksight.collectors": "collectors",
    "ranksight.rules": "rules",
    "ranksight.dashboard": "dashboard",
    "ranksight.integrations": "integrations",
}


def _modules() -> dict[str, Path]:
    found = {}
    for package, folder in PACKAGES.items():
        base = ROOT / folder
        for path in base.rglob("*.py"):
            parts = list(path.relative_to(base).with_suffix("").parts)
            if "__pycache__" in parts:
                continue
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join([package, *parts])] = path
    return found


def _import_graph() -> dict[str, set[str]]:
    """Every import statement, those inside functions included (a lazy import is still a dependency)."""
    files = _modules()
    graph: dict[str, set[str]] = {name: set() for name in files}
    for name, path in files.items():
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                graph[name].update(a.name for a in node.names if a.name in files)
            elif isinstance(node, ast.ImportFrom):
                target = node.module or ""
                if node.level:
                    base = name.split(".") if is_package else name.split(".")[:-1]
                    base = base[: len(base) - (node.level - 1)]
                    target = ".".join(base + ([node.module] if node.module else []))
                for alias in node.names:
                    sub = f"{target}.{alias.name}"
                    graph[name].add(sub if sub in files else target)
        graph[name] = {m for m in graph[name] if m in files and m != name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles():
    assert _cycles(_import_graph()) == []


def test_libraries_never_import_the_cli():
    graph = _import_graph()
    for name, targets in graph.items():
        if name.startswith(("ranksight.agent", "ranksight.collectors", "ranksight.rules", "ranksight.dashboard")):
            bad = sorted(t for t in targets if t.startswith(("ranksight.commands", "ranksight.cli")))
            assert bad == [], f"{name} imports {bad}"


def test_the_agent_imports_no_judging_and_no_ui():
    graph = _import_graph()
    for name, targets in graph.items():
        if name.startswith("ranksight.agent"):
            bad = sorted(t for t in targets if t.startswith(("ranksight.rules", "ranksight.dashboard")))
            assert bad == [], f"{name} imports {bad}"


def _home(module: str) -> str:
    """The package a module belongs to: one of the five libraries, or ``ranksight`` (the CLI and its commands,
    the schema, the demo) for the rest."""
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 and parts[1] in {p.split(".")[-1] for p in PACKAGES} else "ranksight"


def test_packages_meet_through_public_names():
    """Outside a package only its public names are used: no ``ranksight.x._private`` across packages."""
    graph = _import_graph()
    for name, targets in graph.items():
        for target in targets:
            if _home(target) == _home(name) or target == "ranksight._version":
                continue
            private = [p for p in target.split(".")[1:] if p.startswith("_")]
            assert not private, f"{name} imports the private {target}"


def test_docs_describe_the_project_not_the_process():
    pattern = re.compile(r"\bissue #\d|\bengineers?\b", re.IGNORECASE)
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), ROOT / "benchmarks" / "README.md"]
    hits = [
        f"{path.relative_to(ROOT)}:{i}: {line.strip()}"
        for path in docs
        if path.exists()
        for i, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert hits == []


def test_every_module_is_packaged():
    """Each folder with Python files installs as a package (a missing one means a warning per file)."""
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    for package, folder in PACKAGES.items():
        for dirpath, _dirs, filenames in os.walk(ROOT / folder):
            if "__pycache__" in dirpath or not any(f.endswith(".py") for f in filenames):
                continue
            rel = Path(dirpath).relative_to(ROOT / folder).parts
            assert ".".join([package, *rel]) in listed, f"{dirpath} is not in [tool.setuptools] packages"


def _foreign_imports(package_dir: Path, package: str) -> list[str]:
    """The imports in ``package_dir``'s modules that reach outside ``package`` into the rest of ranksight:
    absolute ``ranksight.*`` imports other than ``package`` itself, and relative imports that climb out."""
    bad = []
    for path in sorted(package_dir.rglob("*.py")):
        depth = len(path.relative_to(package_dir).parts) - 1  # folders below the package's own
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level:
                # ``.`` is the file's own folder (an ``__init__``'s too); each further dot climbs one folder
                if node.level - 1 > depth:
                    bad.append(f"{path.name}:{node.lineno}: from {'.' * node.level}{node.module or ''}")
                continue
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            for name in names:
                if (name == "ranksight" or name.startswith("ranksight.")) and not (
                    name == package or name.startswith(package + ".")
                ):
                    bad.append(f"{path.name}:{node.lineno}: {name}")
    return bad


def test_the_format_package_imports_nothing_of_the_project():
    """``ranksight.format`` is the bottom of the house: the agent, the collectors, the rules and the
    dashboard all stand on it, so it stands on nothing of theirs."""
    assert _foreign_imports(ROOT / "ranksight" / "format", "ranksight.format") == []


def test_the_format_check_catches_a_foreign_import(tmp_path):
    """The check above can fail: a module importing the collectors, the CLI's package or a sibling above."""
    pkg = tmp_path / "format"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from . import ok\n")
    (pkg / "ok.py").write_text("import os\nfrom . import sib\nfrom ranksight.format.schema import KINDS\n")
    (pkg / "bad.py").write_text(
        "from ranksight.collectors import open_run\nimport ranksight\nfrom .. import cli\nfrom ..commands import x\n"
    )
    found = _foreign_imports(pkg, "ranksight.format")
    assert found == [
        "bad.py:1: ranksight.collectors",
        "bad.py:2: ranksight",
        "bad.py:3: from ..",
        "bad.py:4: from ..commands",
    ]


def test_a_readings_state_lives_on_its_run_not_beside_its_connection():
    """What a reading knows besides its views (its summary relation, skipped files) is held by the ``Run``
    (``collectors/_run.py``): no module keeps it in a table keyed by connection."""
    hits = [
        f"{path.relative_to(ROOT)}"
        for folder in ("collectors", "rules", "dashboard")
        for path in sorted((ROOT / folder).rglob("*.py"))
        if "WeakKeyDictionary" in path.read_text()
    ]
    assert hits == []
