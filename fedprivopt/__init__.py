"""fedprivopt: differentially private adaptive federated optimization on Flower.

Layers, top to bottom (nothing imports upward):

- :mod:`fedprivopt.privacy`: flat tensors, clipping, noise, samplers, accounting;
- :mod:`fedprivopt.optim`: server transforms;
- :mod:`fedprivopt.clients`, :mod:`fedprivopt.strategies`: Flower ClientApp and strategies;
- :mod:`fedprivopt.data`, :mod:`fedprivopt.models`: StackOverflow data and models;
- :mod:`fedprivopt.simulation` and the command line in :mod:`fedprivopt.cli`.
"""

__version__ = "0.1.0"
