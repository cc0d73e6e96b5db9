"""Discrete-event simulator of one training step (SimPy): program, schedules, engine, flow network, metrics."""
