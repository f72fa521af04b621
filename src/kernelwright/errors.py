"""Error types. A UserError is bad input: the CLI prints its one line and exits 2."""


class UserError(Exception):
    """Bad input from the user (missing file, malformed problem, bad option)."""


class ProblemError(UserError):
    """A problem file that cannot be loaded or run; the message names the file."""

    def __init__(self, path, message: str):
        self.path = str(path)
        super().__init__(f"{self.path}: {message}")
