"""The config base: validators' type/value policy, dotted keys through nesting, from_dict/to_dict/replace."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest

from lnblocks.config import (
    Config,
    ConfigTypeError,
    ConfigValueError,
    check_bool,
    check_choice,
    check_float,
    check_int,
    check_str,
)


@dataclass(frozen=True, kw_only=True)
class Inner(Config):
    n_heads: int = 4
    kind: str = "a"

    def __post_init__(self) -> None:
        self._set("n_heads", check_int("n_heads", self.n_heads))
        check_choice("kind", self.kind, ("a", "b"))


@dataclass(frozen=True, kw_only=True)
class Outer(Config):
    dim: int = 8
    lr: float = 1e-3
    flag: bool = False
    inner: Inner | dict = field(default_factory=Inner)
    sizes: tuple[int, ...] = (1, 2)

    def __post_init__(self) -> None:
        self._set("dim", check_int("dim", self.dim))
        self._set("lr", check_float("lr", self.lr, lo=0, lo_open=True))
        check_bool("flag", self.flag)
        self._nested("inner", Inner)
        self._set("sizes", tuple(self.sizes))


def test_round_trip_and_replace() -> None:
    cfg = Outer.from_dict({"dim": 16, "inner": {"kind": "b"}})
    assert isinstance(cfg.inner, Inner) and cfg.inner.kind == "b"
    d = cfg.to_dict()
    assert d == {"dim": 16, "lr": 1e-3, "flag": False, "inner": {"n_heads": 4, "kind": "b"}, "sizes": [1, 2]}
    assert Outer.from_dict(d) == cfg
    assert cfg.replace(dim=32).dim == 32 and cfg.replace(dim=32).inner == cfg.inner
    assert Outer.from_dict(cfg) is cfg
    assert Outer.from_dict(None) == Outer()


def test_numpy_scalars_are_normalised() -> None:
    cfg = Outer(dim=np.int64(12), lr=np.float32(0.5))
    assert type(cfg.dim) is int and cfg.dim == 12
    assert type(cfg.lr) is float and cfg.lr == 0.5


@pytest.mark.parametrize(
    ("options", "exc", "message"),
    [
        ({"dim": 0}, ConfigValueError, r"^model\.dim must be >= 1, got 0$"),
        ({"dim": 2.0}, ConfigTypeError, r"^model\.dim must be an int, got float 2\.0$"),
        ({"dim": True}, ConfigTypeError, r"^model\.dim must be an int"),
        ({"lr": 0.0}, ConfigValueError, r"^model\.lr must be a finite number > 0, got 0\.0$"),
        ({"lr": float("nan")}, ConfigValueError, r"^model\.lr must be a finite number > 0"),
        ({"lr": "1e-3"}, ConfigTypeError, r"^model\.lr must be a number, got str"),
        ({"flag": 1}, ConfigTypeError, r"^model\.flag must be a bool, got int 1$"),
        ({"inner": {"n_heads": 0}}, ConfigValueError, r"^model\.inner\.n_heads must be >= 1, got 0$"),
        ({"inner": {"kind": "c"}}, ConfigValueError, r"^model\.inner\.kind must be one of \['a', 'b'\], got 'c'$"),
        ({"inner": {"heads": 2}}, ConfigValueError, r"^model\.inner\.heads is not a config key; valid keys of Inner"),
        ({"inner": "x"}, ConfigTypeError, r"^model\.inner must be an Inner or a mapping, got str$"),
        ({"depht": 2, "zz": 1}, ConfigValueError, r"^model\.depht is not a config key \(nor are \['zz'\]\)"),
    ],
)
def test_errors_name_the_dotted_key(options: dict, exc: type, message: str) -> None:
    with pytest.raises(exc, match=message):
        Outer.from_dict(options, key="model")


def test_error_classes_are_builtin_subclasses() -> None:
    assert issubclass(ConfigValueError, ValueError) and issubclass(ConfigTypeError, TypeError)
    with pytest.raises(TypeError, match=r"^model must be a mapping, got list"):
        Outer.from_dict([], key="model")
    with pytest.raises(ValueError, match=r"^nope is not a config key"):
        Outer().replace(nope=1)
    with pytest.raises(ValueError, match=r"^dim must be >= 1"):  # direct construction: key relative to the config
        Outer(dim=-1)


def test_validators() -> None:
    assert check_int("n", None, allow_none=True) is None
    assert check_int("n", -3, minimum=None) == -3
    assert check_float("x", 3, lo=0, hi=3) == 3.0
    with pytest.raises(ValueError, match=r"x must be a finite number >= 0 and < 3, got 3\.0"):
        check_float("x", 3, lo=0, hi=3, hi_open=True)
    with pytest.raises(ValueError, match=r"must be one of \['a'\], got \['a'\]"):
        check_choice("k", ["a"], ("a",))
    with pytest.raises(ValueError, match="must be a non-empty string"):
        check_str("s", "")
    with pytest.raises(TypeError, match="must be a string, got int"):
        check_str("s", 1)
