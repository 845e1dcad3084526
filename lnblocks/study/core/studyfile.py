"""Reading study files: a strict YAML loader and ``extends:`` merging with a record of which file set each key.

The loader differs from ``yaml.safe_load`` in two ways that matter for configs:

- numbers with an exponent and no dot (``1e-3``, ``3E+4``) are floats, as in YAML 1.2 (YAML 1.1 reads them as
  strings), so configs never coerce strings to numbers;
- a key given twice in one mapping is an error naming the file, the line and the key (``safe_load`` silently keeps
  the last one, dropping a whole section).

A study file must be a mapping; an empty file, a list or a scalar is an error naming the file.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lnblocks._optional import require

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
