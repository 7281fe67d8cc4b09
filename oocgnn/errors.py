"""User-facing errors: the CLI prints them as one line and exits with code 2."""


class UserError(ValueError):
    """Bad input from the user (a path, a size string, a flag). Never a bug."""


class StoreError(UserError):
    """A store on disk is missing, truncated, corrupted or of an unknown format."""
