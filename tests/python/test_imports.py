"""The modules of python/treecask form a tree: no module imports, directly or
through others, one that imports it. Every import of a package module counts:
at module level, inside a function, and under ``if TYPE_CHECKING:`` (a cycle
there is still a cycle for a reader of the code and for type checkers)."""

import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "python" / "treecask"


def _module_name(path: pathlib.Path) -> str:
    """A file's module name relative to the package: "_restore", "orbax._items";
    a package's ``__init__.py`` is the package itself ("__init__" for the top)."""
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts.pop()
    return ".".join(parts)


def _imports(tree: ast.AST, here: str, is_package: bool, modules: set) -> set:
    """The package modules that `tree` (module `here`'s AST) imports, named as
    _module_name does; an import of a name inside a module counts as the module."""
    found = set()
    base = [] if here == "__init__" else here.split(".")
    if not is_package:
        base = base[:-1]

    def resolve(dotted: str) -> str:
        while dotted and dotted not in modules:  # from .x import name: the module x
            dotted = dotted.rpartition(".")[0]
        return dotted

    def visit(node):
        if isinstance(node, ast.ImportFrom) and node.level >= 1:
            anchor = base[: len(base) - (node.level - 1)] if node.level > 1 else base
            prefix = anchor + (node.module.split(".") if node.module else [])
            for a in node.names:
                found.add(resolve(".".join(prefix + [a.name])) or ".".join(prefix) or "__init__")
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                and node.module.split(".")[0] == "treecask":
            parts = node.module.split(".")[1:]
            for a in node.names:
                found.add(resolve(".".join(parts + [a.name])) or "__init__")
        elif isinstance(node, ast.Import):
            for a in node.names:
                parts = a.name.split(".")
                if parts[0] == "treecask" and len(parts) > 1:
                    found.add(resolve(".".join(parts[1:])))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return {m for m in found if m in modules}


def import_graph() -> dict:
    """{module: the package modules it imports}, "__init__" for the package,
    dotted names for subpackages ("orbax", "orbax._items")."""
    files = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    files["__init__"] = PACKAGE / "__init__.py"
    modules = set(files) | {"_core"}  # _core: the extension, imports nothing of the package
    graph = {name: _imports(ast.parse(p.read_text(), str(p)), name, p.name == "__init__.py", modules) - {name}
             for name, p in files.items()}
    graph["_core"] = set()
    return graph


def find_cycle(graph: dict):
    """One cycle of `graph` as a list of modules (first == last), or None."""
    state = {}  # 1: on the current path, 2: done

    def dfs(m, path):
        state[m] = 1
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                return path[path.index(n):] + [m, n] if n in path else [m, n]
            if n not in state:
                c = dfs(n, path + [m])
                if c:
                    return c
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state:
            c = dfs(m, [])
            if c:
                return c
    return None


def test_the_package_modules_import_each_other_without_a_cycle():
    graph = import_graph()
    assert len(graph) > 10 and "_restore" in graph["__init__"] | set().union(*graph.values())
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_the_readers_stand_above_restore():
    """_restore walks a treedef over what a reader gives it; it imports no reader."""
    graph = import_graph()

    def reaches(a, b, seen=()):
        return b in graph[a] or any(reaches(n, b, seen + (a,)) for n in graph[a] if n not in seen)

    for reader in ("_reader", "_archive", "_sharded"):
        assert not reaches("_restore", reader), reader
