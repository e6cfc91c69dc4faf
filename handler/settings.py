"""Serving settings of one archive, read from the ``gnn:`` section of its model-config YAML.

Defaults live here and nowhere else; ``build_mar.sh`` writes the YAML from them.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field, fields
from pathlib import PurePosixPath
from typing import Any

from graph_assets.remote.location import is_remote, parse_location

DEFAULT_FANOUTS = (25, 10)
TASKS = ("node", "link", "graph")
SAMPLING_DEVICES = ("cpu", "gpu")
_CHECKSUM = re.compile(r"[0-9a-f]{64}")


def default_fanouts(num_layers: int) -> tuple[int, ...]:
    """25 neighbours at the first hop and 10 at each later one, one hop per model layer (none
    for a model without message passing)."""
    if num_layers == 0:
        return ()
    return (DEFAULT_FANOUTS[0],) + (DEFAULT_FANOUTS[1],) * (num_layers - 1)


@dataclass(frozen=True)
class ServingSettings:
    """What the handler needs besides the weights and the graph.

    Attributes:
        task: the archive's task: ``node`` (node classification), ``link`` (link prediction)
            or ``graph`` (graph classification; the sampling keys do not apply).
        fanouts: neighbours sampled per hop (``-1`` = all); one hop per model layer.
        relation_fanouts: on a graph with several relations, fanouts of the relations named
            (``src__relation__dst``: per hop, as many hops as ``fanouts``), PyG
            ``NeighborLoader``'s dict form; every other relation samples ``fanouts``.
        sampling_seed: seed of the deterministic sampler.
        max_ids_per_request: more IDs in one request is answered 413.
        max_subgraph_nodes, max_subgraph_edges: a single request whose ego-graph exceeds these
            is answered 413; a batch whose union exceeds them is served request by request.
        verify_checksum: hash the graph files when a worker starts (slower start: it reads the
            whole graph once; refuses a corrupt or changed graph). Without it, file sizes,
            meta.json and the graph's structure are still checked, the features' bytes not.
        graph_dir: folder of the serialized graph inside the unpacked archive.
        graph_location: absolute path of a graph store that workers map where it is, read-only,
            instead of a copy inside the archive (``build_mar.sh --graph-location``): a large
            graph is then not unpacked again by every server start; or
            ``redis[s]://host:port/NAME``, a graph loaded into a Redis Cluster or a single
            Redis under prefix NAME, which workers read in batches (never a password: it
            comes from ``GNNSERVE_REDIS_PASSWORD_FILE``). Empty = ``graph_dir``.
        graph_checksum: the checksum of the store at ``graph_location`` the archive was built
            and trained with; a worker refuses a store (or a graph in Redis) that names
            another. Given together with ``graph_location``, or not at all.
        remote_cache_mb: a graph in Redis: MB each worker's caches take in all (an eighth
            for ID lookups, the rest for fetched blocks of the graph and its precomputed rows,
            least recently used dropped first; `graph_assets.remote.reader.budgeted_caches`);
            0 keeps none.
        remote_timeout_ms: a graph in Redis: how long one read may wait for Redis.
        share_graph: map the graph from a cache shared by every archive version with the same
            graph checksum (one copy in memory) instead of from this archive's unpacked copy;
            ignored with ``graph_location``, which every version maps in place already.
        graph_cache_dir: where that cache lives; empty = ``gnnserve-graph-cache`` in the
            worker's temp dir (TorchServe's ``TEMP``), which is on the same filesystem as the
            unpacked archives, so the cache is made of hard links, not copies.
        torch_threads: intra-op threads of each worker's torch (``torch.set_num_threads``);
            default 1, since batches are small and a worker shares the cores with the other
            workers and TorchServe's frontend; 0 leaves torch's default (one per core).
        metrics_interval_s: the batch metrics and the batch log line sum the batches of this
            many seconds (means per batch); 0 reports every batch on its own, which costs a
            busy worker ~10% of its throughput (handler.pipeline.metrics).
        updates_enabled: accept live graph updates (``{"op": "update", ...}``); off by default.
        update_state_dir: where the update log lives, outside the unpacked archive (which
            TorchServe deletes on unregister); empty = ``gnnserve-state`` in the worker's temp dir.
        update_secret_file, update_secret_env: where the update secret comes from (a file, else
            that environment variable); the inference token alone cannot change the graph.
        max_update_operations: more operations in one update request is answered 413.
        update_follow_interval_ms: how often a worker's follower thread checks the update log
            (one ``fstat``) and applies what other workers appended, between batches, so that
            requests rarely replay it themselves; 0 = no follower (each batch replays).
        min_version_wait_ms: how long a prediction that asks for ``min_graph_version`` may wait
            for this worker to apply the log up to it; then it is answered 503 with
            ``Retry-After``.
        max_top_k: link archives: the largest ``top_k`` a request may ask for (more is 413).
        max_graph_nodes, max_graph_edges: graph archives: an inline graph with more nodes or
            edges is answered 413.
        explain_steps: Integrated Gradients steps of an explanation (forward and backward
            passes of the ego-graph); fewer when the time budget would not cover them.
        explain_time_budget_ms: the time one explanation may take; its step count is cut to
            what fits, measured on the request's own ego-graph.
        explain_top_k: how many nodes, edges and features an explanation lists.
        sampling_device: a GPU worker samples on ``cpu`` (its own thread, numpy: a hop costs
            a few dozen small operations, each a kernel launch on a GPU) or on the ``gpu``
            (the structure moved there; pays off only for batches of thousands of seeds).
        gpu_feature_fraction: a GPU worker keeps the stored node features in GPU memory and
            gathers rows there: the whole matrix when it takes at most this share of the GPU's
            free memory at start, else a cache of that size of the rows batches read, fed from
            pinned host memory; 0 gathers from host memory every batch.
        cuda_graphs: a GPU worker runs the forward as CUDA graphs captured per padded size
            bucket (handler.gpu.captured_forward), which removes the launch cost of its many
            small kernels; a model that cannot be captured runs eagerly.
    """

    task: str = "node"
    fanouts: tuple[int, ...] = field(default=DEFAULT_FANOUTS)
    relation_fanouts: dict[str, tuple[int, ...]] = field(default_factory=dict)
    sampling_seed: int = 0
    max_ids_per_request: int = 1024
    max_subgraph_nodes: int = 2_000_000
    max_subgraph_edges: int = 20_000_000
    verify_checksum: bool = True
    graph_dir: str = "graph"
    graph_location: str = ""
    graph_checksum: str = ""
    remote_cache_mb: float = 256.0
    remote_timeout_ms: int = 1000
    share_graph: bool = True
    graph_cache_dir: str = ""
    torch_threads: int = 1
    metrics_interval_s: float = 1.0
    updates_enabled: bool = False
    update_state_dir: str = ""
    update_secret_file: str = ""
    update_secret_env: str = "GNNSERVE_UPDATE_SECRET"
    max_update_operations: int = 1000
    update_follow_interval_ms: float = 5.0
    min_version_wait_ms: float = 1000.0
    max_top_k: int = 1000
    max_graph_nodes: int = 10_000
    max_graph_edges: int = 100_000
    explain_steps: int = 32
    explain_time_budget_ms: int = 2000
    explain_top_k: int = 10
    sampling_device: str = "cpu"
    gpu_feature_fraction: float = 0.5
    cuda_graphs: bool = True

    @classmethod
    def from_yaml_section(cls, section: dict[str, Any] | None) -> ServingSettings:
        """Validates the ``gnn:`` mapping; unknown keys and wrong types fail the worker's start."""
        section = dict(section or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(section) - known)
        if unknown:
            raise ValueError(
                f"unknown key(s) {unknown} in the model-config 'gnn:' section; "
                f"known keys are {sorted(known)}"
            )
        if "fanouts" in section:
            section["fanouts"] = parse_fanouts(section["fanouts"])
        if "relation_fanouts" in section:
            section["relation_fanouts"] = parse_relation_fanouts(section["relation_fanouts"])
        settings = cls(**section)
        settings._check()
        return settings

    def to_yaml_section(self) -> dict[str, Any]:
        data = asdict(self)
        data["fanouts"] = list(self.fanouts)
        data["relation_fanouts"] = {name: list(f) for name, f in self.relation_fanouts.items()}
        return data

    def fanouts_of(self, relation: str) -> tuple[int, ...]:
        """The fanouts of the relation named ``relation`` (``src__relation__dst``)."""
        return self.relation_fanouts.get(relation, self.fanouts)

    def _check(self) -> None:
        if self.task not in TASKS:
            raise ValueError(f"task must be one of {', '.join(TASKS)}; got {self.task!r}")
        for name, fanouts in self.relation_fanouts.items():
            if len(fanouts) != len(self.fanouts):
                raise ValueError(
                    f"relation_fanouts[{name!r}] has {len(fanouts)} hops, fanouts "
                    f"{len(self.fanouts)}: every relation samples as many hops as the model has"
                )
        for name in (
            "max_ids_per_request",
            "max_subgraph_nodes",
            "max_subgraph_edges",
            "max_top_k",
            "max_graph_nodes",
            "max_graph_edges",
            "explain_steps",
            "explain_time_budget_ms",
            "explain_top_k",
            "max_update_operations",
            "remote_timeout_ms",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer; got {value!r}")
        if not isinstance(self.sampling_seed, int) or isinstance(self.sampling_seed, bool):
            raise ValueError(f"sampling_seed must be an integer; got {self.sampling_seed!r}")
        threads = self.torch_threads
        if not isinstance(threads, int) or isinstance(threads, bool) or threads < 0:
            raise ValueError(
                f"torch_threads must be an integer >= 0 (0 = one per core); got {threads!r}"
            )
        interval = self.metrics_interval_s
        if not isinstance(interval, (int, float)) or isinstance(interval, bool) or interval < 0:
            raise ValueError(
                f"metrics_interval_s must be a number of seconds >= 0; got {interval!r}"
            )
        follow = self.update_follow_interval_ms
        is_number = isinstance(follow, (int, float)) and not isinstance(follow, bool)
        if not is_number or not 0 <= follow < math.inf:
            raise ValueError(
                "update_follow_interval_ms must be a number of milliseconds >= 0 "
                f"(0 = no follower thread); got {follow!r}"
            )
        wait = self.min_version_wait_ms
        if not isinstance(wait, (int, float)) or isinstance(wait, bool) or not 0 <= wait < 600_000:
            raise ValueError(
                f"min_version_wait_ms must be a number of milliseconds in [0, 600000); got {wait!r}"
            )
        cache = self.remote_cache_mb
        if not isinstance(cache, (int, float)) or isinstance(cache, bool) or not 0 <= cache < 1e7:
            raise ValueError(f"remote_cache_mb must be a number of MB >= 0; got {cache!r}")
        if self.sampling_device not in SAMPLING_DEVICES:
            raise ValueError(
                f"sampling_device must be one of {', '.join(SAMPLING_DEVICES)}; "
                f"got {self.sampling_device!r}"
            )
        share = self.gpu_feature_fraction
        if not isinstance(share, (int, float)) or isinstance(share, bool) or not 0 <= share <= 0.9:
            raise ValueError(
                "gpu_feature_fraction must be a share of the GPU's free memory in [0, 0.9] "
                f"(0 = gather features from host memory); got {share!r}"
            )
        for name in ("verify_checksum", "share_graph", "updates_enabled", "cuda_graphs"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false; got {getattr(self, name)!r}")
        self._check_graph_location()

    def _check_graph_location(self) -> None:
        """A referenced store needs both keys: where it is, and which graph it must be."""
        location, checksum = self.graph_location, self.graph_checksum
        if not isinstance(location, str) or not isinstance(checksum, str):
            raise ValueError(
                f"graph_location and graph_checksum must be strings; got {location!r} and "
                f"{checksum!r}"
            )
        if bool(location) != bool(checksum):
            raise ValueError(
                "graph_location and graph_checksum go together (the store and the checksum it "
                f"must have); got graph_location={location!r}, graph_checksum={checksum!r}"
            )
        if location and is_remote(location):
            try:
                parse_location(location)
            except ValueError as error:
                raise ValueError(f"graph_location: {error}") from None
        elif location and not PurePosixPath(location).is_absolute():
            raise ValueError(
                f"graph_location must be an absolute path (workers start in TorchServe's "
                f"directories, not the builder's) or redis://host:port/NAME; got {location!r}"
            )
        if checksum and not _CHECKSUM.fullmatch(checksum):
            raise ValueError(
                f"graph_checksum must be 64 lowercase hex digits (a store's meta.json "
                f"checksum); got {checksum!r}"
            )


def check_explain_budget(batch_size: int, response_timeout_s: int, budget_ms: int) -> None:
    """A worker answers a batch's explanations one after another, so a full batch of them may
    take ``batch_size`` budgets; at ``responseTimeout`` TorchServe kills the worker mid-batch."""
    needed_ms = batch_size * budget_ms
    if needed_ms >= response_timeout_s * 1000:
        raise ValueError(
            f"a batch of {batch_size} explanations ({budget_ms} ms each) may take {needed_ms} ms, "
            f"which reaches responseTimeout ({response_timeout_s} s) and gets the worker killed: "
            "lower explain_time_budget_ms (--explain-budget-ms) below "
            f"{math.ceil(response_timeout_s * 1000 / batch_size)}, lower batchSize "
            f"(--batch-size), or raise responseTimeout (--response-timeout) above "
            f"{needed_ms // 1000} s"
        )


def worker_settings(model_yaml: dict[str, Any] | None, batch_size: int) -> ServingSettings:
    """The ``gnn:`` settings a worker starts with, checked against the batch size TorchServe
    gave it and the archive's ``responseTimeout`` (without one, TorchServe's own default
    applies, which the worker cannot see)."""
    config = model_yaml or {}
    settings = ServingSettings.from_yaml_section(config.get("gnn"))
    if "responseTimeout" in config:
        timeout = int(config["responseTimeout"])
        check_explain_budget(batch_size, timeout, settings.explain_time_budget_ms)
    return settings


def parse_relation_fanouts(value: object) -> dict[str, tuple[int, ...]]:
    """``{"user__pays__merchant": [10, 5], ...}``: each entry as :func:`parse_fanouts` reads."""
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise ValueError(
            "relation_fanouts must map edge types to fanouts, like "
            f'{{"user__pays__merchant": [10, 5]}}; got {value!r}'
        )
    return {name: parse_fanouts(fanouts) for name, fanouts in value.items()}


def parse_fanouts(value: object) -> tuple[int, ...]:
    """Accepts ``[25, 10]`` or ``"25,10"``; each entry a positive int or -1 (all neighbours);
    ``[]``: no hop, for a model without message passing (its ego-graph is its seeds)."""
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)):
        raise ValueError(
            f"fanouts must be a list like [25, 10] or '-1,-1' ([] for a model without "
            f"message passing); got {value!r}"
        )
    try:
        fanouts = tuple(int(str(item).strip()) for item in items)
    except ValueError:
        raise ValueError(f"fanouts must be integers (-1 = all neighbours); got {value!r}") from None
    if any(f == 0 or f < -1 for f in fanouts):
        raise ValueError(f"each fanout must be a positive integer or -1; got {value!r}")
    return fanouts
