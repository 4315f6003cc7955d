"""Errors with messages that say what was wrong and what is expected."""


class SpecjaxError(Exception):
    """Base class: the CLI prints the message and exits nonzero."""


class AssetsMissing(SpecjaxError):
    """An offline asset is not in the cache; the message says to run `specjax fetch`."""


class CheckpointError(SpecjaxError):
    """A checkpoint file is truncated, corrupt, has the wrong checksum or unexpected tensors."""
