"""gpuwm store."""
