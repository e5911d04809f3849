"""No import cycle anywhere in ``src``, at module level: imports inside functions and under ``TYPE_CHECKING``
count too, so a cycle cannot hide behind either. The import-linter contract ``acyclic_siblings`` checks the same
between sibling packages; this test also finds a cycle through a package's own ``__init__``."""

from __future__ import annotations

import grimp

import heteroflow


def import_cycles(graph: grimp.ImportGraph, package: str) -> list[list[str]]:
    """Every set of ``package``'s modules that import each other in a circle (Tarjan's strongly connected
    components, iteratively), each sorted."""
    modules = sorted(m for m in graph.modules if m == package or m.startswith(package + "."))
    inside = set(modules)
    edges = {m: sorted(d for d in graph.find_modules_directly_imported_by(m) if d in inside) for m in modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    for root in modules:
        if root in index:
            continue
        work: list[tuple[str, int]] = [(root, 0)]
        while work:
            node, child = work.pop()
            if child == 0:
                index[node] = low[node] = len(index)
                stack.append(node)
                on_stack.add(node)
            if child < len(edges[node]):
                work.append((node, child + 1))
                target = edges[node][child]
                if target not in index:
                    work.append((target, 0))
                elif target in on_stack:
                    low[node] = min(low[node], index[target])
                continue
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component: list[str] = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or node in edges[node]:
                    cycles.append(sorted(component))
    return cycles


def test_src_has_no_import_cycle() -> None:
    graph = grimp.build_graph(heteroflow.__name__, cache_dir=None)
    assert len(graph.modules) > 100  # the whole package was read
    assert import_cycles(graph, heteroflow.__name__) == []


def test_the_check_finds_a_cycle_hidden_behind_a_package_or_a_chain() -> None:
    graph = grimp.ImportGraph()
    for module in ("p", "p.a", "p.b", "p.c", "p.d", "p.e"):
        graph.add_module(module)
    graph.add_import(importer="p.a", imported="p.b")  # a -> b -> c -> a: one cycle of three
    graph.add_import(importer="p.b", imported="p.c")
    graph.add_import(importer="p.c", imported="p.a")
    graph.add_import(importer="p", imported="p.d")  # a package and its own module
    graph.add_import(importer="p.d", imported="p")
    graph.add_import(importer="p.e", imported="p.a")  # one way only: no cycle
    assert sorted(import_cycles(graph, "p")) == [["p", "p.d"], ["p.a", "p.b", "p.c"]]
