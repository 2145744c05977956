"""User-facing errors.

Anything a user can cause (a bad option, an unknown model, an unreadable file) raises ``ParadecodeError``
with a message that says what was wrong and what to do. The CLI prints the message and exits with code 2;
everything else is a bug and keeps its traceback.
"""


class ParadecodeError(Exception):
    """A problem with the user's input, explained in one paragraph."""
