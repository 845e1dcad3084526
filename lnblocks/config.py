"""One base for every typed config in lnblocks: frozen dataclasses with ``from_dict`` / ``to_dict`` / ``replace``,
validators, and one exception policy.

The policy, everywhere (norm specs, block and model configs, study configs):

- an unknown key, or a value of the right type that is out of range or not among the choices, raises
  ``ConfigValueError`` (a ``ValueError``) naming the dotted key and what is valid;
- a value of the wrong type raises ``ConfigTypeError`` (a ``TypeError``) naming the dotted key and the expected type.

Keys are dotted paths: a nested config built through ``from_dict(options, key="model.block")`` reports
``model.block.attention.n_heads must be an int >= 1, got 0``. Both error classes carry ``key`` and ``detail``, so an
enclosing config can prefix its own path without rewriting messages.

This module imports nothing from lnblocks (every package may import it).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import numbers
import operator
import typing
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, TypeVar

C = TypeVar("C", bound="Config")


class ConfigError(Exception):
    """An error about one config key: ``str(err) == f"{key} {detail}"``; base of the two classes below."""

    def __init__(self, key: str, detail: str) -> None:
        self.key = key
        self.detail = detail
        super().__init__(f"{key} {detail}" if key else detail)

    def under(self, prefix: str) -> ConfigError:
        """The same error with ``prefix.`` in front of its key (used by enclosing configs)."""
        if not prefix:
            return self
        return type(self)(f"{prefix}.{self.key}" if self.key else prefix, self.detail)


class ConfigValueError(ConfigError, ValueError):
    """Unknown key, or a value out of range / not among the choices."""


class ConfigTypeError(ConfigError, TypeError):
    """A value of the wrong type."""


def join_key(prefix: str, name: str) -> str:
    """``"model" + "dim" -> "model.dim"``; an empty prefix gives ``name``."""
    return f"{prefix}.{name}" if prefix else name


@contextlib.contextmanager
def under_key(prefix: str) -> Iterator[None]:
    """Config errors raised inside the block get ``prefix.`` in front of their key (for nested configs built by
    hand, e.g. one ``BlockConfig`` per layer under ``block[3]``)."""
    try:
        yield
    except ConfigError as err:
        raise err.under(prefix) from None


def _type_name(value: object) -> str:
    return type(value).__name__


# ---- validators: each returns the normalised value (e.g. numpy ints -> int) --------------------------------------


def check_int(
    key: str, value: Any, *, minimum: int | None = 1, maximum: int | None = None, allow_none: bool = False
) -> int | None:
    """An integral value (``int``, numpy ints; never ``bool``) in ``[minimum, maximum]``; returned as a plain
    ``int``."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        expected = "an int" + (" or None" if allow_none else "")
        raise ConfigTypeError(key, f"must be {expected}, got {_type_name(value)} {value!r}")
    value = operator.index(value)
    if minimum is not None and value < minimum:
        raise ConfigValueError(key, f"must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ConfigValueError(key, f"must be <= {maximum}, got {value}")
    return value


def check_float(
    key: str,
    value: Any,
    *,
    lo: float | None = None,
    hi: float | None = None,
    lo_open: bool = False,
    hi_open: bool = False,
    allow_none: bool = False,
) -> float | None:
    """A finite real number (``int``/``float``/numpy scalars; never ``bool``) within the bounds; returned as ``float``.

    ``lo_open``/``hi_open`` make a bound strict: ``check_float("eps", x, lo=0, lo_open=True)`` is ``eps > 0``.
    """
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        expected = "a number" + (" or None" if allow_none else "")
        raise ConfigTypeError(key, f"must be {expected}, got {_type_name(value)} {value!r}")
    value = float(value)
    lo_ok = lo is None or (value > lo if lo_open else value >= lo)
    hi_ok = hi is None or (value < hi if hi_open else value <= hi)
    if not (math.isfinite(value) and lo_ok and hi_ok):
        bounds = []
        if lo is not None:
            bounds.append(f"{'>' if lo_open else '>='} {lo:g}")
        if hi is not None:
            bounds.append(f"{'<' if hi_open else '<='} {hi:g}")
        where = f" {' and '.join(bounds)}" if bounds else ""
        raise ConfigValueError(key, f"must be a finite number{where}, got {value!r}")
    return value


def check_prob(key: str, value: Any) -> float:
    """A probability in ``[0, 1)``: dropout rates (1 would drop everything)."""
    return check_float(key, value, lo=0, hi=1, hi_open=True)


def check_bool(key: str, value: Any, *, allow_none: bool = False) -> bool | None:
    """``True`` or ``False`` (not 0/1, not ``"yes"``)."""
    if value is None and allow_none:
        return None
    if not isinstance(value, bool):
        expected = "a bool" + (" or None" if allow_none else "")
        raise ConfigTypeError(key, f"must be {expected}, got {_type_name(value)} {value!r}")
    return value


def check_choice(key: str, value: Any, choices: Iterable[Any], *, allow_none: bool = False) -> Any:
    """One of ``choices``; the error lists them."""
    if value is None and allow_none:
        return None
    choices = list(choices)
    if isinstance(value, (list, dict, set)) or value not in choices:
        raise ConfigValueError(key, f"must be one of {choices}, got {value!r}")
    return value


def check_str(key: str, value: Any, *, allow_none: bool = False, nonempty: bool = True) -> str | None:
    """A string (non-empty unless ``nonempty=False``)."""
    if value is None and allow_none:
        return None
    if not isinstance(value, str):
        raise ConfigTypeError(key, f"must be a string, got {_type_name(value)} {value!r}")
    if nonempty and not value:
        raise ConfigValueError(key, "must be a non-empty string")
    return value


# ---- the base class ------------------------------------------------------------------------------------------------


class Config:
    """Base of typed, frozen, validated configs (subclasses are ``@dataclass(frozen=True, kw_only=True)``).

    Subclasses validate in ``__post_init__`` with the ``check_*`` functions (keys relative to the config: ``"dim"``)
    and normalise fields with ``self._set(name, value)``; nested configs given as dicts are turned into objects with
    ``self._nested(name, cls)``, which prefixes their errors with the field name.
    """

    @classmethod
    def field_names(cls) -> list[str]:
        """The keys ``from_dict`` accepts."""
        return [f.name for f in dataclasses.fields(cls) if f.init]  # type: ignore[arg-type]

    @classmethod
    def nested_config(cls, name: str) -> type[Config] | None:
        """The ``Config`` class field ``name`` holds, read from its annotation (``optimizer: OptimizerConfig``,
        ``checkpoint: CheckpointConfig | None``), or None for a plain value."""
        try:
            hint = typing.get_type_hints(cls).get(name)
        except (NameError, TypeError):  # an annotation that cannot be resolved here: a plain value
            return None
        for t in (hint, *typing.get_args(hint)):
            if isinstance(t, type) and issubclass(t, Config):
                return t
        return None

    @classmethod
    def check_key(cls, key: str, where: str = "") -> None:
        """``ConfigValueError`` unless the dotted ``key`` names an option of this config: one of its fields, or,
        through a field that holds a nested config, one of that config's (``optimizer.beta2``). ``where``: where the
        key was given (``"grid"``), for the message. How a study checks a grid axis before any run is built."""
        owner: type[Config] | None = cls
        done: list[str] = []
        context = f" (in {where})" if where else ""
        for part in key.split("."):
            if owner is None:
                raise ConfigValueError(key, f"is not a config key{context}: {'.'.join(done)} takes a value, not keys")
            names = owner.field_names()
            if part not in names:
                of = repr(".".join(done)) if done else owner.__name__
                raise ConfigValueError(key, f"is not a config key{context}; valid keys of {of}: {names}")
            done.append(part)
            owner = owner.nested_config(part)

    @classmethod
    def from_dict(cls: type[C], options: Mapping[str, Any] | C | None = None, *, key: str = "") -> C:
        """Build from a plain mapping (the YAML/JSON form). Unknown keys raise ``ConfigValueError``; every error
        names its dotted key, prefixed with ``key`` (this config's own path, e.g. ``"model"``)."""
        if isinstance(options, cls):
            return options
        if options is None:
            options = {}
        if not isinstance(options, Mapping):
            raise ConfigTypeError(key or cls.__name__, f"must be a mapping, got {_type_name(options)} {options!r}")
        valid = cls.field_names()
        unknown = sorted(str(k) for k in set(options) - set(valid))
        if unknown:
            raise _unknown_keys(unknown, valid, cls.__name__).under(key)
        try:
            return cls(**options)
        except ConfigError as err:
            raise err.under(key) from None

    def to_dict(self) -> dict[str, Any]:
        """Plain nested dict (configs and specs as dicts, tuples as lists): what YAML, JSON and records store."""
        return {name: _plain(getattr(self, name)) for name in self.field_names()}

    def replace(self: C, **changes: Any) -> C:
        """A copy with ``changes`` applied and validated again; unknown keys raise ``ConfigValueError``."""
        current = {name: getattr(self, name) for name in self.field_names()}
        unknown = sorted(set(changes) - set(current))
        if unknown:
            raise _unknown_keys(unknown, list(current), type(self).__name__)
        return type(self).from_dict({**current, **changes})

    # ---- helpers for __post_init__ -------------------------------------------------------------------------------
    def _set(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)

    def _nested(self, name: str, cls: type[C], *, allow_none: bool = False) -> None:
        """Turn field ``name`` into a ``cls`` (from a dict or an instance); errors are prefixed with ``name``."""
        value = getattr(self, name)
        if value is None and allow_none:
            return
        if not isinstance(value, (cls, Mapping)):
            article = "an" if cls.__name__[0] in "AEIOU" else "a"
            raise ConfigTypeError(name, f"must be {article} {cls.__name__} or a mapping, got {_type_name(value)}")
        self._set(name, cls.from_dict(value, key=name))


def _unknown_keys(unknown: list[str], valid: list[str], owner: str) -> ConfigValueError:
    others = f" (nor are {unknown[1:]})" if len(unknown) > 1 else ""
    return ConfigValueError(unknown[0], f"is not a config key{others}; valid keys of {owner}: {valid}")


def _plain(value: Any) -> Any:
    if isinstance(value, Config) or hasattr(value, "to_dict"):
        return value.to_dict()
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    return value
