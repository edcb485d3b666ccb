"""Client side: local training of one user and the Flower ClientApp that wraps it.

:class:`LocalTrainer` runs preconditioned local SGD and returns the user's clipped (optionally
noised) update (:class:`LocalResult`); :mod:`fedprivopt.wire` defines the messages
between the strategies and the ClientApp (:mod:`fedprivopt.clients.client_app`, imported lazily
because it needs Flower).
"""

from fedprivopt.clients.trainer import (
    LocalConfig,
    LocalResult,
    LocalTrainer,
    default_device,
    epoch_orders,
)

__all__ = ["LocalConfig", "LocalResult", "LocalTrainer", "default_device", "epoch_orders"]
