"""Harness for the MXFP4 gpt-oss conformance suite: one module per concern (see docs/DESIGN.md)."""
