"""Devices, model shapes, memory estimates and the planner."""
