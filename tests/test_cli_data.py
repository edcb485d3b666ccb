import sqlite3

from fedprivopt.cli import main


def exit_code(argv):
    try:
        return main(argv)
    except SystemExit as exc:
        return exc.code


def test_synth_then_info(tmp_path, capsys):
    out = tmp_path / "so"
    assert main(["data", "synth", "--out", str(out), "--clients", "200", "--seed", "3",
                 "--vocab", "1000", "--tags", "20"]) == 0
    assert "200 users" in capsys.readouterr().out
    for name in ("stackoverflow.sqlite", "stackoverflow.word_count", "stackoverflow.tag_count"):
        assert (out / name).is_file()
    with sqlite3.connect(out / "stackoverflow.sqlite") as conn:
        tables = {r[0] for r in conn.execute("select name from sqlite_master where type='table'")}
        assert {"examples", "client_metadata"} <= tables
        per_split = dict(conn.execute(
            "select split_name, sum(num_examples) from client_metadata group by split_name"))
    assert main(["data", "info", str(out)]) == 0
    table = capsys.readouterr().out
    lines = {line.split()[0]: line.split() for line in table.splitlines()[1:]}
    for split, examples in per_split.items():
        assert lines[split][2] == f"{examples:,}"
    # refuses to overwrite, and bad values name the flag
    assert exit_code(["data", "synth", "--out", str(out), "--clients", "5"]) == 2
    assert "--overwrite" in capsys.readouterr().err


def test_info_bad_paths(tmp_path, capsys):
    assert exit_code(["data", "info", str(tmp_path / "missing.sqlite")]) == 2
    assert "does not exist" in capsys.readouterr().err
    not_so = tmp_path / "other.sqlite"
    with sqlite3.connect(not_so) as conn:
        conn.execute("create table t (x int)")
    assert exit_code(["data", "info", str(not_so)]) == 2
    err = capsys.readouterr().err
    assert "other.sqlite" in err and len(err.strip().splitlines()) == 1
    assert exit_code(["data", "synth", "--out", str(tmp_path / "x"), "--clients", "0"]) == 2
    assert "--clients" in capsys.readouterr().err
