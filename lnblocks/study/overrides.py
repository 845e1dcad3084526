"""Study-file options that are changed or resolved before validation: ``--set`` overrides and file paths.

``apply_overrides(raw, changes)``: dotted keys set options; a grid axis takes a list of values (a scalar is a list
of one; a named axis takes a list of its labels), which shrinks the grid; an option that a grid axis sets in every
run is refused. ``resolve_file_paths(merged)``: relative file paths among the options (the task's ``path_keys``)
joined to the folder of the study file that set them, so a study runs the same from any folder and on any node
that sees the same paths. Overrides given on the command line resolve against the current folder.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from lnblocks.config import ConfigTypeError, ConfigValueError
from lnblocks.study.yamlfile import MergedFile


def set_dotted(tree: dict[str, Any], key: str, value: Any) -> None:
    """``tree[a][b][c] = value`` for ``key = "a.b.c"`` (creating the mappings on the way)."""
    parts = key.split(".")
    node = tree
    for p in parts[:-1]:
        child = node.get(p)
        if not isinstance(child, dict):
            child = node[p] = {}
        node = child
    node[parts[-1]] = value


def _get_dotted(tree: Mapping[str, Any], key: str) -> tuple[bool, Any]:
    node: Any = tree
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return False, None
        node = node[part]
    return True, node


def absolute_paths(value: Any, folder: Path, literals: Sequence[str] = ()) -> Any:
    """``value`` (a path, a list of paths, or None) with relative paths joined to ``folder``; ``~`` paths, absolute
    paths and the ``literals`` (values that are not paths, e.g. ``tokenizer: bytes``) are kept."""
    if isinstance(value, (list, tuple)):
        return [absolute_paths(v, folder, literals) for v in value]
    if not isinstance(value, str) or not value or value in literals:
        return value
    if value.startswith("~") or os.path.isabs(value):
        return value
    return os.path.normpath(folder / value)


def resolve_tree_paths(tree: dict[str, Any], folder: Path, path_keys: Mapping[str, Sequence[str]], keys=None) -> None:
    for key, literals in path_keys.items():
        if keys is not None and key not in keys:
            continue
        found, value = _get_dotted(tree, key)
        if found and value is not None:
            set_dotted(tree, key, absolute_paths(value, folder, literals))


def resolve_grid_paths(grid: Any, axis: str, folder: Path, path_keys: Mapping[str, Sequence[str]]) -> None:
    """Resolve the paths among the values of grid axis ``axis`` (a dotted axis's list, a named axis's bundles)."""
    spec = grid.get(axis) if isinstance(grid, dict) else None
    if axis in path_keys and isinstance(spec, list):
        grid[axis] = [absolute_paths(v, folder, path_keys[axis]) for v in spec]
    elif "." not in axis and isinstance(spec, dict):
        for bundle in spec.values():
            if isinstance(bundle, dict):
                for key in set(bundle) & set(path_keys):
                    bundle[key] = absolute_paths(bundle[key], folder, path_keys[key])


def resolve_file_paths(merged: MergedFile, path_keys: Mapping[str, Sequence[str]]) -> dict[str, Any]:
    """The merged mapping with every relative path option joined to the folder of the file that set it."""
    raw = copy.deepcopy(merged.raw)
    for key in path_keys:
        at = merged.option_file.get(key)
        if at is not None:
            resolve_tree_paths(raw, merged.files[at].parent, path_keys, keys={key})
    grid = raw.get("grid")
    for axis, at in merged.axis_file.items():
        resolve_grid_paths(grid, axis, merged.files[at].parent, path_keys)
    return raw


def _axis_keys(name: str, spec: Any) -> set[str]:
    if "." in name:
        return {name}
    if isinstance(spec, dict):
        return {str(k) for bundle in spec.values() if isinstance(bundle, dict) for k in bundle}
    return set()


def _related(a: str, b: str) -> bool:
    return a == b or a.startswith(b + ".") or b.startswith(a + ".")


def apply_overrides(
    raw: Mapping[str, Any], changes: Mapping[str, Any], path_keys: Mapping[str, Sequence[str]] = {}
) -> dict[str, Any]:
    """A copy of the study mapping ``raw`` with dotted-key ``changes``: a grid axis takes a list of values (a
    scalar is a list of one; a named axis takes a list of its labels), any other key sets that option (validated
    when the study is built). Relative paths among the changes resolve against the current folder."""
    out = copy.deepcopy(dict(raw))
    grid = out.get("grid") if isinstance(out.get("grid"), dict) else {}
    for key, value in changes.items():
        if not isinstance(key, str) or not key or any(not p for p in key.split(".")):
            raise ConfigValueError(str(key), "is not a dotted config key (e.g. train.steps)")
        value = copy.deepcopy(value)
        if key in grid:
            grid[key] = _axis_override(key, grid[key], value)
            resolve_grid_paths(grid, key, Path.cwd(), path_keys)
            _drop_from_extra_grids(out, key)
            continue
        setters = [axis for axis, spec in grid.items() if any(_related(key, k) for k in _axis_keys(axis, spec))]
        if setters:
            raise ConfigValueError(
                key, f"is set by the grid axis {setters[0]!r} in every run; override the axis instead "
                f"(e.g. {setters[0]}=[...])"
            )  # fmt: skip
        if key in path_keys:
            value = absolute_paths(value, Path.cwd(), path_keys[key])
        if key.split(".")[0] in out and not isinstance(out[key.split(".")[0]], dict) and "." in key:
            raise ConfigTypeError(key.split(".")[0], f"must be a mapping to set {key}")
        set_dotted(out, key, value)
    return out


def _drop_from_extra_grids(out: dict[str, Any], axis: str) -> None:
    """An axis given as an override replaces it in the ``extra_grids`` too: drop it there (an extra grid left with
    no changes is the main grid's own points, so it goes)."""
    extra = out.get("extra_grids")
    if not isinstance(extra, list):
        return
    kept = [{k: v for k, v in g.items() if k != axis} if isinstance(g, dict) else g for g in extra]
    kept = [g for g in kept if g != {}]
    if kept:
        out["extra_grids"] = kept
    else:
        del out["extra_grids"]


def _axis_override(name: str, spec: Any, value: Any) -> Any:
    """The new spec of grid axis ``name``: a list of values for a dotted axis, the chosen labels of a named one."""
    values = value if isinstance(value, list) else [value]
    if "." in name or not isinstance(spec, dict):
        return values
    if isinstance(value, dict):
        return value
    unknown = [str(v) for v in values if str(v) not in {str(k) for k in spec}]
    if unknown:
        raise ConfigValueError(f"grid.{name}", f"has no value labelled {unknown[0]!r}; its labels: {list(spec)}")
    return {k: v for k, v in spec.items() if str(k) in {str(x) for x in values}}
