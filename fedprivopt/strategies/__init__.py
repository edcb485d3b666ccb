"""fedprivopt.strategies (see docs/DESIGN.md)."""
