"""Level 1.5: kernel names from profiler traces, checked against a config's expectations; recording them on a new platform."""
