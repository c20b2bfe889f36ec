"""Levels 4 and 5: workloads, metrics, clocks, memory accounting, reproducibility metadata, baselines and the statistical gate."""
