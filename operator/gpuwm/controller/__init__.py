"""gpuwm controller."""
