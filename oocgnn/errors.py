"""User-facing errors: the CLI prints them as one line and exits with code 2."""


class UserError(ValueError):
    """Bad input from the user (a path, a size string, a flag). Never a bug."""


def first_line(error: BaseException) -> str:
    """The first line of an exception's message (its type's name when it has none): what a one-line error
    quotes of a library's multi-line one."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


class StoreError(UserError):
    """A store on disk is missing, truncated, corrupted or of an unknown format."""
