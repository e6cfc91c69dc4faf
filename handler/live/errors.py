"""Why the live graph refuses an update: domain errors, no statuses
(``handler.protocol.error_table`` maps each to the answer a client gets)."""

from __future__ import annotations


class UpdateRefused(Exception):
    """An update that was not applied; nothing of it is in the update log."""


class UpdatesDisabled(UpdateRefused):
    """The archive was built without updates (or serves no stored graph to update)."""

    def __init__(self) -> None:
        super().__init__("updates are disabled for this archive")


class UpdateKeyRejected(UpdateRefused):
    """The update key is missing or is not the archive's secret."""


class MalformedUpdate(UpdateRefused):
    """The update's own fields are wrong (not its operations: those are ``UpdateRejected``)."""


class TooManyOperations(UpdateRefused):
    """More operations in one update than ``max_update_operations`` allows."""


class UpdatesHalted(UpdateRefused):
    """This worker could not apply a record of the update log, so it serves the version before
    it and validates no update against that stale graph until the record applies."""


class UpdateRaceLost(UpdateRefused):
    """Other servers kept writing the next seq first while this update was being validated."""
