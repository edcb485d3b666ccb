"""Package namespaces that import a name's submodule on first use (PEP 562).

A package whose ``__init__`` imports its submodules makes an import cycle: the package imports
``pkg.a``, and importing ``pkg.a`` first imports the package. Within one thread Python resolves
it; across threads it deadlocks. Thread 1 enters ``pkg/__init__.py`` (holding the lock of
``pkg``) and waits for ``pkg.a``; thread 2 took the lock of ``pkg.a`` before ``pkg`` was loaded and
waits for ``pkg``. Python detects it and raises ``_DeadlockError`` in one of them. Flower's
simulation runtime does exactly this: it runs the ServerApp in one thread, which imports modules
as the run needs them, while another thread loads the ClientApp.

A package built with :func:`lazy_package` imports nothing when it loads, so importing a
submodule never waits for its package's ``__init__``. ``from fedprivopt.data import Vocabulary``
still works: the name is imported from its submodule on first access and then cached on the
package. ``tests/test_lazy_packages.py`` imports every module from many threads at once.
"""

from __future__ import annotations

import importlib
import sys
import types
from collections.abc import Mapping, Sequence


class LazyPackage(types.ModuleType):
    """A package module whose exported names load from their submodules on first access."""

    _exports: Mapping[str, str]

    def __getattr__(self, name: str):
        submodule = self._exports.get(name)
        if submodule is None:
            raise AttributeError(f"module {self.__name__!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{self.__name__}.{submodule}"), name)
        setattr(self, name, value)
        return value

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | set(self._exports))

    def __setattr__(self, name: str, value) -> None:
        # Importing ``pkg.adam`` binds the submodule to ``pkg.adam``. Where the package exports a
        # function of the same name from it (``fedprivopt.optim.adam``), the function keeps the
        # name, as it did when the package imported its submodules eagerly.
        if isinstance(value, types.ModuleType) and self._exports.get(name) == name:
            if value.__name__ == f"{self.__name__}.{name}":
                value = getattr(value, name)
        super().__setattr__(name, value)


def lazy_package(package: str, exports: Mapping[str, Sequence[str]]) -> list[str]:
    """Make ``package`` (an ``__init__`` calls this with ``__name__``) load names on first use.

    Parameters
    ----------
    package:
        The package's ``__name__``; it must be in ``sys.modules`` (true inside its ``__init__``).
    exports:
        Submodule (relative name) to the names it exports through the package.

    Returns
    -------
    list of str
        The exported names, sorted: the package's ``__all__``.
    """
    by_name: dict[str, str] = {}
    for submodule, names in exports.items():
        if isinstance(names, str):
            raise TypeError(f"{package}: the names of {submodule!r} must be a sequence of strings")
        for name in names:
            if name in by_name:
                raise ValueError(f"{package}: {name!r} is exported by two submodules")
            by_name[name] = submodule
    module = sys.modules[package]
    module.__dict__["_exports"] = by_name
    module.__class__ = LazyPackage
    return sorted(by_name)
