"""The package's shape, as docs/design.md draws it: a few modules on top, one package per
layer below, and every import pointing down (or within its own package)."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "swarmnode"

# Bottom up. A unit is a subpackage or a top-level module; it may import its own layer's
# units' modules only within itself, and any unit of a lower layer.
LAYERS = [
    "bounded", "settings", "tasks", "protocol", "sizing", "learn", "model", "screening", "rollout", "swarm", "ops", "loop",
    "assemble", "lab", "demo", "cli", "__main__",
]
FACE = "__init__"  # the package's face (its version) may be imported from anywhere


def _unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else FACE


def _imports() -> list[tuple[str, str, bool]]:
    """(importing module, imported swarmnode module, inside a function) for every import."""
    found = []
    for path in PACKAGE.rglob("*.py"):
        module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__")
        tree = ast.parse(path.read_text())
        local = {
            id(node) for fn in ast.walk(tree) if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef)
            for node in ast.walk(fn) if isinstance(node, ast.ImportFrom | ast.Import)
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "swarmnode":
                targets = [node.module] if node.module != "swarmnode" else [f"swarmnode.{a.name}" for a in node.names]
                found += [(module, target, id(node) in local) for target in targets]
            elif isinstance(node, ast.Import):
                found += [(module, a.name, id(node) in local) for a in node.names if a.name.startswith("swarmnode.")]
    return found


def test_the_top_level_holds_at_most_eight_modules():
    modules = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(modules) <= 8, modules


def test_every_unit_has_a_layer():
    units = {p.stem if p.is_file() else p.name for p in PACKAGE.iterdir() if p.suffix == ".py" or (p / "__init__.py").exists()}
    assert units - {FACE} <= set(LAYERS), sorted(units - {FACE} - set(LAYERS))


def test_imports_point_down_only():
    upward = []
    for module, target, _ in _imports():
        source, dest = _unit(module), _unit(target)
        if source == dest or dest == FACE or target == "swarmnode.__version__":
            continue
        if dest not in LAYERS or source not in LAYERS or LAYERS.index(dest) >= LAYERS.index(source):
            upward.append(f"{module} -> {target}")
    assert upward == []


def test_modules_import_no_circle():
    graph: dict[str, set[str]] = {}
    modules = {
        ".".join(p.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__") for p in PACKAGE.rglob("*.py")
    }
    for module, target, _ in _imports():
        while target not in modules and "." in target:  # `from swarmnode.protocol import wire` names a module
            target = target.rsplit(".", 1)[0]
        graph.setdefault(module, set()).add(target)
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> None:
        if node in path:
            raise AssertionError(" -> ".join(path[path.index(node):] + [node]))
        if node in done:
            return
        for nxt in graph.get(node, ()):
            visit(nxt, path + [node])
        done.add(node)

    for module in sorted(graph):
        visit(module, [])


def test_no_function_imports_a_swarmnode_module_but_the_cli():
    """cli.py imports a command's implementation inside it, so that --help is instant."""
    local = [f"{m} -> {t}" for m, t, inside in _imports() if inside and m != "swarmnode.cli"]
    assert local == []


def test_the_hivemind_face_holds_every_name_it_lists_and_loads_a_light_one_alone():
    """The composition root and the commands use swarm/hivemind/ through its face; a command
    that only checks an address or reads a swarm file must not pay for hivemind and torch."""
    code = ("import sys; from swarmnode.swarm.hivemind import check_multiaddr, read_peers_file; "
            "print(sorted({'hivemind', 'torch'} & set(sys.modules)))")
    light = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert light.stdout.strip() == "[]", light.stdout + light.stderr
    face = importlib.import_module("swarmnode.swarm.hivemind")
    assert all(getattr(face, name) is not None for name in face.__all__)
    with pytest.raises(AttributeError):
        face.HivemindExchange  # noqa: B018 - inside, not on the face
