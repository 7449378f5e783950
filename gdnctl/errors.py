"""Errors a user can cause (as opposed to bugs): each carries one sentence that says what and how to fix."""


class GdnctlError(Exception):
    """A problem with the user's input or environment, reported without a traceback."""

    exit_code = 2


class PresetLoadError(GdnctlError):
    """The preset file (or a `base:` it names, or a --set override) cannot be read at all."""
