"""The command line's one kind of error: a mistake the user can fix from the message alone."""


class UsageError(Exception):
    """A mistake the user can fix from the message alone; printed as one line, exit code 2."""
