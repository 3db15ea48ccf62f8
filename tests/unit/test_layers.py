"""The layers of docs/ARCHITECTURE.md hold: imports point down only.

faces -> runtime -> cores -> base. Every module of the package is read (ast, nothing
imported), and each import it makes, at the top or inside a function, is checked: no arrow
points up, and the cores import neither asyncio, socket, selectors, coord/ nor kio (they are
sans-I/O). A module missing from LAYERS fails too, so a new package has to be placed.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "localcluster"
ORDER = ("base", "cores", "runtime", "faces")

# Most specific first: the first prefix a module name starts with gives its layer.
LAYERS = (
    ("localcluster.controller.controller", "runtime"),
    ("localcluster.controller.zk_operations", "runtime"),
    ("localcluster.controller.channel", "runtime"),
    ("localcluster.controller", "cores"),
    ("localcluster.replication", "cores"),
    # the consumer protocol's embedded bytes: wire format the client encodes too
    ("localcluster.group.consumer_protocol", "base"),
    ("localcluster.group", "cores"),
    ("localcluster.broker", "runtime"),
    ("localcluster.cli", "faces"),
    ("localcluster.tools", "faces"),
    ("localcluster.supervisor", "faces"),
    ("localcluster.cluster", "faces"),
    ("localcluster.__main__", "faces"),
    ("localcluster.storage", "base"),
    ("localcluster.coord", "base"),
    ("localcluster.protocol", "base"),
    ("localcluster.client", "base"),
    ("localcluster.metrics", "base"),
    ("localcluster.metadata_types", "base"),
    ("localcluster.waiting", "base"),
    ("localcluster.topic_config", "base"),
    ("localcluster.lazy_exports", "base"),
    ("localcluster.backoff", "base"),
    ("localcluster.tasks", "base"),
    ("localcluster.heap", "base"),
)
PACKAGE_ROOT_LAYER = "base"  # `from localcluster import __version__`
CORE_FORBIDDEN = ("asyncio", "socket", "selectors", "kio", "localcluster.coord")

# Arrows that point up today, each with the reason it is allowed; the test fails when one
# goes away (so the list cannot rot) or a new one appears.
KNOWN_UPWARD: dict[tuple[str, str], str] = {}


def layer_of(name: str) -> str | None:
    if name == "localcluster":
        return PACKAGE_ROOT_LAYER
    for prefix, layer in LAYERS:
        if name == prefix or name.startswith(prefix + "."):
            return layer
    return None


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """Every module name `path` imports (`from a import b` gives a, and a.b when b is one of
    our modules)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module
            found.add(module)
            found |= {f"{module}.{alias.name}" for alias in node.names
                      if _is_module(f"{module}.{alias.name}")}  # fmt: skip
    return found


def modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_every_module_has_a_layer():
    assert [module_name(p) for p in modules() if layer_of(module_name(p)) is None] == []


def test_no_import_points_up():
    upward = {}
    for path in modules():
        name = module_name(path)
        here = ORDER.index(layer_of(name))
        for imported in imports_of(path):
            layer = layer_of(imported) if imported.startswith("localcluster") else None
            if layer is not None and ORDER.index(layer) > here:
                upward[(name, imported)] = f"{layer_of(name)} -> {layer}"
    unexpected = {k: v for k, v in upward.items() if k not in KNOWN_UPWARD}
    assert unexpected == {}, "imports that point up (fix them, or say why in KNOWN_UPWARD)"
    assert set(KNOWN_UPWARD) <= set(upward), "KNOWN_UPWARD lists arrows that are gone"


def _is_module(name: str) -> bool:
    if not name.startswith("localcluster."):
        return False
    relative = PACKAGE.joinpath(*name.split(".")[1:])
    return relative.with_suffix(".py").exists() or (relative / "__init__.py").exists()


@pytest.mark.parametrize("path", [p for p in modules() if layer_of(module_name(p)) == "cores"],
                         ids=module_name)  # fmt: skip
def test_cores_do_no_io(path):
    bad = sorted(i for i in imports_of(path)
                 if any(i == f or i.startswith(f + ".") for f in CORE_FORBIDDEN))  # fmt: skip
    assert bad == [], f"{module_name(path)} is a core and imports {bad}"
