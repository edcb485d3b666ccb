"""fedprivopt.simulation (see docs/DESIGN.md)."""
