"""The suite's harness, one folder per concern; imports point down this list, never up or sideways:

core        errors, paths, YAML, platform, statistics, NVML, file locks, the record/compare store
config      the configuration catalog: axes, named configs, flavours, kernel expectations
engine      vLLM itself: servers, clients, models, /metrics, site plugins, GPUs, process memory
session     what one run is about (Suite, Target, RunningServer) and the servers it boots
kernelpath  level 1.5: kernel names from profiler traces
correctness level 2: goldens and the rules that compare them      perf  levels 4-5: workloads, metrics, gate
stress      level 3
matrix      level 6                                             features  feature verdicts against a baseline
report      what a run prints and writes for people
plugin      the pytest layer: options, xdist, known engine issues, the nightly

tests/unit/test_layering.py holds this order and imports every module alone.
"""
