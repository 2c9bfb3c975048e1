"""Agents defined in the test package, found through the registry as any user's plugin would be."""
