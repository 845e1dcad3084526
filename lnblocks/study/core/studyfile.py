"""A study file on disk, and ``--set`` overrides, to the one merged mapping a task validates.

Reading. Scalars are read with the YAML 1.2 core schema, in study files and ``--set`` values alike (PyYAML's
``safe_load`` uses YAML 1.1): ``010`` is the int 10 (not octal 8), ``0o17`` and ``0x1f`` are octal and hex,
``1e-3`` and ``3E+4`` are floats, ``.inf`` and ``.nan`` too; ``1:30`` (1.1's base 60), ``1_000``, ``yes``/``no``/
``on``/``off`` and dates are strings (so a config that meant a number or a bool gets a type error naming the key);
``true``/``false`` and ``null``/``~`` are what they say. YAML merge keys (``<<: *anchor``) work. A key given twice in
one mapping is an error naming the file, the line and the key (``safe_load`` silently keeps the last one, dropping a
whole section). A study file must be UTF-8 text holding a mapping; an empty file, a list or a scalar is an error
naming the file (never quoting it whole). ``extends: base.yaml`` (or a list) deep-merges the base files first,
recording which file set each option and grid axis (``MergedFile``).

Paths. Relative file paths among the options (the task's ``path_keys``, e.g. ``data.train_path``) are joined to the
folder of the file that set them (``resolve_file_paths``), so a study runs the same from any folder and on any node
that sees the same paths; paths given as overrides resolve against the current folder.

Overrides. ``apply_overrides(raw, changes)``: a dotted key sets that option (a section given a mapping,
``model={depth: 2, dim: 8}``, sets each key it names); a grid axis takes a list of values (a scalar is a list of
one; a named axis takes a list of its labels), which shrinks the grid; an option that a grid axis sets in every run
(a dotted axis, or a key every bundle of a named axis sets) is refused; ``extends``, ``task`` and ``grid.*`` are not
overridable. ``parse_value`` reads one ``--set key=VALUE`` value as YAML.
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
# Top-level keys ``--set`` cannot change: the files are merged, and the task chosen, before overrides apply.
NOT_OVERRIDABLE = ("extends", "task")

# The YAML 1.2 core schema's implicit scalars (https://yaml.org/spec/1.2.2/#1032-tag-resolution), by tag.
_CORE_SCHEMA = (
    ("tag:yaml.org,2002:null", r"^(?:~|null|Null|NULL|)$", ["~", "n", "N", ""]),
    ("tag:yaml.org,2002:bool", r"^(?:true|True|TRUE|false|False|FALSE)$", list("tTfF")),
    ("tag:yaml.org,2002:int", r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$", list("-+0123456789")),
    (
        "tag:yaml.org,2002:float",
        r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$",
        list("-+.0123456789"),
    ),
)
_SCHEMA_1_1 = {"tag:yaml.org,2002:" + t for t in ("null", "bool", "int", "float", "timestamp", "value")}


def _short(value: Any, limit: int = 60) -> str:
    """``repr(value)`` cut to ``limit`` characters (a message never quotes a whole file)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class StudyFileError(ValueError):
    """A study file that cannot be read as a config (not YAML, not a mapping, duplicated key, bad ``extends``)."""


def _construct_int(loader: Any, node: Any) -> int:
    """A YAML 1.2 int: decimal (leading zeros are decimal), ``0o`` octal or ``0x`` hex."""
    text = loader.construct_scalar(node)
    sign, digits = (-1, text[1:]) if text[:1] == "-" else (1, text.lstrip("+"))
    for prefix, base in (("0o", 8), ("0x", 16)):
        if digits.startswith(prefix):
            return sign * int(digits[2:], base)
    return sign * int(digits, 10)


def _loader_class() -> type:
    yaml = require("yaml")

    class StrictLoader(yaml.SafeLoader):
        """``SafeLoader`` with the YAML 1.2 core schema's scalars and duplicate keys rejected."""

        def construct_mapping(self, node: Any, deep: bool = False) -> dict[Any, Any]:
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":  # ``<<: *base``: merged by SafeLoader, may repeat
                    continue
                key = self.construct_object(key_node, deep=True)
                line = key_node.start_mark.line + 1
                if key in seen:
                    raise StudyFileError(
                        f"{self.name}:{line}: duplicate key {key!r} (first given at line {seen[key]}); "
                        "a key may appear once per mapping"
                    )
                seen[key] = line
            return super().construct_mapping(node, deep=deep)

    StrictLoader.yaml_implicit_resolvers = {
        first: [(tag, regexp) for tag, regexp in resolvers if tag not in _SCHEMA_1_1]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }
    for tag, pattern, first in _CORE_SCHEMA:
        StrictLoader.add_implicit_resolver(tag, re.compile(pattern), first)
    StrictLoader.add_constructor("tag:yaml.org,2002:int", _construct_int)
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
    """Parse one YAML file with the strict loader; a file that is not UTF-8 text or not YAML is a
    ``StudyFileError`` naming it."""
    try:
        text = Path(path).read_bytes().decode("utf-8")
    except UnicodeDecodeError as err:
        raise StudyFileError(
            f"{path}: not UTF-8 text (byte 0x{err.object[err.start]:02x} at offset {err.start}); a study file is "
            "UTF-8 YAML"
        ) from None
    return _parse(text, str(path), "not valid YAML")


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
        got = f"text ({len(raw)} characters)" if isinstance(raw, str) else f"a {type(raw).__name__} {_short(raw)}"
        raise StudyFileError(f"{path}: {what} must be a mapping of sections (data:, model:, ...), got {got}")
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
    given = raw.pop("extends", None)
    parents = [] if given is None else [given] if isinstance(given, str) else given
    if not isinstance(parents, list) or not all(isinstance(p, str) and p.strip() for p in parents):
        raise StudyFileError(f"{path}: extends must be a file name or a list of file names, got {_short(given)}")
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


def axis_keys_in_every_run(name: str, spec: Any) -> set[str]:
    """The dotted keys grid axis ``name`` sets in every run: a dotted axis its own key; a named axis the keys that
    every one of its bundles sets (a key only some bundles set is the base value in the others' runs)."""
    if "." in name:
        return {name}
    bundles = list(spec.values()) if isinstance(spec, dict) else []
    if not bundles or not all(isinstance(b, dict) for b in bundles):
        return set()
    return set.intersection(*({str(k) for k in b} for b in bundles))


def _inside(key: str, axis_key: str) -> bool:
    """Whether setting ``key`` changes what ``axis_key`` sets (the same key, or a key inside it)."""
    return key == axis_key or key.startswith(axis_key + ".")


def _expanded(changes: Mapping[str, Any], axes: Sequence[str]) -> dict[str, Any]:
    """``changes`` with a section given as a mapping (``model={depth: 2}``) as one change per key it names (a grid
    axis given a mapping, ``variant={...}``, stays whole: its new bundles)."""
    out: dict[str, Any] = {}
    for key, value in changes.items():
        if not isinstance(key, str) or not key or any(not p for p in key.split(".")):
            raise ConfigValueError(str(key), "is not a dotted config key (e.g. train.steps)")
        if key in NOT_OVERRIDABLE or key == "grid" or key.startswith("grid."):
            why = {
                "extends": "the study file's base files are merged before overrides apply; write a study file that "
                "extends the others instead",
                "task": "a study file's task decides what its keys mean; use a study file of the other task",
            }.get(key, "give a grid axis by its own name instead (e.g. --set model.depth=[2, 4])")
            raise ConfigValueError(key, f"cannot be overridden: {why}")
        if "." not in key and key not in META_KEYS and key not in axes and isinstance(value, dict) and value:
            for sub, v in value.items():
                if not isinstance(sub, str):
                    raise ConfigValueError(key, f"keys must be strings, got {sub!r}")
                out[f"{key}.{sub}"] = v
        else:
            out[key] = value
    return out


def apply_overrides(
    raw: Mapping[str, Any], changes: Mapping[str, Any], path_keys: Mapping[str, Sequence[str]] = {}
) -> dict[str, Any]:
    """A copy of the study mapping ``raw`` with dotted-key ``changes``: a grid axis takes a list of values (a
    scalar is a list of one; a named axis takes a list of its labels), any other key sets that option (validated
    when the study is built; a section given a mapping sets each key it names). Relative paths among the changes
    resolve against the current folder."""
    out = copy.deepcopy(dict(raw))
    grid = out.get("grid") if isinstance(out.get("grid"), dict) else {}
    for key, value in _expanded(changes, list(grid)).items():
        value = copy.deepcopy(value)
        if key in grid:
            grid[key] = _axis_override(key, grid[key], value)
            resolve_grid_paths(grid, key, Path.cwd(), path_keys)
            _drop_from_extra_grids(out, key)
            continue
        setters = [
            (axis, k) for axis, spec in grid.items() for k in sorted(axis_keys_in_every_run(axis, spec))
            if _inside(key, k)
        ]  # fmt: skip
        if setters:
            axis, k = setters[0]
            what = "" if axis == k else f" (every value of the axis sets {k})"
            raise ConfigValueError(
                key, f"is set by the grid axis {axis!r} in every run{what}; override the axis instead "
                f"(e.g. {axis}=[...])"
            )  # fmt: skip
        if key in path_keys:
            value = absolute_paths(value, Path.cwd(), path_keys[key])
        head = key.split(".")[0]
        if "." in key and head in out and not isinstance(out[head], dict):
            raise ConfigTypeError(head, f"must be a mapping to set {key}, got {type(out[head]).__name__}")
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
    labels = [str(k) for k in spec]
    unknown = [str(v) for v in values if str(v) not in labels]
    if unknown:
        raise ConfigValueError(f"grid.{name}", f"has no value labelled {unknown[0]!r}; its labels: {labels}")
    wanted = {str(x) for x in values}
    return {k: v for k, v in spec.items() if str(k) in wanted}
