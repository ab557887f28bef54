"""The pillar's two refusals, apart from the modules that raise them so that any of them (the live workflow,
theme labels) can raise them without importing each other; a face maps them to HTTP answers."""


class NotYours(LookupError):
    """No such task or pool entry of this worker, whatever the reason (a face answers 404)."""


class NotAllowed(PermissionError):
    """The worker's roles do not allow this (a face answers 403)."""
