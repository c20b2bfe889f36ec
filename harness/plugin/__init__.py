"""The pytest layer: command-line options, pytest-xdist wiring, known engine issues as strict xfails, the nightly's orchestration."""
