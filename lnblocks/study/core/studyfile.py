"""A study file on disk, and ``--set`` overrides, to the one merged mapping a task validates.

Reading. The loader differs from ``yaml.safe_load`` in two ways that matter for configs: numbers with an exponent
and no dot (``1e-3``, ``3E+4``) are floats, as in YAML 1.2 (YAML 1.1 reads them as strings), so configs never coerce
strings to numbers; and a key given twice in one mapping is an error naming the file, the line and the key
(``safe_load`` silently keeps the last one, dropping a whole section). A study file must be a mapping; an empty
file, a list or a scalar is an error naming the file. ``extends: base.yaml`` (or a list) deep-merges the base files
first, recording which file set each option and grid axis (``MergedFile``).

Paths. Relative file paths among the options (the task's ``path_keys``, e.g. ``data.train_path``) are joined to the
folder of the file that set them (``resolve_file_paths``), so a study runs the same from any folder and on any node
that sees the same paths; paths given as overrides resolve against the current folder.

Overrides. ``apply_overrides(raw, changes)``: a dotted key sets that option; a grid axis takes a list of values (a
scalar is a list of one; a named axis takes a list of its labels), which shrinks the grid; an option that a grid
axis sets in every run is refused. ``parse_value`` reads one ``--set key=VALUE`` value as YAML.
"""

from __future__ import annotations

import copy
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lnblocks._optional import require
from lnblocks.config import ConfigTypeError, ConfigValueError

# Keys whose values are replaced whole by a child file instead of merged key by key (a norm spec changes meaning
# with its kind: merging {kind: dyt} into {kind: layernorm, eps: ...} would mix options of two norms).
REPLACED_WHOLE = ("norm", "qk_norm")
# Top-level keys that are not sections of run options.
META_KEYS = ("extends", "name", "description", "task", "grid")

_EXP_FLOAT = re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$")


class StudyFileError(ValueError):
    """A study file that cannot be read as a config (not YAML, not a mapping, duplicated key, bad ``extends``)."""


def _loader_class() -> type:
    yaml = require("yaml")

    class StrictLoader(yaml.SafeLoader):
        """``SafeLoader`` + YAML 1.2 exponent floats + duplicate keys rejected."""

        def construct_mapping(self, node: Any, deep: bool = False) -> dict[Any, Any]:
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=True)
                line = key_node.start_mark.line + 1
                if key in seen:
                    raise StudyFileError(
                        f"{self.name}:{line}: duplicate key {key!r} (first given at line {seen[key]}); "
                        "a key may appear once per mapping"
                    )
                seen[key] = line
            return super().construct_mapping(node, deep=deep)

    StrictLoader.add_implicit_resolver("tag:yaml.org,2002:float", _EXP_FLOAT, list("-+.0123456789"))
    return StrictLoader


def _parse(text: str, where: str, invalid: str) -> Any:
    """The one YAML document in ``text``, read with the strict loader; a syntax error becomes ``StudyFileError``
    ``"<where>: <invalid>: <the parser's message>"``."""
    yaml = require("yaml")
    loader = _loader_class()(text)
    loader.name = where
    try:
        return loader.get_single_data()
    except yaml.YAMLError as err:
        raise StudyFileError(f"{where}: {invalid}: {' '.join(str(err).split())}") from None
    finally:
        loader.dispose()


def read_yaml(path: Path) -> Any:
    """Parse one YAML file with the strict loader; syntax errors become ``StudyFileError`` naming the file."""
    return _parse(Path(path).read_text(), str(path), "not valid YAML")


def parse_value(text: str, where: str = "value") -> Any:
    """One YAML value from the command line (``--set key=VALUE``), read as in a study file: ``3``, ``1e-3``, ``true``,
    ``null``, ``[pre, post]``, ``{name: adam}``, or a plain string; ``StudyFileError`` naming ``where`` if invalid."""
    return _parse(text, where, "not a valid YAML value")


def read_mapping(path: Path, what: str = "a study config") -> dict[str, Any]:
    """``read_yaml`` that insists on a non-empty mapping at the top."""
    raw = read_yaml(path)
    if raw is None:
        raise StudyFileError(f"{path}: the file is empty; {what} is a mapping of sections (data:, model:, ...)")
    if not isinstance(raw, dict):
        raise StudyFileError(
            f"{path}: {what} must be a mapping of sections (data:, model:, ...), got a {type(raw).__name__} {raw!r}"
        )
    bad = [k for k in raw if not isinstance(k, str)]
    if bad:
        raise StudyFileError(f"{path}: top-level keys must be strings, got {bad[0]!r}")
    return raw


@dataclass
class MergedFile:
    """A study file with its ``extends`` chain merged: ``raw`` (the merged mapping), and for every option leaf
    (``"train.lr"``) and grid axis (``"train.lr"``, ``"variant"``) the file that set it last."""

    raw: dict[str, Any]
    files: list[Path] = field(default_factory=list)  # merge order: bases first, the file itself last
    option_file: dict[str, int] = field(default_factory=dict)  # option leaf -> index into files
    axis_file: dict[str, int] = field(default_factory=dict)  # grid axis -> index into files


def _leaves(tree: dict[str, Any], prefix: str = "") -> list[str]:
    out = []
    for k, v in tree.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, dict) and k not in REPLACED_WHOLE:
            out += _leaves(v, key)
        else:
            out.append(key)
    return out


def merge(base: dict[str, Any], child: dict[str, Any]) -> dict[str, Any]:
    """Deep merge: ``child`` wins; ``null`` in the child removes the key; norm specs are replaced whole."""
    out = dict(base)
    for k, v in child.items():
        if v is None:
            out.pop(k, None)
        elif isinstance(v, dict) and isinstance(out.get(k), dict) and k not in REPLACED_WHOLE:
            out[k] = merge(out[k], v)
        else:
            out[k] = v
    return out


def load_merged(path: str | Path) -> MergedFile:
    """Read ``path`` and the files it ``extends`` (paths relative to the including file), merged."""
    result = MergedFile(raw={})
    _merge_into(result, Path(path).resolve(), ())
    return result


def _merge_into(result: MergedFile, path: Path, chain: tuple[Path, ...]) -> None:
    if path in chain:
        raise StudyFileError(f"extends cycle: {' -> '.join(str(p) for p in (*chain, path))}")
    if not path.is_file():
        where = f" (extended by {chain[-1]})" if chain else ""
        raise FileNotFoundError(f"study config {str(path)!r} not found{where}")
    raw = read_mapping(path)
    parents = raw.pop("extends", None) or []
    if isinstance(parents, str):
        parents = [parents]
    if not isinstance(parents, list) or not all(isinstance(p, str) for p in parents):
        raise StudyFileError(f"{path}: extends must be a file name or a list of them, got {parents!r}")
    for parent in parents:
        _merge_into(result, (path.parent / parent).resolve(), (*chain, path))
    index = len(result.files)
    result.files.append(path)
    for section, value in raw.items():
        if section in META_KEYS:
            continue
        if isinstance(value, dict):
            for leaf in _leaves(value, section):
                result.option_file[leaf] = index
        else:
            result.option_file[section] = index
    grid = raw.get("grid")
    if isinstance(grid, dict):
        for axis, values in grid.items():
            if values is None:
                result.axis_file.pop(str(axis), None)
            else:
                result.axis_file[str(axis)] = index
    result.raw = merge(result.raw, raw)


# ---- options changed or resolved before validation: file paths and --set overrides -----------------------


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
