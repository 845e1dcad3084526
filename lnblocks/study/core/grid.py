"""A study's grid: its axes (``GridAxis``), their value labels, and how the ``grid`` and ``extra_grids`` sections of a
study file are read (``parse_grid``: the core's reading, which a task whose file gives its grid otherwise replaces).

Each grid axis is either a dotted key with a list of values::

    grid:
      model.placement: [pre, post]
      train.lr: [1.0e-3, 3.0e-3]

or a named axis whose values are labelled bundles of overrides (for settings that only make sense together)::

    grid:
      variant:
        deepnorm: {model.placement: deepnorm, model.init: deepnet}
        dyt: {model.norm: dyt}

The grid is the product of the axes in file order; overrides apply to the base options before validation.
``extra_grids`` (a list) adds the points of more grids, each the main grid with some axes changed: a named axis by a
list of its labels (a subset) or by a mapping of bundles, a dotted key by a new list of values; the other axes and
the axis order (so the labels) stay the main grid's, and points already in the grid are not repeated::

    extra_grids:
      - {variant: [pre, post], model.depth: [24]}   # depth 24 for two of the variants only

Labels are unique per distinct value (a dict value's label names the options that tell it apart). Every dotted key an
axis sets is checked against the task's run config (``Config.check_key``) before any run is built.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from lnblocks.config import ConfigTypeError, ConfigValueError

CheckKey = Callable[[str, str], None]  # (dotted key, where it was given): ValueError unless it names an option


@dataclass(frozen=True)
class GridAxis:
    """One axis: ``name`` and its values as ``(label, ((dotted_key, value), ...))``."""

    name: str
    values: tuple[tuple[str, tuple[tuple[str, Any], ...]], ...]

    @property
    def keys(self) -> list[str]:
        """Every dotted key this axis sets (in some of its values)."""
        return sorted({k for _, overrides in self.values for k, _ in overrides})

    @property
    def keys_in_every_run(self) -> list[str]:
        """The dotted keys every value of this axis sets: what it overrides in every run."""
        sets = [{k for k, _ in overrides} for _, overrides in self.values]
        return sorted(set.intersection(*sets)) if sets else []


def _scalar_label(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, dict):
        return str(value.get("kind", "x"))
    return str(value)


def value_labels(name: str, values: Sequence[Any]) -> list[str]:
    """Labels of an axis's values, unique per distinct value: a dict is labelled by its ``kind`` plus the options
    that differ among the dicts sharing that label (``dyt(alpha_init=0.5)``); a float by ``%g``, then by ``repr``
    where ``%g`` collides. Values that still share a label are refused (``ValueError``)."""
    labels = [_scalar_label(v) for v in values]
    for label in set(labels):
        same = [i for i, lab in enumerate(labels) if lab == label]
        if len(same) < 2:
            continue
        if all(isinstance(values[i], dict) for i in same):
            keys = sorted({k for i in same for k in values[i]} - {"kind"})
            differ = [k for k in keys if len({json.dumps(values[i].get(k), sort_keys=True) for i in same}) > 1]
            for i in same:
                opts = ",".join(f"{k}={_scalar_label(values[i].get(k))}" for k in differ)
                labels[i] = f"{label}({opts})" if opts else label
        else:
            for i in same:
                labels[i] = repr(values[i]) if isinstance(values[i], float) else labels[i]
    seen: dict[str, int] = {}
    for i, label in enumerate(labels):
        if label in seen and values[seen[label]] != values[i]:
            raise ConfigValueError(
                f"grid.{name}", f"values {values[seen[label]]!r} and {values[i]!r} would share the label {label!r}"
            )
        seen[label] = i
    return labels


def parse_axis(name: Any, spec: Any, check_key: CheckKey) -> GridAxis:
    """One ``grid`` entry: a dotted key with a non-empty list, or a named axis of labelled override bundles."""
    if not isinstance(name, str):
        raise ConfigValueError("grid", f"axis names must be strings, got {name!r}")
    if "." in name:
        check_key(name, "grid")
        if not isinstance(spec, list) or not spec:
            raise ConfigValueError(f"grid.{name}", f"must be a non-empty list of values, got {spec!r}")
        labels = value_labels(name, spec)
        return GridAxis(name, tuple((lab, ((name, v),)) for lab, v in zip(labels, spec)))
    if not isinstance(spec, dict) or not spec:
        raise ConfigValueError(
            f"grid.{name}",
            "a named axis maps labels to overrides, e.g. {deepnorm: {model.placement: deepnorm}}; "
            f"got {spec!r} (a dotted key such as 'model.depth' takes a list of values)",
        )
    values = []
    given: dict[str, Any] = {}  # label as the ids and the report write it -> the key as the file gave it
    for label, overrides in spec.items():
        text = str(label)
        if not text.strip():
            raise ConfigValueError(f"grid.{name}", f"labels must be non-empty names, got {label!r}")
        if text in given:
            raise ConfigValueError(
                f"grid.{name}",
                f"labels {given[text]!r} and {label!r} are both {text!r} as the run ids, --set and the report "
                "write them; give the values distinct names",
            )
        given[text] = label
        if not isinstance(overrides, dict) or not overrides:
            raise ConfigValueError(
                f"grid.{name}.{label}", f"must be a mapping of dotted keys to values, got {overrides!r}"
            )
        for key in overrides:
            check_key(str(key), f"grid.{name}.{label}")
        values.append((text, tuple((str(k), v) for k, v in overrides.items())))
    return GridAxis(name, tuple(values))


def parse_extra_grids(spec: Any, axes: Sequence[GridAxis], check_key: CheckKey) -> tuple:
    """``extra_grids``: a list of mappings, each changing some axes of the main grid ``axes`` (see the module
    docstring). Returns one tuple of axes per extra grid, in the main grid's axis order."""
    if spec is None:
        return ()
    if not isinstance(spec, list):
        raise ConfigValueError("extra_grids", f"must be a list of grids (mappings of axes), got {spec!r}")
    main = {a.name: a for a in axes}
    out = []
    for i, grid in enumerate(spec):
        where = f"extra_grids[{i}]"
        if not isinstance(grid, dict) or not grid:
            raise ConfigValueError(where, f"must be a non-empty mapping of axes to change, got {grid!r}")
        changed = {}
        for name, values in grid.items():
            if name not in main:
                raise ConfigValueError(f"{where}.{name}", f"is not an axis of the main grid; its axes: {list(main)}")
            if "." not in name and isinstance(values, list):  # a subset of a named axis's labels
                known = dict(main[name].values)
                missing = [v for v in values if str(v) not in known]
                if not values or missing:
                    raise ConfigValueError(
                        f"{where}.{name}", f"must list labels of the axis {name!r} {list(known)}, got {values!r}"
                    )
                changed[name] = GridAxis(name, tuple((str(v), known[str(v)]) for v in values))
            else:
                changed[name] = parse_axis(name, values, check_key)
        out.append(tuple(changed.get(a.name, a) for a in axes))
    return tuple(out)


def parse_grid(raw: Mapping[str, Any], check_key: CheckKey) -> tuple[tuple[GridAxis, ...], tuple]:
    """The axes of a study file's ``grid`` section and its ``extra_grids`` (both optional)."""
    grid = raw.get("grid")
    if grid is None:
        grid = {}
    if not isinstance(grid, dict):
        got = f"{type(grid).__name__} {grid!r}"
        raise ConfigTypeError("grid", f"must be a mapping of axes (dotted key: [values]), got {got}")
    axes = tuple(parse_axis(k, v, check_key) for k, v in grid.items())
    return axes, parse_extra_grids(raw.get("extra_grids"), axes, check_key)


def grid_dict(axes: Sequence[GridAxis]) -> dict[str, Any]:
    """The manifest form of a grid: every axis's labels and overrides."""
    return {a.name: [{"label": lab, "overrides": dict(ov)} for lab, ov in a.values] for a in axes}
