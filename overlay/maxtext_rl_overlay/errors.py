"""The one exception type of the tool: every failure the user can act on."""


class OverlayError(Exception):
    """A failure with a message that says what went wrong and what to do next.

    The CLI prints the message alone (no traceback) and exits non-zero.
    """


class UsageError(OverlayError):
    """The command line was wrong in a way argparse cannot see (a flag that
    excludes another, an argument given twice): the CLI prints the usage."""
