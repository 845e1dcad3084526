"""Reading a norm class's forward into the graph of ``lnblocks.hf.norm_graph``: statements, branches, helper
methods and expressions evaluated symbolically, each op built through the graph's rules.

``trace(defs, world, with_gate)`` takes the syntax trees of ``forward`` and the methods it calls on ``self``, and a
``World`` that answers what the code reads of its instance and module (a parameter, an attribute's value, a global
name); it returns the ``Trace``. The attributes a branch or lookup read are recorded in ``Trace.guards``.
"""

from __future__ import annotations

import ast
import types
from typing import Any, Protocol

from lnblocks.hf.norm_graph import (
    GATE,
    NeedRank,
    Node,
    Rules,
    Trace,
    Unsupported,
    X,
    attr_name,
    dtype_of,
    finish,
    is_op,
    leaf,
    shaped_like_input,
)
from lnblocks.hf.norm_names import (
    BINOPS,
    CALLABLES,
    DTYPES,
    EPS_ATTRS,
    SELF,
    Activation,
    Bound,
    Global,
    Method,
    Opaque,
    SelfRef,
    activation_name,
    hashable,
)


class World(Protocol):
    """What a trace may ask of the class's instance and module: the kind of an attribute (``"param"``, ``"none"``
    for a missing or None parameter/attribute, ``"value"``), its value, and a global name."""

    def kind(self, name: str) -> str: ...

    def value(self, name: str) -> Any: ...

    def resolve(self, name: str) -> Any: ...


class _Scope:
    """Local names of one function being traced."""

    def __init__(self, names: dict[str, Any]) -> None:
        self.names = dict(names)
        self.returned: Any = _NOTHING


_NOTHING = object()


class Tracer(Rules):
    """Evaluates one forward (and the helpers it calls on ``self``) into a ``Trace``."""

    def __init__(self, defs: dict[str, ast.FunctionDef], world: World, rank: int | None) -> None:
        self.defs, self.world = defs, world
        self.t = Trace(rank=rank)
        self.depth = 0

    # ---- statements ---------------------------------------------------------------------------------------------
    def call_def(self, name: str, args: list[Any]) -> Any:
        fn = self.defs.get(name)
        if fn is None:
            raise Unsupported(f"it calls self.{name}(), which is no Python method of the class")
        self.depth += 1
        if self.depth > 8:
            raise Unsupported("its helper methods call each other too deep")
        params = [a.arg for a in fn.args.args][1:]  # after self
        if fn.args.vararg or fn.args.kwarg or fn.args.kwonlyargs or len(args) > len(params):
            raise Unsupported(f"self.{name}() takes *args, **kwargs or keyword-only arguments")
        defaults = fn.args.defaults
        bound = {"self": SELF, **dict(zip(params, args))}
        for i, p in enumerate(params[len(args) :], start=len(args)):
            j = i - (len(params) - len(defaults))
            if j < 0:
                raise Unsupported(f"self.{name}() is called without its argument {p!r}")
            bound[p] = self.expr(defaults[j], _Scope({}))
        scope = _Scope(bound)
        self.block(fn.body, scope)
        self.depth -= 1
        if scope.returned is _NOTHING:
            raise Unsupported(f"self.{name}() returns nothing")
        return scope.returned

    def block(self, body: list[ast.stmt], scope: _Scope) -> None:
        for stmt in body:
            if scope.returned is not _NOTHING:
                return
            self.stmt(stmt, scope)

    def stmt(self, s: ast.stmt, scope: _Scope) -> None:
        if isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant):
            return  # a docstring
        if isinstance(s, ast.Return):
            scope.returned = self.expr(s.value, scope) if s.value is not None else None
        elif isinstance(s, (ast.Assign, ast.AnnAssign)):
            targets = s.targets if isinstance(s, ast.Assign) else [s.target]
            if s.value is None or len(targets) != 1:
                raise Unsupported(f"`{ast.unparse(s)}` is no single assignment")
            self.assign(targets[0], self.expr(s.value, scope), scope, s)
        elif isinstance(s, ast.If):
            self.if_stmt(s, scope)
        elif isinstance(s, ast.With) and len(s.items) == 1 and len(s.body) == 1 and isinstance(s.body[0], ast.Return):
            ctx = self.expr(s.items[0].context_expr, scope)
            value = self.expr(s.body[0].value, scope)
            scope.returned = Node("with", (ctx, value), src=ast.unparse(s).split("\n")[0])
        elif isinstance(s, ast.Pass):
            return
        else:
            raise Unsupported(f"`{ast.unparse(s).splitlines()[0]}` ({type(s).__name__}) is no statement it follows")

    def assign(self, target: ast.expr, value: Any, scope: _Scope, s: ast.stmt) -> None:
        if isinstance(target, ast.Name):
            scope.names[target.id] = value
            return
        if not isinstance(target, (ast.Tuple, ast.List)):
            raise Unsupported(f"`{ast.unparse(s)}` assigns to something other than local names")
        items = self.unpack(value, len(target.elts), [isinstance(e, ast.Starred) for e in target.elts], s)
        for elt, item in zip(target.elts, items):
            name = elt.value if isinstance(elt, ast.Starred) else elt
            if not isinstance(name, ast.Name):
                raise Unsupported(f"`{ast.unparse(s)}` unpacks into something other than local names")
            scope.names[name.id] = item

    def unpack(self, value: Any, n: int, starred: list[bool], s: ast.stmt) -> list[Any]:
        if isinstance(value, tuple):
            items = list(value)
        elif isinstance(value, Node) and value.op == "shape":
            if starred == [True, False] and self.t.rank is None:  # *lead, last = x.shape
                return [Node("lead", tensor=False), Node("dim", (-1,), tensor=False)]
            if self.t.rank is None:
                raise NeedRank
            items = [Node("dim", (i - self.t.rank,), tensor=False) for i in range(self.t.rank)]
        else:
            raise Unsupported(f"`{ast.unparse(s)}` unpacks a value that is no shape or tuple")
        if any(starred):
            k = starred.index(True)
            tail = n - k - 1
            return [*items[:k], tuple(items[k : len(items) - tail]), *items[len(items) - tail :]]
        if len(items) != n:
            if isinstance(value, Node) and self.t.rank is not None:
                raise NeedRank  # the shape of an input of another rank: try that one
            raise Unsupported(f"`{ast.unparse(s)}` unpacks {len(items)} values into {n} names")
        return items

    def if_stmt(self, s: ast.If, scope: _Scope) -> None:
        if len(s.body) == 1 and isinstance(s.body[0], ast.Raise) and not s.orelse:
            return  # a guard that raises on bad input: no part of the math
        test = self.test(s.test, scope)
        if isinstance(test, bool):
            self.block(s.body if test else s.orelse, scope)
            return
        then, other = _Scope(scope.names), _Scope(scope.names)
        self.block(s.body, then)
        self.block(s.orelse, other)
        if (then.returned is _NOTHING) != (other.returned is _NOTHING):
            raise Unsupported(f"`if {ast.unparse(s.test)}:` returns on one branch only")
        if then.returned is not _NOTHING:
            scope.returned = self.select(test, then.returned, other.returned)
            return
        for name in set(then.names) | set(other.names):
            a, b = then.names.get(name, _NOTHING), other.names.get(name, _NOTHING)
            if a is not b:
                if a is _NOTHING or b is _NOTHING:
                    raise Unsupported(f"`{name}` is set on one branch of `if {ast.unparse(s.test)}:` only")
                scope.names[name] = self.select(test, a, b)

    def select(self, test: Node, a: Any, b: Any) -> Node:
        return Node("select", (test, a, b), src=test.src)

    # ---- conditions ----------------------------------------------------------------------------------------------
    def test(self, e: ast.expr, scope: _Scope) -> bool | Node:
        """A branch condition: decided (True/False) where the instance or the rank fixes it, else a node."""
        if isinstance(e, ast.UnaryOp) and isinstance(e.op, ast.Not):
            inner = self.test(e.operand, scope)
            return (not inner) if isinstance(inner, bool) else Node("not", (inner,), tensor=False, src=ast.unparse(e))
        if isinstance(e, ast.BoolOp):
            parts = [self.test(v, scope) for v in e.values]
            if all(isinstance(p, bool) for p in parts):
                return all(parts) if isinstance(e.op, ast.And) else any(parts)
            raise Unsupported(f"`{ast.unparse(e)}` mixes decided and open conditions")
        value = self.value_of(self.expr(e, scope))
        if isinstance(value, (bool, int, str, type(None))) and not isinstance(value, Node):
            return bool(value)
        if isinstance(value, Node) and value.op in ("in", "cmp"):
            return value
        raise Unsupported(f"the condition `{ast.unparse(e)}` depends on something it cannot decide")

    def compare(self, e: ast.Compare, scope: _Scope) -> Any:
        if len(e.ops) != 1:
            raise Unsupported(f"`{ast.unparse(e)}` chains comparisons")
        left, op = self.value_of(self.expr(e.left, scope)), e.ops[0]
        right = self.value_of(self.expr(e.comparators[0], scope))
        if isinstance(op, (ast.Is, ast.IsNot)) and right is None:
            present = left is not None
            return present if isinstance(op, ast.IsNot) else not present
        if isinstance(left, Node) or isinstance(right, Node):
            if isinstance(op, ast.In) and isinstance(left, Node) and isinstance(right, tuple):
                return Node("in", (left, right), tensor=False, src=ast.unparse(e))
            raise Unsupported(f"the comparison `{ast.unparse(e)}` depends on the data")
        table = {ast.Eq: left == right, ast.NotEq: left != right, ast.Lt: None, ast.Gt: None}
        if type(op) not in table or table[type(op)] is None:
            raise Unsupported(f"the comparison `{ast.unparse(e)}` is not one it decides")
        return table[type(op)]

    # ---- expressions ---------------------------------------------------------------------------------------------
    def expr(self, e: ast.expr, scope: _Scope) -> Any:
        src = ast.unparse(e)
        if isinstance(e, ast.Constant):
            return e.value
        if isinstance(e, ast.Name):
            if e.id in scope.names:
                return scope.names[e.id]
            return Global(self.world.resolve(e.id), e.id)
        if isinstance(e, (ast.Tuple, ast.List)):
            return tuple(self.expr(x, scope) for x in e.elts)
        if isinstance(e, ast.Attribute):
            return self.attribute(self.expr(e.value, scope), e.attr, src)
        if isinstance(e, ast.Call):
            return self.call(e, scope, src)
        if isinstance(e, ast.BinOp):
            name = BINOPS.get(type(e.op))
            if name is None:
                raise Unsupported(f"`{src}` uses an operator it does not follow")
            return self.binop(name, self.expr(e.left, scope), self.expr(e.right, scope), src)
        if isinstance(e, ast.UnaryOp) and isinstance(e.op, ast.USub):
            value = self.expr(e.operand, scope)
            return -value if isinstance(value, (int, float)) else self.op("neg", value, src=src)
        if isinstance(e, ast.Compare):
            return self.compare(e, scope)
        if isinstance(e, ast.IfExp):
            test = self.test(e.test, scope)
            if isinstance(test, bool):
                return self.expr(e.body if test else e.orelse, scope)
            return self.select(test, self.expr(e.body, scope), self.expr(e.orelse, scope))
        if isinstance(e, ast.Subscript):
            return self.subscript(self.expr(e.value, scope), e.slice, scope, src)
        if isinstance(e, ast.Starred):
            return Node("star", (self.expr(e.value, scope),), tensor=False, src=src)
        raise Unsupported(f"`{src}` ({type(e).__name__}) is no expression it follows")

    def attribute(self, base: Any, name: str, src: str) -> Any:
        if isinstance(base, SelfRef):
            return self.self_attribute(name, src)
        if isinstance(base, Global):
            return Global(getattr(base.obj, name, None), f"{base.src}.{name}")
        if isinstance(base, Node) and base.tensor:
            if name == "dtype":
                return self.dtype_node(base)
            if name == "shape":
                if not shaped_like_input(base):
                    raise Unsupported(f"`{src}` reads the shape of a value not shaped like the input")
                return Node("shape", tensor=False)
            if name == "ndim":
                return self.rank()
            if name == "device":
                return Node("device", tensor=False, src=src)
            return Method(base, name)
        if isinstance(base, Node) and base.op == "device" and name == "type":
            return Node("device_type", tensor=False, src=src)
        raise Unsupported(f"`{src}` reads an attribute it does not follow")

    def self_attribute(self, name: str, src: str) -> Any:
        if name in EPS_ATTRS:
            self.t.eps_attrs.add(name)
            return leaf("eps", tensor=False, src=src)
        if name in self.defs:
            return Bound(name)
        kind = self.world.kind(name)
        if kind == "value":
            return Node(f"attr:{name}", tensor=False, src=src)  # its value is read (and guarded) where needed
        self.t.guards[name] = kind
        if kind == "param":
            self.t.params.add(name)
            return leaf(f"param:{name}", src=src)
        return None

    def value_of(self, v: Any) -> Any:
        """The instance's value of an attribute node (recorded as a guard), anything else as it is."""
        attr = attr_name(v)
        if attr is None:
            return v
        value = self.world.value(attr)
        self.t.guards[attr] = value
        return value

    def dtype_node(self, t: Node) -> Node:
        d = dtype_of(t)
        if d in ("x", "gate"):
            return Node("dtype:x", tensor=False)  # the gate has the input's dtype in every gated class
        if d == "param":
            return Node("dtype:param", tensor=False)
        if d in DTYPES.values():
            return Node(f"dtype:{d}", tensor=False)
        raise Unsupported("it reads the dtype of a value whose dtype the source does not fix")

    def rank(self) -> int:
        if self.t.rank is None:
            raise NeedRank
        return self.t.rank

    def subscript(self, base: Any, index: ast.expr, scope: _Scope, src: str) -> Any:
        if isinstance(base, Global) and isinstance(base.obj, dict) and base.src == "ACT2FN":
            key = self.value_of(self.expr(index, scope))
            try:
                act = activation_name(base.obj[key]) if isinstance(key, str) else None
            except (KeyError, TypeError):
                act = None
            if act is None:
                raise Unsupported(f"`{src}` is the activation {key!r}, not silu or sigmoid")
            return Activation(act)
        if isinstance(base, Node) and base.op == "shape":
            if isinstance(index, ast.Slice) and index.lower is None and index.step is None:
                stop = self.expr(index.upper, scope) if index.upper is not None else None
                if stop == -1:
                    return Node("lead", tensor=False)
            i = self.expr(index, scope)
            if isinstance(i, int):
                rank = self.t.rank
                return Node("dim", (i - rank if rank is not None and i >= 0 else i,), tensor=False)
        if isinstance(base, tuple):
            i = self.expr(index, scope)
            if isinstance(i, int):
                return base[i]
        raise Unsupported(f"`{src}` indexes something it does not follow")

    def call(self, e: ast.Call, scope: _Scope, src: str) -> Any:
        func = self.expr(e.func, scope)
        args: list[Any] = []
        for a in e.args:
            value = self.expr(a, scope)
            if is_op(value, "star") and isinstance(value.args[0], tuple):
                args.extend(value.args[0])  # *tuple: its items
            else:
                args.append(value)
        kwargs = {k.arg: self.expr(k.value, scope) for k in e.keywords if k.arg is not None}
        if len(kwargs) != len(e.keywords):
            raise Unsupported(f"`{src}` passes **kwargs")
        if isinstance(func, Bound):
            if kwargs:
                raise Unsupported(f"`{src}` calls a helper with keyword arguments")
            return self.call_def(func.name, args)
        if isinstance(func, Activation):
            return self.activation(func.name, args, src)
        if isinstance(func, Method):
            return self.method(func.obj, func.name, args, kwargs, src)
        if isinstance(func, Global):
            return self.function(func, args, kwargs, src)
        raise Unsupported(f"`{src}` calls something it does not follow")

    def function(self, fn: Global, args: list[Any], kwargs: dict[str, Any], src: str) -> Any:
        obj = fn.obj
        if obj is len and len(args) == 1 and isinstance(args[0], Node) and args[0].op == "shape":
            return self.rank()
        if obj is int and len(args) == 1:
            return args[0] if isinstance(args[0], Node) else int(args[0])
        name = CALLABLES.get(obj) if hashable(obj) else None
        if name is None:
            if isinstance(obj, (types.FunctionType, Opaque)):
                qual = obj.name if isinstance(obj, Opaque) else f"{obj.__module__}.{obj.__qualname__}"
                items = tuple(args) + tuple(sorted(kwargs.items()))
                return Node(f"fn:{qual}", items, tensor=True, src=src)
            raise Unsupported(f"`{src}` calls {fn.src}, a function it does not know")
        if name.startswith("act:"):
            return self.activation(name[4:], args, src)
        return self.torch_op(name, args, kwargs, src)

    def method(self, obj: Node, name: str, args: list[Any], kwargs: dict[str, Any], src: str) -> Any:
        if name == "float" and not args and not kwargs:
            return self.cast(obj, Node("dtype:f32", tensor=False), src)
        if name in ("half", "bfloat16", "double") and not args and not kwargs:
            short = {"half": "f16", "bfloat16": "bf16", "double": "f64"}[name]
            return self.cast(obj, Node(f"dtype:{short}", tensor=False), src)
        if name in ("to", "type") and len(args) + len(kwargs) == 1 and set(kwargs) <= {"dtype"}:
            target = args[0] if args else kwargs["dtype"]
            return self.cast(obj, self.as_dtype(target, src), src)
        if name == "type_as" and len(args) == 1 and not kwargs:
            return self.cast(obj, self.dtype_node(args[0]), src)
        if name == "dim" and not args and not kwargs:
            return self.rank()
        if name in ("view", "reshape"):
            if kwargs:
                raise Unsupported(f"`{src}` reshapes with keyword arguments")
            items = args[0] if len(args) == 1 and isinstance(args[0], tuple) else tuple(args)
            return self.reshape(obj, items, src)
        if name == "flatten":
            start = args[0] if args else kwargs.get("start_dim", 0)
            end = args[1] if len(args) > 1 else kwargs.get("end_dim", -1)
            if (start, end) == (-2, -1):
                return self.ungroup(obj, src)
            raise Unsupported(f"`{src}` flattens other than the last two dims")
        if name == "squeeze":
            raise NeedRank if self.t.rank is None else Unsupported(f"`{src}` squeezes a dim")
        if name in ("rsqrt", "sigmoid", "pow", "square", "mean", "sum", "var", "sqrt"):
            if name == "sigmoid":
                return self.activation("sigmoid", [obj], src)
            return self.torch_op(name, [obj, *args], kwargs, src)
        raise Unsupported(f"`{src}` calls the tensor method .{name}(), which it does not follow")

    def as_dtype(self, value: Any, src: str) -> Node:
        if isinstance(value, Global) and value.obj in DTYPES:
            return Node(f"dtype:{DTYPES[value.obj]}", tensor=False)
        if isinstance(value, Node) and value.op.startswith("dtype:"):
            return value
        raise Unsupported(f"`{src}` casts to something that is no dtype")


def trace(defs: dict[str, ast.FunctionDef], world: World, with_gate: bool) -> Trace:
    """Trace ``defs["forward"]`` called as ``forward(x)`` or, with ``with_gate``, ``forward(x, gate)``; a decision on
    the input's rank is taken for 3-D hidden states, or 4-D per-head ones where the code unpacks four dims
    (``Trace.rank``: the patched forward runs the class for inputs of other ranks)."""
    for rank in (None, 3, 4):
        tracer = Tracer(defs, world, rank)
        forward = defs["forward"]
        n_args = len(forward.args.args) - 1
        args: list[Any] = [leaf(X, src=forward.args.args[1].arg if n_args else "x")]
        if n_args >= 2:
            args.append(leaf(GATE, src=forward.args.args[2].arg) if with_gate else None)
        try:
            tracer.t.root = tracer.call_def("forward", args)
        except NeedRank:
            continue
        return finish(tracer.t)
    raise Unsupported("it depends on the input's rank in a way it does not follow")
