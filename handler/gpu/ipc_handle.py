"""A float32 matrix shared between processes, described as plain JSON, never a pickle.

``torch.multiprocessing`` sends tensors as pickles, and unpickling runs whatever the sender
chose: a worker must not unpickle what arrives on a socket (tests/unit/test_load_path_security.py).
The same facts torch's reduction pickles are sent here as JSON fields and opened with torch's
own rebuild functions, the classes and the dtype fixed on the receiving side: on a GPU a CUDA
IPC handle (the allocation, its reference counter and event), on a CPU (tests) a shared-memory
file of torch's ``file_system`` strategy.
"""

from __future__ import annotations

import json
from typing import Any

import torch
from torch.multiprocessing import reductions


class BadHandle(ValueError):
    """A description that is not one this module wrote."""


def describe(table: torch.Tensor) -> bytes:
    """JSON that :func:`open_shared` opens as ``table`` in another process of this user (the
    caller keeps ``table`` alive while others use it)."""
    if table.dtype != torch.float32 or table.dim() != 2:
        raise ValueError(f"expected a float32 matrix, got {table.dtype} {tuple(table.shape)}")
    layout: dict[str, Any] = {
        "size": list(table.shape),
        "stride": list(table.stride()),
        "offset": table.storage_offset(),
    }
    if table.is_cuda:
        # torch's own reduction: (tensor class, size, stride, offset, storage class, dtype,
        # device, handle, size bytes, offset bytes, requires_grad, counter, counter offset,
        # event, event sync required)
        _, args = reductions.reduce_tensor(table)
        device, handle, size_bytes, offset_bytes = args[6:10]
        counter, counter_offset, event, sync = args[11:15]
        layout.update(
            kind="cuda",
            device=int(device),
            handle=bytes(handle).hex(),
            size_bytes=int(size_bytes),
            offset_bytes=int(offset_bytes),
            counter=bytes(counter).hex(),
            counter_offset=int(counter_offset),
            event=bytes(event).hex() if event else "",
            sync=bool(sync),
        )
    else:
        storage = table.untyped_storage()
        manager, name, size_bytes = storage._share_filename_cpu_()
        storage._shared_incref()
        layout.update(
            kind="cpu", manager=manager.decode(), name=name.decode(), size_bytes=size_bytes
        )
    return json.dumps(layout).encode()


def open_shared(message: bytes) -> torch.Tensor:
    """The matrix :func:`describe` described; BadHandle for anything else, whatever is wrong
    with it (torch's rebuild functions raise RuntimeError or AssertionError for a handle they
    cannot open: a stale name, a CUDA handle on a torch without CUDA)."""
    try:
        return _open(message)
    except (KeyError, TypeError, ValueError, OverflowError, RecursionError) as error:
        raise BadHandle(f"not a shared matrix's description: {error}") from None
    except (RuntimeError, AssertionError) as error:
        raise BadHandle(f"a shared matrix's description that cannot be opened: {error}") from None


def _open(message: bytes) -> torch.Tensor:
    layout = json.loads(message)  # RecursionError: nested too deeply
    size, stride = _ints(layout["size"]), _ints(layout["stride"])
    (offset,) = _counts([layout["offset"]])
    kind = layout["kind"]
    if kind == "cuda":
        device, size_bytes, offset_bytes, counter_offset = _counts(
            [layout[key] for key in ("device", "size_bytes", "offset_bytes", "counter_offset")]
        )
        return reductions.rebuild_cuda_tensor(
            torch.Tensor,
            torch.Size(size),
            tuple(stride),
            offset,
            torch.storage.TypedStorage,
            torch.float32,
            device,
            bytes.fromhex(layout["handle"]),
            size_bytes,
            offset_bytes,
            False,
            bytes.fromhex(layout["counter"]),
            counter_offset,
            bytes.fromhex(layout["event"]) if layout["event"] else None,
            bool(layout["sync"]),
        )
    if kind == "cpu":
        storage = reductions.rebuild_storage_filename(
            torch.UntypedStorage,
            str(layout["manager"]).encode(),
            str(layout["name"]).encode(),
            *_counts([layout["size_bytes"]]),
        )
        typed = torch.storage.TypedStorage(
            wrap_storage=storage, dtype=torch.float32, _internal=True
        )
        return torch._utils._rebuild_tensor(typed, offset, tuple(size), tuple(stride))
    raise ValueError(f"unknown kind {kind!r}")


def _ints(values: object) -> list[int]:
    if not isinstance(values, list) or len(values) != 2:
        raise ValueError(f"expected two integers, got {values!r}")
    return _counts(values)


def _counts(values: list[object]) -> list[int]:
    """``values`` as they are when each is an integer >= 0 (no string, float or bool)."""
    counts = [v for v in values if type(v) is int and v >= 0]
    if len(counts) != len(values):
        raise ValueError(f"expected integers >= 0, got {values!r}")
    return counts
