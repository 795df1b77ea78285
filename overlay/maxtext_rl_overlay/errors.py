"""The one exception type of the tool: every failure the user can act on."""


class OverlayError(Exception):
    """A failure with a message that says what went wrong and what to do next.

    The CLI prints the message alone (no traceback) and exits non-zero.
    """
