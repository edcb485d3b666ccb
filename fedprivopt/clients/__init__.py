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

from fedprivopt.core.lazy import lazy_package

__all__ = lazy_package(
    __name__,
    {
        "privatize": (
            "NOISE_PURPOSE",
            "PrivateUpdate",
            "noise_generator",
            "privatize_update",
        ),
        "trainer": (
            "LocalConfig",
            "LocalResult",
            "LocalTrainer",
            "default_device",
            "epoch_orders",
        ),
        "messages": (
            "TASK_ERROR",
            "TrainMessage",
            "hosted_users",
            "reply_task_error",
            "reply_updates",
            "reply_users",
        ),
    },
)
