"""Which object a replayed call returned (`replay._identity`), element by element: a view of
an argument held in a tuple must not compare equal to a copy of equal values, and equivalent
code must still describe the same objects alike."""

from __future__ import annotations

import dataclasses

import torch

from fastci.runner.prune.replay import _ELEMENTS, _identity

SHARED = {"lr": 0.1}


def _of(fn, *args, **kwargs) -> str:
    return _identity(fn(*args, **kwargs), args, kwargs, fn)


def test_a_view_in_a_tuple_differs_from_a_copy_in_one():
    x = torch.zeros(2, 2)
    view = _of(lambda t: (t.view(-1), t.sum()), x)
    copy = _of(lambda t: (t.flatten().clone(), t.sum()), x)
    assert view != copy
    assert "a view of args[0]" in view and "a new object" in copy
    assert _of(lambda t: (t.reshape(-1), t.sum()), x) == view  # a view either way


def test_a_tuple_is_a_value_and_only_what_it_holds_counts():
    pair = (torch.ones(1), torch.zeros(1))
    assert _of(lambda p: p, pair) == _of(lambda p: tuple(p), pair)


def test_a_list_an_argument_holds_is_named_by_its_place():
    xs = [torch.ones(1), torch.zeros(1)]
    assert _of(lambda v: v, xs) == "args[0]"
    assert _of(lambda v: v[1], xs) == "args[0][1]"
    assert _of(lambda v: list(v), xs) == "a new list (0: args[0][0], 1: args[0][1])"


def test_dicts_and_dataclasses_are_described_by_their_fields():
    @dataclasses.dataclass
    class Out:
        hidden: torch.Tensor
        config: dict

    x = torch.ones(3)
    shared = _of(lambda t: Out(t[:2], SHARED), x)
    assert shared == "a new Out (hidden: a view of args[0], config: global SHARED)"
    assert _of(lambda t: Out(t[:2], dict(SHARED)), x) != shared
    assert _of(lambda t: {"h": t}, x) == "a new dict ('h': args[0])"


def test_a_container_too_large_to_compare_never_matches():
    wide = list(range(_ELEMENTS + 1))
    first, second = _of(lambda: list(wide)), _of(lambda: list(wide))
    assert first.startswith("a container too large to compare") and first != second


def test_scalars_and_torch_return_types_are_values_or_new():
    x = torch.tensor([1.0, 3.0])
    assert _of(lambda t: float(t.sum()), x) == "a value"
    assert _of(lambda t: t.max(dim=0), x) == "a new max (0: a new object, 1: a new object)"


class Output:
    """A plain output object, as a model returns one."""

    def __init__(self, hidden, extra):
        self.hidden, self.extra, self.steps = hidden, extra, 3


def test_a_plain_object_is_described_by_its_attributes():
    x = torch.ones(4)
    kept = _of(lambda t: Output(t.view(2, 2), SHARED), x)
    assert kept == "a new Output (hidden: a view of args[0], extra: global SHARED)"
    assert _of(lambda t: Output(t.view(2, 2).clone(), SHARED), x) != kept
    assert _of(lambda t: Output(t.reshape(2, 2), SHARED), x) == kept


def test_values_are_left_out_and_library_objects_are_not_looked_into():
    vocab = {chr(65 + i): i for i in range(26)}
    assert _of(lambda: dict(vocab)) == "a new dict ()"
    model = torch.nn.Linear(2, 2)
    optimizer = _of(lambda m: torch.optim.SGD(m.parameters(), lr=0.1), model)
    assert optimizer == "a new object"
    assert _of(lambda: torch.nn.Linear(2, 2)) == "a new object"


class Node:
    def __init__(self, parent=None):
        self.parent, self.children = parent, []


def test_a_back_reference_is_described_not_followed():
    def tree():
        root = Node()
        root.children.append(Node(root))
        return root

    # root -> its children list -> the child, whose parent is the root: three objects up.
    assert _of(tree) == ("a new Node (children: a new list (0: a new Node (parent: the "
                         "object 3 up, children: a new list ())))")
