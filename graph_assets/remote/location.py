"""A graph's place in Redis as one string, ``redis://host:port/NAME`` (or ``rediss://`` for
TLS): the URL of any node of the cluster (or of the single Redis) and the prefix the graph was
loaded under. A cluster has only database 0, so the path names the graph, not a database. The
password never goes in it: it is read from the file ``GNNSERVE_REDIS_PASSWORD_FILE`` names
(graph_assets.remote.connect), so archives and logs never hold it."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

from graph_assets.remote.layout import check_prefix

SCHEMES = ("redis", "rediss")


@dataclass(frozen=True)
class RemoteLocation:
    """Where a graph in Redis is: ``url`` (``redis://host:port``) and ``prefix`` (NAME)."""

    url: str
    prefix: str


def is_remote(location: str) -> bool:
    """Whether ``location`` names a graph in Redis rather than a store directory."""
    return urlsplit(location).scheme in SCHEMES


def parse_location(location: str) -> RemoteLocation:
    """``redis[s]://host:port/NAME`` split into URL and prefix; ValueError saying what is
    expected for a URL with no NAME, a password, a query or more than one path segment."""
    parts = urlsplit(location)
    example = "redis://host:port/NAME (rediss:// for TLS; NAME: the load's --prefix)"
    if parts.scheme not in SCHEMES or not parts.hostname:
        raise ValueError(f"a graph in Redis is named {example}; got {location!r}")
    if parts.password is not None:
        raise ValueError(
            "a graph location must not hold a password (archives and logs would show it): put "
            "it in a file and name the file in GNNSERVE_REDIS_PASSWORD_FILE"
        )
    name = parts.path.lstrip("/")
    if parts.query or parts.fragment or not name or "/" in name:
        raise ValueError(f"a graph in Redis is named {example}; got {location!r}")
    check_prefix(name)
    return RemoteLocation(f"{parts.scheme}://{parts.netloc}", name)
