"""The package graph holds to the layers docs/architecture.md draws: every arrow points down, no package circle.

The graph is built from the source, not from what Python happens to import at start-up: every
`import` counts wherever it stands (inside a function, under `if TYPE_CHECKING:`), because an
import placed in a function to dodge a cycle still ties the two packages together, and moving
that line is all it takes to break a command at start-up.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
ARCHITECTURE = ROOT / "docs" / "architecture.md"

Arrows = dict[tuple[str, str], list[str]]  # (importer, imported) → where, as "path:line"


def module_name(path: Path, src: Path) -> str:
    parts = list(path.relative_to(src).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, src: Path, known: set[str]) -> list[tuple[str, int]]:
    """Every module of `known` that `path` imports (absolute or relative, anywhere in the file), with its line."""
    name = module_name(path, src)
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package[: len(package) - (node.level - 1)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            # `from trackway import validation` takes the module trackway.validation: an arrow to it, not
            # to the package it sits in; `from trackway.ledger.schema import runs` takes a name of a module.
            modules = [f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in known]
            found += [(module, node.lineno) for module in modules or [base]]
    return [(module, line) for module, line in found if module in known]


def room_of(module: str, top: str) -> str | None:
    """The package (or top-level module) of `top` a module belongs to; `top` itself for its `__init__`."""
    parts = module.split(".")
    if parts[0] != top:
        return None
    return parts[1] if len(parts) > 1 else top


def package_arrows(src: Path, top: str) -> Arrows:
    """The arrows between the rooms of package `top` under `src`, each with every place that draws it."""
    files = sorted((src / top).rglob("*.py"))
    known = {module_name(path, src) for path in files}
    arrows: Arrows = defaultdict(list)
    for path in files:
        importer = room_of(module_name(path, src), top)
        for target, line in imported_modules(path, src, known):
            imported = room_of(target, top)
            if imported is not None and imported != importer:
                arrows[(importer, imported)].append(f"{path.relative_to(src)}:{line}")
    return dict(arrows)


def module_arrows(src: Path, top: str) -> Arrows:
    """The same graph one level finer: module to module, inside the rooms too."""
    files = sorted((src / top).rglob("*.py"))
    known = {module_name(path, src) for path in files}
    arrows: Arrows = defaultdict(list)
    for path in files:
        importer = module_name(path, src)
        for target, line in imported_modules(path, src, known):
            if target != importer and not importer.startswith(target + "."):
                arrows[(importer, target)].append(f"{path.relative_to(src)}:{line}")
    return dict(arrows)


def circles(arrows: Arrows) -> list[list[str]]:
    """Each set of nodes that reach one another (Tarjan's strongly connected components), larger than one."""
    graph: dict[str, list[str]] = defaultdict(list)
    for a, b in arrows:
        graph[a].append(b)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(set(graph)):
        if node not in index:
            visit(node)
    return found


def floors(page: Path) -> dict[str, int]:
    """Room → floor, from the table under "## The layers of the code" in docs/architecture.md."""
    section = page.read_text().split("## The layers of the code\n", 1)[1].split("\n## ", 1)[0]
    placed: dict[str, int] = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) >= 2 and cells[0].isdigit():
            for room in re.findall(r"`([\w.]+)`", cells[1]):
                assert room not in placed, f"{page.name}: `{room}` is on two floors"
                placed[room] = int(cells[0])
    return placed


def arrows_up(arrows: Arrows, placed: dict[str, int]) -> list[str]:
    return [f"{a} (floor {placed[a]}) -> {b} (floor {placed[b]}): {', '.join(where)}"
            for (a, b), where in sorted(arrows.items()) if placed[a] < placed[b]]


def test_every_room_of_trackway_is_on_a_floor_of_the_architecture_page():
    rooms = {room_of(module_name(path, SRC), "trackway") for path in (SRC / "trackway").rglob("*.py")}
    placed = floors(ARCHITECTURE)
    assert sorted(rooms - set(placed)) == [], "add these to the table in docs/architecture.md"
    assert sorted(set(placed) - rooms) == [], "the table in docs/architecture.md names rooms the code does not have"


def test_every_arrow_between_packages_points_down_the_layers():
    assert arrows_up(package_arrows(SRC, "trackway"), floors(ARCHITECTURE)) == []


def test_no_package_imports_one_that_imports_it_back():
    assert circles(package_arrows(SRC, "trackway")) == []


def test_no_module_imports_one_that_imports_it_back():
    assert circles(module_arrows(SRC, "trackway")) == []


# The checks above would pass on a graph they cannot see; these hold that they see what they must.

def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = tmp_path / "pkg" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def test_an_import_inside_a_function_is_an_arrow(tmp_path):
    src = _tree(tmp_path, {
        "__init__.py": "",
        "low/__init__.py": "",
        "low/a.py": "def f():\n    from pkg.high.b import g\n",
        "high/__init__.py": "",
        "high/b.py": "from pkg.low import a\n",
    })
    arrows = package_arrows(src, "pkg")
    assert arrows[("low", "high")] == ["pkg/low/a.py:2"]
    assert circles(arrows) == [["high", "low"]]
    assert arrows_up(arrows, {"pkg": 3, "low": 1, "high": 2}) == ["low (floor 1) -> high (floor 2): pkg/low/a.py:2"]


def test_relative_and_type_checking_imports_are_arrows(tmp_path):
    src = _tree(tmp_path, {
        "__init__.py": "",
        "low/__init__.py": "",
        "low/a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..high import b\n",
        "high/__init__.py": "",
        "high/b.py": "from . import c\n",
        "high/c.py": "from .b import x\n",
    })
    assert ("low", "high") in package_arrows(src, "pkg")
    assert circles(module_arrows(src, "pkg")) == [["pkg.high.b", "pkg.high.c"]]
