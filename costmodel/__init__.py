"""Analytic cost model: FLOPs, bytes, memory, efficiencies and collective costs. Imports no SimPy and no torch."""
