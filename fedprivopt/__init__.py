"""fedprivopt: differentially private adaptive federated optimization on Flower.

Layers, bottom to top (a module imports only from its own layer or the ones below; the test
``tests/test_layers.py`` checks it, and that no private name crosses a module):

- :mod:`fedprivopt.core`: local-training settings and epoch orders, parameter checks;
- :mod:`fedprivopt.privacy`: flat tensors, clipping, noise, samplers, accounting;
- :mod:`fedprivopt.optim` (server transforms), :mod:`fedprivopt.data` (StackOverflow files) and
  :mod:`fedprivopt.wire` (the messages between the Flower ServerApp and ClientApp);
- :mod:`fedprivopt.models`: the Task protocol and the tasks;
- :mod:`fedprivopt.clients`: the local trainer and the Flower ClientApp;
- :mod:`fedprivopt.strategies`: the server algorithms and the Flower strategy;
- :mod:`fedprivopt.simulation`: runs, both engines, reports;
- :mod:`fedprivopt.deploy`: the Flower app on SuperLink and SuperNodes;
- the command line: :mod:`fedprivopt.cli` and its ``cli_*`` modules (argument types and errors,
  one module per command or group of commands), and :mod:`fedprivopt.deploy.cli`.
"""

__version__ = "0.1.0"
