"""Imports run one way: no module imports itself back through a loop, and every folder
imports only folders below it (the kernels, in particular, nothing of the engine).
Between folders, imports go through the public face: a private module (``_name.py``)
of a folder is imported only inside that folder.

The graph comes from the AST of every module of the package (``triton_kernels/`` is
``lightning_embark.kernels``, ``search/`` is ``lightning_embark.search``), lazy imports
inside functions included. ``from pkg import name`` is an edge to ``pkg`` (a package's
``__init__``, its public face, whose namespace the import reads) and, when ``name`` is a
submodule, to ``pkg.name`` too: so a private module that reaches a sibling through its own
package's face (``from pkg import _sibling``) closes a loop with the face that imports it.
The floors and faces rules leave out imports under ``if TYPE_CHECKING:``, which never run;
the cycle rule counts them, since a loop of type-only imports still ties two modules into
one.
"""

from __future__ import annotations

import ast
from collections.abc import Collection
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
    {"errors", "lists", "_dictconfig", "_logs", "_traffic", "_handover", "_host_work", "_leave"},
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


def _imports(
    source: str, modules: Collection[str], *, type_checking: bool = False, where: str = ""
) -> set[str]:
    """The project modules that ``source`` imports: ``from pkg import name`` counts as
    ``pkg`` and, when it is a module, ``pkg.name``; with ``type_checking``, the imports
    under ``if TYPE_CHECKING:`` count too."""
    out: set[str] = set()

    def visit(node: ast.AST) -> None:
        if _type_checking_only(node) and not type_checking:
            return
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith(PACKAGE))
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(PACKAGE):
            assert node.level == 0, f"{where}: relative import of {node.module}"
            out.add(node.module)
            out.update(
                f"{node.module}.{alias.name}"
                for alias in node.names
                if f"{node.module}.{alias.name}" in modules
            )
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(source))
    return out


def _graph(*, type_checking: bool = False) -> dict[str, set[str]]:
    modules = _modules()
    return {
        name: {
            m
            for m in _imports(
                path.read_text(), modules, type_checking=type_checking, where=str(path)
            )
            if m in modules and m != name
        }
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


#: Loops of imports known today, each as the set of modules it ties; the list only shrinks.
#: The loop runs through imports under ``if TYPE_CHECKING:`` (the tower code names the
#: engine's types it is called with). Once one is cut, the cycle test
#: fails until it is struck from here, so a loop cannot come back unseen.
KNOWN_CYCLES: set[frozenset[str]] = set()


def _cycles(graph: dict[str, set[str]]) -> set[frozenset[str]]:
    """The graph's loops: its strongly connected components of more than one module
    (Tarjan's algorithm, iterative so a deep graph needs no recursion)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: set[frozenset[str]] = set()
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, deps = work[-1]
            dep = next(deps, None)
            if dep is not None:
                if dep not in index:
                    index[dep] = low[dep] = len(index)
                    stack.append(dep)
                    on_stack.add(dep)
                    work.append((dep, iter(sorted(graph[dep]))))
                elif dep in on_stack:
                    low[node] = min(low[node], index[dep])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.add(frozenset(component))
    return found


def _named(cycles: set[frozenset[str]]) -> list[str]:
    return sorted(" <-> ".join(sorted(c)) for c in cycles)


def test_no_module_imports_itself_back() -> None:
    """No loop of imports at module level, package faces and type-only imports included,
    but the known ones; and each known one still exists (the list only shrinks)."""
    cycles = _cycles(_graph(type_checking=True))
    new = cycles - KNOWN_CYCLES
    assert not new, "import cycles:\n" + "\n".join(_named(new))
    gone = KNOWN_CYCLES - cycles
    assert not gone, "cut, strike them from KNOWN_CYCLES:\n" + "\n".join(_named(gone))


def test_the_cycle_rule_sees_a_loop_through_a_package_face() -> None:
    """A guard on the guard: ``from pkg import _sibling`` inside ``pkg`` reads ``pkg``'s
    face, which imports the module back; a type-only import closes a loop too."""
    modules = {f"{PACKAGE}.pkg", f"{PACKAGE}.pkg._a", f"{PACKAGE}.pkg._b"}
    face = f"from {PACKAGE}.pkg._a import A\n"
    through_face = f"from {PACKAGE}.pkg import _b\n"
    type_only = (
        f"from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import {PACKAGE}.pkg._a\n"
    )
    graph = {
        f"{PACKAGE}.pkg": _imports(face, modules),
        f"{PACKAGE}.pkg._a": _imports(through_face, modules),
        f"{PACKAGE}.pkg._b": _imports(type_only, modules, type_checking=True),
    }
    assert graph[f"{PACKAGE}.pkg._a"] == {f"{PACKAGE}.pkg", f"{PACKAGE}.pkg._b"}
    assert _cycles(graph) == {frozenset(modules)}
    assert _imports(type_only, modules) == set()  # the floors rule leaves it out
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == set()


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
    assert f"{PACKAGE}.strategies" in _imports(modules[PACKAGE].read_text(), modules)
