"""The repository's Flower app with a task referenced by module path in its FAB (issue 18).

The module must travel in the app's FAB: the SuperNodes' ClientApp processes and the SuperLink's
ServerApp process import it from the installed FAB. :func:`app_with_task` writes the repository's
app (the files of its FAB) plus ``tests/models/minimal_task.py``, listed in ``fab-include``. Run
it with ``deploy_local(..., app_dir=app_with_task(...))`` and ``task = REF``.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

from fedprivopt.deploy.local import REPO_ROOT, stage_app

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

__all__ = ["CARRIED", "REF", "app_with_task"]

REF = "tests.models.minimal_task:make_task"
CARRIED = ("tests/__init__.py", "tests/models/__init__.py", "tests/models/minimal_task.py")


def app_with_task(dst: Path) -> Path:
    """The repository's app with the minimal task module added to its FAB."""
    app = stage_app(REPO_ROOT, dst)
    for rel in CARRIED:
        (app / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(REPO_ROOT / rel, app / rel)
    pyproject = app / "pyproject.toml"
    text = pyproject.read_text()
    include = tomllib.loads(text)["tool"]["flwr"]["app"]["fab-include"]
    text, count = re.subn(
        r"(?m)^fab-include = .*$", f"fab-include = {json.dumps([*include, *CARRIED])}", text
    )
    assert count == 1
    pyproject.write_text(text)
    return app
