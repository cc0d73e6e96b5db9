"""Real runs and calibration: the torch.distributed runner, microbenchmarks, profile fitting, and the published-runs accuracy harness."""
