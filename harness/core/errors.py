"""Errors the suite shows to its users."""


class SuiteError(Exception):
    """One-line, actionable error shown to the user without a traceback."""
