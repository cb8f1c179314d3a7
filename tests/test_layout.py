"""The import graph of ``provisionerd`` and ``refcontroller``: no cycle between modules, and the layers hold.

The graph is grimp's (import-linter's own graph library), which sees every import statement, including those
inside functions: an import deferred into a function still runs, so it still closes a cycle. The rule for
``if TYPE_CHECKING:`` imports: they never run, so they may not *make* a cycle here (the graph excludes them), but
they still count for the layers (``.importlinter``): a type named from a layer above is a leak all the same.

A cycle fails the test of every top-level package it passes through, named module by module with the line of
each import (``a -> b (l.12) -> a (l.40)``), so the message says where to cut it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path

import grimp  # with import-linter, in the test extra: this test never skips
import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = (
    "provisionerd.cli",
    "provisionerd.demo",
    "provisionerd.testing",
    "provisionerd.daemon",
    "provisionerd.execution",
    "provisionerd.conformance",
    "provisionerd.controller",
    "provisionerd.agent",
    "provisionerd.provider",
    "provisionerd.wire",
    "provisionerd.telemetry",
    "provisionerd.orphans",
    "provisionerd.planner",
    "provisionerd.config",
    "provisionerd.pki",
    "provisionerd.domain",
    "provisionerd.resources",
    "provisionerd.plugin_sdk",
    "refcontroller",
)

#: Cycles found when this test was written, in packages whose owners were changing them at the time: the package's
#: test is expected to fail until the cycle is cut (strict: once it is, remove the entry).
KNOWN_CYCLES: dict[str, str] = {}


@pytest.fixture(scope="module")
def graph():
    return grimp.build_graph("provisionerd", "refcontroller", exclude_type_checking_imports=True, cache_dir=None)


def strongly_connected(graph, modules: Iterable[str]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan's, iterative: no recursion limit)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []
    for root in sorted(modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.find_modules_directly_imported_by(child)))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(component)
    return found


def describe(graph, component: set[str]) -> str:
    """One shortest cycle through the component's first module, with the line of each import."""
    start = min(component)
    best: tuple[str, ...] | None = None
    for first in graph.find_modules_directly_imported_by(start) & component:
        chain = graph.find_shortest_chain(importer=first, imported=start)
        if chain is not None and (best is None or len(chain) + 1 < len(best)):
            best = (start, *chain)
    assert best is not None
    steps = [best[0]]
    for importer, imported in zip(best, best[1:], strict=False):
        lines = sorted(d["line_number"] for d in graph.get_import_details(importer=importer, imported=imported))
        steps.append(f"{imported} (l.{','.join(map(str, lines))})")
    return " -> ".join(steps) + f"   [{len(component)} modules in this knot: {', '.join(sorted(component))}]"


def in_package(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


@pytest.mark.parametrize(
    "package",
    [
        pytest.param(p, marks=pytest.mark.xfail(strict=True, reason=f"known cycle: {KNOWN_CYCLES[p]}"))
        if p in KNOWN_CYCLES
        else p
        for p in PACKAGES
    ],
)
def test_no_import_cycle_through(graph, package):
    cycles = [c for c in strongly_connected(graph, graph.modules) if any(in_package(m, package) for m in c)]
    assert not cycles, "import cycles (cut one import in each):\n" + "\n".join(describe(graph, c) for c in cycles)


def test_every_subpackage_is_checked(graph):
    """A new top-level subpackage must be placed in ``PACKAGES`` here and in the layers of ``.importlinter``."""
    top = {".".join(m.split(".")[:2]) for m in graph.modules if m.startswith("provisionerd.")}
    top -= {"provisionerd.__main__"}
    assert top == {p for p in PACKAGES if p.startswith("provisionerd.")}


def test_the_import_contracts_hold():
    """``lint-imports`` over ``.importlinter``: the layers, refcontroller only from testing, pure packages."""
    from importlinter import cli

    # lint_imports configures logging by dictConfig, which disables every logger made before it: the tests this
    # process runs next would see nothing their code logs (caplog empty; found when xdist's work stealing put the
    # daemon's log tests after this one). Their state is put back whatever the outcome.
    made = [logger for logger in logging.root.manager.loggerDict.values() if isinstance(logger, logging.Logger)]
    disabled = [logger.disabled for logger in made]
    try:
        assert cli.lint_imports(config_filename=str(ROOT / ".importlinter"), no_cache=True) == 0
    finally:
        for logger, was in zip(made, disabled, strict=True):
            logger.disabled = was
