"""The layering of the package (issue 16): no module imports from a higher layer, and no private
name (``_x``) is imported from another module. ``fedprivopt/__init__.py`` documents the layers.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "fedprivopt"

# bottom to top; a module belongs to the layer of its longest listed prefix
LAYERS = (
    ("core",),
    ("privacy",),
    ("optim", "data", "wire", "wire_train"),
    ("models",),
    ("clients",),
    ("strategies",),
    ("simulation",),
    ("deploy",),
    (
        "cli",
        "cli_args",
        "cli_data",
        "cli_runs",
        "cli_tune",
        "cli_compare_tune",
        "cli_stdout",
        "cli_exit",
        "cli_privacy",
        "cli_tune_setup",
        "cli_compare_tuned",
        "cli_compare_tune_report",
        "cli_compare",
        "cli_task_errors",
        "deploy.cli",
    ),
)


def layer_of(module: str) -> int | None:
    """The layer of ``fedprivopt.<module>`` (``None`` for the package itself)."""
    best, found = -1, None
    for level, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            hit = module == prefix or module.startswith(prefix + ".")
            if hit and len(prefix) > best:
                best, found = len(prefix), level
    return found


def imports(source: str) -> list[tuple[str, str | None, int]]:
    """``(module, name or None, line)`` of every ``fedprivopt`` import in ``source``, nested too.

    ``from fedprivopt import optim`` counts as an import of the module ``optim``.
    """
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "fedprivopt":
                found += [(a.name, None, node.lineno) for a in node.names]
            elif node.module.startswith("fedprivopt."):
                module = node.module.removeprefix("fedprivopt.")
                found += [(module, a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.Import):
            found += [
                (a.name.removeprefix("fedprivopt."), None, node.lineno)
                for a in node.names
                if a.name.startswith("fedprivopt.")
            ]
    return found


def violations(module: str, source: str) -> list[str]:
    """What ``source`` (the text of ``fedprivopt.<module>``) does against the two rules."""
    own = layer_of(module)
    out = []
    for target, name, line in imports(source):
        if target == "__version__":
            continue
        level = layer_of(target)
        if own is not None and level is not None and level > own:
            out.append(f"{module}:{line} imports {target} (layer {level} > {own})")
        if name and name.startswith("_") and not name.startswith("__") and target != module:
            out.append(f"{module}:{line} imports the private name {target}.{name}")
    return out


def all_modules() -> dict[str, str]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path.read_text(encoding="utf-8")
    return out


def test_every_module_has_a_layer():
    assert [m for m in all_modules() if m and layer_of(m) is None] == []


def test_no_module_imports_from_a_higher_layer_or_a_private_name():
    found = [v for module, source in all_modules().items() for v in violations(module, source)]
    assert found == []


def test_the_check_finds_what_it_looks_for():
    # an upward import, a nested one, the package form, and a private name
    source = (
        "from fedprivopt.simulation.run import simulate\n"
        "def f():\n    import fedprivopt.cli\n"
        "from fedprivopt import strategies\n"
        "from fedprivopt.models.task import _hidden\n"
        "from fedprivopt.privacy.clip import clip_l2\n"
    )
    found = violations("models.tag_prediction", source)
    assert len(found) == 4, found
    text = "\n".join(found)
    for what in (
        "imports simulation.run (layer 6 > 3)",
        ":3 imports cli (layer 8 > 3)",
        ":4 imports strategies (layer 5 > 3)",
        "private name models.task._hidden",
    ):
        assert what in text, found
    assert violations("deploy.cli", "from fedprivopt.cli_args import check_out_dir\n") == []
    assert violations("deploy.local", "from fedprivopt.deploy.cli import x\n") != []


def imported_modules(source: str) -> set[str]:
    """Every module ``source`` imports, nested too (``from a import b`` gives ``a`` and ``a.b``)."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
    return found


def fault_injection_imports(module: str, source: str) -> list[str]:
    """How ``source`` (the text of ``fedprivopt.<module>``) reaches the tests' fault injection."""
    out = [
        f"{module} imports {name}"
        for name in sorted(imported_modules(source))
        if name.split(".")[0] == "tests" or "faults" in name.split(".")
    ]
    if "make_faulty_client_app" in source:
        out.append(f"{module} names make_faulty_client_app")
    return out


def test_no_module_imports_the_fault_injection():
    # fault injection (tests/faults.py) is test scaffolding: no app path can switch it on (issue 16)
    found = [
        v
        for module, source in all_modules().items()
        for v in fault_injection_imports(module, source)
    ]
    assert found == []
    assert fault_injection_imports("clients.client_app", "from tests.faults import FAULTS\n")
    assert fault_injection_imports("x", "def f():\n    import fedprivopt.clients.faults\n")
    assert fault_injection_imports("x", "from fedprivopt.clients import faults\n")
    assert fault_injection_imports("x", "app = make_faulty_client_app({})\n")
