"""Imports run one way: no module imports itself back through a loop, and every folder
imports only folders below it (the kernels, in particular, nothing of the engine).
Between folders, imports go through the public face: a private module (``_name.py``)
of a folder is imported only inside that folder.

The graph comes from the AST of every module of the package (``triton_kernels/`` is
``lightning_embark.kernels``, ``search/`` is ``lightning_embark.search``), lazy imports
inside functions included; imports under ``if TYPE_CHECKING:`` are left out, since
they never run.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "lightning_embark"
#: Source folders and the module prefix each installs as.
SOURCES = {
    "lightning_embark": PACKAGE,
    "triton_kernels": f"{PACKAGE}.kernels",
    "search": f"{PACKAGE}.search",
}

#: The rooms of the house from the ground up: a room may import its own and lower
#: floors only. ``__init__`` is the package's public face, above everything.
FLOORS: list[set[str]] = [
    {"errors", "_dictconfig", "_logs", "_traffic"},
    {"spec", "topology"},
    {"plan"},
    {"wire"},
    {"kernels"},
    {"exchange", "accounting", "data", "emulation"},
    {"engine", "planner"},
    {"models", "torchrec_modules"},
    {"baseline", "calibration", "testing", "gpucheck"},
    {"sharding"},
    {"strategies"},
    {"registry"},
    {"harness"},
    {"search"},
    {"cli"},
    {"__init__"},
]


def _modules() -> dict[str, Path]:
    found = {}
    for folder, prefix in SOURCES.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join([prefix, *parts])] = path
    return found


def _type_checking_only(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules that ``path`` imports (a ``from`` import of a submodule counts as
    it)."""
    out: set[str] = set()

    def visit(node: ast.AST) -> None:
        if _type_checking_only(node):
            return
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith(PACKAGE))
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(PACKAGE):
            assert node.level == 0, f"{path}: relative import of {node.module}"
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                out.add(sub if sub in modules else node.module)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text()))
    return out


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {
        name: {m for m in _imports(path, modules) if m in modules and m != name}
        for name, path in modules.items()
    }


def _room(module: str) -> str:
    parts = module.split(".")
    return "__init__" if len(parts) == 1 else parts[1]


def _floor(room: str) -> int:
    for level, rooms in enumerate(FLOORS):
        if room in rooms:
            return level
    raise AssertionError(
        f"room {room!r} is on no floor of FLOORS in {__file__}; add it where it belongs"
    )


def test_no_module_imports_itself_back() -> None:
    graph = _graph()
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []
    cycles: list[list[str]] = []

    def walk(node: str) -> None:
        state[node] = 1
        path.append(node)
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                cycles.append([*path[path.index(dep) :], dep])
            elif dep not in state:
                walk(dep)
        path.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            walk(node)
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_every_room_imports_only_its_own_and_lower_floors() -> None:
    wrong = [
        f"{module} ({_room(module)}, floor {_floor(_room(module))}) imports {dep} "
        f"({_room(dep)}, floor {_floor(_room(dep))})"
        for module, deps in sorted(_graph().items())
        for dep in sorted(deps)
        if _floor(_room(dep)) > _floor(_room(module))
    ]
    assert not wrong, "imports that run up:\n" + "\n".join(wrong)


def _private_to(module: str) -> str | None:
    """The room that may import ``module``, or None when any may: a ``_name`` module
    inside a room is that room's; a ``_name`` module of the package itself (shared
    helpers such as ``_logs``) is the whole package's."""
    parts = module.split(".")
    if len(parts) > 2 and any(p.startswith("_") for p in parts[2:]):
        return parts[1]
    return None


def test_rooms_import_each_other_through_their_faces() -> None:
    wrong = [
        f"{module} imports {dep}, private to {_private_to(dep)}/"
        for module, deps in sorted(_graph().items())
        for dep in sorted(deps)
        if _private_to(dep) not in (None, _room(module))
    ]
    assert not wrong, (
        "imports of another folder's private module (export the name from its "
        "__init__ and import that):\n" + "\n".join(wrong)
    )


def test_the_face_rule_sees_a_private_import() -> None:
    """A guard on the guard: the rule flags a cross-room private module, not its own."""
    assert _private_to(f"{PACKAGE}.engine._engine") == "engine"
    assert _private_to(f"{PACKAGE}.engine.clusters._dp") == "engine"
    assert _private_to(f"{PACKAGE}._logs") is None
    assert _private_to(f"{PACKAGE}.plan.layouts") is None


def test_the_kernels_import_nothing_of_the_engine() -> None:
    graph = _graph()
    kernels = [m for m in graph if m.startswith(f"{PACKAGE}.kernels")]
    assert kernels, "no kernel modules found"
    wrong = [
        f"{m} imports {d}" for m in kernels for d in graph[m] if d.startswith(f"{PACKAGE}.engine")
    ]
    assert not wrong, wrong


def test_the_graph_sees_lazy_imports() -> None:
    """A guard on the guard: an import inside a function is an edge too."""
    modules = _modules()
    assert f"{PACKAGE}.strategies" in _imports(modules[PACKAGE], modules)
