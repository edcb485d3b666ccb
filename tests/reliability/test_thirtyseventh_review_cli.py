"""Issue 15, thirty-seventh hostile review (command line): regression tests of its findings.

The first four are the environment reviewer's reports on the limits of a process.

1. ``ulimit -n 20; compare toy.toml --strategies dp-fedavg,fedavg --rounds 2 --jobs 2 --out C``
   ended in a 49-line ``OSError: [Errno 24] Too many open files`` traceback (the worker pool's
   ``os.pipe``), rc 1: ``cli_args.is_file_error`` did not count EMFILE/ENFILE, and where it would
   have the line would have blamed ``--out``. Now rc 2, one line: ``too many open files: this
   process reached its limit of open files (20); raise it (ulimit -n 4096) and run the command
   again; nothing already written is lost`` (ENFILE: the machine's table, ``fs.file-max``).
2. ``ulimit -n 30; simulate toy.toml --engine flower --rounds 2 --out R`` printed 156 lines (Ray's
   "Timed out waiting for … gcs_server_port", Flower's "Simulation Runtime crashed"), rc 1.
   Now the soft limit is raised within the hard one before Ray starts
   (``ray_processes.enough_open_files``, from ``engines.check_flower_resources``: also
   ``fast-actors``, ``compare`` and ``--resume``), and a limit still below 256 (measured: the
   toy's raylet holds 58 files; 40 and 48 failed) is refused before anything is written: rc 2,
   ``engine = "flower" starts Ray, which needs at least 256 open files, but this process may
   open 30 (ulimit -n; hard limit 30): …``.
3. ``ulimit -v 1500000; simulate toy.toml --set task-params.dim=800000 --rounds 2`` ended in a
   32-line traceback, rc 1: torch's CPU allocator raises ``RuntimeError("… DefaultCPUAllocator:
   can't allocate memory …")``, not ``MemoryError``, so the out-of-memory line of the
   thirty-fifth review was not reached; raised in a task's ``user_data``, ``task_calls`` made it
   the task's error (``Task.user_data(0) raised RuntimeError …``, rc 2). Now
   ``task_calls.out_of_memory`` tells it, and both end with ``this machine ran out of memory
   (…); nothing already written is lost`` (rc 1, as that line always had; a fork refused with
   ENOMEM alike).
4. ``--out L`` with ``L -> L`` (or ``A -> B -> A``) was refused as "a symbolic link to nothing";
   now "a symbolic link that leads back to itself". ``--resume R`` of a directory its user may
   not write said ``R/summary.json: Permission denied`` (a file, after the lock) or, on a
   read-only mount, ``R/run.lock: Read-only file system``; now ``--resume directory 'R' cannot
   be written by this user (permission denied): …`` before anything is touched.
5. ``ulimit -v 400000; fedprivopt epsilon …`` (any command) ended in a 25-line traceback,
   ``ImportError: libtorch_cpu.so: failed to map segment from shared object``, rc 1; at
   ``ulimit -v 800000`` a 45-line one, ``OSError: [Errno 12] Cannot allocate memory:
   '…/torch/_logging'``. Loading the libraries happens while the parser is built; now one line,
   ``fedprivopt: error: this machine ran out of memory while loading the libraries (…); raise
   this process's limit of memory (ulimit -v) or free memory``, rc 1.
6. ``PYTHONWARNINGS=error simulate toy.toml --engine flower --rounds 1`` (a CI file's habit)
   ended in a 54-line traceback of click's ``DeprecationWarning`` raised while Flower was
   imported, rc 1. Now, when ``PYTHONWARNINGS`` or ``-W`` make warnings errors, one line naming
   the warning and ``PYTHONWARNINGS=default``, rc 2 (nothing written: the run directory it had
   begun is removed as for any refusal); otherwise a raised Warning stays a traceback.
7. ``TMPDIR`` (Ray takes it on Linux) or ``RAY_TMPDIR`` of 90 characters (a cluster job's
   scratch directory) made ``simulate toy.toml --engine flower`` print 152 lines
   ("validate_socket_filename failed: AF_UNIX path length cannot exceed 107 bytes", "Simulation
   Runtime crashed"), rc 1. Now ``ray_processes.check_ray_temp_dir`` (from
   ``check_flower_resources``, before anything is written) refuses it: rc 2, ``engine =
   "flower" starts Ray, whose sockets would lie under TMPDIR = '…': their paths would have 108
   bytes, more than the 107 …; set RAY_TMPDIR to a directory of at most 41 bytes``
   (measured: 41 bytes run, rc 0).
"""

from __future__ import annotations

import errno
import os
import resource
import sys
import warnings
from pathlib import Path

import pytest

from fedprivopt.simulation import parallel, ray_processes
from tests.reliability.test_twentyninth_review_cli import _cli, _one_line

ROOT = Path(__file__).resolve().parents[2]
TOY = str(ROOT / "simulations" / "toy.toml")


# -- finding 1: a limit of open files reached --------------------------------------------------


@pytest.mark.parametrize(
    ("code", "says"), [(errno.EMFILE, "ulimit -n"), (errno.ENFILE, "fs.file-max")]
)
def test_1_too_many_open_files_is_one_line_naming_the_limit(tmp_path, monkeypatch, code, says):
    def no_more_files(*args, **kwargs):
        raise OSError(code, os.strerror(code))  # as the worker pool's os.pipe raised it

    monkeypatch.setattr(parallel, "run_plans", no_more_files)
    argv = ["compare", TOY, "--strategies", "dp-fedavg,fedavg", "--rounds", "1", "--jobs", "2"]
    line = _one_line(_cli(tmp_path, *argv, "--out", str(tmp_path / "C"), "--quiet"))
    assert line.startswith("fedprivopt compare: error: "), line
    assert says in line and "nothing already written is lost" in line, line
    assert "--out" not in line, line  # before: a traceback (and not the output's fault)


# -- finding 2: too few open files for Ray -----------------------------------------------------


def _limits(monkeypatch, soft: int, hard: int, kind: int = resource.RLIMIT_NOFILE) -> list:
    """``getrlimit`` of ``kind`` (open files) answering (soft, hard); ``setrlimit`` recorded, not
    made."""
    real = resource.getrlimit
    made: list = []
    monkeypatch.setattr(
        resource, "getrlimit", lambda which: (soft, hard) if which == kind else real(which)
    )
    monkeypatch.setattr(resource, "setrlimit", lambda which, limits: made.append(limits))
    return made


def test_2_a_flower_run_under_too_low_a_limit_is_refused_before_ray(tmp_path, monkeypatch):
    made = _limits(monkeypatch, 30, 30)
    out = tmp_path / "R"
    argv = ["simulate", TOY, "--engine", "flower", "--rounds", "2", "--out", str(out), "--quiet"]
    line = _one_line(_cli(tmp_path, *argv))  # before: Ray started (156 lines under a real limit)
    assert line == (
        'fedprivopt simulate: error: engine = "flower" starts Ray, which needs at least 256 open '
        "files, but this process may open 30 (ulimit -n; hard limit 30): raise the limit "
        '(ulimit -n 4096) or use engine = "fast" without fast-actors'
    )
    assert not out.exists() and made == []


def test_2_the_soft_limit_is_raised_within_the_hard_one(monkeypatch):
    made = _limits(monkeypatch, 30, 1000)
    ray_processes.enough_open_files('engine = "flower"')  # no refusal: 1000 is enough
    assert made == [(1000, 1000)]
    made = _limits(monkeypatch, 1024, resource.RLIM_INFINITY)
    ray_processes.enough_open_files("fast-actors")
    assert made == [(8192, resource.RLIM_INFINITY)]


# -- finding 3: torch's allocator out of memory ------------------------------------------------


def _huge(*args, **kwargs):
    import torch

    return torch.empty(2**60, dtype=torch.uint8)  # torch's allocator refuses: RuntimeError


def _out_of_memory(proc) -> str:
    assert proc.returncode == 1, (proc.returncode, proc.stderr)
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith("fedprivopt simulate: error: this machine ran out of memory ("), (
        lines
    )
    assert "can't allocate memory" in lines[0], lines
    assert lines[0].endswith("nothing already written is lost (FEDPRIVOPT_DEBUG=1 shows where)")
    return lines[0]


def test_3_the_allocators_error_while_building_the_task_is_out_of_memory(tmp_path, monkeypatch):
    from fedprivopt.models.toy import ToyClassificationTask

    monkeypatch.setattr(ToyClassificationTask, "_draw_test", _huge)
    out = tmp_path / "R"
    _out_of_memory(_cli(tmp_path, "simulate", TOY, "--rounds", "2", "--out", str(out), "--quiet"))
    assert not out.exists()  # before: a 32-line traceback, rc 1


def test_3_the_allocators_error_in_user_data_is_not_the_tasks(tmp_path, monkeypatch):
    from fedprivopt.models.toy import ToyClassificationTask

    monkeypatch.setattr(ToyClassificationTask, "user_data", _huge)
    out = tmp_path / "R"
    _out_of_memory(_cli(tmp_path, "simulate", TOY, "--rounds", "2", "--out", str(out), "--quiet"))
    # before: rc 2, "ToyClassificationTask.user_data(...) raised RuntimeError ...": the task blamed


def test_3_a_fork_refused_for_memory_is_out_of_memory(tmp_path, monkeypatch):
    def no_memory(*args, **kwargs):
        raise OSError(errno.ENOMEM, os.strerror(errno.ENOMEM))  # os.fork under ulimit -v

    monkeypatch.setattr(parallel, "run_plans", no_memory)
    argv = ["compare", TOY, "--strategies", "dp-fedavg,fedavg", "--rounds", "1", "--jobs", "2"]
    proc = _cli(tmp_path, *argv, "--out", str(tmp_path / "C"), "--quiet")
    assert proc.returncode == 1 and len(proc.stderr.splitlines()) == 1, proc.stderr
    assert "this machine ran out of memory (" in proc.stderr, proc.stderr  # before: a traceback


# -- finding 4: a looping --out, a --resume directory that cannot be written -------------------


def test_4_a_symbolic_link_loop_is_not_called_a_link_to_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "L").symlink_to("L")
    line = _one_line(_cli(tmp_path, "simulate", TOY, "--rounds", "1", "--out", "L", "--quiet"))
    assert line == (
        "fedprivopt simulate: error: argument --out: 'L' is a symbolic link that leads back to "
        "itself ('L'; too many levels of symbolic links)"
    )
    (tmp_path / "gone").symlink_to("nowhere")  # unchanged
    line = _one_line(_cli(tmp_path, "simulate", TOY, "--rounds", "1", "--out", "gone", "--quiet"))
    assert line.endswith("'gone' is a symbolic link to nothing"), line


def test_4_resume_of_a_directory_this_user_cannot_write_names_it(tmp_path, monkeypatch):
    run = tmp_path / "R"
    assert (
        _cli(tmp_path, "simulate", TOY, "--rounds", "1", "--out", str(run), "--quiet").returncode
        == 0
    )
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    real = os.access
    monkeypatch.setattr(  # as for a user other than root after chmod -R a-w R
        os, "access", lambda path, mode, **kw: Path(path) != run and real(path, mode, **kw)
    )
    line = _one_line(_cli(tmp_path, "simulate", "--resume", str(run), "--quiet"))
    assert line == (
        f"fedprivopt simulate: error: --resume directory {str(run)!r} cannot be written by this "
        "user (permission denied): a resumed run writes its checkpoint, rows and summary there; "
        "copy it to a directory you may write, or make it writable"
    )  # before: rc 0 as root; another user: "R/summary.json: Permission denied"
    assert {p.name: p.read_bytes() for p in run.iterdir()} == before


# -- finding 5: no memory to load the libraries ------------------------------------------------


@pytest.mark.parametrize(
    "failure",
    [
        ImportError("libtorch_cpu.so: failed to map segment from shared object"),
        OSError(errno.ENOMEM, os.strerror(errno.ENOMEM), "/venv/torch/_logging"),
    ],
)
def test_5_no_memory_to_load_the_libraries_is_one_line(tmp_path, monkeypatch, failure):
    import fedprivopt.cli

    def loading(*args, **kwargs):
        raise failure

    monkeypatch.setattr(fedprivopt.cli, "build_parser", loading)
    proc = _cli(tmp_path, "epsilon", "--rounds", "10")
    assert proc.returncode == 1 and len(proc.stderr.splitlines()) == 1, proc.stderr
    assert proc.stderr.startswith(
        "fedprivopt: error: this machine ran out of memory while loading the libraries ("
    ), proc.stderr  # before: the ImportError's or OSError's traceback
    assert proc.stderr.endswith("(ulimit -v) or free memory\n"), proc.stderr


def test_5_an_import_error_of_a_bug_stays_a_traceback(tmp_path, monkeypatch):
    import fedprivopt.cli

    def broken(*args, **kwargs):
        raise ImportError("cannot import name 'x' from 'fedprivopt.y'")

    monkeypatch.setattr(fedprivopt.cli, "build_parser", broken)
    with pytest.raises(ImportError, match="cannot import name"):
        _cli(tmp_path, "epsilon", "--rounds", "10")


# -- finding 6: warnings made errors -------------------------------------------------------------


def _deprecated(*args, **kwargs):
    warnings.warn("'click.utils.get_binary_stream' is deprecated", DeprecationWarning, stacklevel=1)


@pytest.mark.parametrize("options", [["error"], ["error::DeprecationWarning"]])
def test_6_a_warning_raised_as_an_error_is_one_line(tmp_path, monkeypatch, options):
    import fedprivopt.cli_runs

    monkeypatch.setattr(fedprivopt.cli_runs, "build_checked_run", _deprecated)
    monkeypatch.setattr(sys, "warnoptions", options)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        proc = _cli(tmp_path, "simulate", TOY, "--rounds", "1", "--out", str(tmp_path / "R"))
    line = _one_line(proc)  # before: the DeprecationWarning's traceback
    assert line == (
        "fedprivopt simulate: error: a warning was raised as an error (PYTHONWARNINGS or "
        "python -W make warnings errors): DeprecationWarning: 'click.utils.get_binary_stream' "
        "is deprecated; run with PYTHONWARNINGS=default to see it as a warning; nothing already "
        "written is lost"
    )


def test_6_a_warning_raised_otherwise_stays_a_traceback(tmp_path, monkeypatch):
    import fedprivopt.cli_runs

    monkeypatch.setattr(fedprivopt.cli_runs, "build_checked_run", _deprecated)
    monkeypatch.setattr(sys, "warnoptions", [])
    with warnings.catch_warnings(), pytest.raises(DeprecationWarning):
        warnings.simplefilter("error")
        _cli(tmp_path, "simulate", TOY, "--rounds", "1", "--out", str(tmp_path / "R"))


# -- finding 7: a temporary directory too long for Ray's sockets ---------------------------------


def _room() -> int:
    return 107 - len(ray_processes._RAY_SOCKET.format(pid=os.getpid()))


@pytest.mark.parametrize("name", ["RAY_TMPDIR", "TMPDIR"])
def test_7_a_temporary_directory_too_long_for_rays_sockets_is_refused(tmp_path, monkeypatch, name):
    monkeypatch.delenv("RAY_TMPDIR", raising=False)
    monkeypatch.setenv(name, "/" + "d" * 89)
    out = tmp_path / "R"
    argv = ["simulate", TOY, "--engine", "flower", "--rounds", "1", "--out", str(out), "--quiet"]
    line = _one_line(_cli(tmp_path, *argv))  # before: 152 lines of Ray's and Flower's errors, rc 1
    assert line.startswith(
        f'fedprivopt simulate: error: engine = "flower" starts Ray, whose sockets would lie '
        f"under {name} = '/ddd"
    ), line
    assert line.endswith(
        f"set RAY_TMPDIR to a directory of at most {_room()} bytes (RAY_TMPDIR=/tmp)"
    )
    assert not out.exists()


def test_7_a_directory_that_leaves_room_passes(monkeypatch):
    monkeypatch.setenv("RAY_TMPDIR", "/" + "d" * (_room() - 1))
    ray_processes.check_ray_temp_dir("fast-actors")  # exactly the room: Ray started (measured)
    monkeypatch.setenv("RAY_TMPDIR", "/" + "d" * _room())
    with pytest.raises(ValueError, match=r"^fast-actors starts Ray, .* would have 108 bytes"):
        ray_processes.check_ray_temp_dir("fast-actors")
    monkeypatch.delenv("RAY_TMPDIR")
    monkeypatch.delenv("TMPDIR", raising=False)
    ray_processes.check_ray_temp_dir("fast-actors")  # /tmp
