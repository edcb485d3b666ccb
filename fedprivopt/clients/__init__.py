"""Client side: local training of one user, its privacy step and the Flower ClientApp.

:class:`LocalTrainer` runs preconditioned local SGD and returns the user's clipped (optionally
noised) update (:class:`LocalResult`). Its privacy step is the public function
:func:`privatize_update` (clip the whole update, add the noise share from :func:`noise_generator`),
which a user's own ClientApp calls after its own training loop (``docs/FLOWER.md``).
:mod:`fedprivopt.wire` defines the messages between the strategies and the ClientApp;
:mod:`fedprivopt.clients.messages` reads and answers them for a ClientApp of one's own
(:class:`~fedprivopt.clients.messages.TrainMessage`, ``reply_users``, ``reply_updates``), and
:mod:`fedprivopt.clients.client_app` is fedprivopt's own ClientApp. Both import Flower, so they are
imported only when named (``from fedprivopt.clients import TrainMessage`` works too).
"""

import importlib

from fedprivopt.clients.privatize import (
    NOISE_PURPOSE,
    PrivateUpdate,
    noise_generator,
    privatize_update,
)
from fedprivopt.clients.trainer import (
    LocalConfig,
    LocalResult,
    LocalTrainer,
    default_device,
    epoch_orders,
)

# Flower is imported on first use of these names (PEP 562): the fast engine never loads it.
_LAZY = {
    "TrainMessage": "messages",
    "hosted_users": "messages",
    "reply_updates": "messages",
    "reply_users": "messages",
}


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(f"fedprivopt.clients.{_LAZY[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'fedprivopt.clients' has no attribute {name!r}")


__all__ = [
    "NOISE_PURPOSE",
    "LocalConfig",
    "LocalResult",
    "LocalTrainer",
    "PrivateUpdate",
    "TrainMessage",
    "default_device",
    "epoch_orders",
    "hosted_users",
    "noise_generator",
    "privatize_update",
    "reply_updates",
    "reply_users",
]
