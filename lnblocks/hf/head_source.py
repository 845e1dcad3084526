"""What an HF causal LM's ``forward`` does between its LM head and its loss, read from its verified source.

``read_head(cls, head)`` parses ``cls.forward`` (checked against the code the class runs: its source compiled again
must give the same bytecode) and accepts it only in the form transformers writes its causal LMs in (5.24: most
``*ForCausalLM`` classes and ``GPT2LMHeadModel``)::

    logits = self.<head>(hidden_states)       # the one use of the head, maybe with .float() or a scale
    <the logit map: nothing, a scale or divisor, soft-capping (HeadForm's steps)>
    loss = None
    if labels is not None:
        loss = self.loss_function(logits, labels, <vocab size>, **kwargs)

with ``labels``, ``kwargs`` and ``logits`` not changed anywhere else (so the loss function gets the forward's own
``labels`` and keyword arguments: ``num_items_in_batch``, ``ignore_index``, ``shift_labels``). What it finds is a
``HeadForm``: the logit map's steps, or why the forward is refused.
"""

from __future__ import annotations
import __future__

import ast
import functools
import inspect
import types
from collections.abc import Callable
from dataclasses import dataclass

from lnblocks.hf.layer_source import checked_definition, module_tree, same_code, wrapper_chain

Step = tuple[str, str]  # (kind, attribute path on the model): ("mul", "logit_scale"), ("float", "")
_KNOWN = (
    "`.float()`, `.contiguous()`, `* self.<attr>`, `/ self.<attr>` and "
    "`if self.<cap> is not None: logits = tanh(logits / cap) * cap` in transformers' three statements"
)


@dataclass(frozen=True)
class HeadForm:
    """``steps``: the logit map, in order (empty: none); ``reason``: why the forward is refused ('' if it is not).

    A step is ``("float", "")`` (``.float()``), ``("mul", path)`` / ``("div", path)`` (times / over the value of
    ``self.<path>``: Cohere's ``logit_scale``, Granite's ``config.logits_scaling``, Falcon-H1's
    ``model.lm_head_multiplier``) or ``("softcap", path)`` (``cap * tanh(logits / cap)`` with ``cap =
    self.<path>``, skipped while it is None: Gemma 2's ``config.final_logit_softcapping``, arXiv 2408.00118).
    """

    steps: tuple[Step, ...] = ()
    reason: str = ""

    def describe(self) -> str:
        return ", ".join(f"{k}({p})" if p else k for k, p in self.steps) or "none"


def _path(node: ast.AST) -> str | None:
    """``self.a.b`` -> ``"a.b"``, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return ".".join(reversed(parts)) if isinstance(node, ast.Name) and node.id == "self" and parts else None


def _expr_steps(expr: ast.AST, base: Callable[[ast.AST], bool]) -> list[Step] | None:
    """The steps of ``expr`` applied to what ``base`` accepts (the head call, or the logits variable), or None."""
    if base(expr):
        return []
    if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) and not expr.args and not expr.keywords:
        inner = _expr_steps(expr.func.value, base)
        if inner is not None and expr.func.attr in ("float", "contiguous"):
            return inner + ([("float", "")] if expr.func.attr == "float" else [])
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, (ast.Mult, ast.Div)) and _path(expr.right):
        inner = _expr_steps(expr.left, base)
        if inner is not None:
            return [*inner, ("mul" if isinstance(expr.op, ast.Mult) else "div", _path(expr.right))]
    return None


def _softcap_step(stmt: ast.stmt, logits: str) -> Step | None:
    """``if self.P is not None: L = L / self.P; L = torch.tanh(L); L = L * self.P`` -> ``("softcap", P)``."""
    if not (isinstance(stmt, ast.If) and not stmt.orelse and len(stmt.body) == 3):
        return None
    test = stmt.test
    cap = _path(test.left) if isinstance(test, ast.Compare) else None
    if cap is None or ast.unparse(test) != f"self.{cap} is not None":
        return None
    x, c = logits, f"self.{cap}"
    want = (f"{x} = {x} / {c}", f"{x} = torch.tanh({x})", f"{x} = {x} * {c}")
    return ("softcap", cap) if tuple(ast.unparse(s) for s in stmt.body) == want else None


def _map_steps(stmts: list[ast.stmt], logits: str) -> list[Step] | None:
    """The steps of the statements between the head and the loss, or None if one is not a known step."""
    steps: list[Step] = []
    for stmt in stmts:
        cap = _softcap_step(stmt, logits)
        if cap is not None:
            steps.append(cap)
            continue
        if not (isinstance(stmt, ast.Assign) and ast.unparse(stmt.targets[0]) == logits and len(stmt.targets) == 1):
            return None
        more = _expr_steps(stmt.value, lambda e: isinstance(e, ast.Name) and e.id == logits)
        if more is None:
            return None
        steps += more
    return steps


def _is_self_attr(node: ast.AST, attr: str) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and node.attr == attr
        and isinstance(node.value, ast.Name)
        and (node.value.id == "self")
    )


def _stores(tree: ast.AST, name: str) -> int:
    """How often ``name`` is assigned (or deleted) in ``tree``, its mutating method calls and item stores included."""
    count = 0
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id == name and not isinstance(node.ctx, ast.Load):
            count += 1
        elif isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id == name:
            count += not isinstance(node.ctx, ast.Load)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and (isinstance(node.func.value, ast.Name) and node.func.value.id == name)
        ):
            count += node.func.attr in ("pop", "popitem", "update", "setdefault", "clear", "__setitem__")
    return count


def _head_statement(fn: ast.FunctionDef, head: str) -> tuple[int, str, list[Step]] | str:
    """``(index in fn.body, logits variable, steps)`` of ``logits = self.<head>(x)<steps>``, or why there is none."""
    uses = [n for n in ast.walk(fn) if _is_self_attr(n, head)]
    if len(uses) != 1:
        return f"its forward uses self.{head} {len(uses)} times (expected once: logits = self.{head}(hidden_states))"

    def is_head_call(e: ast.AST) -> bool:
        return isinstance(e, ast.Call) and _is_self_attr(e.func, head) and len(e.args) == 1 and not e.keywords

    for i, stmt in enumerate(fn.body):
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
            steps = _expr_steps(stmt.value, is_head_call)
            if steps is not None:
                return i, stmt.targets[0].id, steps
    return (
        f"its forward does not compute `logits = self.{head}(hidden_states)` (with known steps: {_KNOWN}) as a "
        "statement of its own"
    )


def _loss_call(stmt: ast.stmt, logits: str, labels: str, kwargs: str | None) -> str:
    """'' if ``stmt`` is ``if labels is not None: loss = self.loss_function(logits, labels, ..., **kwargs)``."""
    test = getattr(stmt, "test", None)
    if not (
        isinstance(stmt, ast.If)
        and isinstance(test, ast.Compare)
        and ast.unparse(test) == f"{labels} is not None"
        and isinstance(stmt.body[0], ast.Assign)
    ):
        return f"its forward computes no loss from `{labels}` right after the head"
    call = stmt.body[0].value
    if not (isinstance(call, ast.Call) and _is_self_attr(call.func, "loss_function")):
        return f"its loss is not computed by self.loss_function (it runs `{ast.unparse(stmt.body[0])}`)"
    given = {k.arg: ast.unparse(k.value) for k in call.keywords if k.arg is not None}
    given.update(zip(("logits", "labels", "vocab_size"), (ast.unparse(a) for a in call.args)))
    star = [ast.unparse(k.value) for k in call.keywords if k.arg is None]
    only = len(call.args) <= 3 and set(given) <= {"logits", "labels", "vocab_size"}
    same = given.get("logits") == logits and given.get("labels") == labels and star == ([kwargs] if kwargs else [])
    if not (only and same):
        return f"its loss_function call `{ast.unparse(call)}` does not pass the head's logits, labels and **kwargs"
    return ""


def _module_imports(filename: str) -> list[ast.stmt]:
    """The import statements at the top level of a module (inside ``if``/``try`` too), to compile, not to run."""
    tree = module_tree(filename)
    found: list[ast.stmt] = []
    todo = list(tree.body) if tree is not None else []
    while todo:
        stmt = todo.pop(0)
        if isinstance(stmt, (ast.Import, ast.ImportFrom)):
            found.append(stmt)
        elif isinstance(stmt, (ast.If, ast.Try)):
            todo += [*stmt.body, *stmt.orelse, *getattr(stmt, "finalbody", []), *getattr(stmt, "handlers", [])]
        elif isinstance(stmt, ast.ExceptHandler):
            todo += stmt.body
    return [ast.ImportFrom(**vars(s)) if isinstance(s, ast.ImportFrom) else s for s in found if _no_future(s)]


def _no_future(stmt: ast.stmt) -> bool:
    return not (isinstance(stmt, ast.ImportFrom) and stmt.module == "__future__")


def _verified(raw: types.FunctionType) -> ast.FunctionDef | str:
    """The definition of ``raw``, checked: its source compiled again gives ``raw``'s bytecode."""
    if raw.__code__.co_freevars:
        return f"its forward is a closure (over {', '.join(raw.__code__.co_freevars)})"
    fn = checked_definition(raw)
    if isinstance(fn, str):
        return fn
    # compiled next to the module's imports: CPython 3.11 compiles `module.f()` differently for an imported name
    bare = ast.FunctionDef(**{**vars(fn), "decorator_list": []})
    tree = ast.fix_missing_locations(ast.Module([*_module_imports(raw.__code__.co_filename), bare], []))
    flags = raw.__code__.co_flags & __future__.annotations.compiler_flag  # as the module was compiled
    try:
        code = compile(tree, raw.__code__.co_filename, "exec", flags=flags, dont_inherit=True)
    except (SyntaxError, ValueError) as err:
        return f"its forward cannot be compiled again ({err})"
    again = next(c for c in code.co_consts if isinstance(c, types.CodeType) and c.co_name == raw.__name__)
    return fn if same_code(again, raw.__code__) else "its source does not match the code it runs"


@functools.cache
def read_head(cls: type, head: str) -> HeadForm:
    """How ``cls.forward`` turns ``self.<head>``'s output into the loss (see the module docstring)."""
    raw = wrapper_chain(cls.forward)[-1]
    if not inspect.isfunction(raw):
        return HeadForm(reason="its forward is not Python code")
    fn = _verified(raw)
    if isinstance(fn, str):
        return HeadForm(reason=fn)
    names = [a.arg for a in fn.args.args + fn.args.kwonlyargs]
    kwargs = fn.args.kwarg.arg if fn.args.kwarg else None
    if "labels" not in names:
        return HeadForm(reason="its forward takes no labels argument")
    found = _head_statement(fn, head)
    if isinstance(found, str):
        return HeadForm(reason=found)
    at, logits, steps = found
    end = next((j for j in range(at + 1, len(fn.body)) if ast.unparse(fn.body[j]) == "loss = None"), None)
    if end is None or end + 1 >= len(fn.body):
        return HeadForm(reason="its forward has no `loss = None` followed by the loss after the head")
    more = _map_steps(fn.body[at + 1 : end], logits)
    if more is None:
        code = "; ".join(ast.unparse(s).replace("\n", " ") for s in fn.body[at + 1 : end])
        return HeadForm(reason=f"its logits go through `{code}` before the loss, which the chunked loss does not "
                        f"reproduce (it knows {_KNOWN})")  # fmt: skip
    steps += more
    if any(k == "softcap" for k, _ in steps) and raw.__globals__.get("torch") is not _torch():
        return HeadForm(reason="its soft-capping calls a `torch` that is not PyTorch")
    reason = _loss_call(fn.body[end + 1], logits, "labels", kwargs)
    if reason:
        return HeadForm(reason=reason)
    changed = [n for n in ("labels", *([kwargs] if kwargs else [])) if _stores(fn, n)]
    if _stores(fn, logits) != sum(_stores(s, logits) for s in fn.body[at:end]):  # only the head and the map
        changed.append(logits)
    if changed:
        return HeadForm(reason=f"its forward changes {', '.join(changed)} besides the head and the loss")
    return HeadForm(steps=tuple(steps))


def _torch() -> types.ModuleType:
    import torch

    return torch
