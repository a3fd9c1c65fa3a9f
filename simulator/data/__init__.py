"""Data shipped with the simulator (grid carbon intensity)."""
