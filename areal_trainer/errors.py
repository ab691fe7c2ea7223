"""Errors shown to the user as one clear message (no traceback) by the command line."""


class UserError(RuntimeError):
    """A problem the user can fix (bad path, bad data row, failing plugin); the message says how."""
