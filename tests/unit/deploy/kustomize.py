"""What `kubectl apply -k <dir>` would apply, built in Python for the tests of deploy/.

The subset of kustomize the deploy/ tree uses: `resources` (files, and directories with their
own kustomization.yaml), `configMapGenerator` (files of the directory; the generated name is
kept without kustomize's content hash, and the references to it are left alone, so they still
match), `patches` (JSON 6902 patches with `add`, `replace`, `test` and `remove`, or a
strategic-merge `$patch: delete` of the whole object, each aimed at one kind and name) and
`images` (new name and tag). Anything else in a kustomization.yaml fails here, so
the emulation cannot drift from the tree unnoticed; test_kustomize_renders_what_the_tests_check
compares it with `kubectl kustomize` where kubectl is installed.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

KNOWN_FIELDS = {
    "apiVersion",
    "kind",
    "namespace",
    "resources",
    "configMapGenerator",
    "patches",
    "images",
}


def load_docs(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def kustomization(directory: Path) -> dict[str, Any]:
    return yaml.safe_load((directory / "kustomization.yaml").read_text())


def generated_config_maps(directory: Path) -> list[dict[str, Any]]:
    """The ConfigMaps kustomize generates (before it appends the content hash to the name)."""
    maps = []
    for generator in kustomization(directory).get("configMapGenerator", []):
        assert set(generator) <= {"name", "files", "options"}, generator
        metadata: dict[str, Any] = {"name": generator["name"]}
        labels = generator.get("options", {}).get("labels")
        if labels:
            metadata["labels"] = labels
        data = {name: (directory / name).read_text() for name in generator["files"]}
        maps.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": data})
    return maps


def apply_json_patch(doc: dict[str, Any], operations: list[dict[str, Any]]) -> dict[str, Any]:
    """`add` (at the end of a list with `/-`, or as a new member of an object), `replace` (of
    a member that exists), `test` (a value is what the patch expects) and `remove` (an item of
    a list): the JSON-patch operations the overlays use."""
    patched = copy.deepcopy(doc)
    for operation in operations:
        *parents, last = operation["path"].strip("/").split("/")
        target: Any = patched
        for part in parents:
            target = target[int(part)] if isinstance(target, list) else target[part]
        if operation["op"] == "add" and last == "-":
            assert isinstance(target, list), f"{operation['path']} does not end at a list"
            target.append(operation["value"])
        elif operation["op"] == "add":
            assert isinstance(target, dict) and last not in target, operation["path"]
            target[last] = operation["value"]
        elif operation["op"] == "replace":
            assert isinstance(target, dict) and last in target, operation["path"]
            target[last] = operation["value"]
        elif operation["op"] == "test":
            found = target[int(last)] if isinstance(target, list) else target[last]
            assert found == operation["value"], f"{operation['path']} is {found!r}"
        elif operation["op"] == "remove":
            assert isinstance(target, list) and int(last) < len(target), operation["path"]
            del target[int(last)]
        else:
            raise AssertionError(f"unsupported patch operation {operation}")
    return patched


def render(directory: Path) -> list[dict[str, Any]]:
    """Every object `kubectl kustomize directory` builds, in resource order, then generated
    ConfigMaps, with the directory's patches applied."""
    spec = kustomization(directory)
    assert set(spec) <= KNOWN_FIELDS, sorted(set(spec) - KNOWN_FIELDS)
    assert "namespace" not in spec, "the tests assume objects without a namespace"
    objects: list[dict[str, Any]] = []
    for resource in spec.get("resources", []):
        path = (directory / resource).resolve()
        objects += render(path) if path.is_dir() else load_docs(path)
    objects += generated_config_maps(directory)
    for patch in spec.get("patches", []):
        target = patch["target"]
        matches = [
            i
            for i, doc in enumerate(objects)
            if doc["kind"] == target["kind"] and doc["metadata"]["name"] == target["name"]
        ]
        assert len(matches) == 1, f"patch target {target} matches {len(matches)} objects"
        (index,) = matches
        group, _, version = objects[index]["apiVersion"].rpartition("/")
        assert (target.get("group", ""), target["version"]) == (group, version), target
        operations = yaml.safe_load(patch["patch"])
        if isinstance(operations, dict):  # a strategic-merge patch: only deletes are used
            assert operations.pop("$patch") == "delete", patch
            assert object_key(operations) == object_key(objects[index]), patch
            del objects[index]
        else:
            objects[index] = apply_json_patch(objects[index], operations)
    for image in spec.get("images", []):
        assert set(image) <= {"name", "newName", "newTag"}, image
        for doc in objects:
            for container in pod_containers(doc):
                name, _, tag = container["image"].partition(":")
                if name == image["name"]:
                    new_tag = image.get("newTag", tag)
                    new_name = image.get("newName", name)
                    container["image"] = f"{new_name}:{new_tag}" if new_tag else new_name
    return objects


def object_key(doc: dict[str, Any]) -> tuple[str, str]:
    return doc["kind"], doc["metadata"]["name"]


def pod_containers(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The containers of a Pod or of a workload's pod template (none for other kinds)."""
    spec = doc.get("spec", {})
    pod = spec if doc["kind"] == "Pod" else spec.get("template", {}).get("spec", {})
    return pod.get("containers", []) + pod.get("initContainers", [])


def only(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [
        doc
        for doc in docs
        if doc["kind"] == kind and (name is None or doc["metadata"]["name"] == name)
    ]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]
