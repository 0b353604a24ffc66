"""gpuwm sim."""
