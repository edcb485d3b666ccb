"""Issue 15, thirty-first review (processes: signals, engine subprocesses, deployment misuse).

1. A train config (``wire.decode_train_config``, what every ClientApp trains from; the
   thirtieth review checked only its ``users``) took its other fields through ``int()``,
   ``float()``, ``bool()`` and ``str()``: ``max-examples`` 0.5 became 0, "no cap", so the user
   trained on all its examples; ``local-epochs`` 2.9 ran 2 epochs, ``round`` 1.5 and ``seed``
   1.5 were rounds and seeds 1, ``round`` -1 was taken, ``"32"`` and ``"7"`` were parsed,
   ``secure`` ``"false"``, ``report-private-metrics`` ``"no"`` and ``clip-bit`` ``"false"``
   were true (the node then sent its users' example counts and losses), a ``stream`` of 5 or
   ``""`` was taken, and a NaN ``round`` raised ``int()``'s message naming no key. Now each key
   has its type and range, and a bad one is a ``ValueError`` naming it (``train config
   'max-examples' must be an integer >= 0, got 0.5``); what ``encode_train_config`` writes
   decodes as before. The three checks of a list of user ids (``read_user_ids``, which took
   only ``int``, ``decode_train_config``, which took any integral, and ``clients.reply_users``)
   are one, ``wire.check_user_ids``, which the ClientApp's evaluation now uses too (its
   ``users`` ``[1.5]`` evaluated user 1, ``["a"]`` raised ``int()``'s message).
2. ``deploy local`` signalled (Ctrl-C, SIGTERM, SIGHUP) said ``fedprivopt deploy local:
   interrupted; every process was stopped`` whatever the run had done: after its last round,
   with ``summary.json`` written (SIGTERM as the deployment waited for Flower to report the run
   finished), the user read "interrupted" and never saw the ``finished`` line; mid-run nothing
   said that ``fedprivopt simulate --resume OUT`` continues it (``simulate``'s line names
   ``--resume``). Now the line says which: ``interrupted after the run had finished (its
   results are in OUT)``, ``... the run can be continued with fedprivopt simulate --resume
   OUT`` (or why it cannot, as ``simulate`` says), or ``interrupted before the run released a
   round``; the exit code is still 128 + the signal.
3. A ``compare --jobs`` worker asked the kernel for SIGTERM when its parent dies, and, for a
   parent that had died before that call, checked ``os.getppid() == 1``. Where orphans go to a
   subreaper (a desktop's ``systemd --user``, ``tini -s``, a supervisor) and not to PID 1, a
   worker whose ``compare`` was killed (``kill -9``, the out-of-memory killer) while the worker
   started lived on: it went on to load torch and wait for cells from a dead parent (shown with
   a subreaper's orphan: ``survived``). It now uses the shared ``core.orphans.die_with_parent``
   (with SIGTERM, which a worker turns into a kept, resumable run), which compares the parent
   with the PID the parent passed it.
4. ``deploy local`` signalled while its run was in progress (SIGHUP when ``metrics.jsonl``
   showed round 1 of 5) went on releasing rounds while it stopped: it stopped the SuperNodes
   first (up to 5 s each to go), then the SuperLink, and the ServerApp, which Flower's
   SuperExec runs in a session of its own, last; meanwhile the ServerApp trained and released
   rounds 2-5 (ε 7.55 at the signal, 15.03 in the ledger at the end) and wrote
   ``summary.json``, 11 s after the signal. The other engines release nothing after the round
   in progress. The ServerApp (``flwr-serverapp``) is now stopped first, and the SuperNodes
   only once it is gone (``ProcessSet.stop`` takes roles of the processes it found in its
   order too).
5. A ClientApp of one's own (``clients.reply_updates``, issue 18's API) sent the update of a
   user id 1.5, ``True`` or ``"1"`` under ``update/1`` (``wire.update_key`` took any id through
   ``int()``; two such ids silently became one key, the last update winning) and -1 under
   ``update/-1``; and it sent its users' example counts and training losses (private) when the
   train config's ``report-private-metrics`` was any true-looking value (``"no"``, 1), through
   ``bool()``. Now ``update_key`` takes an integer ``>= 0`` (numpy's too) or raises
   ``ValueError`` naming ``user_id``, and the private metrics go back only when the server
   asked with ``true`` itself.
6. Two SuperNodes started with the same ``partition-id`` (or with different
   ``num-partitions``) made the ServerApp's user discovery end the run with ``RuntimeError:
   user 2 is hosted by two nodes``, naming neither node nor the cause. It still ends the run
   before anything is released (no user may be trained by two nodes), now naming both nodes
   and how SuperNodes are started.
7. ``deploy local … --rounds 300 --timeout 60`` whose run did not finish in time (rc 1, the
   ServerApp log's last lines) left a resumable run (ledger and checkpoints of 2 rounds) and
   said nothing of it: the user could not tell the run could go on. The failure now ends with
   the same words as an interruption (``the run can be continued with fedprivopt simulate
   --resume OUT``, or why it cannot).
8. ``nohup fedprivopt simulate …`` (SIGHUP ignored, so that the run outlives its terminal)
   stopped when the terminal closed: rc 129, ``interrupted; the run can be continued with
   --resume``. The program's handlers (``interrupt.handle_until_exit``) replaced an ending
   signal that was ignored at its start, which the command's own blocks already leave
   ignored. Now SIGHUP ignored at the start (``nohup``) stays ignored; Ctrl-C and SIGTERM are
   handled as before.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from fedprivopt import wire as P
from fedprivopt.core.local import LocalConfig

_SETTINGS = P.ClientSettings(
    local=LocalConfig(learning_rate=0.1, epochs=2, batch_size=4, max_examples=5, clip_norm=1.0),
    seed=7,
)


def _train_config(**changes: object) -> dict[str, object]:
    record = dict(P.encode_train_config(users=[1, 2], round_num=3, settings=_SETTINGS))
    record.update({key.replace("_", "-"): value for key, value in changes.items()})
    return record


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("round", 1.5),
        ("round", math.nan),
        ("round", "3"),
        ("round", -1),
        ("local-epochs", 2.9),
        ("batch-size", "32"),
        ("max-examples", 0.5),
        ("max-examples", 1.9),
        ("seed", 1.5),
        ("seed", "7"),
        ("secure", "false"),
        ("secure", 1),
        ("report-private-metrics", "no"),
        ("clip-bit", "false"),
        ("clip-norm", "1.0"),
        ("local-learning-rate", "0.1"),
        ("noise-std", "0"),
        ("count-noise-std", "0"),
        ("stream", 5),
        ("stream", ""),
    ],
)
def test_1_a_train_config_key_of_the_wrong_type_is_refused_naming_it(key, value):
    with pytest.raises(ValueError, match=f"train config '{key}' must be"):
        P.decode_train_config(_train_config(**{key: value}))


def test_1_what_encode_writes_decodes_unchanged():
    local = LocalConfig(
        learning_rate=0.25,
        epochs=3,
        batch_size=2,
        max_examples=None,
        clip_norm=None,
        noise_std=0.5,
        clip_bit=True,
        count_noise_std=2.0,
    )
    settings = P.ClientSettings(local=local, seed=2**63 - 1, secure=True)
    for stream, round_num in (("train", 0), ("second", 10**6)):
        record = P.encode_train_config(
            users=[np.int64(4), 0], round_num=round_num, settings=settings, stream=stream
        )
        decoded = P.decode_train_config(record)
        assert decoded == P.TrainConfig((4, 0), round_num, stream, settings)
    assert P.decode_train_config(_train_config()).settings == _SETTINGS


@pytest.mark.parametrize("ids", [[np.int64(3), 1], [0]])
def test_1_the_user_query_answer_takes_integers_of_any_kind_as_the_train_config_does(ids):
    class _Content(dict):
        pass

    content = _Content({P.USERS_RECORD: {P.USER_IDS: ids}})
    assert P.read_user_ids(content) == [int(u) for u in ids]
    assert P.decode_train_config(_train_config(users=ids)).users == tuple(int(u) for u in ids)


@pytest.mark.parametrize("users", [[1.5], ["a"], [True], [-1], [0, 0]])
def test_1_the_client_app_evaluates_only_a_list_of_user_ids(users, server_side):
    from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict

    from fedprivopt.clients.client_app import _evaluate

    message = Message(
        RecordDict(
            {P.ARRAYS_RECORD: ArrayRecord(), P.CONFIG_RECORD: ConfigRecord({P.USERS: users})}
        ),
        dst_node_id=1,
        message_type="evaluate",
    )
    with pytest.raises(ValueError, match="users"):
        _evaluate(message, _toy_context(), _toy_defaults())


def _toy_context():
    from flwr.app import Context, RecordDict

    node_config = {P.NODE_PARTITION_ID: 0, P.NODE_NUM_PARTITIONS: 1}
    return Context(1, 1, node_config, RecordDict(), {})


def _toy_defaults():
    from fedprivopt.clients.client_app import _canonical_params, _Defaults

    return _Defaults("toy", _canonical_params({"num_users": 4}), "cpu")


# -- finding 2: the line of an interrupted deployment ------------------------------------------


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    from tests.reliability.test_fuzz_cli import run_cli
    from tests.reliability.test_misuse_cli import TOY

    out = tmp_path_factory.mktemp("deployed") / "run"
    code, _, err = run_cli(["simulate", str(TOY), "--rounds", "2", "--quiet", "--out", str(out)])
    assert code == 0, err
    return out


def _deploy_interrupted(monkeypatch, tmp_path, source, drop=()):
    """``deploy local`` whose deployment wrote ``source``'s files (but ``drop``), then SIGINT."""
    import shutil
    import signal

    from fedprivopt.deploy import local
    from fedprivopt.simulation.interrupt import Interrupted
    from tests.reliability.test_fuzz_cli import run_cli

    out = tmp_path / "out"

    def deployed(**kwargs):
        if source is not None:
            shutil.copytree(source, kwargs["out"], dirs_exist_ok=True)
            for name in drop:
                (Path(kwargs["out"]) / name).unlink()
        raise Interrupted(signal.SIGINT)

    monkeypatch.setattr(local, "deploy_local", deployed)
    code, _, err = run_cli(["deploy", "local", "--nodes", "2", "--out", str(out)])
    assert code == 130, err
    assert len(err.strip().splitlines()) == 1, err
    return out, err.strip()


def test_2_a_deployment_interrupted_after_its_run_finished_says_so(
    monkeypatch, tmp_path, finished_run
):
    out, line = _deploy_interrupted(monkeypatch, tmp_path, finished_run)
    assert "interrupted after the run had finished" in line, line
    assert str(out) in line, line


def test_2_a_deployment_interrupted_mid_run_names_the_command_that_continues_it(
    monkeypatch, tmp_path, finished_run
):
    from tests.reliability.test_fuzz_cli import run_cli

    out, line = _deploy_interrupted(monkeypatch, tmp_path, finished_run, drop=["summary.json"])
    assert line.endswith(f"the run can be continued with fedprivopt simulate --resume {out}"), line
    code, _, err = run_cli(["simulate", "--resume", str(out), "--quiet"])
    assert code == 0, err  # the advice works


def test_2_a_deployment_interrupted_before_its_run_began_says_nothing_was_released(
    monkeypatch, tmp_path
):
    _, line = _deploy_interrupted(monkeypatch, tmp_path, None)
    assert "interrupted before the run released a round" in line, line


# -- finding 3: a compare worker whose parent died as it started -------------------------------

# What a compare worker's start does first (test_3_..._asks_for_sigterm below checks that
# parallel._start_worker makes this call, before it imports torch); importing parallel itself
# (torch, dp-accounting: 8-12 s on a loaded machine) is no part of the check.
_ORPHAN = """
import os, signal, sys, time
parent = int(sys.argv[1])
while os.getppid() == parent:  # until the parent has died
    time.sleep(0.01)
from fedprivopt.core.orphans import die_with_parent
die_with_parent(parent, signal.SIGTERM)
"""

_SUBREAPER = """
import ctypes, os, subprocess, sys
assert ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
starter = (
    "import os, subprocess, sys; "
    f"p = subprocess.Popen([sys.executable, '-c', {sys.argv[1]!r}, str(os.getpid())], "
    "stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); "
    "print(p.pid, flush=True)"
)
a = subprocess.run([sys.executable, "-c", starter], capture_output=True, text=True, check=True)
worker = int(a.stdout.split()[0])
print(worker, flush=True)
_, status = os.waitpid(worker, 0)  # the orphan is this process's child now
print("exit", os.waitstatus_to_exitcode(status), flush=True)
"""


def test_3_a_compare_worker_whose_parent_died_as_it_started_ends_under_a_subreaper():
    import os
    import signal
    import subprocess
    import sys

    helper = subprocess.Popen(
        [sys.executable, "-c", _SUBREAPER, _ORPHAN],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    worker = None
    try:
        worker = int(helper.stdout.readline())
        out = helper.communicate(timeout=240)[0]  # the helper reaps the worker
    except BaseException:
        for pid in (worker, helper.pid):  # the worker is the helper's child until reaped
            if pid is not None:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        helper.wait()
        raise
    assert f"exit {-signal.SIGTERM}" in out, out  # exit 0: it went on, its parent dead


def test_3_a_compare_worker_asks_for_sigterm_with_its_parent_before_it_imports_torch(
    monkeypatch,
):
    import signal
    import sys

    from fedprivopt.simulation import interrupt, parallel

    class _Asked(Exception):
        pass

    asked, handlers = [], []

    def die_with_parent(parent, sig=signal.SIGKILL):
        asked.append((parent, sig))
        raise _Asked

    monkeypatch.setattr(parallel, "die_with_parent", die_with_parent)
    monkeypatch.setattr(signal, "signal", lambda sig, handler: handlers.append((sig, handler)))
    monkeypatch.setattr(signal, "pthread_sigmask", lambda how, mask: set())
    monkeypatch.setattr(interrupt._SIGNALS, "line", interrupt._SIGNALS.line)
    monkeypatch.setitem(sys.modules, "torch", None)  # importing torch first: ImportError
    with pytest.raises(_Asked):
        parallel._start_worker(4242)
    assert asked == [(4242, signal.SIGTERM)]
    assert signal.SIGTERM not in [sig for sig, _ in handlers]  # SIGTERM still ends it


# -- finding 4: the ServerApp is stopped before the SuperNodes -------------------------------

_FAKE_SERVERAPP = (
    "import os, sys, time; open(sys.argv[2], 'w').write(str(os.getpid())); time.sleep(600)"
)
_FAKE_LINK = (
    "import subprocess, sys, time; "
    "subprocess.Popen([sys.executable, '-c', sys.argv[1], 'flwr-serverapp', sys.argv[2]], "
    "start_new_session=True); time.sleep(600)"
)
_FAKE_NODE = """
import signal, sys, time
from fedprivopt.simulation.watchdog import pid_alive

def stopped(signum, frame):  # what a SuperNode would still serve: is the ServerApp running?
    pid = int(open(sys.argv[1]).read())
    open(sys.argv[2], "w").write("running" if pid_alive(pid) else "gone")
    sys.exit(0)

signal.signal(signal.SIGTERM, stopped)
open(sys.argv[3], "w").close()  # ready
time.sleep(600)
"""


def test_4_a_deployment_stops_its_server_app_before_its_super_nodes(tmp_path):
    import os
    import sys
    import time

    from fedprivopt.deploy.local import STOP_ORDER
    from fedprivopt.deploy.processes import ProcessSet

    pid_file, seen, ready = tmp_path / "serverapp.pid", tmp_path / "node-saw", tmp_path / "ready"
    procs = ProcessSet(dict(os.environ), tmp_path / "logs")
    try:
        procs.start(
            "superlink",
            [sys.executable, "-c", _FAKE_LINK, _FAKE_SERVERAPP, str(pid_file)],
            "superlink",
        )
        procs.start(
            "supernode",
            [sys.executable, "-c", _FAKE_NODE, str(pid_file), str(seen), str(ready)],
            "supernode-0",
        )
        for _ in range(1200):  # the ServerApp and the node run, whatever the load
            if ready.is_file() and pid_file.is_file() and pid_file.read_text():
                break
            time.sleep(0.1)
    finally:
        procs.stop(order=STOP_ORDER)  # by PID, also when the test failed before
    assert seen.read_text() == "gone"  # "running": rounds went on while the nodes stopped


# -- finding 5: a ClientApp's reply names its users as the server does --------------------------


@pytest.mark.parametrize("user", [1.5, True, "1", -1, np.float64(1.0)])
def test_5_an_update_key_is_made_of_a_user_id_only(user):
    with pytest.raises(ValueError, match="user_id"):
        P.update_key(user)  # 1.5, True, "1": update/1; -1: update/-1


def test_5_a_client_app_cannot_reply_for_a_user_id_that_is_no_integer(server_side):
    import torch

    from fedprivopt.clients import reply_updates
    from tests.messages import delivered

    message = delivered({P.CONFIG_RECORD: _config_record()}, "train")
    assert P.update_key(np.int64(3)) == "update/3"
    with pytest.raises(ValueError, match="user_id"):
        reply_updates(message, {1: torch.zeros(3), 1.5: torch.ones(3)})  # one key, ones won


@pytest.mark.parametrize("asked", ["no", 1, "false"])
def test_5_private_metrics_go_back_only_when_the_server_asked_with_true(asked, server_side):
    import torch

    from fedprivopt.clients import reply_updates
    from tests.messages import delivered

    message = delivered({P.CONFIG_RECORD: _config_record(report_private_metrics=asked)}, "train")
    reply = reply_updates(message, {1: torch.zeros(3)}, num_examples=[7], losses=[0.5])
    assert P.NUM_EXAMPLES not in reply.content[P.TRAIN_METRICS]  # example counts: private
    # a non-private round's (clip-norm 0): a private one never sends them (forty-second review)
    asked = _config_record(report_private_metrics=True, clip_norm=0.0)
    message = delivered({P.CONFIG_RECORD: asked}, "train")
    reply = reply_updates(message, {1: torch.zeros(3)}, num_examples=[7], losses=[0.5])
    assert reply.content[P.TRAIN_METRICS][P.NUM_EXAMPLES] == [7]


def _config_record(**changes: object):
    from flwr.app import ConfigRecord

    return ConfigRecord(_train_config(**changes))


# -- finding 6: two SuperNodes hosting one user -----------------------------------------------


def test_6_two_nodes_hosting_one_user_are_named_with_the_cause(server_side):
    from flwr.app import MetricRecord, RecordDict

    from tests.reliability.test_twentyninth_review_privacy import QueryGrid, user_query_strategy

    again = RecordDict({P.USERS_RECORD: MetricRecord({P.USER_IDS: [2]})})  # node 101's user
    with pytest.raises(ValueError, match="user 2 is hosted by nodes 100 and 101") as info:
        user_query_strategy().discover_users(QueryGrid(again))
    assert "partition-id" in str(info.value)


# -- finding 7: a deployment that ran out of time says how its run continues --------------------


def test_7_a_deployment_past_its_timeout_names_the_command_that_continues_its_run(
    monkeypatch, tmp_path, finished_run
):
    import shutil

    from fedprivopt.deploy import local
    from tests.reliability.test_fuzz_cli import run_cli

    out = tmp_path / "out"

    def deployed(**kwargs):
        shutil.copytree(finished_run, kwargs["out"], dirs_exist_ok=True)
        (Path(kwargs["out"]) / "summary.json").unlink()
        raise TimeoutError("run 7 did not finish within the timeout; ServerApp log:\nround 2")

    monkeypatch.setattr(local, "deploy_local", deployed)
    code, _, err = run_cli(["deploy", "local", "--nodes", "2", "--out", str(out)])
    assert code == 1, err
    last = err.strip().splitlines()[-1]
    assert last.endswith(f"the run can be continued with fedprivopt simulate --resume {out}"), err


# -- finding 8: a signal ignored at the start (nohup) stays ignored -----------------------------

_NOHUP = """
import signal
signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as nohup starts the program
from fedprivopt.simulation import interrupt
interrupt.handle_until_exit()
print(signal.getsignal(signal.SIGHUP) is signal.SIG_IGN, signal.getsignal(signal.SIGTERM))
"""


def test_8_the_program_leaves_a_signal_ignored_at_its_start_ignored():
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", _NOHUP], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    kept, term = done.stdout.split(maxsplit=1)
    assert kept == "True", done.stdout  # False: a closed terminal stopped a nohup run
    assert "_raise" in term  # the others are still the program's
