"""A package's names imported on first use (PEP 562's module `__getattr__`).

A package that re-exports its modules' names would import all of them at once; a light user
such as the client, which needs one of them, would pay for the rest (numpy, the group
coordinator). The package lists where each name lives instead, and this loads it when asked.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable


def lazy_getattr(package: dict, exports: dict[str, str]) -> Callable[[str], object]:
    """The `__getattr__` for the package whose globals are `package`: `exports` maps each name
    to the module that defines it. A name found is kept in the package, so it is looked up once."""

    def __getattr__(name: str):
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package['__name__']!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        package[name] = value
        return value

    return __getattr__
