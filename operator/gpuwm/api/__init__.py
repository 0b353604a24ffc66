"""gpuwm api."""
