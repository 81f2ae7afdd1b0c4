"""Evaluating a parsed template (:mod:`.parse`) against data, as Go's ``text/template`` executes one. Pure.

Theory of operation: :func:`compile_template` parses the text and checks that every function it names exists
(Go refuses an unknown function when parsing, even in a branch never taken); :func:`execute` walks the tree with
a :class:`_State` holding dot, the variables in scope and the output, and returns the text or raises
:class:`TemplateError` naming the position of the command that failed.

Rules:

1. A command whose first operand is a function calls it with the other operands, and, in a pipeline, the
   previous command's value as the last argument. Any other first operand is a value and takes no arguments.
2. ``and`` and ``or`` stop at the first operand that decides them and return that operand, as Go's do.
3. ``if``, ``with`` and ``range`` judge truth as Go does (:mod:`.values`); ``with`` and ``range`` move dot;
   ``range`` walks lists in order, maps in sorted key order, and an integer ``n`` as 0..n-1, with ``$k, $v :=``
   or ``$v :=`` bound per item. Variables declared in a block end with it.
4. Fields: of a map, its key (absent: None); of a :class:`~.values.Message`, the field by Go name; of None,
   None; ``.String`` of a string is itself (the proto enums' method); of anything else, an error.
5. Bounded: the output is at most :data:`MAX_OUTPUT` characters, a run evaluates at most :data:`MAX_STEPS`
   commands and :data:`MAX_ITERATIONS` range items, and its function calls return at most :data:`MAX_WORK`
   characters of strings, in all; past any of them the run stops with a :class:`TemplateError`, so that a template
   written to loop or grow cannot make the caller allocate, or spend its time, without bound.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import yaml

from ambit.controlplane.gateway.gotemplate.funcs import FUNCS, FuncError
from ambit.controlplane.gateway.gotemplate.parse import (
    Action,
    Chain,
    Command,
    Dot,
    Field,
    Ident,
    If,
    Literal,
    Node,
    Operand,
    Pipe,
    Range,
    Template,
    TemplateError,
    Text,
    Var,
    With,
    parse,
)
from ambit.controlplane.gateway.gotemplate.values import Message, go_print, truth

__all__ = ["MAX_ITERATIONS", "MAX_OUTPUT", "MAX_STEPS", "MAX_WORK", "compile_template", "execute"]

MAX_OUTPUT: Final = 1 << 20
MAX_STEPS: Final = 100_000
MAX_ITERATIONS: Final = 50_000
MAX_WORK: Final = 2 << 20
"""Characters of strings the function calls of one run may return, in all (``toYaml`` of a large value in a loop)."""
LAZY: Final = frozenset({"and", "or"})


def _idents(nodes: tuple[Node, ...]) -> Iterator[tuple[str, str]]:
    for node in nodes:
        if isinstance(node, Text):
            continue
        yield from _pipe_idents(node.pipe)
        if isinstance(node, If | Range | With):
            yield from _idents(node.body)
            yield from _idents(node.orelse)


def _pipe_idents(pipe: Pipe) -> Iterator[tuple[str, str]]:
    for command in pipe.commands:
        for arg in command.args:
            if isinstance(arg, Ident):
                yield arg.name, command.pos
            elif isinstance(arg, Chain):
                yield from _pipe_idents(arg.node)


def compile_template(text: str) -> Template:
    """The parsed template, with every function it names known; raises :class:`TemplateError`."""
    template = parse(text)
    for name, pos in _idents(template):
        if name not in FUNCS and name not in LAZY:
            raise TemplateError(f"template: {pos}: function {name!r} not defined")
    return template


@dataclass(slots=True)
class _State:
    root: Any
    out: list[str] = field(default_factory=list)
    size: int = 0
    steps: int = 0
    iterations: int = 0
    work: int = 0
    vars: list[tuple[str, Any]] = field(default_factory=list)

    def write(self, text: str, pos: str) -> None:
        self.size += len(text)
        if self.size > MAX_OUTPUT:
            raise TemplateError(f"template: {pos}: output longer than {MAX_OUTPUT} characters")
        self.out.append(text)

    def variable(self, name: str, pos: str) -> Any:
        for bound, value in reversed(self.vars):
            if bound == name:
                return value
        if name == "$":
            return self.root
        raise TemplateError(f"template: {pos}: undefined variable {name!r}")

    def assign(self, name: str, value: Any, pos: str) -> None:
        for index in range(len(self.vars) - 1, -1, -1):
            if self.vars[index][0] == name:
                self.vars[index] = (name, value)
                return
        raise TemplateError(f"template: {pos}: undefined variable {name!r}")


def _field(value: Any, name: str, pos: str) -> Any:
    """Rule 4."""
    if value is None:
        return None
    if isinstance(value, Message):
        return value.get(name)
    if isinstance(value, Mapping):
        return value.get(name)
    if isinstance(value, str) and name == "String":
        return value
    kind = {bool: "bool", int: "int", float: "float64", str: "string"}.get(type(value), "list")
    raise TemplateError(f"template: {pos}: can't evaluate field {name} in type {kind}")


def _fields(value: Any, names: tuple[str, ...], pos: str) -> Any:
    for name in names:
        value = _field(value, name, pos)
    return value


class _Executor:
    def __init__(self, state: _State) -> None:
        self.state = state

    def run(self, nodes: tuple[Node, ...], dot: Any) -> None:
        for node in nodes:
            if isinstance(node, Text):
                self.state.write(node.text, "text")
            elif isinstance(node, Action):
                value = self.pipe(node.pipe, dot)
                if not node.pipe.decl:
                    self.state.write(go_print(value), node.pipe.pos)
            elif isinstance(node, If):
                self.block(node, dot, lambda value, dot: dot)
            elif isinstance(node, With):
                self.block(node, dot, lambda value, dot: value)
            else:
                self.range(node, dot)

    def block(self, node: If | With, dot: Any, new_dot: Any) -> None:
        mark = len(self.state.vars)
        value = self.pipe(node.pipe, dot)
        if truth(value):
            self.run(node.body, new_dot(value, dot))
        else:  # a variable the pipeline declared is seen by the else branch too
            self.run(node.orelse, dot)
        del self.state.vars[mark:]

    def range(self, node: Range, dot: Any) -> None:
        mark = len(self.state.vars)
        pipe = node.pipe
        value = self.pipe(Pipe((), False, pipe.commands, pipe.pos), dot)
        items: list[tuple[Any, Any]]
        if value is None:
            items = []
        elif isinstance(value, Message | Mapping):
            fields = value.fields if isinstance(value, Message) else value
            items = [(key, fields[key]) for key in sorted(fields, key=str)]
        elif isinstance(value, list | tuple):
            items = list(enumerate(value))
        elif isinstance(value, int) and not isinstance(value, bool):
            if value > MAX_ITERATIONS:
                raise TemplateError(f"template: {pipe.pos}: range over {value}, more than {MAX_ITERATIONS}")
            items = [(index, index) for index in range(max(value, 0))]
        else:
            raise TemplateError(f"template: {pipe.pos}: range can't iterate over {go_print(value)[:40]}")
        if not items:
            self.run(node.orelse, dot)
            return
        for key, item in items:
            self.state.iterations += 1
            if self.state.iterations > MAX_ITERATIONS:
                raise TemplateError(f"template: {pipe.pos}: more than {MAX_ITERATIONS} range iterations")
            del self.state.vars[mark:]
            if len(pipe.decl) == 2:
                self.state.vars += [(pipe.decl[0], key), (pipe.decl[1], item)]
            elif pipe.decl:
                self.state.vars.append((pipe.decl[0], item))
            self.run(node.body, item)
        del self.state.vars[mark:]

    def pipe(self, pipe: Pipe, dot: Any) -> Any:
        value: Any = None
        piped = False
        for command in pipe.commands:
            value = self.command(command, dot, value if piped else _NOTHING)
            piped = True
        for name in pipe.decl:
            if pipe.assign:
                self.state.assign(name, value, pipe.pos)
            else:
                self.state.vars.append((name, value))
        return value

    def command(self, command: Command, dot: Any, final: Any) -> Any:
        self.state.steps += 1
        if self.state.steps > MAX_STEPS:
            raise TemplateError(f"template: {command.pos}: more than {MAX_STEPS} commands evaluated")
        head, *rest = command.args
        if isinstance(head, Ident):
            return self.call(head.name, rest, dot, final, command.pos)
        if rest or final is not _NOTHING:
            raise TemplateError(f"template: {command.pos}: can't give argument to non-function {_show(head)}")
        return self.operand(head, dot, command.pos)

    def call(self, name: str, args: list[Operand], dot: Any, final: Any, pos: str) -> Any:
        if name in LAZY:
            return self.lazy(name, args, dot, final, pos)
        func = FUNCS.get(name)
        if func is None:
            raise TemplateError(f"template: {pos}: function {name!r} not defined")
        values = [self.operand(arg, dot, pos) for arg in args]
        if final is not _NOTHING:
            values.append(final)
        if len(values) < func.least or (func.most is not None and len(values) > func.most):
            want = str(func.least) if func.least == func.most else f"at least {func.least}"
            raise TemplateError(f"template: {pos}: wrong number of args for {name}: want {want} got {len(values)}")
        try:
            result = func.code(*values)
        except FuncError as exc:
            raise TemplateError(f"template: {pos}: error calling {name}: {exc}") from None
        except (RecursionError, TypeError, ValueError, yaml.YAMLError) as exc:
            raise TemplateError(f"template: {pos}: error calling {name}: {type(exc).__name__}") from None
        if isinstance(result, str):
            self.state.work += len(result)
            if self.state.work > MAX_WORK:
                raise TemplateError(f"template: {pos}: functions returned more than {MAX_WORK} characters in all")
        return result

    def lazy(self, name: str, args: list[Operand], dot: Any, final: Any, pos: str) -> Any:
        """Rule 2."""
        count = len(args) + (final is not _NOTHING)
        if count < 1:
            raise TemplateError(f"template: {pos}: wrong number of args for {name}: want at least 1 got 0")
        value: Any = None
        for arg in args:
            value = self.operand(arg, dot, pos)
            if truth(value) == (name == "or"):
                return value
        return final if final is not _NOTHING else value

    def operand(self, node: Operand, dot: Any, pos: str) -> Any:
        if isinstance(node, Literal):
            return node.value
        if isinstance(node, Dot):
            return dot
        if isinstance(node, Field):
            return _fields(dot, node.names, pos)
        if isinstance(node, Var):
            return _fields(self.state.variable(node.name, pos), node.names, pos)
        if isinstance(node, Chain):
            return _fields(self.pipe(node.node, dot), node.names, pos)
        # A function named as an argument is called without arguments, as Go does.
        return self.call(node.name, [], dot, _NOTHING, pos)


def _show(node: Operand) -> str:
    if isinstance(node, Literal):
        return repr(node.value)
    if isinstance(node, Field):
        return "." + ".".join(node.names)
    if isinstance(node, Var):
        return ".".join((node.name, *node.names))
    return "."


class _Nothing:
    """No piped value (None is a value: nil)."""


_NOTHING: Any = _Nothing()


def execute(template: Template, data: Any) -> str:
    """The text ``template`` produces with ``data`` as dot and ``$`` (rules 1-5); raises :class:`TemplateError`."""
    state = _State(data)
    try:
        _Executor(state).run(template, data)
    except RecursionError:
        raise TemplateError("template: nested too deeply") from None
    return "".join(state.out)
