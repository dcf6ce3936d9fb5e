"""Triton backend ``cpu`` of a stand-in CPU runtime (see scripts/cpu_triton/__init__.py in the repository)."""
