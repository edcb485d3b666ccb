"""One end-to-end run of the ClientApp under Flower's simulation runtime (Ray backend)."""

import time

import numpy as np
from flwr.app import ArrayRecord, Message, RecordDict
from flwr.serverapp import ServerApp
from flwr.simulation import run_simulation

from fedprivopt import wire as P
from fedprivopt.clients import LocalConfig, LocalTrainer
from fedprivopt.clients.client_app import make_client_app
from fedprivopt.models import build_task, initial_flat
from fedprivopt.privacy import RngFactory

PARAMS = {"num_users": 3, "dim": 4, "num_classes": 3, "seed": 1}
LOCAL = LocalConfig(learning_rate=0.3, epochs=2, batch_size=4, clip_norm=0.2)


def test_query_and_train_through_run_simulation():
    task = build_task("toy", **PARAMS)
    results = {}
    server_app = ServerApp()

    @server_app.main()
    def main(grid, context):
        deadline = time.monotonic() + 120
        while len(nodes := sorted(grid.get_node_ids())) < 3 and time.monotonic() < deadline:
            time.sleep(0.1)  # simulated nodes come online asynchronously
        results["nodes"] = nodes
        query = [Message(P.users_query(), dst_node_id=n, message_type="query") for n in nodes]
        replies = list(grid.send_and_receive(query, timeout=120))
        results["query_errors"] = [r.has_error() for r in replies]
        hosted = {r.metadata.src_node_id: P.read_user_ids(r.content) for r in replies}
        results["hosted"] = hosted
        arrays = ArrayRecord(task.build_model().state_dict())
        train = []
        for node, users in hosted.items():
            foreign = (users[0] + 1) % PARAMS["num_users"]
            config = P.encode_train_config(
                users=[*users, foreign],
                round_num=1,
                settings=P.ClientSettings(local=LOCAL, seed=3),
            )
            content = RecordDict({P.ARRAYS_RECORD: arrays, P.CONFIG_RECORD: config})
            train.append(Message(content, dst_node_id=node, message_type="train"))
        replies = list(grid.send_and_receive(train, timeout=120))
        results["train_errors"] = [r.error.reason for r in replies if r.has_error()]
        results["metrics"] = [
            dict(r.content[P.TRAIN_METRICS]) for r in replies if not r.has_error()
        ]
        results["updates"] = {}
        for r in replies:
            if not r.has_error():
                results["updates"].update(P.read_updates(r.content))

    run_simulation(
        server_app=server_app,
        client_app=make_client_app(task="toy", task_params=PARAMS, device="cpu"),
        num_supernodes=3,
        backend_config={
            "client_resources": {"num_cpus": 1, "num_gpus": 0.0},
            "init_args": {"num_cpus": 2},
        },
    )

    assert len(results["nodes"]) == 3, results
    assert results["query_errors"] == [False] * 3
    assert sorted(u for us in results["hosted"].values() for u in us) == [
        0,
        1,
        2,
    ]  # one user per node
    assert results["train_errors"] == []
    assert results["metrics"] == [{P.USERS_TRAINED: 1, P.USERS_REJECTED: 1}] * 3
    trainer = LocalTrainer(task, device="cpu")
    for user, delta in sorted(results["updates"].items()):
        want = trainer.train(
            initial_flat(task), user_id=user, round_num=1, config=LOCAL, rngs=RngFactory(seed=3)
        )
        np.testing.assert_array_equal(delta, want.delta.numpy())
        assert np.linalg.norm(delta) <= 0.2 * (1 + 1e-6)
    assert sorted(results["updates"]) == [0, 1, 2]
