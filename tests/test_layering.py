"""The package table of docs/layout.md as tests: it lists every module, and each imports only down its rows; the
modules everyone imports for their names stay light; no import cycle, no module past MAX_LINES in the
package, and no migration imports it."""
from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from convsweep.base.paths import MIGRATIONS_DIR, ROOT

FIGURES_DIR = ROOT / "convsweep" / "figures"


def loaded_packages(modules: str, packages: tuple[str, ...]) -> list[str]:
    """The modules of `packages` a fresh interpreter has loaded after importing `modules`."""
    code = (f"import sys\nimport {modules}\n"
            f"print(sorted(m for m in sys.modules if m.split('.')[0] in {packages!r}))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    return ast.literal_eval(proc.stdout)


def test_the_planner_the_command_line_and_the_report_load_without_matplotlib():
    """The Snakefile plans through plan (which checks the bench file), every command starts in cli,
    and report imports the figure registry: matplotlib loads only when a figure is drawn."""
    assert loaded_packages("convsweep.app.plan, convsweep.app.cli, convsweep.report, convsweep.figures", ("matplotlib",)) == []


def test_the_reading_vocabulary_loads_neither_the_database_nor_matplotlib():
    assert loaded_packages("convsweep.analysis.reading", ("matplotlib", "sqlalchemy")) == []


def convsweep_imports(path: Path) -> set[str]:
    """The convsweep modules a module of convsweep/figures imports, anywhere in it, as dotted names."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = ["convsweep", "figures"][:3 - node.level]  # level 1: this package, 2: convsweep
            module = ".".join([*base, *([node.module] if node.module else [])])
            found |= {module} if node.module else {f"{module}.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("convsweep"):
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith("convsweep")}
    return found


def test_figures_import_the_vocabulary_and_the_query_layer_never_the_report_or_the_command_line():
    modules = sorted(FIGURES_DIR.glob("*.py"))
    assert {"convsweep.analysis.reading", "convsweep.figures.drawing"} <= convsweep_imports(FIGURES_DIR / "op_time.py")
    for path in modules:
        above = {m for m in convsweep_imports(path) if m.split(".")[1] in ("report", "cli", "document", "compare")}
        assert not above, f"{path.name} imports {sorted(above)}"


# The whole package's imports, read the same way: no cycle, no module past MAX_LINES, no migration importing it.

PACKAGE_DIR = ROOT / "convsweep"
MAX_LINES = 600

# Cycles allowed while a split is under way, each as exactly its group, so that a module joining it, or
# any other cycle, still fails test_no_import_cycles. None today.
KNOWN_CYCLES: list[frozenset[str]] = []

# Over MAX_LINES at HEAD, while they are being split (issue 31), each with its length then as a ceiling so
# it cannot grow meanwhile; test_long_modules_are_still_long says when to take one off.
KNOWN_LONG: dict[str, int] = {}


def module_name(path: Path) -> str:
    """The dotted name of a source file of the package (a package's __init__.py is the package)."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in sorted(PACKAGE_DIR.rglob("*.py"))}


def _resolve(name: str) -> str | None:
    """The package module an imported dotted name loads: itself, or its longest known prefix
    (`convsweep.store.Base` is convsweep.store's); None outside the package."""
    while name:
        if name in MODULES:
            return name
        name = name.rpartition(".")[0]
    return None


def imports_of(module: str) -> dict[str, int]:
    """The package modules `module` imports, with the line of the first import of each. Every import
    statement counts: module-level, in a function, and under `if TYPE_CHECKING:` (a type-only import
    of a higher layer inverts the layering as much as a real one)."""
    path = MODULES[module]
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    # The package a relative import starts from: a package's own name, or a module's parent.
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    nodes = [node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))]
    found: dict[str, int] = {}
    for node in sorted(nodes, key=lambda node: node.lineno):
        if isinstance(node, ast.Import):
            targets = [_resolve(alias.name) for alias in node.names]
        else:
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            source = ".".join(part for part in (base, node.module) if part)
            # `from . import nsys` and `from .store import engine` load the submodule itself.
            targets = [_resolve(f"{source}.{alias.name}") for alias in node.names]
        for target in targets:
            if target is not None and target != module:
                found.setdefault(target, node.lineno)
    return found


def import_graph() -> dict[str, dict[str, int]]:
    return {module: imports_of(module) for module in MODULES}


def cyclic_groups(graph: dict[str, dict[str, int]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[frozenset[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(graph[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            for target in edges:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(graph[target])))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    group = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.add(member)
                        if member == node:
                            break
                    if len(group) > 1:
                        groups.append(frozenset(group))
    return groups


def shown_cycle(graph: dict[str, dict[str, int]], group: frozenset[str]) -> str:
    """One cycle through a cyclic group, each import with its file and line: `a (a.py:3) -> b (...) -> a`."""
    start = min(group)
    path, seen = [start], {start}
    while True:
        # Within a strongly connected group every module imports another one of it; follow them until one repeats.
        target = min(t for t in graph[path[-1]] if t in group)
        if target in seen:
            path = path[path.index(target):] + [target]
            break
        path.append(target)
        seen.add(target)
    steps = [f"{a} ({MODULES[a].relative_to(ROOT)}:{graph[a][b]})" for a, b in zip(path, path[1:])]
    return " -> ".join([*steps, path[-1]])


def test_imports_are_read():
    # The reader itself: relative, absolute, `from . import x` and function-level imports are all edges.
    graph = import_graph()
    assert "convsweep.store.engine" in graph["convsweep.store.ingest"]  # from .engine import ...
    assert "convsweep.device.nsys" in graph["convsweep.measure.job"]  # from . import nsys as nsys_mod
    assert "convsweep.measure.settings" in graph["convsweep.measure.job"]  # inside the functions that measure
    assert "convsweep.store" in graph["convsweep.analysis.query"]  # from convsweep.store import make_engine, ...
    assert "convsweep.base.errors" in graph["convsweep"]  # the package's __init__.py


def test_no_import_cycles():
    graph = import_graph()
    cycles = [shown_cycle(graph, group) for group in cyclic_groups(graph) if group not in KNOWN_CYCLES]
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_job_and_measure_import_one_way():
    # job.py decides where settings are measured and imports measure; both read the job's context from below.
    graph = import_graph()
    assert "convsweep.measure.settings" in graph["convsweep.measure.job"] and "convsweep.measure.job" not in graph["convsweep.measure.settings"]
    assert "convsweep.measure.context" in graph["convsweep.measure.settings"]


def module_lengths() -> dict[str, int]:
    return {str(path.relative_to(ROOT)): len(path.read_text(encoding="utf-8").splitlines())
            for path in MODULES.values()}


def test_no_module_is_too_long():
    too_long = {path: n for path, n in module_lengths().items() if n > KNOWN_LONG.get(path, MAX_LINES)}
    assert not too_long, f"over {MAX_LINES} lines, or a KNOWN_LONG module grown (split the module): {too_long}"


def test_long_modules_are_still_long():
    lengths = module_lengths()
    no_longer = sorted(path for path in KNOWN_LONG if lengths.get(path, 0) <= MAX_LINES)
    assert not no_longer, f"within {MAX_LINES} lines now (or gone): take them off KNOWN_LONG: {no_longer}"


@pytest.mark.parametrize("path", sorted((MIGRATIONS_DIR / "versions").glob("*.py")), ids=lambda p: p.name)
def test_migration_imports_no_live_code(path):
    # A migration runs the same way whenever it runs: it copies what it needs, never imports the package,
    # whose models and helpers move on. (env.py may: autogenerate compares the models with the schema.)
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    imported = [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names]
    imported += [node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and not node.level]
    relative = [node.lineno for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.level]
    live = [name for name in imported if name == "convsweep" or name.startswith("convsweep.")]
    assert not live and not relative, f"{path.name} imports {live or 'relatively, at line ' + str(relative)}"


# -- docs/layout.md's package table: every module in it, every import down it -------------------------

def readme_layers() -> list[list[str]]:
    """The rows of docs/layout.md's package table, bottom first, each the modules its first cell names:
    `errors` is convsweep.base.errors, `bench/` the package convsweep.bench and every module in it."""
    section = (ROOT / "docs" / "layout.md").read_text(encoding="utf-8").split("## The package", 1)[1]
    lines = section.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("| `"))
    rows = []
    for line in lines[first:]:
        if not line.startswith("| `"):
            break
        names = []
        for name in re.findall(r"`([^`]+)`", line.split("|")[1]):
            dotted = "convsweep." + name.strip("/").replace("/", ".")
            assert dotted in MODULES, f"docs/layout.md's package table names `{name}`: no such module"
            names += [dotted] + ([m for m in MODULES if m.startswith(dotted + ".")] if name.endswith("/") else [])
        rows.append(names)
    return rows


def test_readme_lists_every_module_once():
    listed = [m for row in readme_layers() for m in row]
    twice = sorted({m for m in listed if listed.count(m) > 1})
    assert not twice, f"in two rows of docs/layout.md's package table: {twice}"
    missing = sorted(set(MODULES) - set(listed) - {"convsweep"})
    assert not missing, f"docs/layout.md's package table lacks {missing}"


def test_imports_follow_readme_layers():
    """Each module imports only modules of its own row of the table or of the rows above it (the table
    is written from the bottom up). The package's own __init__ is left out: it only re-exports names."""
    row_of = {m: i for i, row in enumerate(readme_layers()) for m in row}
    upward = [f"{m} ({MODULES[m].relative_to(ROOT)}:{line}) imports {target}, from a later row of the layout table"
              for m, targets in import_graph().items() if m in row_of
              for target, line in targets.items() if row_of.get(target, -1) > row_of[m]]
    assert not upward, "\n".join(upward)


def test_the_report_package_exports_what_it_loads_lazily():
    """convsweep.report names its parts' API in __all__ and loads each part when first used: the Snakefile's
    import of report.coverage stays light."""
    import convsweep.report as report

    assert sorted(report.__all__) == sorted(report._EXPORTS)
    for name in report.__all__:
        assert getattr(report, name) is getattr(__import__(f"convsweep.report.{report._EXPORTS[name]}",
                                                           fromlist=[name]), name)
    assert loaded_packages("convsweep.report.coverage", ("matplotlib",)) == []
    loaded = loaded_packages("convsweep.report.coverage", ("convsweep",))
    assert "convsweep.report.sections" not in loaded and "convsweep.report.files" not in loaded, loaded


def wing_of(module: str) -> str:
    """The wing a package module lives in: convsweep.device.gpu's is device; the package's own files have none."""
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and (PACKAGE_DIR / parts[1]).is_dir()) else ""


def test_each_wing_says_what_it_may_import_and_imports_nothing_else():
    """Each wing's __init__ ends its docstring with "May import: ..." (the wings below it in docs/layout.md's
    table, "nothing of convsweep outside this wing", or "every other wing"); what its modules import is held
    to that sentence, so the folder a newcomer opens says where its imports may go."""
    wings = sorted(p.name for p in PACKAGE_DIR.iterdir() if (p / "__init__.py").is_file())
    order = [row[0].split(".")[1] for row in readme_layers()]
    assert sorted(order) == wings, (order, wings)
    graph = import_graph()
    wrong = []
    for wing in wings:
        doc = ast.get_docstring(ast.parse((PACKAGE_DIR / wing / "__init__.py").read_text(encoding="utf-8"))) or ""
        said = re.search(r"May import: ([^.]+)\.", doc.replace("\n", " "))
        if wing in ("store", "bench", "figures", "report"):  # the wings that were packages before: their table row says it
            allowed = set(order[:order.index(wing)])
        else:
            assert said, f"convsweep/{wing}/__init__.py's docstring does not end with 'May import: ...'"
            text = said.group(1).strip()
            allowed = (set() if text.startswith("nothing") else set(wings) - {wing} if text.startswith("every other wing")
                       else {name.strip() for name in text.split(",")})
            assert allowed <= set(order[:order.index(wing)]), f"{wing} may import {sorted(allowed)}: not all below it"
        for module, targets in graph.items():
            if wing_of(module) != wing:
                continue
            wrong += [f"{module} imports {target}" for target in targets
                      if wing_of(target) not in (wing, "", *allowed)]
    assert not wrong, "\n".join(wrong)
