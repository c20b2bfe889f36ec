"""Foundations every other folder may use: one-line errors, repository paths, YAML loading, platform detection, statistics, NVML, file locks, the record/compare store."""
