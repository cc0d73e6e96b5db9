"""Discrete-event simulator of one training step (SimPy), plus topology, model and plan specs."""
