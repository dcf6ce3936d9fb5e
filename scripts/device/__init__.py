"""Checks that need an accelerator (CUDA GPU or Intel XPU); each says so and
exits 3 when none is present."""
