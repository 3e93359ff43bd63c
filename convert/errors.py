class ConvertError(Exception):
    """A problem with the user's input: reported as one line, exit code 2."""
