"""tfopt's modules import each other without cycles.

Every import counts, the ones inside functions too (a lazy import hides a cycle from Python, not from
the reader), and importing `a.b.c` counts as importing the packages `a.b` and `a` as well, since Python
runs their `__init__` first. Lazy exports by name (`tfopt._lazy`) and the registry's name table are
looked up on use and are not edges.
"""

import ast
import pathlib

import tfopt

PACKAGE = pathlib.Path(tfopt.__file__).parent


def module_files():
    files = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        files[".".join(parts)] = path
    return files


def imported_modules(name, path, known):
    """The tfopt modules that module `name` imports, each with the packages above it."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            targets.update(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names)
    edges = set()
    for target in targets:
        parts = target.split(".")
        edges.update(".".join(parts[:end]) for end in range(1, len(parts) + 1) if ".".join(parts[:end]) in known)
    edges.discard(name)
    # A package is imported before its own modules run: a module "importing" its ancestors is no edge.
    return {edge for edge in edges if not name.startswith(edge + ".")}


def import_graph():
    files = module_files()
    return {name: imported_modules(name, path, files) for name, path in files.items()}


def find_cycle(graph):
    """One import cycle as a list of modules (first == last), or None."""
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for target in sorted(graph[node]):
            if state.get(target) == "open":
                return [*stack[stack.index(target) :], target]
            if target not in state and (cycle := visit(target)):
                return cycle
        state[node] = "done"
        stack.pop()
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_no_import_cycles():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_cycle_finder_finds_a_cycle_through_a_package():
    graph = {"a": {"a.b"}, "a.b": {"c"}, "c": {"a"}, "d": set()}
    assert find_cycle(graph) == ["a", "a.b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_function_level_imports_count(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from tfopt.plan import Plan\n")
    assert "tfopt.plan" in imported_modules("tfopt.m", module, module_files())
