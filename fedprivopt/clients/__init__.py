"""fedprivopt.clients (see docs/DESIGN.md)."""
