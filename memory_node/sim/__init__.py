"""Deterministic sample recording of a Go2-like robot exploring a small flat."""
