"""Which object a replayed call returned (`prune/identity.py`), element by element: a view of
an argument held in a tuple must not compare equal to a copy of equal values, and equivalent
code must still describe the same objects alike."""

from __future__ import annotations

import dataclasses

import numpy
import torch

from fastci.runner.prune.identity import ELEMENTS, held, holding, identity

SHARED = {"lr": 0.1}


def _of(fn, *args, **kwargs) -> str:
    return identity(fn(*args, **kwargs), args, kwargs, fn)


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
    assert _of(lambda v: list(v), xs) == "a new list ([0]: args[0][0], [1]: args[0][1])"


def test_dicts_and_dataclasses_are_described_by_their_fields():
    @dataclasses.dataclass
    class Out:
        hidden: torch.Tensor
        config: dict

    x = torch.ones(3)
    shared = _of(lambda t: Out(t[:2], SHARED), x)
    assert shared == ("a new Out (.hidden: a view of args[0] at byte 0 (2,)/(1,), "
                      ".config: global SHARED)")
    assert _of(lambda t: Out(t[:2], dict(SHARED)), x) != shared
    assert _of(lambda t: {"h": t}, x) == "a new dict (['h']: args[0])"


def test_a_container_too_large_to_compare_never_matches():
    wide = list(range(ELEMENTS + 1))
    first, second = _of(lambda: list(wide)), _of(lambda: list(wide))
    assert first.startswith("a container too large to compare") and first != second


def test_scalars_and_torch_return_types_are_values_or_new():
    x = torch.tensor([1.0, 3.0])
    assert _of(lambda t: float(t.sum()), x) == "a value"
    assert _of(lambda t: t.max(dim=0), x) == "a new max ([0]: a new object, [1]: a new object)"


class Output:
    """A plain output object, as a model returns one."""

    def __init__(self, hidden, extra):
        self.hidden, self.extra, self.steps = hidden, extra, 3


def test_a_plain_object_is_described_by_its_attributes():
    x = torch.ones(4)
    kept = _of(lambda t: Output(t.view(2, 2), SHARED), x)
    assert kept == ("a new Output (.hidden: a view of args[0] at byte 0 (2, 2)/(2, 1), "
                    ".extra: global SHARED)")
    assert _of(lambda t: Output(t.view(2, 2).clone(), SHARED), x) != kept
    assert _of(lambda t: Output(t.reshape(2, 2), SHARED), x) == kept


def test_values_are_left_out_and_modules_are_not_looked_into():
    vocab = {chr(65 + i): i for i in range(26)}
    assert _of(lambda: dict(vocab)) == "a new dict ()"
    assert _of(lambda: torch.nn.Linear(2, 2)) == "a new object"


def test_torch_objects_written_in_python_are_looked_into():
    # An optimizer over the model's own parameters is not one over copies of them: a step
    # of the second leaves the model as it was.
    model = torch.nn.Linear(2, 2)
    own = _of(lambda m: torch.optim.SGD(m.parameters(), lr=0.1), model)
    assert "[0]: args[0].weight, [1]: args[0].bias" in own
    copies = _of(lambda m: torch.optim.SGD([p.detach().clone() for p in m.parameters()],
                                           lr=0.1), model)
    assert copies != own
    # A dataset over a view of the input, against one over a copy.
    x = torch.zeros(4, 2)
    view = _of(lambda t: torch.utils.data.TensorDataset(t[:2]), x)
    assert "a view of args[0]" in view
    assert _of(lambda t: torch.utils.data.TensorDataset(t[:2].clone()), x) != view


def test_a_numpy_view_differs_from_a_copy():
    a = numpy.zeros(6)
    view = _of(lambda arr: arr[1:], a)
    assert view == "a view of args[0] at byte 8 (5,)/(8,)"
    assert _of(lambda arr: arr[1:].copy(), a) == "a new object"
    assert _of(lambda arr: arr.reshape(2, 3)[1], a).startswith("a view of args[0] at byte 24")
    # The same memory, elsewhere in it: equal values, another object to write through.
    assert _of(lambda arr: arr[:-1], a) != view
    t = torch.zeros(3)
    # torch's memory seen by numpy, from an offset too.
    assert _of(lambda x: x.numpy(), t) == "a view of args[0] at byte 0 (3,)/(4,)"
    assert _of(lambda x: x[1:].numpy(), t) == "a view of args[0] at byte 4 (2,)/(4,)"


def test_what_an_argument_holds_is_named_by_its_path():
    # A view of a tensor kept in an argument's dict or attribute is not a new object.
    state = {"cache": torch.zeros(4)}
    assert _of(lambda s: s["cache"][:2], state) == "a view of args[0]['cache'] at byte 0 (2,)/(1,)"
    assert _of(lambda s: s["cache"][:2].clone(), state) == "a new object"
    holder = Output(torch.zeros(4), None)
    assert _of(lambda h: h.hidden.view(2, 2), holder).startswith("a view of args[0].hidden ")
    model = torch.nn.Linear(2, 2)
    assert _of(lambda m: m.weight.view(-1), model).startswith("a view of args[0].weight ")
    # A buffer a state dict leaves out (a rotary cache) is named too.
    model.register_buffer("cache", torch.zeros(4), persistent=False)
    assert _of(lambda m: m.cache[:2], model).startswith("a view of args[0].cache ")
    assert _of(lambda m: m.cache[:2].clone(), model) == "a new object"
    assert _of(lambda m: m.weight.detach().clone().view(-1), model) == "a new object"


def test_a_huge_argument_is_not_walked_and_nothing_new_is_proved_beside_it():
    # What it holds is not named, so no returned object is proved new: one of them could
    # be what the argument holds.
    ids = [torch.zeros(1) for _ in range(ELEMENTS * 2)]
    assert _of(lambda v: v, ids) == "args[0]"
    first, second = _of(lambda v: v[5], ids), _of(lambda v: v[5], ids)
    assert first.startswith("an object the arguments may hold") and first != second


def test_later_arguments_are_named_before_the_first_is_walked_deep():
    # A first argument holding more than the walk's bound leaves the second named.
    samples = [{"x": torch.zeros(1)} for _ in range(ELEMENTS)]
    weight = torch.zeros(4)
    assert _of(lambda s, w: w[:2], samples, weight).startswith("a view of args[1] ")


class Touchy:
    @property
    def __dict__(self):
        raise RuntimeError("no")


def test_an_object_that_cannot_be_read_is_never_proved_new():
    first, second = _of(lambda t: [t], Touchy()), _of(lambda t: [t], Touchy())
    assert first != second


def test_a_frozenset_key_is_no_path():
    key = frozenset({"a", "b", "c"})
    assert _of(lambda: {key: torch.zeros(1)}) == "a new dict ([<frozenset 0>]: a new object)"


class Node:
    def __init__(self, parent=None):
        self.parent, self.children = parent, []


def test_a_back_reference_is_described_not_followed():
    def tree():
        root = Node()
        root.children.append(Node(root))
        return root

    # root -> its children list -> the child, whose parent is the root: three objects up.
    assert _of(tree) == ("a new Node (.children: a new list ([0]: a new Node (.parent: the "
                         "object 3 up, .children: a new list ())))")


# What the repository's modules hold (`state.own_objects`, by `module.name`), as a replay
# passes it.
TABLE = torch.arange(8.0)
GLOBALS = [("lib.TABLE", TABLE), ("lib.CONFIG", {"opts": {"lr": 0.1}}), ("lib.SEEN", [])]


def test_a_view_of_what_a_module_holds_is_named_by_where_it_lives():
    def of(fn, *args):
        return identity(fn(*args), args, {}, fn, shared=GLOBALS)

    assert of(lambda n: TABLE[:n], 2) == "a view of global lib.TABLE at byte 0 (2,)/(1,)"
    assert of(lambda n: TABLE[:n].clone(), 2) == "a new object"
    config = GLOBALS[1][1]
    assert of(lambda: config["opts"]) == "global lib.CONFIG['opts']"
    assert of(lambda: dict(config["opts"])) == "a new dict ()"
    # An argument is named first: a tensor both passed and held is the argument.
    assert of(lambda t: t, TABLE) == "args[0]"


def test_what_a_call_leaves_in_a_module_or_an_argument_is_named_by_where_it_was():
    def left(fn, *args):
        before = held(args, {}, GLOBALS)
        fn(*args)
        try:
            return holding(args, {}, before, GLOBALS)
        finally:
            GLOBALS[2][1].clear()

    x = torch.ones(2)
    kept = left(lambda t: GLOBALS[2][1].append(t), x)
    copied = left(lambda t: GLOBALS[2][1].append(t.clone()), x)
    assert "global lib.SEEN[0]=new" in copied and kept != copied
    shared = left(lambda c: c.update(eps=GLOBALS[1][1]["opts"]), {})
    assert "args[0]['eps']=global lib.CONFIG['opts']" in shared
    assert left(lambda c: c.update(eps=dict(GLOBALS[1][1]["opts"])), {}) != shared
    # Nothing moved: the places are counted, not listed.
    assert left(lambda t: None, x) == left(lambda t: t.add_(0), x)


def test_a_module_walked_short_proves_nothing_new():
    first, second = (identity(torch.zeros(1), (), {}, None, shared=[("lib.IDS", list(range(
        ELEMENTS + 1)))]) for _ in range(2))
    assert first.startswith("an object the arguments may hold") and first != second
    before = held((), {}, [("lib.DEEP", DEEP)])
    assert holding((), {}, before, [("lib.DEEP", DEEP)]) != holding(
        (), {}, before, [("lib.DEEP", DEEP)])


DEEP: list = [[[[[[[[torch.zeros(1)]]]]]]]]


def test_a_logger_is_not_walked_into_the_logging_configuration():
    import logging  # noqa: PLC0415

    log = logging.getLogger("lib.train")
    out = identity(torch.zeros(1), (), {}, None, shared=[("lib.log", log)])
    assert out == "a new object"


class Rope:
    def __init__(self):
        self.cos = torch.ones(4)

    def __call__(self, n):
        return self.cos[:n]


class Slotted:
    __slots__ = ("k",)

    def __init__(self):
        self.k = torch.zeros(4)


def test_callable_slotted_and_queued_objects_are_walked():
    rope, slotted = Rope(), Slotted()
    assert _of(lambda r: r.cos[:2], rope).startswith("a view of args[0].cos ")
    assert _of(lambda s: s.k[:2], slotted).startswith("a view of args[0].k ")
    history = __import__("collections").deque([{"loss": 1.0}])
    assert _of(lambda h: h[-1], history) == "args[0][0]"
    weights = torch.ones(3)
    kept = _of(lambda w: __import__("functools").partial(torch.mul, w), weights)
    copied = _of(lambda w: __import__("functools").partial(torch.mul, w.clone()), weights)
    assert "args[0]" in kept and kept != copied


def test_a_module_s_plain_attributes_are_places():
    block = torch.nn.Linear(2, 2)
    block.config = {"eps": 1e-5}
    block.kv = [torch.zeros(4)]
    assert _of(lambda m: m.config, block) == "args[0].config"
    assert _of(lambda m: m.kv[0][:2], block).startswith("a view of args[0].kv[0] ")
    assert _of(lambda m: dict(m.config), block) == "a new dict ()"
