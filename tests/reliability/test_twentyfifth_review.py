"""Issue 15, twenty-fifth hostile review: regression tests of its findings.

1. ``deploy local --nodes 2 simulations/toy.toml --set min-nodes=V`` converted ``V`` with
   ``int()`` unchecked (with a preset; without one only ``>= 1`` was checked): ``1.5``, ``"2"``
   and ``true`` ran as 1, 2 and 1; ``inf`` and ``[1]`` ended in ``OverflowError`` and
   ``TypeError`` tracebacks (rc 1); ``abc`` and ``nan`` in ``int()``'s messages naming no key;
   ``0``, ``-3`` and ``1e300`` started the SuperLink and both SuperNodes and failed in the
   ServerApp (rc 1, Flower's lines, ``OUT/deploy`` left behind); ``5`` (more than ``--nodes``)
   waited for nodes that never come until ``--timeout``. Now ``--set min-nodes must be an integer
   in [1, --nodes=2], got ...``: rc 2, one line, before anything is written or started.
2. ``fedprivopt.strategies.flower.DPStrategy`` (Python API) took any value: ``node_wait`` NaN (or
   inf) waited for ever for a user on no node (``time.monotonic() > nan`` is never true; a hang
   seen with 5 s limits); ``min_nodes`` 1.5, 0, -5, ``"2"`` and ``True`` and ``node_wait`` ``"3"``
   were converted; ``min_nodes`` NaN raised ``int()``'s message naming nothing; an ``on_round``
   of 5 failed after the first round was released; ``start(num_rounds=-1)`` ran no round and
   said the rounds were done (1.5 and ``"2"`` were ``TypeError``s); ``start(timeout=nan)``, 0 or
   -1 were taken, and Flower's grids then wait for no reply (``time.time() < end_time`` is
   false at once), so every update of every round is lost and counted as timed out. Now each is
   a ``ValueError`` naming the parameter and its range, before anything is sent.
3. The local trainers (Python API: ``LocalTrainer.train``, ``TagCohortTrainer`` and
   ``NextWordCohortTrainer``'s ``train``/``train_batches``) took a user id of 1.5, ``True`` or
   ``"3"`` as users 1, 1 and 3, and a round of 1.5 as round 1 (``int()``); a user NaN raised
   ``int()``'s message naming nothing; the cohort trainers took a ``stream`` of ``None`` or
   ``""`` (``LocalTrainer`` refused them), failed on a ``config`` dict or ``rngs=None`` with
   ``AttributeError`` and on an int64 model with torch's ``RuntimeError`` (``LocalTrainer``
   converted the int64 model silently), and ``NextWordCohortTrainer(stacked="no")`` stacked.
   Now ``core.local.check_train_call`` (and ``CohortTrainer.checked_call``) refuse each with a
   ``ValueError`` naming the argument, before anything is trained. (``LocalTrainer``'s checks of
   ``stream``, ``config`` and ``rngs``, and the integer ids of numpy and torch, held before and
   are kept here as guards; so did a cohort round of 1.5 in this working tree, refused by the
   generators of the privacy package.)
4. ``TagCohortTrainer(task, cpu_threads=10**5)`` (also ``NextWordCohortTrainer``; Python API) was
   accepted, and the first local step set torch's intra-op threads to 100,000: OpenMP started
   them (``SystemError: error return without exception set`` under an 8 GiB address-space
   limit; ``10**9``: ``RuntimeError: std::bad_alloc``). ``cpu_threads`` and ``cpu_workers`` are
   now at most ``models.cohort.MAX_THREADS`` (1,024), refused when the trainer is built.
5. ``simulate stackoverflow-tp-mini.toml --set task-params.data-dir=D --set
   task-params.synth-clients=5000`` with ``D`` on a 20 MB file system wrote until the disk was
   full and then ended rc 2 (``No space left on device``), where ``data synth`` refuses before
   writing (fourteenth review); a task's generation had no check, so 10**6 users of
   ``synth-user-sizes = "real"`` (about 140 GB) would fill a shared disk for half an hour first.
   ``data.synthetic.generate`` now checks the free space itself (a lower bound of 200 bytes an
   example): rc 2, one line naming the directory, the need and the free space, nothing written.
6. ``clients.privatize_update`` (the public privacy step of a user's own ClientApp), documented
   to raise ``ValueError``: ``clip_norm=1+0j`` or ``[1]`` and ``noise_std="1"`` or ``None`` raised
   ``TypeError``s naming nothing (``float()``'s, ``'>' not supported``), ``clip_norm=True`` a
   ``TypeError``, ``noise_std=True`` a message naming ``std``; a 0-d tensor ``noise_std`` was
   taken; a sparse update ended in torch's ``NotImplementedError`` and ``clip=5`` in ``'int'
   object is not callable``. Now a ``ValueError`` naming the parameter, before anything runs.
7. ``simulate toy.toml --set 'task-params.examples-per-user=[1.5,40.9]'`` (also ``[true,5]``,
   ``["3","5"]``, ``[-0.5,3]``) ran rc 0 with users of ``(1, 40)``, ``(1, 5)``, ``(3, 5)`` and
   ``(0, 3)`` examples (``int()`` of each entry), while ``config.toml`` and the ledger recorded
   the values as written; ``[3,1e300]`` was refused with a 301-digit number. Now the pair's
   entries must be integers: rc 2, one line naming ``task-params.examples-per-user``.
8. The tasks' ``user_data`` and ``user_size`` (toy, tag prediction, next-word prediction; Python
   API) took a user id of 1.5, 2.0 or ``"3"`` through ``int()`` as users 1, 2 and 3, and NaN
   raised ``cannot convert float NaN to integer``. Now ``core.local.check_user_id``: an integer
   of any kind (numpy's, a 0-d integer tensor) in ``[0, num_users)``, else a ``ValueError``
   naming ``user_id`` and its range.
9. ``simulate toy.toml --out "~/runs/a"`` (the tilde quoted, as in a script or a notes file)
   created a directory named ``~`` in the working directory, where ``compare``, ``tune``,
   ``data synth`` and ``deploy local`` write into the home directory (the check of ``--out``
   expanded it, and the run then used the text as given); ``simulate --resume "~/runs/a"``
   looked for ``./~/runs/a``. A user cleaning up the stray ``~`` with ``rm -rf ~`` deletes
   their home. Now both use the checked, expanded path, as the other commands do.
10. ``data.Vocabulary.top(k)`` and ``read_word_counts``/``read_tag_counts(limit=...)`` (Python
   API) took ``True`` as 1 and raised ``TypeError``s naming nothing for 1.5, NaN, ``"5"`` and
   ``None``; ``SQLiteSplit``/``HDF5Split`` echoed a 1 MB client id whole in their ``KeyError``.
   Now a ``ValueError`` naming ``k`` or ``limit``, and the id cut as every other message cuts
   values.
11. ``models.side_information.two_level_preconditioner(vocab_size=10**9, num_tags=10**9)``
   (also ``token_frequency_preconditioner``; Python API) asked torch's allocator for 4 EB (a
   ``RuntimeError``): the layout, the tag model's, is now bounded as that model is (2**26
   values), before anything is allocated. ``models.register_task("t", 5)`` registered a
   factory that is not callable, which failed only when the task was built.
12. ``LocalConfig(learning_rate=1e300)`` (Python API) was accepted: ``LocalTrainer.train`` then
   failed with torch's ``RuntimeError: value cannot be converted to type float without
   overflow`` and the tag cohort trainer returned zero updates (diverged); the command line
   bounds ``local-learning-rate`` at float32's largest value. ``count_noise_std=1e101`` was
   accepted and refused by ``count_share`` only after the round had trained. Now both are
   bounded when the ``LocalConfig`` is made (float32's largest value; 1e100).
13. A SuperNode's ``--node-config "partition-id=1.9 num-partitions=2.5"`` (also ``"1"``, ``true``)
   went through ``int()``: the node hosted partition 1 of 2 without a word
   (``clients.hosted_users``, ``wire.hosted_users``). Now a ``ValueError`` naming the key.
14. ``simulation.run.simulate(config, "")`` (Python API) wrote the run into the working
   directory and ``resume("")`` resumed whatever run was there (the command line refuses
   ``--out ""`` and ``--resume ""`` since the first reviews; the functions did not); ``None``
   or ``5`` raised ``os.fspath``'s ``TypeError`` and a config dict an ``AttributeError``. Now a
   ``ValueError`` naming ``out_dir`` or ``config``, before anything is written.
15. The tag task's token store (``data.token_cache.EncodedUsers``, Python API):
   ``example_counts([1.5])`` read user 1 and ``gather``'s pick 0.7 example 0 (``np.asarray(...,
   dtype=int64)``), ``user(1.5)`` raised numpy's ``IndexError``. Now ``ValueError``s naming
   ``users``, ``picks`` or ``user_id``.
16. ``fedprivopt data info D | true`` (a pipe whose reader has left: ``| head -0``, ``| grep -q``;
   also ``epsilon`` and ``simulate``) ended in a ``BrokenPipeError`` traceback, rc 1, after the
   command's work was done; ``fedprivopt simulate … --out R > /dev/full`` (a full disk under the
   redirected output) said ``error: argument --out: R: [Errno 28] No space left on device``
   of a run written completely (an error without a file name was taken for one of ``--out``).
   Now (``cli_stdout``) a closed pipe ends the command quietly with 141 (128 + SIGPIPE) and any
   other failure of standard output is one line naming it, rc 2.
17. ``fedprivopt simulate toy.toml --rounds 3 --out R 2> LOG`` with ``LOG`` on a full disk
   (``2>/dev/full``), or ``2>&1 | head -1`` once ``head`` has left, stopped the run at its first
   progress line: rc 1, a traceback nobody could read, no checkpoint and no ``summary.json``
   (resumable). Progress lines, notes and errors are diagnostics: a write to standard error that
   fails is now dropped, and the run completes (rc 0; 141 when standard output is the closed
   pipe too).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fedprivopt.clients import LocalConfig, LocalTrainer
from fedprivopt.models import build_task, initial_flat
from fedprivopt.models.next_word_cohort import NextWordCohortTrainer
from fedprivopt.models.tag_prediction_cohort import TagCohortTrainer
from fedprivopt.privacy import RngFactory
from fedprivopt.privacy.flat import flatten
from fedprivopt.strategies import StrategyConfig, build_algorithm
from fedprivopt.strategies.flower import DPStrategy
from fedprivopt.strategies.flower_arrays import flat_to_arrays
from tests.reliability.test_fuzz_cli import run_cli
from tests.reliability.test_twentythird_review import one_line_error
from tests.strategies.test_flower_faults import DIM, POPULATION, ScriptedGrid
from tests.tag_synth import SYNTH, make_synth_dir, tag_task

ROOT = Path(__file__).resolve().parents[2]
TOY = ROOT / "simulations" / "toy.toml"
MINI = ROOT / "simulations" / "stackoverflow-tp-mini.toml"


@pytest.fixture
def no_deployment(monkeypatch):
    """Fail at once if ``deploy local`` gets past its checks (nothing may start)."""
    import fedprivopt.simulation.run as run

    def started(*args, **kwargs):
        raise AssertionError("deploy local went on to build the run")

    monkeypatch.setattr(run, "build_run", started)


@pytest.mark.parametrize(
    "value", ["1.5", "'2'", "true", "inf", "nan", "[1]", "abc", "0", "-3", "1e300", "5"]
)
@pytest.mark.parametrize("preset", [True, False], ids=["preset", "app-config"])
def test_1_deploy_min_nodes_checked(tmp_path, no_deployment, value, preset):
    out = tmp_path / "dl"
    argv = ["deploy", "local", "--nodes", "2", "--insecure", "--rounds", "1", "--out", str(out)]
    argv += [str(TOY)] if preset else []
    code, _, err = run_cli([*argv, "--set", f"min-nodes={value}", "--quiet"])
    one_line_error(code, err, "min-nodes", "[1, --nodes=2]")
    assert not out.exists()


def flower_strategy(**kwargs) -> tuple[DPStrategy, torch.Tensor, object]:
    """A DPStrategy of dp-fedavg over the scripted grid's users (every user every round)."""
    config = StrategyConfig(
        strategy="dp-fedavg",
        population=POPULATION,
        clients_per_round=POPULATION,
        num_server_rounds=3,
        noise_multiplier=0.8,
        clip_norm=1.0,
        seed=5,
    )
    flat, spec = flatten({"w": torch.zeros(DIM)})
    return DPStrategy(build_algorithm(config, flat), spec, **kwargs), flat, spec


@pytest.mark.parametrize(
    "name, value",
    [
        ("node_wait", float("nan")),
        ("node_wait", float("inf")),
        ("node_wait", -1.0),
        ("node_wait", "3"),
        ("min_nodes", 1.5),
        ("min_nodes", 0),
        ("min_nodes", -5),
        ("min_nodes", "2"),
        ("min_nodes", True),
        ("min_nodes", float("nan")),
        ("on_round", 5),
    ],
)
def test_2_flower_strategy_arguments_checked(name, value):
    with pytest.raises(ValueError, match=f"^{name} must be"):
        flower_strategy(**{name: value})


@pytest.mark.parametrize(
    "name, value",
    [
        ("num_rounds", -1),
        ("num_rounds", 0),
        ("num_rounds", 1.5),
        ("num_rounds", "2"),
        ("num_rounds", True),
        ("timeout", float("nan")),
        ("timeout", 0),
        ("timeout", -1),
        ("timeout", "1"),
    ],
)
def test_2_flower_strategy_start_checked(server_side, name, value):
    strategy, flat, spec = flower_strategy(node_wait=0.3)
    arguments = {"num_rounds": 2, "timeout": 1.0, name: value}
    with pytest.raises(ValueError, match=f"^{name} must be"):
        strategy.start(ScriptedGrid({}), flat_to_arrays(flat, spec), **arguments)
    assert strategy.algorithm.round_num == 0  # nothing was released


def test_2_flower_strategy_still_runs(server_side):
    strategy, flat, spec = flower_strategy(node_wait=0.3, min_nodes=6)
    strategy.start(ScriptedGrid({}), flat_to_arrays(flat, spec), 2, timeout=1.0)
    assert strategy.algorithm.round_num == 2


@pytest.fixture(scope="module")
def trainers(tmp_path_factory):
    """``name: (train(users, **overrides), the model)`` of the three local trainers."""
    tag = tag_task(make_synth_dir(tmp_path_factory, "r25-tag"))
    nwp = build_task(
        "stackoverflow-nwp", data_dir=str(tmp_path_factory.mktemp("r25-nwp")), num_users=20,
        eval_users=5, vocab_size=500, embedding_dim=8, hidden_size=8, **SYNTH,
    )  # fmt: skip
    local = LocalTrainer(tag, device="cpu")

    def call(trainer, model):
        def train(users, **overrides):
            config = LocalConfig(learning_rate=1.0, batch_size=4, clip_norm=0.5)
            args = dict(round_num=3, config=config, rngs=RngFactory(seed=11), stream="train")
            args.update(overrides)
            model_ = args.pop("model", model)
            if trainer is local:
                return [local.train(model_, user_id=users[0], **args).delta]
            return [d for _, d in trainer.train(model_, users, **args)]

        return train, model, trainer.task

    return {
        "local": call(local, initial_flat(tag)),
        "tag-cohort": call(TagCohortTrainer(tag, device="cpu"), initial_flat(tag)),
        "next-word-cohort": call(NextWordCohortTrainer(nwp, device="cpu"), initial_flat(nwp)),
    }


BAD_CALLS = [
    ("user id", {"users": [1.5]}),
    ("user id", {"users": [True]}),
    ("user id", {"users": ["3"]}),
    ("user id", {"users": [float("nan")]}),
    ("round_num", {"round_num": 1.5}),
    ("round_num", {"round_num": None}),
    ("stream", {"stream": None}),
    ("stream", {"stream": ""}),
    ("config", {"config": {"learning_rate": 1.0}}),
    ("rngs", {"rngs": None}),
    ("global_flat", {"model": "int64"}),
]


@pytest.mark.parametrize("kind", ["local", "tag-cohort", "next-word-cohort"])
@pytest.mark.parametrize(
    "name, bad", BAD_CALLS, ids=[f"{n}-{i}" for i, (n, _) in enumerate(BAD_CALLS)]
)
def test_3_local_trainers_check_their_call(trainers, kind, name, bad):
    train, model, _ = trainers[kind]
    bad = dict(bad)
    users = bad.pop("users", [1])
    if bad.get("model") == "int64":
        bad["model"] = model.long()
    with pytest.raises(ValueError, match=f"^{name} must"):
        train(users, **bad)


@pytest.mark.parametrize("kind", ["local", "tag-cohort", "next-word-cohort"])
def test_3_local_trainers_take_integer_ids(trainers, kind):
    """numpy's integers and an integer tensor are user ids; the update equals the int's."""
    import numpy as np

    train, _, _ = trainers[kind]
    (want,) = train([2])
    for users in ([np.int64(2)], torch.tensor([2])):
        (got,) = train(users, round_num=np.int64(3))
        torch.testing.assert_close(dense(got), dense(want), rtol=0, atol=0)


def dense(update) -> torch.Tensor:
    """A dense update as it is; a row-sparse one made dense."""
    return update.to_dense() if hasattr(update, "to_dense") else update


def test_3_stacked_is_a_bool(trainers):
    task = trainers["next-word-cohort"][2]
    with pytest.raises(ValueError, match=r"^stacked must be true or false"):
        NextWordCohortTrainer(task, device="cpu", stacked="no")


@pytest.mark.parametrize("name", ["cpu_threads", "cpu_workers"])
@pytest.mark.parametrize("kind", [TagCohortTrainer, NextWordCohortTrainer])
def test_4_cohort_trainer_threads_bounded(trainers, kind, name):
    task = trainers["tag-cohort" if kind is TagCohortTrainer else "next-word-cohort"][2]
    for value in (1025, 10**5, 10**9):
        with pytest.raises(ValueError, match=rf"^{name} must be an integer in \[1, 1024\]"):
            kind(task, device="cpu", **{name: value})
    assert getattr(kind(task, device="cpu", **{name: 1024}), name) == 1024


def test_5_task_generation_checks_the_free_disk(tmp_path, monkeypatch):
    import shutil

    disk_usage = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage", lambda p: disk_usage(p)._replace(free=2_000_000))
    data, out = tmp_path / "data", tmp_path / "run"
    argv = ["simulate", str(MINI), "--rounds", "1", "--out", str(out), "--quiet"]
    for key, value in (("data-dir", data), ("synth-clients", 500), ("num-users", 400)):
        argv += ["--set", f"task-params.{key}={value}"]
    code, _, err = run_cli(argv)
    one_line_error(code, err, str(data), "500 users", "0.002 GB free")
    assert not (data / "stackoverflow.sqlite").exists() and not out.exists()
    from fedprivopt.data.synthetic import check_free_disk
    from fedprivopt.data.synthetic_config import SyntheticConfig

    free = 500 * 40 * 200  # the bound: 200 bytes an example
    monkeypatch.setattr(shutil, "disk_usage", lambda p: disk_usage(p)._replace(free=free))
    check_free_disk(data, SyntheticConfig(num_clients=500, vocab_size=600, num_tags=20))


@pytest.mark.parametrize(
    "name, value",
    [
        ("clip_norm", 1 + 0j),
        ("clip_norm", [1]),
        ("clip_norm", True),
        ("clip_norm", "1"),
        ("noise_std", "1"),
        ("noise_std", None),
        ("noise_std", True),
        ("noise_std", torch.tensor(0.5)),
        ("clip", 5),
        ("add_noise", 5),
        ("update", "sparse"),
    ],
)
def test_6_privatize_update_arguments(name, value):
    from fedprivopt.clients import privatize_update

    update = torch.tensor([3.0, 4.0])
    kwargs = {"clip_norm": 1.0, "noise_std": 0.5, "generator": torch.Generator().manual_seed(0)}
    if name == "update":
        update = update.to_sparse()
    else:
        kwargs[name] = value
    with pytest.raises(ValueError, match=f"^{name} must be"):
        privatize_update(update, **kwargs)


@pytest.mark.parametrize(
    "value", ["[1.5,40.9]", "[true,5]", '["3","5"]', "[-0.5,3]", "[3,1e300]", "[1,2,3]"]
)
def test_7_toy_examples_per_user_pair_of_integers(tmp_path, value):
    out = tmp_path / "run"
    argv = ["simulate", str(TOY), "--rounds", "1", "--out", str(out), "--quiet"]
    code, _, err = run_cli([*argv, "--set", f"task-params.examples-per-user={value}"])
    err = one_line_error(code, err, "task-params.examples-per-user", "pair (lo, hi) of integers")
    assert len(err) < 300 and not out.exists()


def test_7_toy_examples_per_user_integers_still_taken():
    import numpy as np

    from fedprivopt.models.toy import ToyClassificationTask

    for value, want in (((0, 0), (0, 0)), ([5, 40], (5, 40)), ((np.int64(2), 9), (2, 9))):
        assert ToyClassificationTask(num_users=3, examples_per_user=value).examples_per_user == want
    assert ToyClassificationTask(num_users=3, examples_per_user=np.int64(7)).examples_per_user == 7


@pytest.mark.parametrize("value", [1.5, 2.0, "3", True, float("nan")])
@pytest.mark.parametrize("kind", ["toy", "tag-cohort", "next-word-cohort"])
def test_8_task_user_ids_are_integers(trainers, kind, value):
    import numpy as np

    from fedprivopt.models.toy import ToyClassificationTask

    task = ToyClassificationTask(num_users=5) if kind == "toy" else trainers[kind][2]
    for read in (task.user_data, task.user_size):
        with pytest.raises(ValueError, match=r"^user_id must be an integer in \[0, "):
            read(value)
        assert read(np.int64(2)) is not None and read(torch.tensor(2)) is not None


def test_9_simulate_expands_a_tilde_as_the_other_commands_do(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(tmp_path)
    argv = ["simulate", str(TOY), "--rounds", "1", "--out", "~/runs/a", "--quiet"]
    code, out, err = run_cli(argv)
    assert code == 0, err
    assert not (tmp_path / "~").exists()
    assert (home / "runs" / "a" / "config.toml").is_file() and str(home) in out
    config = home / "runs" / "a" / "config.toml"
    config.write_text(config.read_text().replace("num-server-rounds = 1", "num-server-rounds = 2"))
    code, out, err = run_cli(["simulate", "--resume", "~/runs/a", "--quiet"])
    assert code == 0, err
    assert out.startswith("2 rounds") and not (tmp_path / "~").exists()


@pytest.mark.parametrize("value", [1.5, float("nan"), "5", None, True, -1])
def test_10_vocabulary_sizes_are_integers(tmp_path, value):
    """``k`` is an integer; ``limit`` too, or None (every word)."""
    from fedprivopt.data import read_word_counts

    path = tmp_path / "stackoverflow.word_count"
    path.write_text("the 30\nof 20\nto 10\n")
    vocab = read_word_counts(path)
    with pytest.raises(ValueError, match=r"^k must be an integer >= 0"):
        vocab.top(value)
    if value is not None:
        with pytest.raises(ValueError, match=r"^limit must be an integer >= 0 or None"):
            read_word_counts(path, limit=value)
    assert read_word_counts(path, limit=2).items == ("the", "of")
    assert len(read_word_counts(path, limit=None)) == 3


def test_10_unknown_client_id_is_cut(tmp_path):
    from fedprivopt.data import SQLiteSplit, generate
    from fedprivopt.data.synthetic_config import SyntheticConfig

    files = generate(tmp_path, SyntheticConfig(num_clients=20, vocab_size=200, num_tags=5))
    split = SQLiteSplit(files.sqlite, "train")
    with pytest.raises(KeyError) as info:
        split.num_examples("x" * 1_000_000)
    assert len(str(info.value)) < 300


def test_11_side_information_layout_bounded():
    from fedprivopt.models.side_information import (
        token_frequency_preconditioner,
        two_level_preconditioner,
    )

    with pytest.raises(ValueError, match="vocab_size=1000000000, num_tags=1000000000 give"):
        two_level_preconditioner(vocab_size=10**9, num_tags=10**9, top_k=2)
    with pytest.raises(ValueError, match="vocab_size=100000000, num_tags=100 give"):
        token_frequency_preconditioner([1.0] * 10, vocab_size=10**8, num_tags=100)
    assert two_level_preconditioner(vocab_size=5, num_tags=2, top_k=2).shape == (12,)


def test_11_register_task_needs_a_callable(monkeypatch):
    from fedprivopt.models import registry

    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    with pytest.raises(ValueError, match=r"^factory must be callable, got 5"):
        registry.register_task("r25", 5)
    assert "r25" not in registry.task_names()


def test_12_local_config_bounds(trainers):
    with pytest.raises(ValueError, match=r"^learning_rate must be a finite number in"):
        LocalConfig(learning_rate=1e300, clip_norm=1.0)
    with pytest.raises(ValueError, match=r"^count_noise_std must be a finite number in"):
        LocalConfig(learning_rate=1.0, clip_norm=1.0, clip_bit=True, count_noise_std=1e101)
    top = LocalConfig(learning_rate=float(torch.finfo(torch.float32).max), count_noise_std=1e100)
    train, _, _ = trainers["local"]
    (update,) = train([1], config=top)  # the largest rate trains (and diverges), no error
    assert update.shape[0] > 0


@pytest.mark.parametrize(
    "partition, parts", [(1.9, 2), (1, 2.5), ("1", 2), (True, 2), (0, float("nan")), (2, 2)]
)
def test_13_node_partition_keys_are_integers(partition, parts):
    from fedprivopt import wire

    with pytest.raises(ValueError, match=r"^(partition-id|num-partitions) must be an integer"):
        wire.hosted_users(partition, parts, 10)
    assert wire.hosted_users(1, 3, 10) == [1, 4, 7]


@pytest.mark.parametrize("out", ["", None, 5])
def test_14_simulate_and_resume_need_a_path(tmp_path, monkeypatch, out):
    from fedprivopt.simulation.config import load_config
    from fedprivopt.simulation.run import resume, simulate

    monkeypatch.chdir(tmp_path)
    config = load_config(str(TOY), {"num-server-rounds": 1})
    with pytest.raises(ValueError, match=r"^out_dir must be a non-empty path"):
        simulate(config, out)
    assert list(tmp_path.iterdir()) == []
    simulate(config, tmp_path / "run")
    monkeypatch.chdir(tmp_path / "run")
    with pytest.raises(ValueError, match=r"^out_dir must be a non-empty path"):
        resume(out)
    with pytest.raises(ValueError, match=r"^config must be a RunConfig"):
        simulate({"task": "toy"}, tmp_path / "other")


def test_15_token_store_ids_are_integers(tmp_path_factory):
    import numpy as np

    task = tag_task(make_synth_dir(tmp_path_factory, "r25-store"), token_cache=True)
    store = task.encoded_users()
    with pytest.raises(ValueError, match=r"^users must be integers"):
        store.example_counts([1.5])
    with pytest.raises(ValueError, match=r"^picks must be integers"):
        store.gather([1], [np.array([0.7])])
    with pytest.raises(ValueError, match=r"^user_id must be an integer in \[0, 80\)"):
        store.user(1.5)
    assert store.example_counts([np.int64(1)]).tolist() == [len(store.user(1)[1])]
    assert len(store.gather([1], [[]])[1]) == 0


def _console(argv: list[str], tmp_path, stdout, stderr=None) -> tuple[int, str]:
    """Run the ``fedprivopt`` program in a child with ``stdout``; its code and its stderr.

    ``stderr``: an open file for the child's standard error instead of the one read back.
    """
    import os
    import subprocess
    import sys

    env = dict(os.environ, FLWR_TELEMETRY_ENABLED="0", FLWR_DISABLE_UPDATE_CHECK="1")
    env["FLWR_HOME"] = str(tmp_path / "flwr")
    err_path = tmp_path / "stderr.txt"
    code = "from fedprivopt.cli import console; console()"
    with open(err_path, "w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-c", code, *argv], stdout=stdout, stderr=stderr or err, env=env,
            cwd=ROOT,
        )  # fmt: skip
        try:
            if stdout == subprocess.PIPE:
                proc.stdout.close()  # the reader leaves before the command writes
            rc = proc.wait(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()  # by its PID, even when the test fails
                proc.wait()
    return rc, err_path.read_text()


EPSILON = ["epsilon", "--noise-multiplier", "1", "--sample-rate", "0.1", "--rounds", "10",
           "--delta", "1e-5"]  # fmt: skip


def test_16_closed_pipe_ends_quietly(tmp_path):
    import subprocess

    rc, err = _console(EPSILON, tmp_path, subprocess.PIPE)
    assert rc == 141 and err == "", err


def test_16_full_standard_output_is_not_blamed_on_out(tmp_path):
    out = tmp_path / "run"
    argv = ["simulate", str(TOY), "--rounds", "1", "--out", str(out), "--quiet"]
    with open("/dev/full", "w") as full:
        rc, err = _console(argv, tmp_path, full)
    one_line_error(rc, err, "cannot write standard output: No space left on device")
    assert "--out" not in err and (out / "summary.json").is_file()


def test_17_a_full_standard_error_does_not_stop_the_run(tmp_path):
    import json
    import subprocess

    out = tmp_path / "run"
    argv = ["simulate", str(TOY), "--rounds", "3", "--out", str(out)]  # progress lines on
    with open("/dev/full", "w") as full:
        rc, _ = _console(argv, tmp_path, subprocess.DEVNULL, stderr=full)
    assert rc == 0
    assert json.loads((out / "summary.json").read_text())["rounds_completed"] == 3
