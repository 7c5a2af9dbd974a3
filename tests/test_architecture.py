"""The package's shape, checked from its source: no process role imports another role's
modules, libraries import no role, and modules and functions stay small enough to read."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "dapo_async"
# One OS process each (dapo_async/<role>/); they meet only through protocol messages and the
# weight-sync interfaces.
ROLES = {"buffer", "evaluator", "generator", "learner", "launch"}
# May import anything: the command line and the commands built on whole roles.
TOP = {"cli", "bench", "tools"}
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60


def _modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        yield path, ast.parse(path.read_text())


def _top_package(path: Path) -> str:
    rel = path.relative_to(PACKAGE)
    return rel.parts[0].removesuffix(".py")


def _imported_packages(tree) -> set[str]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "dapo_async":
                out |= {a.name for a in node.names}
            elif node.module.startswith("dapo_async."):
                out.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            out |= {a.name.split(".")[1] for a in node.names if a.name.startswith("dapo_async.")}
    return out


def test_roles_and_libraries_do_not_reach_into_roles():
    bad = []
    for path, tree in _modules():
        pkg = _top_package(path)
        if pkg in TOP:
            continue
        for target in _imported_packages(tree) & ROLES:
            if target != pkg:
                bad.append(f"{path.relative_to(PACKAGE)} imports dapo_async.{target}")
    assert not bad, "\n".join(bad)


def test_modules_and_functions_stay_small():
    long_modules, long_functions = [], []
    for path, tree in _modules():
        rel = str(path.relative_to(PACKAGE))
        n = len(path.read_text().splitlines())
        if n > MAX_MODULE_LINES:
            long_modules.append(f"{rel}: {n} lines")
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    long_functions.append(f"{rel}:{node.name}: {length} lines")
    assert not long_modules, long_modules
    assert not long_functions, long_functions


def test_every_imported_package_is_declared():
    """A third-party module the package imports is a dependency in pyproject.toml (runtime, or
    the cpu/gpu extras for vLLM), so an install from pyproject alone can run it."""
    import re
    import sys
    from importlib.metadata import packages_distributions

    import tomllib

    project = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())["project"]
    declared = {
        re.split(r"[<>=!\[ ;]", req, maxsplit=1)[0].lower().replace("_", "-")
        for req in project["dependencies"]
        + project["optional-dependencies"]["cpu"]
        + project["optional-dependencies"]["gpu"]
    }
    dists = packages_distributions()
    missing = set()
    for path, tree in _modules():
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            for name in names:
                top = name.split(".")[0]
                if top == "dapo_async" or top in sys.stdlib_module_names:
                    continue
                owners = {d.lower().replace("_", "-") for d in dists.get(top, [top])}
                if not owners & declared and top not in ("math_verify",):  # optional, guarded
                    missing.add(f"{top} ({path.relative_to(PACKAGE)})")
    assert not missing, sorted(missing)


def _module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imported_modules(tree) -> set[str]:
    """Every dapo_async module a module imports, at its top or inside a function."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("dapo_"):
            out.add(node.module)
            out |= {f"{node.module}.{a.name}" for a in node.names}  # a submodule by name
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("dapo_async.")}
    return out


def test_no_import_circles_inside_a_folder():
    """Within one folder (engines/, weight_sync/, …) no two modules import each other, even
    lazily: a reader follows the imports one way (shared parts live in a module both use)."""
    # package __init__ files re-export (``from dapo_async import protocol``): not edges to follow
    modules = {_module_name(p): tree for p, tree in _modules() if p.name != "__init__.py"}
    graph = {
        name: {m for m in _imported_modules(tree) if m in modules and m != name}
        for name, tree in modules.items()
    }
    folder = {name: name.rsplit(".", 1)[0] for name in modules}
    circles = set()

    def visit(node, stack):
        for nxt in graph[node]:
            if folder[nxt] != folder[node]:
                continue
            if nxt in stack:
                circles.add(" → ".join([*stack[stack.index(nxt) :], nxt]))
            elif len(stack) < 8:
                visit(nxt, [*stack, nxt])

    for name in modules:
        visit(name, [name])
    assert not circles, sorted(circles)


def test_benches_build_roles_from_their_libraries_not_their_main():
    bad = []
    for path, tree in _modules():
        if _top_package(path) != "bench":
            continue
        bad += [f"{path.name} imports {m}" for m in _imported_modules(tree) if m.endswith(".main")]
    assert not bad, bad


def test_each_generator_loop_has_only_its_own_methods():
    """The stream loop and the batch loop share a session and nothing else: neither inherits a
    method it never calls."""
    from dapo_async.generator.loop import GeneratorLoop
    from dapo_async.generator.session import GeneratorSession
    from dapo_async.generator.stream import StreamLoop

    batch_only = set(vars(GeneratorLoop)) - set(vars(GeneratorSession)) - {"__doc__", "__module__"}
    assert {"lease", "rollout", "_await_weights"} <= batch_only
    assert not batch_only & set(dir(StreamLoop)) - {"step", "__init__"}
    assert GeneratorSession in StreamLoop.__mro__ and GeneratorLoop not in StreamLoop.__mro__
