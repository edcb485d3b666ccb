"""The order ``make test`` gives the workers (tests/conftest.py): the slowest files first."""

from pathlib import Path
from types import SimpleNamespace

from tests.conftest import SLOWEST_FILES, pytest_collection_modifyitems

ROOT = Path(__file__).resolve().parents[1]


def test_every_file_named_slowest_exists_once():
    # a renamed or deleted file would drop out of the order without a word
    assert len(set(SLOWEST_FILES)) == len(SLOWEST_FILES)
    assert [name for name in SLOWEST_FILES if not (ROOT / name).is_file()] == []


def test_the_slowest_files_go_first_in_their_order_and_the_rest_keep_theirs():
    ids = ["tests/test_cli.py::a", f"{SLOWEST_FILES[1]}::b", "tests/a.py::c", "tests/a.py::d"]
    ids.append(f"{SLOWEST_FILES[0]}::e")
    items = [SimpleNamespace(nodeid=i) for i in ids]
    pytest_collection_modifyitems(None, items)
    assert [item.nodeid for item in items] == [ids[4], ids[1], ids[0], ids[2], ids[3]]


def test_this_session_runs_them_first(request):
    names = list(dict.fromkeys(item.nodeid.split("::", 1)[0] for item in request.session.items))
    listed = [name for name in SLOWEST_FILES if name in names]
    assert names[: len(listed)] == listed
