"""gpuwm accounting."""
