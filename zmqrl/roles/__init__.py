"""Roles: thin process mains (actor, learner, supervisor) that wire the parts together."""
