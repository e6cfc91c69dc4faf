"""gRPC stubs of TorchServe's own protos, compiled at test time from the jar the installed
TorchServe runs (so they are exactly the server's), the way a user builds a client for it."""

from __future__ import annotations

import importlib
import sys
import zipfile
from pathlib import Path
from types import ModuleType

import google.rpc
import grpc_tools
import ts
from grpc_tools import protoc

JAR = Path(ts.__file__).parent / "frontend" / "model-server.jar"
PROTOS = ("inference", "management", "open_inference_grpc")


def compile_stubs(directory: Path) -> dict[str, ModuleType]:
    """``<name>_pb2`` and ``<name>_pb2_grpc`` of each of TorchServe's protos, compiled into
    ``directory`` (which goes on ``sys.path``: the generated modules import each other by their
    top-level names)."""
    with zipfile.ZipFile(JAR) as jar:
        for name in PROTOS:
            jar.extract(f"proto/{name}.proto", directory)
    includes = [
        directory / "proto",
        Path(grpc_tools.__file__).parent / "_proto",  # google/protobuf/*.proto
        Path(google.rpc.__path__[0]).parents[1],  # google/rpc/status.proto
    ]
    for name in PROTOS:
        arguments = [
            "protoc",
            *(f"-I{path}" for path in includes),
            f"--python_out={directory}",
            f"--grpc_python_out={directory}",
            str(directory / "proto" / f"{name}.proto"),
        ]
        if protoc.main(arguments) != 0:
            raise RuntimeError(f"protoc failed on {name}.proto from {JAR}")
    sys.path.insert(0, str(directory))
    modules = {}
    for name in PROTOS:
        for suffix in ("_pb2", "_pb2_grpc"):
            modules[name + suffix] = importlib.import_module(name + suffix)
    return modules
