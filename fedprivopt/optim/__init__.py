"""Server optimizers as optax-style ``(init, update)`` transforms over flat tensors.

Every transform consumes the noised mean model delta Δ̃ of a round (the only data-dependent input
under the privacy contract, so everything here is post-processing) and returns the server step;
the new parameters are ``params + step``. States are small frozen dataclasses that convert to and
from plain dicts for checkpoints (:func:`state_to_dict`, :func:`state_from_dict`).

- :func:`momentum_sgd`: DP-FedAvg server step with optional (Nesterov) momentum.
- :func:`adam`, :func:`flower_fedadam`: FedAdam; the latter reproduces Flower's ``FedAdam``.
- :func:`adam_bc`: DP-AdamBC, Adam with the DP noise variance removed from its second moment.
- :func:`dp2`: DP² delayed preconditioners, a state machine alternating SGD and adaptive rounds.
- :func:`adadp`: ADADP learning-rate control from one full step and two half steps.
"""

from fedprivopt.core.lazy import lazy_package

__all__ = lazy_package(
    __name__,
    {
        "adadp": (
            "NOISE_MARGIN",
            "ADADPController",
            "ADADPResult",
            "ADADPState",
            "adadp",
            "adadp_error",
            "noise_calibrated_tolerance",
        ),
        "adam": (
            "AdamState",
            "adam",
            "flower_fedadam",
        ),
        "adam_bc": (
            "AdamBCState",
            "adam_bc",
            "noise_corrected_second_moment",
        ),
        "base": (
            "ServerTransform",
            "StateDictMixin",
            "UpdateFn",
            "apply_step",
            "state_from_dict",
            "state_to_dict",
        ),
        "dp2": (
            "DP2State",
            "Phase",
            "dp2",
            "dp2_capped_fraction",
            "dp2_rate",
            "phase",
            "preconditioner",
            "preconditioner_mean",
        ),
        "sgd": (
            "MomentumState",
            "capped_rate",
            "momentum_sgd",
            "momentum_sgd_rate",
        ),
    },
)
