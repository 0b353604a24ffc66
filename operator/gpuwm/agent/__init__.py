"""gpuwm agent."""
