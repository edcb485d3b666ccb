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

from .adadp import (
    NOISE_MARGIN,
    ADADPController,
    ADADPResult,
    ADADPState,
    adadp,
    adadp_error,
    noise_calibrated_tolerance,
)
from .adam import AdamState, adam, flower_fedadam
from .adam_bc import AdamBCState, adam_bc, noise_corrected_second_moment
from .base import (
    ServerTransform,
    StateDictMixin,
    UpdateFn,
    apply_step,
    state_from_dict,
    state_to_dict,
)
from .dp2 import DP2State, Phase, dp2, phase, preconditioner
from .sgd import MomentumState, momentum_sgd

__all__ = [
    "NOISE_MARGIN",
    "ADADPController",
    "ADADPResult",
    "ADADPState",
    "AdamBCState",
    "AdamState",
    "DP2State",
    "MomentumState",
    "Phase",
    "ServerTransform",
    "StateDictMixin",
    "UpdateFn",
    "adadp",
    "adadp_error",
    "adam",
    "adam_bc",
    "apply_step",
    "dp2",
    "flower_fedadam",
    "momentum_sgd",
    "noise_calibrated_tolerance",
    "noise_corrected_second_moment",
    "phase",
    "preconditioner",
    "state_from_dict",
    "state_to_dict",
]
