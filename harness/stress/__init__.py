"""Level 3: the stress workloads (sequential, concurrent, long, abusive) and the crash-prone cases' own server."""
