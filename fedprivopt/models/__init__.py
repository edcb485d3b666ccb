"""fedprivopt.models (see docs/DESIGN.md)."""
