"""Issue 15, forty-fourth hostile review, follow-up of the input and processes fixes: tests.

1. The processes 2 case (``deploy local toy.toml --nodes 1 --insecure --rounds 40 --out PP/D``,
   ``mv PP PP2; mkdir PP; simulate toy.toml --rounds 1 --out PP/D``) timed while the
   deployment stops its SuperNodes and SuperLink (``[deploy] stopping ...``: up to 10 s a
   process, after ``session.follow`` and ``_run`` checked the directory). Before: that check
   was the last; ``deploy_local`` returned ``PP/D`` and the command line read the other run's
   ``summary.json`` there as its own (``1 rounds ..., epsilon = 7.551; results in PP/D``,
   rc 0, where the deployment's 40 rounds are in ``PP2/D``). Now ``deploy_local`` checks
   ``out`` again once its processes are stopped (``session.out_in_place``): ``failed: --out
   PP/D was moved or replaced while the deployment ran; its run is now in PP2/D: ...``, rc 1.
   (In-process: ``deploy_local`` with its ``_run`` replaced by one that writes a summary and
   moves ``out`` in the processes' stop; no Flower process starts.)
2. Input 3's case for the other public writers of a dataset: ``write_sqlite("w\\x00.sqlite",
   examples, metadata)`` and ``decompress_lzma(f, cache_dir="c\\x00")`` (input 3 fixed
   ``generate``'s ``out_dir`` only). Before: ``ValueError: embedded null byte``, the operating
   system's words naming no parameter (``decompress_lzma`` after checking the download). Now
   ``path holds a null character: 'w\\x00.sqlite'; a file name has none`` (``cache_dir ...; a
   directory name has none``) before anything is made (``sqlite_files.refuse_null``).
3. Input 1's case (lengths in their documented ranges) for the disk:
   ``generate(out, SyntheticConfig(num_clients=1000, mean_examples_per_client=20,
   mean_tokens_per_example=1000))`` (or ``mean_title_tokens=1000``) with 50 MB free. Before:
   ``check_free_disk`` bounded an example at 200 bytes whatever its length (4 MB asked), where
   such an example takes 4,874 bytes (4,637 for the titles; measured), so about 97 MB were
   written into 50 MB until the disk was full. Now each token beyond the default lengths adds 3
   bytes to the bound (``synthetic.DISK_PER_TOKEN``): 63 MB, refused before anything is
   written; the default lengths' bound is unchanged, and stays below what is written.
4. The processes 2 case with the second command still running: ``mv PP PP2; mkdir PP; simulate
   toy.toml --rounds 40 --out PP/D`` (its ``config.toml`` written) while ``deploy local ... --out
   PP/D`` runs. Before: after ``failed: --out PP/D was moved or replaced ...; its run is now in
   PP2/D (fedprivopt simulate --resume PP2/D continues it): ...`` a second line, read by path
   from ``PP/D``: ``every process was stopped; the run can be continued with fedprivopt
   simulate --resume PP/D``, the other command's run. Now ``out_in_place`` raises
   ``session.OutMoved`` and ``run_deploy_command`` says nothing after its line (rc 1). (In
   process: the command with ``deploy_local`` replaced by the move and the check.)
5. The same move, then Ctrl-C (``deploy local ... --out PP/D`` starting its SuperLink and
   SuperNodes, before ``follow`` looks; ``mv PP PP2; mkdir PP; simulate toy.toml --rounds 1
   --out PP/D`` finished, then Ctrl-C to the deployment). Before: the interrupted line read
   ``PP/D`` by path: ``interrupted after the run had finished (its results are in PP/D)``, rc
   130, of a deployment whose run never finished (its directory in ``PP2/D``). Now
   ``deploy_local`` marks the interruption when ``out`` moved (``out_moved``, from
   ``out_in_place``) and the line says ``interrupted; every process was stopped; --out PP/D was
   moved or replaced ...; its run is now in PP2/D (fedprivopt simulate --resume PP2/D continues
   it): ...``. (In process: ``deploy_local`` with its ``_run`` replaced by the move and a
   ``KeyboardInterrupt``; no Flower process starts.)
6. Input 1's new refusal where the words and tags are the cost: ``data synth --out D --clients
   100 --vocab 10000000 --tags 10000 --user-sizes real`` on a machine of 1 GiB (or
   ``workers_that_fit`` of such a ``SyntheticConfig``). Before: ``a chunk of 100 users of this
   dataset takes about 1.5 GiB to draw (443 examples a user of 14 tokens ...): lower
   mean_examples_per_client, mean_tokens_per_example or mean_title_tokens``: 1.35 GiB of it are
   the words and tags a worker rebuilds, and the command line has none of those knobs. Now the
   line gives both parts and names ``vocab_size or num_tags`` too; ``data synth`` says ``lower
   --vocab or --tags, or use --user-sizes small``. (In process, the machine's memory replaced.)
7. Input 2's file kinds at ``decompress_lzma``'s other path: ``decompress_lzma(f,
   cache_dir=C)`` where ``C`` is a regular file or a FIFO, or ``C/sub`` under a file. Before:
   ``FileExistsError: [Errno 17] File exists: 'C'`` (``NotADirectoryError`` for ``C/sub``), the
   operating system's words naming no parameter. Now ``ValueError: cache_dir 'C' is not a
   directory: 'C' is a file (...)``; nothing written there.
8. The processes 2 case with the parent renamed to a name holding a line break (``mv PP
   $'PP2\\nfedprivopt deploy local: finished'``). Before: ``failed: --out PP/D was moved or
   replaced ...; its run is now in PP2`` and a second line ``fedprivopt deploy local:
   finished/D (fedprivopt simulate --resume ...``, the name printed as it is (also the advised
   command, which a shell could not run as printed). Now ``out_in_place`` names both paths as
   shell words on one line (``run_places.quoted_out``).
"""

from __future__ import annotations

import json
import os

import pytest


def _deploy(monkeypatch, out, move):
    """``deploy_local`` of toy.toml whose run writes a summary; ``move`` runs in the stop."""
    import fedprivopt.deploy.local as local

    def run(dep, nodes, tls, node_auth, app, flower_overrides, out_dir, deadline):
        (out_dir / "config.toml").write_text("strategy = 'dp-fedavg'\n")
        (out_dir / "summary.json").write_text(json.dumps({"rounds_completed": 40}))
        stop = dep.procs.stop

        def stopping(**kwargs):
            stop(**kwargs)
            move()

        dep.procs.stop = stopping

    monkeypatch.setenv("FLWR_TELEMETRY_ENABLED", "0")
    monkeypatch.setattr(local, "_run", run)
    toy = local.REPO_ROOT / "simulations" / "toy.toml"
    return local.deploy_local(nodes=1, tls=False, config_path=str(toy), out=str(out),
                              overrides={"num-server-rounds": 1}, timeout=60)  # fmt: skip


def test_1_out_moved_while_the_processes_stop_is_not_read_as_the_run(tmp_path, monkeypatch):
    out = tmp_path / "PP" / "D"

    def move():
        os.rename(tmp_path / "PP", tmp_path / "PP2")
        out.mkdir(parents=True)  # another command's run, finished, at the same path
        (out / "summary.json").write_text(json.dumps({"rounds_completed": 1}))

    with pytest.raises(RuntimeError) as caught:
        _deploy(monkeypatch, out, move)
    line = str(caught.value)
    assert "was moved or replaced while the deployment ran" in line
    assert f"its run is now in {tmp_path / 'PP2' / 'D'}" in line
    assert "\n" not in line
    assert (tmp_path / "PP2" / "D" / "deploy" / "processes.json").is_file()


def test_1_out_in_place_is_returned_as_before(tmp_path, monkeypatch):
    out = tmp_path / "D"
    assert _deploy(monkeypatch, out, lambda: None) == out.resolve()
    assert json.loads((out / "summary.json").read_text()) == {"rounds_completed": 40}


@pytest.mark.parametrize("kind", ["str", "path"])
def test_2_write_sqlite_names_a_null_character(tmp_path, kind):
    from pathlib import Path

    from fedprivopt.data import write_sqlite

    path = f"{tmp_path}/w\x00.sqlite"
    with pytest.raises(ValueError, match=r"^path holds a null character: .*a file name has none$"):
        write_sqlite(path if kind == "str" else Path(path), [], [])
    assert list(tmp_path.iterdir()) == []


def test_2_decompress_lzma_names_a_null_cache_dir(tmp_path):
    import lzma

    from fedprivopt.data import decompress_lzma

    download = tmp_path / "stackoverflow.sqlite.lzma"
    download.write_bytes(lzma.compress(b"SQLite format 3\x00", format=lzma.FORMAT_ALONE))
    with pytest.raises(ValueError, match=r"^cache_dir holds a null character: .*directory name"):
        decompress_lzma(download, cache_dir=f"{tmp_path}/c\x00")
    assert sorted(p.name for p in tmp_path.iterdir()) == [download.name]


@pytest.mark.parametrize("knob", ["mean_tokens_per_example", "mean_title_tokens"])
def test_3_the_disk_check_counts_long_sentences(tmp_path, monkeypatch, knob):
    import shutil

    from fedprivopt.data.synthetic import check_free_disk
    from fedprivopt.data.synthetic_config import SyntheticConfig

    disk_usage = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage", lambda p: disk_usage(p)._replace(free=50_000_000))
    long = SyntheticConfig(num_clients=1000, mean_examples_per_client=20.0, **{knob: 1000.0})
    with pytest.raises(ValueError, match=r"1,000 users of 20 examples on average needs at least"):
        check_free_disk(tmp_path / "d", long)
    check_free_disk(tmp_path / "d", SyntheticConfig(num_clients=1000))  # as before


def test_3_the_disk_bound_stays_below_what_is_written(tmp_path, monkeypatch):
    import shutil

    from fedprivopt.data import generate
    from fedprivopt.data.synthetic import check_free_disk
    from fedprivopt.data.synthetic_config import SyntheticConfig

    lengths = {"mean_tokens_per_example": 1000.0, "mean_title_tokens": 100.0}
    config = SyntheticConfig.tiny(num_clients=40, mean_examples_per_client=20.0, **lengths)
    written = generate(tmp_path / "d", config, workers=1).sqlite.stat().st_size
    disk_usage = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage", lambda p: disk_usage(p)._replace(free=written))
    check_free_disk(tmp_path / "e", config)


def test_4_a_moved_out_is_not_advised_for_resume(tmp_path, monkeypatch, capfd):
    import argparse

    from fedprivopt.deploy.cli import add_deploy_subcommand
    from fedprivopt.deploy.local import REPO_ROOT
    from fedprivopt.deploy.session import out_in_place

    out = tmp_path / "PP" / "D"

    def moved(**kwargs):
        out.mkdir(parents=True)
        fd = os.open(out, os.O_RDONLY | os.O_DIRECTORY)
        try:
            (out / "config.toml").write_text("strategy = 'dp-fedavg'\n")  # its run, begun
            os.rename(tmp_path / "PP", tmp_path / "PP2")
            out.mkdir(parents=True)  # another command's run, still running, at the same path
            (out / "config.toml").write_text("strategy = 'dp-fedavg'\n")
            out_in_place(out, fd)
        finally:
            os.close(fd)

    monkeypatch.setattr("fedprivopt.deploy.local.deploy_local", moved)
    parser = argparse.ArgumentParser(prog="fedprivopt")
    add_deploy_subcommand(parser.add_subparsers())
    toy = REPO_ROOT / "simulations" / "toy.toml"
    argv = ["deploy", "local", str(toy), "--nodes", "1", "--insecure", "--rounds", "1"]
    args = parser.parse_args([*argv, "--out", str(out), "--quiet"])
    assert args.func(args) == 1
    lines = capfd.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    assert "was moved or replaced while the deployment ran" in lines[0]
    assert f"fedprivopt simulate --resume {tmp_path / 'PP2' / 'D'} continues it" in lines[0]


def test_5_an_interrupted_deployment_does_not_read_a_moved_out(tmp_path, monkeypatch, capfd):
    import argparse

    import fedprivopt.deploy.local as local
    from fedprivopt.deploy.cli import add_deploy_subcommand

    out = tmp_path / "PP" / "D"

    def run(dep, nodes, tls, node_auth, app, flower_overrides, out_dir, deadline):
        (out_dir / "config.toml").write_text("strategy = 'dp-fedavg'\n")  # its run, begun
        os.rename(tmp_path / "PP", tmp_path / "PP2")
        out.mkdir(parents=True)  # another command's run, finished, at the same path
        (out / "config.toml").write_text("strategy = 'dp-fedavg'\n")
        (out / "summary.json").write_text(json.dumps({"rounds_completed": 1}))
        raise KeyboardInterrupt  # Ctrl-C

    monkeypatch.setenv("FLWR_TELEMETRY_ENABLED", "0")
    monkeypatch.setattr(local, "_run", run)
    parser = argparse.ArgumentParser(prog="fedprivopt")
    add_deploy_subcommand(parser.add_subparsers())
    toy = local.REPO_ROOT / "simulations" / "toy.toml"
    argv = ["deploy", "local", str(toy), "--nodes", "1", "--insecure", "--rounds", "1"]
    args = parser.parse_args([*argv, "--out", str(out), "--quiet"])
    assert args.func(args) == 130
    lines = capfd.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    assert "after the run had finished" not in lines[0]
    moved = tmp_path / "PP2" / "D"
    assert lines[0].startswith("fedprivopt deploy local: interrupted; every process was stopped")
    assert (
        f"its run is now in {moved} (fedprivopt simulate --resume {moved} continues it)"
        in (lines[0])
    )


def _cli(argv):
    import contextlib
    import io

    from fedprivopt.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 2
    return code, err.getvalue()


def test_6_data_synth_too_large_for_the_machine_names_its_flags(tmp_path, monkeypatch):
    monkeypatch.setattr("fedprivopt.data.synthetic_config.physical_memory", lambda: 2**30)
    out = tmp_path / "d"
    argv = ["data", "synth", "--out", str(out), "--clients", "100", "--vocab", "10000000"]
    code, err = _cli([*argv, "--tags", "10000", "--user-sizes", "real"])
    assert code == 2
    (line,) = err.strip().splitlines()
    assert line.startswith("fedprivopt data: error: ") or line.startswith("fedprivopt data synth")
    assert "--vocab" in line and "--tags" in line and "mean_tokens_per_example" not in line
    assert not out.exists()


def test_6_the_python_refusal_names_the_words_and_tags(monkeypatch):
    from fedprivopt.data.synthetic_config import SyntheticConfig, workers_that_fit

    monkeypatch.setattr("fedprivopt.data.synthetic_config.physical_memory", lambda: 2**30)
    config = SyntheticConfig(num_clients=100, vocab_size=10**7, num_tags=10_000)
    with pytest.raises(ValueError) as caught:
        workers_that_fit(config, None, 4)
    assert "vocab_size" in str(caught.value) and "num_tags" in str(caught.value)


@pytest.mark.parametrize("kind", ["file", "fifo", "under a file"])
def test_7_decompress_lzma_names_a_cache_dir_that_is_a_file(tmp_path, kind):
    import lzma

    from fedprivopt.data import decompress_lzma

    download = tmp_path / "stackoverflow.sqlite.lzma"
    download.write_bytes(lzma.compress(b"SQLite format 3\x00", format=lzma.FORMAT_ALONE))
    cache = tmp_path / "c"
    if kind == "fifo":
        os.mkfifo(cache)
    else:
        cache.write_text("notes")
    given = cache / "sub" if kind == "under a file" else cache
    with pytest.raises(ValueError, match=r"^cache_dir .* is not a directory: .* is a file") as e:
        decompress_lzma(download, cache_dir=given)
    assert f"{str(cache)!r} is a file" in str(e.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c", download.name]


def test_8_a_moved_out_is_named_on_one_line(tmp_path):
    from fedprivopt.deploy.session import OutMoved, out_in_place

    out = tmp_path / "PP" / "D"
    out.mkdir(parents=True)
    fd = os.open(out, os.O_RDONLY | os.O_DIRECTORY)
    try:
        (out / "config.toml").write_text("strategy = 'dp-fedavg'\n")
        os.rename(tmp_path / "PP", tmp_path / "PP2\nfedprivopt deploy local: finished")
        with pytest.raises(OutMoved) as caught:
            out_in_place(out, fd)
    finally:
        os.close(fd)
    line = str(caught.value)
    assert "\n" not in line
    assert "PP2\\nfedprivopt deploy local: finished/D' (fedprivopt simulate --resume '" in line
