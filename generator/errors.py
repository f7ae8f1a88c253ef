"""The one exception type a user can cause: it carries a complete one-line message."""


class ColibriError(Exception):
    """A failure caused by the user's input or environment (not a bug).

    The CLI prints ``colibri: error: <message>`` and exits non-zero; the message must say what
    was wrong and, where possible, what to do about it.
    """
