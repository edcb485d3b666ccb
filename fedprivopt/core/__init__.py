"""The lowest layer: what every other package shares and nothing here imports from them.

- :mod:`fedprivopt.core.local`: :class:`LocalConfig` (one user's local training settings) and
  :func:`epoch_orders` (which examples a user trains on, in which order), shared by the client
  trainers and the vectorized cohort trainers of the tasks;
- :mod:`fedprivopt.core.checks`: parameter checks whose errors name the parameter and its range;
- :mod:`fedprivopt.core.text`: values shown in one-line messages;
- :mod:`fedprivopt.core.files`: OS errors named by their file, links removed before a rewrite,
  read-only file systems (shared by the data layer, the runs and the command line);
- :mod:`fedprivopt.core.threads`: OpenMP threads that wait passively (set before torch loads);
- :mod:`fedprivopt.core.orphans`: forked pool workers killed with their parent (Linux);
- :mod:`fedprivopt.core.progress`: the rich progress bar on stderr that long work shows;
- :mod:`fedprivopt.core.lazy`: package namespaces that import a name's submodule on first use, so
  threads importing modules at once never deadlock.

Nothing is imported here, so the command line can show a message without loading torch.
"""
