import sqlite3

from fedprivopt.cli import main


def exit_code(argv):
    try:
        return main(argv)
    except SystemExit as exc:
        return exc.code


def test_synth_then_info(tmp_path, capsys):
    out = tmp_path / "so"
    assert (
        main(
            [
                "data",
                "synth",
                "--out",
                str(out),
                "--clients",
                "200",
                "--seed",
                "3",
                "--vocab",
                "1000",
                "--tags",
                "20",
            ]
        )
        == 0
    )
    assert "200 users" in capsys.readouterr().out
    for name in ("stackoverflow.sqlite", "stackoverflow.word_count", "stackoverflow.tag_count"):
        assert (out / name).is_file()
    with sqlite3.connect(out / "stackoverflow.sqlite") as conn:
        tables = {r[0] for r in conn.execute("select name from sqlite_master where type='table'")}
        assert {"examples", "client_metadata"} <= tables
        per_split = dict(
            conn.execute(
                "select split_name, sum(num_examples) from client_metadata group by split_name"
            )
        )
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


def test_synth_overwrite_replaces_only_a_synthetic_dataset(tmp_path, capsys):
    out = tmp_path / "so"
    argv = ["data", "synth", "--out", str(out), "--clients", "30", "--vocab", "300", "--tags", "5"]
    assert main(argv) == 0
    assert main([*argv, "--seed", "1", "--overwrite"]) == 0  # ours: replaced
    capsys.readouterr()
    (out / "stackoverflow.synthetic.json").unlink()  # now it looks like a real download
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert exit_code([*argv, "--overwrite"]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "--out" in err and "stackoverflow.synthetic.json" in err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    # a lone vocabulary file of a real dataset is protected too
    words = tmp_path / "words"
    words.mkdir()
    (words / "stackoverflow.word_count").write_text("the 10\n")
    assert exit_code(["data", "synth", "--out", str(words), "--clients", "5", "--overwrite"]) == 2
    assert (words / "stackoverflow.word_count").read_text() == "the 10\n"


def test_generate_refuses_to_replace_files_it_did_not_write(tmp_path):
    import pytest

    from fedprivopt.data import SyntheticConfig, generate

    cfg = SyntheticConfig.tiny(num_clients=20)
    files = generate(tmp_path, cfg)
    files.meta.unlink()
    with pytest.raises(FileExistsError, match=r"stackoverflow\.synthetic\.json"):
        generate(tmp_path, cfg, overwrite=True)
    # an interrupted generation leaves our marker (not a complete one): it may be replaced
    files.meta.write_text('{"generator": "fedprivopt.data.synthetic", "complete": false}\n')
    generate(tmp_path, cfg, overwrite=True)


def test_synth_clients_bound_is_documented(capsys):
    assert exit_code(["data", "synth", "--help"]) == 0
    assert "1000000" in capsys.readouterr().out.replace(",", "")


def test_synthetic_config_bounds_num_clients_before_allocating():
    import pytest

    from fedprivopt.data import SyntheticConfig
    from fedprivopt.data.synthetic_config import MAX_CLIENTS

    assert SyntheticConfig(num_clients=MAX_CLIENTS).num_clients == 1_000_000
    with pytest.raises(ValueError, match="num_clients must be at most 1000000"):
        SyntheticConfig(num_clients=10**20)


def _usage_line(capsys, argv):
    assert exit_code(argv) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err.splitlines()[0]


def test_synth_bounds_vocab_and_tags_naming_their_flags(tmp_path, capsys):
    """Issue 15: --vocab 10**9 grew to 6.4 GB; a huge --tags was reported as a --vocab error."""
    out = str(tmp_path / "y")
    line = _usage_line(capsys, ["data", "synth", "--clients", "10", "--vocab", "1000000000",
                                "--out", out])  # fmt: skip
    assert "--vocab must be at most 10000000" in line
    line = _usage_line(capsys, ["data", "synth", "--clients", "10", "--tags", "99999999999999",
                                "--out", out])  # fmt: skip
    assert "--tags must be at most 10000" in line and "--vocab" not in line
    assert not (tmp_path / "y").exists() or not any((tmp_path / "y").iterdir())


def test_synth_refuses_a_strangers_marker_file_without_overwrite(tmp_path, capsys):
    """Issue 15: a stackoverflow.synthetic.json that is not ours was silently replaced."""
    marker = tmp_path / "stackoverflow.synthetic.json"
    marker.write_text("my notes, not JSON\n")
    line = _usage_line(capsys, ["data", "synth", "--clients", "10", "--out", str(tmp_path)])
    assert "stackoverflow.synthetic.json" in line and "--overwrite" in line
    assert marker.read_text() == "my notes, not JSON\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["stackoverflow.synthetic.json"]


def test_synth_real_user_sizes_and_workers(tmp_path, capsys):
    """Issue 19: --user-sizes real gives users of the real size; --workers is checked."""
    out = tmp_path / "real"
    assert main(["data", "synth", "--out", str(out), "--clients", "40", "--vocab", "1000",
                 "--tags", "20", "--user-sizes", "real", "--workers", "2"]) == 0  # fmt: skip
    printed = capsys.readouterr().out
    assert "40 users" in printed and "examples/s" in printed
    with sqlite3.connect(out / "stackoverflow.sqlite") as conn:
        heldout = [n for (n,) in conn.execute(
            "select num_examples from client_metadata where split_name = 'heldout'")]  # fmt: skip
    assert heldout and min(heldout) >= 100
    for flag, value, text in (
        ("--user-sizes", "huge", "invalid choice: 'huge'"),
        ("--workers", "0", "--workers: must be an integer in [1, 1024]"),
    ):
        line = _usage_line(capsys, ["data", "synth", "--clients", "10", flag, value,
                                    "--out", str(tmp_path / "bad")])  # fmt: skip
        assert text in line
    assert not (tmp_path / "bad").exists()
