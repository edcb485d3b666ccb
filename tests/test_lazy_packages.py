"""Packages load their names on first use, so threads importing modules never deadlock.

Flower's simulation runtime runs the ServerApp in one thread while another loads the ClientApp;
with package ``__init__``s that imported their submodules, two such threads deadlocked on module
locks (``_DeadlockError``, seen in ``tests/deploy/test_flwr_run.py``).
"""

from __future__ import annotations

import importlib
import subprocess
import sys
import types
from pathlib import Path

import pytest

from fedprivopt.core.lazy import lazy_package

PACKAGE = Path(__file__).resolve().parents[1] / "fedprivopt"
LAZY_PACKAGES = ("clients", "data", "models", "optim", "privacy", "strategies")

# Imports every module of the package, each from its own thread, all released at once, in an order
# drawn from the seed; prints the errors.
RACE = """
import importlib, pathlib, random, sys, threading
root = pathlib.Path(sys.argv[1])
names = []
for path in sorted(root.rglob("*.py")):
    parts = ("fedprivopt",) + path.relative_to(root).with_suffix("").parts
    names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
random.Random(int(sys.argv[2])).shuffle(names)
barrier = threading.Barrier(len(names))
errors = []
def load(name):
    barrier.wait()
    try:
        importlib.import_module(name)
    except BaseException as error:
        errors.append(f"{name}: {type(error).__name__}: {error}")
threads = [threading.Thread(target=load, args=(name,)) for name in names]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
print(len(names), "modules;", len(errors), "errors")
print("\\n".join(errors[:5]))
"""


@pytest.mark.parametrize("seed", [0])
def test_modules_imported_from_many_threads_at_once_do_not_deadlock(seed):
    # With the eager package __init__s this failed for every one of ten seeds tried; one seed
    # (about 6 s: every module of the package loaded in a fresh process) is enough to see it.
    done = subprocess.run(
        [sys.executable, "-c", RACE, str(PACKAGE), str(seed)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert " modules; 0 errors" in done.stdout, done.stdout


def test_importing_a_package_imports_none_of_its_submodules():
    code = (
        "import sys, fedprivopt.data, fedprivopt.optim\n"
        "print(sorted(m for m in sys.modules if m.startswith('fedprivopt.')))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = done.stdout.strip()
    expected = ["fedprivopt.core", "fedprivopt.core.lazy", "fedprivopt.data", "fedprivopt.optim"]
    assert loaded == str(expected)


@pytest.mark.parametrize("package", LAZY_PACKAGES)
def test_every_exported_name_is_its_submodules_object(package):
    module = importlib.import_module(f"fedprivopt.{package}")
    assert module.__all__ == sorted(module.__all__) and module.__all__
    for name in module.__all__:
        source = importlib.import_module(f"fedprivopt.{package}.{module._exports[name]}")
        assert getattr(module, name) is getattr(source, name), name
        assert name in dir(module)
    with pytest.raises(AttributeError, match=f"'fedprivopt.{package}' has no attribute 'nope'"):
        module.nope  # noqa: B018


def test_an_exported_function_keeps_its_name_when_its_submodule_of_the_same_name_loads():
    code = (
        "import fedprivopt.optim.adam, fedprivopt.optim.dp2\n"
        "from fedprivopt.optim import adam, dp2\n"
        "import fedprivopt.optim as optim\n"
        "print(type(adam).__name__, type(dp2).__name__, type(optim.adam_bc).__name__)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["function", "function", "function"]


def test_lazy_package_refuses_a_bare_string_and_a_name_exported_twice():
    module = types.ModuleType("fedprivopt_lazy_probe")
    sys.modules[module.__name__] = module
    try:
        with pytest.raises(TypeError, match="'a' must be a sequence of strings"):
            lazy_package(module.__name__, {"a": "name"})
        with pytest.raises(ValueError, match="'x' is exported by two submodules"):
            lazy_package(module.__name__, {"a": ("x",), "b": ("x",)})
    finally:
        del sys.modules[module.__name__]


def test_the_client_app_does_not_load_the_accountant_or_scipy():
    # Every ClientApp process of a deployment and every Ray actor of the flower engine loads the
    # client app. It trains and clips; the accountant is the server's. Before, the client side
    # loaded dp-accounting and SciPy through `privacy.adaptive_clip` (one bound's constant):
    # about 1.1 s of CPU in each such process on the 2-core development machine.
    code = (
        "import sys, fedprivopt.clients.client_app\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'dp_accounting', 'scipy'}))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_building_the_packages_models_does_not_load_sympy():
    # Every command, Ray actor and ClientApp process builds its task's model. Made on the meta
    # device and materialized with `to_empty` (or an Embedding initialized there), torch went
    # through its Python reference implementations, which load SymPy: about 0.3-0.7 s of CPU
    # (1.1-1.4 s of wall time) in each such process on the 2-core development machine.
    code = (
        "import sys, torch\n"
        "from fedprivopt.models import build_task\n"
        "from fedprivopt.models.next_word_model import NextWordLSTM\n"
        "toy = build_task('toy', num_users=4).build_model()\n"
        "lstm = NextWordLSTM(50, 8, 16)\n"
        "tensors = [*toy.parameters(), *lstm.parameters()]\n"
        "assert all(t.device.type == 'cpu' and t.requires_grad for t in tensors)\n"
        "print('sympy' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"
