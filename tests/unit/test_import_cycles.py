"""No import circles in ``orchestrator`` (issue #35 item 6): a module never imports, directly or through others,
a module that imports it back -- counting imports inside functions (a lazy import is still a dependency), not
those only for type checkers (``if TYPE_CHECKING:``). Built with grimp, the graph library import-linter's
contracts use."""

from __future__ import annotations

import grimp


def cycles(graph: grimp.ImportGraph) -> list[tuple[str, ...]]:
    """Each import ``a -> b`` for which ``b`` reaches ``a`` again, as the chain ``a, b, ..., a``."""
    out = []
    for a in sorted(graph.modules):
        for b in sorted(graph.find_modules_directly_imported_by(a)):
            back = graph.find_shortest_chain(importer=b, imported=a)
            if back:
                out.append((a, *back))
    return out


def test_no_module_of_the_orchestrator_imports_itself_back() -> None:
    graph = grimp.build_graph("orchestrator", exclude_type_checking_imports=True)
    found = cycles(graph)
    assert not found, "import circles:\n" + "\n".join(" -> ".join(c) for c in found)


def test_the_check_sees_a_circle_made_through_a_lazy_import() -> None:
    graph = grimp.ImportGraph()
    for m in ("p", "p.a", "p.b", "p.c"):
        graph.add_module(m)
    graph.add_import(importer="p.a", imported="p.b")
    graph.add_import(importer="p.b", imported="p.c")
    assert cycles(graph) == []
    graph.add_import(importer="p.c", imported="p.a")  # what a function-level import adds
    assert ("p.a", "p.b", "p.c", "p.a") in cycles(graph)
