"""A norm class's forward as one dataflow graph, with every equivalent spelling reduced to one.

``trace(fn, world)`` evaluates the syntax tree of a forward symbolically. The input (and the gate) are leaves, and so
are the parameters, eps and the instance's other attributes; every torch op the source applies is one ``Node``. A
value computed once and used twice stays one node, because that is where autograd sums two gradients, which decides
the backward's bits (T5's norm multiplies the *uncast* input, so its input gradient is summed in bf16). Locals,
helper methods (``self._norm``), keyword arguments and statement order disappear.

The rules, each an equivalence in values *and* gradients (the rounding happens at the same place in both spellings):

- ``x.float()``, ``x.to(dtype=torch.float32)``, ``x.type(torch.float32)`` are ``x.to(torch.float32)``;
  ``x.type_as(y)`` is ``x.to(y.dtype)``; a cast to the dtype a value already has is no op (returns its input);
- ``torch.rsqrt(v)`` / ``v.rsqrt()``, ``x.pow(2)`` / ``x ** 2`` / ``x.square()``, ``x.mean(-1, keepdim=True)`` /
  ``torch.mean(x, dim=-1, keepdim=True)``: one op each, keywords bound to positions;
- ``a * b`` is ``b * a`` and ``a + b`` is ``b + a`` (IEEE products and sums commute, and so does type promotion);
- ``self.variance_epsilon`` and ``self.eps`` are eps (the attribute is recorded and read live by the patched forward);
- ``w.to(torch.float32) * h`` with ``h`` in fp32 is ``w * h`` (the multiply promotes ``w`` exactly; true while the
  parameters are at most fp32: a patched forward runs the class's own code for fp64 parameters);
- an input used once, by an op whose other operand is fp32, is cast there: ``x * silu(g.float())`` is
  ``x.float() * silu(g.float())`` (one gradient path: the same rounding of its gradient);
- ``torch.pow(v, -0.5)`` computes ``torch.rsqrt(v)`` (ATen dispatches that exponent to rsqrt), but its backward
  rounds differently: recognised, with the note that the torch backend must run the class's own ops;
- the groups of a grouped norm, however they are spelt (``view(*shape[:-1], n // g, g)``, ``reshape(..., -1, g)``,
  ``view(batch, seq, groups, dim // groups)``, with ``view(...)`` or ``flatten(-2)`` back, a weight viewed as the
  groups), are one group size, recorded; the graph then reads as the ungrouped norm;
- ``silu``, ``sigmoid`` (``F.silu``, ``torch.sigmoid``, transformers' ``ACT2FN[self.activation]``) are one
  activation op, the name recorded;
- branches on the instance (``if self.with_scale``, ``self.group_size is not None``, ``gate is not None``) are taken
  as the instance says (the attributes read are recorded: the patched forward checks they still hold), and branches
  on the input's rank are taken for 3-D hidden states (recorded the same way); a branch on a tensor's dtype stays a
  ``select`` node (T5's half-precision weight rule).

What the reader does not follow (a loop, an in-place update, an unknown statement) raises ``Unsupported`` naming it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

_REDUCTIONS = ("mean", "sum", "var")
_COMMUTATIVE = ("mul", "add")


class Unsupported(Exception):
    """The forward does something this reader does not follow; the message names it."""


class NeedRank(Exception):
    """A decision depends on the input's rank."""


class Node:
    """A value of the forward: an op on its arguments, or a leaf (``op`` ``x``, ``gate``, ``param:<name>``,
    ``eps``, ``attr:<name>``, ``dtype:<name>``). ``tensor``: a tensor op, whose identity matters (a value used twice
    is one node); other nodes (shapes, dtypes, attributes) compare by structure. ``src``: the source it came from."""

    __slots__ = ("args", "op", "src", "tensor")

    def __init__(self, op: str, args: tuple = (), *, tensor: bool = True, src: str = "") -> None:
        self.op, self.args, self.tensor, self.src = op, args, tensor, src

    def __repr__(self) -> str:
        return f"Node({self.op}, {len(self.args)} args)"


@dataclass
class Trace:
    """A traced forward: ``root`` (its result) and what the rules recorded on the way."""

    root: Any = None
    eps_attrs: set[str] = field(default_factory=set)
    params: set[str] = field(default_factory=set)
    group: tuple[str, str] | None = None  # (attribute, "size" | "count")
    activations: set[str] = field(default_factory=set)
    guards: dict[str, Any] = field(default_factory=dict)  # instance attributes a branch or lookup read
    notes: set[str] = field(default_factory=set)  # "weight_upcast", "pow_rsqrt"
    rank: int | None = None


X = "x"
GATE = "gate"


def leaf(op: str, tensor: bool = True, src: str = "") -> Node:
    return Node(op, (), tensor=tensor, src=src or op)


def dtype_of(node: Any) -> str:
    """The dtype a value has, as far as the source fixes it: ``x``, ``gate``, ``param``, ``f32`` (also ``f16``,
    ``bf16``, ``f64``), ``f32?`` (fp32 while the parameters are at most fp32), ``mixed``; None for a scalar."""
    if not isinstance(node, Node) or not node.tensor:
        return None  # type: ignore[return-value]
    op = node.op
    if op in (X, GATE):
        return op
    if op.startswith("param:"):
        return "param"
    if op == "to":
        target = node.args[1]
        return target.op[len("dtype:") :] if isinstance(target, Node) else "mixed"
    if op in ("group", "ungroup", "wgroup", "act", "rsqrt", "pow", "sqrt", *_REDUCTIONS):
        return dtype_of(node.args[0])
    if op == "layer_norm":
        return dtype_of(node.args[0])
    if op == "select":
        a, b = dtype_of(node.args[1]), dtype_of(node.args[2])
        return a if a == b else "mixed"
    if op in ("mul", "add", "sub", "div", "neg"):
        out = None
        for arg in node.args:
            out = _promote(out, dtype_of(arg))
        return out if out is not None else "mixed"
    return "mixed"


def _promote(a: str | None, b: str | None) -> str | None:
    if a is None or a == b:
        return b
    if b is None:
        return a
    pair = {a, b}
    if "f32" in pair and pair <= {"f32", X, GATE}:
        return "f32"  # the HF classes run fp64 inputs through their own code (fp32_only), so x is at most fp32
    if pair <= {"f32", "f32?", X, GATE, "param"} and pair & {"f32", "f32?"}:
        return "f32?"
    return "mixed"


class Rules:
    """The rules applied as each op is built (see the module docstring), on the trace ``t`` being built."""

    t: Trace

    def activation(self, name: str, args: list[Any], src: str) -> Node:
        if len(args) != 1:
            raise Unsupported(f"`{src}` calls an activation with other than one argument")
        self.t.activations.add(name)
        return self.op("act", args[0], src=src)

    def torch_op(self, name: str, args: list[Any], kwargs: dict[str, Any], src: str) -> Any:
        if name in _REDUCTIONS:
            dim = args[1] if len(args) > 1 else kwargs.pop("dim", None)
            keep = args[2] if len(args) > 2 else kwargs.pop("keepdim", False)
            unbiased = kwargs.pop("unbiased", None)
            if kwargs or dim not in (-1, (-1,), self.t.rank - 1 if self.t.rank else -1) or keep is not True:
                raise Unsupported(f"`{src}` reduces other than the last dim with keepdim=True")
            extra = () if unbiased is None else (("unbiased", unbiased),)
            return self.op(name, args[0], *extra, src=src)
        if name == "square":
            return self.op("pow", args[0], 2, src=src)
        if name == "pow":
            exponent = args[1] if len(args) > 1 else kwargs.get("exponent")
            if exponent == -0.5:
                self.t.notes.add("pow_rsqrt")
                return self.op("rsqrt", args[0], src=src)
            return self.op("pow", args[0], exponent, src=src)
        if name == "layer_norm" and any(is_op(a, "star") for a in args):
            return Node("layer_norm", tuple(args), src=src)
        if name == "layer_norm":
            names = ("input", "normalized_shape", "weight", "bias", "eps")
            bound = [*args, *[None] * (len(names) - len(args))]
            for k, v in kwargs.items():
                if k not in names:
                    raise Unsupported(f"`{src}` passes layer_norm an argument it does not know")
                bound[names.index(k)] = v
            if bound[4] is None:
                bound[4] = 1e-5
            return Node("layer_norm", tuple(bound), src=src)
        if kwargs:
            raise Unsupported(f"`{src}` passes keyword arguments it does not follow")
        return self.op(name, *args, src=src)

    def op(self, name: str, *args: Any, src: str = "") -> Node:
        return Node(name, tuple(args), src=src)

    def cast(self, value: Any, target: Node, src: str) -> Any:
        d = dtype_of(value)
        want = target.op[len("dtype:") :]
        if d == want:
            return value  # .to() of a tensor that already has the dtype returns the tensor itself
        if d == "f32?" and want == "f32":
            self.t.notes.add("weight_upcast")
            return value
        if not isinstance(value, Node) or not value.tensor:
            raise Unsupported(f"`{src}` casts something that is no tensor")
        return Node("to", (value, target), src=src)

    def binop(self, name: str, a: Any, b: Any, src: str) -> Any:
        for v in (a, b):
            if not isinstance(v, (Node, int, float)) or v is None:
                raise Unsupported(f"`{src}` applies an operator to something that is no tensor or number")
        if not isinstance(a, Node) and not isinstance(b, Node):
            return {"mul": lambda: a * b, "add": lambda: a + b, "sub": lambda: a - b, "div": lambda: a / b,
                    "pow": lambda: a**b, "floordiv": lambda: a // b}[name]()  # fmt: skip
        if not _is_tensor(a) and not _is_tensor(b):
            return Node(name, (a, b), tensor=False, src=src)  # shape arithmetic
        if name == "pow":
            return self.torch_op("pow", [a, b], {}, src)
        if name == "mul":
            a, b = self.upcast_weight(a, b), self.upcast_weight(b, a)
        return Node(name, (a, b), src=src)

    def upcast_weight(self, w: Any, other: Any) -> Any:
        """``w.to(torch.float32) * h`` with ``h`` in fp32 is ``w * h`` while the parameters are at most fp32."""
        if (
            isinstance(w, Node)
            and w.op == "to"
            and w.args[1].op == "dtype:f32"
            and isinstance(w.args[0], Node)
            and w.args[0].op.startswith("param:")
            and dtype_of(other) == "f32"
        ):
            self.t.notes.add("weight_upcast")
            return w.args[0]
        return w

    def reshape(self, value: Node, items: tuple, src: str) -> Node:
        """A view or reshape: into groups, back out of them, or a weight viewed as the groups."""
        flat: list[Any] = []
        for item in items:
            if is_op(item, "star") and is_op(item.args[0], "lead"):
                flat.append(item.args[0])
            elif is_op(item, "star"):
                raise Unsupported(f"`{src}` reshapes with *args it does not follow")
            else:
                flat.append(item)
        flat = _fold_lead(flat, self.t.rank)
        lead = bool(flat) and is_op(flat[0], "lead")
        rest = flat[1:] if lead else flat
        group = _group_spec(rest)
        if group is not None:
            self.record_group(group, src)
            return Node("group" if lead else "wgroup", (value,), src=src)
        if lead and len(rest) == 1 and (is_op(rest[0], "dim", -1) or _is_groups_product(rest[0])):
            return self.ungroup(value, src)
        raise Unsupported(f"`{src}` reshapes into something other than groups of the last dim")

    def record_group(self, group: tuple[str, str], src: str) -> None:
        if self.t.group not in (None, group):
            raise Unsupported(f"`{src}` groups by {group}, after grouping by {self.t.group}")
        self.t.group = group

    def ungroup(self, value: Any, src: str) -> Node:
        if isinstance(value, Node) and value.op == "mul":  # a weight viewed as the groups: its multiply moves out
            a, b = value.args
            if isinstance(a, Node) and a.op == "wgroup":
                return Node("mul", (a.args[0], self.ungroup(b, src)), src=value.src)
            if isinstance(b, Node) and b.op == "wgroup":
                return Node("mul", (self.ungroup(a, src), b.args[0]), src=value.src)
        return Node("ungroup", (value,), src=src)


def shaped_like_input(v: Any) -> bool:
    """``v`` has the input's shape: the input or gate through elementwise ops and casts."""
    if not isinstance(v, Node) or not v.tensor:
        return False
    if v.op in (X, GATE):
        return True
    if v.op in ("to", "act", "neg", "rsqrt", "pow", "mul", "add", "sub", "div", "select"):
        return any(shaped_like_input(a) for a in v.args if _is_tensor(a))
    return False


def _is_tensor(v: Any) -> bool:
    return isinstance(v, Node) and v.tensor


def is_op(v: Any, op: str, *args: Any) -> bool:
    return isinstance(v, Node) and v.op == op and (not args or v.args == args)


def _fold_lead(items: list[Any], rank: int | None) -> list[Any]:
    """Explicit leading dims ``d0, ..., d(r-2)`` (a known rank) read as ``lead``, the shape less its last dim."""
    if rank is None or len(items) < rank - 1:
        return items
    head = items[: rank - 1]
    if all(is_op(d, "dim", i - rank) for i, d in enumerate(head)):
        return [Node("lead", tensor=False), *items[rank - 1 :]]
    return items


def attr_name(v: Any) -> str | None:
    return v.op[len("attr:") :] if isinstance(v, Node) and v.op.startswith("attr:") else None


def _group_spec(rest: list[Any]) -> tuple[str, str] | None:
    """``(-1 or n // g, g)`` -> ``(g's attribute, "size")``; ``(k, n // k)`` -> ``(k's attribute, "count")``."""
    if len(rest) != 2:
        return None
    a, b = rest
    size, count = attr_name(b), attr_name(a)
    if size is not None and (a == -1 or _per(a, size)):
        return size, "size"
    if count is not None and _per(b, count):
        return count, "count"
    return None


def _per(v: Any, attr: str) -> bool:
    """``v`` is ``n // self.<attr>`` (n: the last dim of the input)."""
    return is_op(v, "floordiv") and is_op(v.args[0], "dim", -1) and attr_name(v.args[1]) == attr


def _is_groups_product(v: Any) -> bool:
    """``(n // g) * g``: the grouped dims multiplied back."""
    if not is_op(v, "mul"):
        return False
    a, b = v.args
    return is_op(a, "floordiv") and is_op(a.args[0], "dim", -1) and attr_name(a.args[1]) == attr_name(b) is not None


# ---- finishing a trace -------------------------------------------------------------------------------------------
def finish(t: Trace) -> Trace:
    """Groups removed (the group size is recorded), a once-used input cast where its op promotes it."""
    counts = {"group": 0, "ungroup": 0, "wgroup": 0}
    memo: dict[int, Any] = {}

    def strip(v: Any) -> Any:
        if not isinstance(v, Node):
            return tuple(strip(x) for x in v) if isinstance(v, tuple) else v
        if id(v) in memo:
            return memo[id(v)]
        if v.op in counts:
            counts[v.op] += 1
            out = strip(v.args[0])
        else:
            out = Node(v.op, tuple(strip(a) for a in v.args), tensor=v.tensor, src=v.src) if v.args else v
        memo[id(v)] = out
        return out

    root = strip(t.root)
    if counts["group"] != counts["ungroup"] or counts["wgroup"]:
        raise Unsupported("its groups are not undone by one view back (or its weight is viewed otherwise)")
    if counts["group"] > 1:
        raise Unsupported("it groups the row more than once")
    if not counts["group"]:
        t.group = None
    t.root = _cast_single_use_input(root)
    return t


def _consumers(root: Any) -> dict[int, list[Node]]:
    users: dict[int, list[Node]] = {}
    seen: set[int] = set()

    def walk(v: Any) -> None:
        if isinstance(v, tuple):
            for x in v:
                walk(x)
        if not isinstance(v, Node) or id(v) in seen:
            return
        seen.add(id(v))
        for a in v.args:
            if isinstance(a, Node):
                users.setdefault(id(a), []).append(v)
            walk(a)

    walk(root)
    return users


def _cast_single_use_input(root: Any) -> Any:
    """``x * f`` with ``f`` in fp32 and no other use of ``x`` is ``x.to(torch.float32) * f``."""
    users = _consumers(root)
    for used_by in users.values():
        user = used_by[0]
        x = next((a for a in user.args if is_op(a, X)), None)
        if x is None or len(users.get(id(x), ())) != 1 or user.op not in ("mul", "add", "sub"):
            continue
        others = [a for a in user.args if a is not x]
        if len(others) == 1 and dtype_of(others[0]) == "f32":
            cast = Node("to", (x, Node("dtype:f32", tensor=False)), src=f"{x.src} (promoted by the op)")
            user.args = tuple(cast if a is x else a for a in user.args)
            return root
    return root


# ---- canonical form -------------------------------------------------------------------------------------------
def canonical(root: Any) -> str:
    """The graph as one string: tensor ops numbered on first visit (``#k`` on a revisit: a shared value), commutative
    operands ordered by their shape-blind form, so two spellings of one graph give one string."""
    trees: dict[int, str] = {}
    ids: dict[int, int] = {}

    def tree(v: Any) -> str:
        if not isinstance(v, Node):
            return "(" + ",".join(tree(x) for x in v) + ")" if isinstance(v, tuple) else repr(v)
        if id(v) not in trees:
            parts = sorted(tree(a) for a in v.args) if v.op in _COMMUTATIVE else [tree(a) for a in v.args]
            trees[id(v)] = f"{v.op}({','.join(parts)})" if v.args else v.op
        return trees[id(v)]

    def ser(v: Any) -> str:
        if not isinstance(v, Node):
            return "(" + ",".join(ser(x) for x in v) + ")" if isinstance(v, tuple) else repr(v)
        if not v.args:
            return v.op
        if v.tensor and id(v) in ids:
            return f"#{ids[id(v)]}"
        if v.tensor:
            ids[id(v)] = len(ids)
        args = sorted(v.args, key=tree) if v.op in _COMMUTATIVE else v.args
        return f"{v.op}({','.join(ser(a) for a in args)})"

    return ser(root)


def ordered_args(v: Node) -> tuple:
    """``v``'s arguments in canonical order (commutative operands sorted), for comparing two graphs."""
    if v.op not in _COMMUTATIVE:
        return v.args
    memo: dict[int, str] = {}

    def tree(u: Any) -> str:
        if not isinstance(u, Node):
            return repr(u)
        if id(u) not in memo:
            parts = sorted(tree(a) for a in u.args) if u.op in _COMMUTATIVE else [tree(a) for a in u.args]
            memo[id(u)] = f"{u.op}({','.join(parts)})"
        return memo[id(u)]

    return tuple(sorted(v.args, key=tree))
