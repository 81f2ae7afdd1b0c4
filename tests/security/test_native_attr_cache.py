"""The native paths' attribute cache (``src/ambit/native/attr_cache.h``) against Python's own getattr and setattr.

The C paths read and write the Python objects' fields through a cache per attribute name that remembers, per exact
type and type version tag, whether the attribute is a ``__slots__`` member (read at its offset) or an instance-dict
entry. The extension's test hooks (``_attr_get``, ``_attr_set``, ``_attr_kind``) go through that cached path for
any name. A hypothesis state machine keeps pairs of twin objects: the C side writes one twin, Python's setattr the
other, and after every step each object's every attribute must read the same through C as through Python, and both
twins the same; between steps it mutates the classes and bases (a property, a plain class attribute, a
``__getattribute__`` or ``__setattr__`` added once the cache is warm, a slot's descriptor deleted), the objects
(an attribute or a slot deleted, ``__dict__`` replaced, ``__class__`` changed, so two types alternate under one
name). Plain tests pin each of those cases once. The cache's guards (the version tag, the generic getattro and
setattro, the member's class) are what keep the two equal; each was taken out by hand and tests here failed.

Run where the extension is built (under CI, ``CI=true``, a missing build fails instead of skipping); the sanitizer
run (``test_native_sanitizers.py``) runs this module against an ``-fsanitize=address,undefined`` build.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from types import MethodType, ModuleType
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from tests.conftest import hbone_data_or_skip

EXAMPLES = int(os.environ.get("AMBIT_ATTR_CACHE_EXAMPLES", "150"))
"""Hypothesis examples of the state machine (the sanitizer run asks for fewer)."""
NAMES = ("a", "b", "c", "x")
"""Attribute names the objects and classes use: a and b are slots of the slotted classes, c of one subclass."""


def _hooks() -> ModuleType:
    return hbone_data_or_skip()


@pytest.fixture
def hooks() -> ModuleType:
    return _hooks()


def outcome(read: Callable[[], object]) -> tuple[str, object]:
    """What a read or write gives: its value (a bound method as its function), or its exception's type and message."""
    try:
        value = read()
    except Exception as exc:  # every exception is part of the comparison
        return (type(exc).__name__, str(exc))
    return ("method", value.__func__) if isinstance(value, MethodType) else ("value", value)


def read_through_c(hooks: ModuleType, obj: object, name: str) -> tuple[str, object]:
    return outcome(lambda: hooks._attr_get(obj, name))


def read(obj: object, name: str) -> tuple[str, object]:
    return outcome(lambda: getattr(obj, name))


def make_classes() -> dict[str, type]:
    """A fresh family of classes: slotted, dict-based, mixed, and ones with their own attribute hooks."""

    class SlotBase:
        __slots__ = ("a", "b")

    class SlotTwin:  # the same layout as SlotBase: instances can trade classes
        __slots__ = ("a", "b")

    class SlotChild(SlotBase):
        __slots__ = ("c",)

    class SlotDict(SlotBase):
        __slots__ = ("__dict__",)

    class DictBase:
        pass

    class DictChild(DictBase):
        pass

    class Getattr(DictBase):
        def __getattr__(self, name: str) -> object:
            return ("missing", name)

    class Getattribute(DictBase):
        def __getattribute__(self, name: str) -> object:
            if name in NAMES:
                return ("intercepted", name)
            return object.__getattribute__(self, name)

    class Setattr(DictBase):
        def __setattr__(self, name: str, value: object) -> None:
            object.__setattr__(self, name, ("stored", value))

    return {
        cls.__name__: cls
        for cls in (SlotBase, SlotTwin, SlotChild, SlotDict, DictBase, DictChild, Getattr, Getattribute, Setattr)
    }


def _getattribute(self: object, name: str) -> object:
    if name == "b":
        return ("late getattribute", name)
    return object.__getattribute__(self, name)


def _setattr(self: object, name: str, value: object) -> None:
    object.__setattr__(self, name, ("late setattr", value))


CLASS_ATTRIBUTES: dict[str, Callable[[], object]] = {
    "a property": lambda: property(lambda self: "from the property"),
    "a property with a setter": lambda: property(lambda self: "read", lambda self, value: None),
    "a plain value": lambda: 17,
    "a method": lambda: lambda self: None,
}


class AttrCacheMachine(RuleBasedStateMachine):
    """Twin objects of each class: C writes twin 0, Python twin 1; reads must agree everywhere."""

    def __init__(self) -> None:
        super().__init__()
        self.hooks = _hooks()
        self.classes = make_classes()
        self.pairs: list[tuple[Any, Any]] = [(cls(), cls()) for cls in self.classes.values()]

    @rule(pair=st.integers(0, 8), name=st.sampled_from(NAMES), value=st.integers(-3, 3))
    def set_attribute(self, pair: int, name: str, value: int) -> None:
        through_c, through_python = self.pairs[pair]
        written = outcome(lambda: self.hooks._attr_set(through_c, name, value))
        assert written == outcome(lambda: setattr(through_python, name, value))

    @rule(pair=st.integers(0, 8), name=st.sampled_from(NAMES))
    def read_attribute(self, pair: int, name: str) -> None:
        for obj in self.pairs[pair]:
            assert read_through_c(self.hooks, obj, name) == read(obj, name)

    @rule(pair=st.integers(0, 8), name=st.sampled_from(NAMES))
    def delete_attribute(self, pair: int, name: str) -> None:
        first, second = self.pairs[pair]
        assert outcome(lambda: delattr(first, name)) == outcome(lambda: delattr(second, name))

    @rule(pair=st.integers(0, 8), contents=st.dictionaries(st.sampled_from(NAMES), st.integers(-3, 3)))
    def replace_dict(self, pair: int, contents: dict[str, int]) -> None:
        first, second = self.pairs[pair]
        assert outcome(lambda: setattr(first, "__dict__", dict(contents))) == outcome(
            lambda: setattr(second, "__dict__", dict(contents))
        )

    @rule(pair=st.integers(0, 8), to=st.sampled_from(["SlotBase", "SlotTwin", "DictBase", "DictChild", "Getattr"]))
    def change_class(self, pair: int, to: str) -> None:
        first, second = self.pairs[pair]
        cls = self.classes[to]
        assert outcome(lambda: setattr(first, "__class__", cls)) == outcome(lambda: setattr(second, "__class__", cls))

    @rule(
        cls=st.sampled_from(["SlotBase", "SlotChild", "DictBase", "DictChild", "SlotDict"]),
        name=st.sampled_from(NAMES),
        what=st.sampled_from(sorted(CLASS_ATTRIBUTES)),
    )
    def add_class_attribute(self, cls: str, name: str, what: str) -> None:
        setattr(self.classes[cls], name, CLASS_ATTRIBUTES[what]())

    @rule(
        cls=st.sampled_from(["SlotBase", "SlotChild", "DictBase", "DictChild", "SlotDict"]),
        name=st.sampled_from([*NAMES, "__getattribute__", "__setattr__"]),
    )
    def delete_class_attribute(self, cls: str, name: str) -> None:
        if name in vars(self.classes[cls]):  # a slot's descriptor too: its values can no longer be reached
            delattr(self.classes[cls], name)

    @rule(cls=st.sampled_from(["SlotBase", "DictBase", "DictChild"]))
    def add_getattribute(self, cls: str) -> None:
        self.classes[cls].__getattribute__ = _getattribute  # type: ignore[method-assign]

    @rule(cls=st.sampled_from(["SlotBase", "DictBase", "DictChild"]))
    def add_setattr(self, cls: str) -> None:
        self.classes[cls].__setattr__ = _setattr  # type: ignore[method-assign]

    @rule(pair=st.integers(0, 8))
    def read_every_attribute(self, pair: int) -> None:
        for obj in self.pairs[pair]:
            for name in NAMES:
                assert read_through_c(self.hooks, obj, name) == read(obj, name)

    @invariant()
    def both_twins_read_the_same(self) -> None:
        # Python's reads only: C reads of every object here would refill the cache at each step, and the stale
        # entries the rules above must meet would never be met.
        for first, second in self.pairs:
            for name in NAMES:
                assert read(first, name) == read(second, name), name


AttrCacheMachine.TestCase.settings = settings(max_examples=EXAMPLES, stateful_step_count=30, deadline=None)


def test_cached_reads_and_writes_match_getattr_and_setattr_through_every_mutation() -> None:
    _hooks()
    AttrCacheMachine.TestCase().runTest()


def test_slots_and_instance_dicts_take_the_cached_kinds_and_anything_else_the_generic_path(
    hooks: ModuleType,
) -> None:
    classes = make_classes()
    slotted, plain, mixed = classes["SlotChild"](), classes["DictChild"](), classes["SlotDict"]()
    slotted.a, plain.x, mixed.x = 1, 2, 3
    assert hooks._attr_kind(slotted, "a") == "slot"
    assert hooks._attr_kind(slotted, "c") == "slot"
    assert hooks._attr_kind(plain, "x") == "dict"
    assert hooks._attr_kind(mixed, "x") == "dict"
    assert hooks._attr_kind(mixed, "a") == "slot"
    assert hooks._attr_kind(classes["Getattribute"](), "x") == "generic"
    assert hooks._attr_kind(classes["Getattr"](), "x") == "generic"
    assert hooks._attr_kind(slotted, "x") == "generic"  # neither a slot nor a dict: Python's AttributeError
    classes["DictBase"].x = property(lambda self: 5)
    assert hooks._attr_kind(plain, "x") == "generic"


def test_a_property_added_to_a_slotted_base_once_the_cache_is_warm_wins(hooks: ModuleType) -> None:
    classes = make_classes()
    obj = classes["SlotChild"]()
    obj.a = 1
    for _ in range(3):
        assert hooks._attr_get(obj, "a") == 1
    classes["SlotBase"].a = property(lambda self: "from the property")
    assert hooks._attr_get(obj, "a") == "from the property"
    with pytest.raises(AttributeError):
        hooks._attr_set(obj, "a", 2)


def test_a_class_attribute_added_to_a_base_shadows_no_instance_dict_entry_but_a_data_descriptor_does(
    hooks: ModuleType,
) -> None:
    classes = make_classes()
    obj = classes["DictChild"]()
    obj.x = 1
    assert hooks._attr_get(obj, "x") == 1
    classes["DictBase"].x = 9  # a plain class attribute: the instance's own entry still wins
    assert hooks._attr_get(obj, "x") == 1
    classes["DictBase"].x = property(lambda self: "descriptor")  # a data descriptor wins over the entry
    assert hooks._attr_get(obj, "x") == "descriptor"
    del classes["DictBase"].x
    hooks._attr_set(obj, "x", 4)
    assert obj.x == 4 and hooks._attr_get(obj, "x") == 4


def test_an_empty_or_deleted_slot_raises_attribute_error_as_getattr_does(hooks: ModuleType) -> None:
    classes = make_classes()
    obj = classes["SlotBase"]()
    with pytest.raises(AttributeError) as empty:
        hooks._attr_get(obj, "a")
    assert ("AttributeError", str(empty.value)) == read(obj, "a")
    hooks._attr_set(obj, "a", 1)
    assert obj.a == 1
    del obj.a
    with pytest.raises(AttributeError):
        hooks._attr_get(obj, "a")


def test_a_replaced_dict_is_the_one_read_and_written(hooks: ModuleType) -> None:
    obj = make_classes()["DictBase"]()
    obj.x = 1
    assert hooks._attr_get(obj, "x") == 1
    old = obj.__dict__
    obj.__dict__ = {"x": 2}
    assert hooks._attr_get(obj, "x") == 2
    hooks._attr_set(obj, "x", 3)
    assert obj.__dict__ == {"x": 3} and old == {"x": 1}


def test_objects_of_two_types_alternate_under_one_name(hooks: ModuleType) -> None:
    classes = make_classes()
    slotted, twin, plain = classes["SlotBase"](), classes["SlotTwin"](), classes["DictBase"]()
    slotted.a, twin.b, plain.a = "slot a", "twin b", "dict a"
    for _ in range(3):
        assert hooks._attr_get(slotted, "a") == "slot a"
        assert hooks._attr_get(plain, "a") == "dict a"
        assert outcome(lambda: hooks._attr_get(twin, "a")) == outcome(lambda: twin.a)  # same offset, empty
    slotted.__class__ = classes["SlotTwin"]  # the same layout: the object now reads with the other type's entry
    assert hooks._attr_get(slotted, "a") == "slot a"
    plain.__class__ = classes["Getattribute"]
    assert hooks._attr_get(plain, "a") == ("intercepted", "a")


def test_a_getattribute_or_setattr_added_once_the_cache_is_warm_is_called(hooks: ModuleType) -> None:
    classes = make_classes()
    obj = classes["DictChild"]()
    hooks._attr_set(obj, "b", 1)
    assert hooks._attr_get(obj, "b") == 1
    classes["DictBase"].__getattribute__ = _getattribute  # type: ignore[method-assign]
    assert hooks._attr_get(obj, "b") == ("late getattribute", "b")
    classes["DictBase"].__setattr__ = _setattr  # type: ignore[method-assign]
    hooks._attr_set(obj, "x", 2)
    assert hooks._attr_get(obj, "x") == ("late setattr", 2)


def test_a_member_descriptor_copied_onto_an_unrelated_class_is_refused_as_python_refuses_it(
    hooks: ModuleType,
) -> None:
    classes = make_classes()
    stranger = classes["Getattr"]
    stranger.c = vars(classes["SlotChild"])["c"]  # a slot of another layout: Python raises TypeError
    del stranger.__getattr__
    obj = stranger()
    assert outcome(lambda: hooks._attr_get(obj, "c")) == outcome(lambda: obj.c)
    assert outcome(lambda: hooks._attr_get(obj, "c"))[0] == "TypeError"
    assert outcome(lambda: hooks._attr_set(obj, "c", 1)) == outcome(lambda: setattr(obj, "c", 1))


def test_a_slot_write_keeps_the_reference_counts(hooks: ModuleType) -> None:
    import sys

    obj = make_classes()["SlotBase"]()
    value, other = object(), object()
    before = sys.getrefcount(value), sys.getrefcount(other)
    hooks._attr_set(obj, "a", value)
    assert sys.getrefcount(value) == before[0] + 1
    hooks._attr_set(obj, "a", other)
    assert (sys.getrefcount(value), sys.getrefcount(other)) == (before[0], before[1] + 1)
    del obj
    assert sys.getrefcount(other) == before[1]
