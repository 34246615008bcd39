"""Pruning and objects a replay's identities must walk into: a callable object (a rotary
cache, a tokenizer with `__call__`), an object with `__slots__`, a deque, a
`functools.partial` that keeps a tensor, and a module's plain attributes (its config, a list
of cached keys, a config a call attaches, an input its forward keeps), and a callable
object whose model a method replaces with a copy.

An attacker review found each of these pruned while its test failed: the identity walk
stopped at anything callable, read `__dict__` only, opened tuples, lists and dicts only, and
gave a module only its tensors; and a module call's replay compared the places its
arguments held but not the module's own. Each change here fails its test: a replay that
walked less would let the failure escape.
"""

from __future__ import annotations

from soundness_world import copied_once, failing

LIB = {
    "lib/__init__.py": "",
    "lib/objects.py": '''
        import collections
        import copy
        import functools

        import torch


        class RopeCache:
            def __init__(self, n=8):
                self.cos = torch.cos(torch.arange(n, dtype=torch.float32))

            def __call__(self, n):
                return self.cos[:n]


        CACHE = RopeCache()
        DEFAULTS = {"eps": 1e-5}


        class Tokenizer:
            def __init__(self, words):
                self.vocab = {w: i for i, w in enumerate(words)}

            def __call__(self, text):
                return [self.vocab[w] for w in text.split()]


        class KVCache:
            __slots__ = ("k", "v")

            def __init__(self, n):
                self.k = torch.zeros(n, 2)
                self.v = torch.zeros(n, 2)


        class Block(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.config = {"eps": 1e-5}
                self.kv = [torch.zeros(2, 4)]
                self.past = None

            def forward(self, x):
                self.past = x.clone()
                return x * 2


        def make_history():
            return collections.deque(maxlen=4)


        def rope_cos(n):
            return CACHE.cos[:n].clone()


        def vocab(tok):
            return dict(tok.vocab)


        def keys(cache, n):
            return cache.k[:n].clone()


        def latest(history):
            return dict(history[-1])


        def make_loss_fn(weights):
            return functools.partial(torch.nn.functional.cross_entropy, weight=weights.clone())


        def export_config(model):
            return dict(model.config)


        def cached_keys(model, n):
            return model.kv[0][:n].clone()


        def attach_defaults(model):
            model.cfg = dict(DEFAULTS)


        class Trainer:
            def __init__(self, model):
                self.model = model

            def __call__(self, x):
                return self.model(x)

            def prepare(self):
                self.model.train()
    ''',
    "tests/test_objects.py": '''
        import torch

        from lib.objects import (CACHE, DEFAULTS, Block, KVCache, Tokenizer, Trainer,
                                 attach_defaults, cached_keys, export_config, keys, latest,
                                 make_history, make_loss_fn, rope_cos, vocab)


        def test_rope_cos_is_a_copy():
            rope_cos(3).zero_()
            assert CACHE(3).abs().sum() > 0


        def test_vocab_is_a_copy():
            tok = Tokenizer(["a", "b"])
            vocab(tok)["c"] = 2
            assert "c" not in tok.vocab


        def test_keys_are_a_copy():
            cache = KVCache(3)
            keys(cache, 2).fill_(1.0)
            assert cache.k.sum() == 0


        def test_latest_is_a_copy():
            history = make_history()
            history.append({"loss": 1.0})
            latest(history)["loss"] = 2.0
            assert history[-1]["loss"] == 1.0


        def test_loss_fn_keeps_its_weights():
            weights = torch.ones(3)
            loss_fn = make_loss_fn(weights)
            weights.zero_()  # the caller reuses its buffer
            assert loss_fn.keywords["weight"].sum() == 3


        def test_exported_config_is_a_copy():
            block = Block()
            export_config(block)["eps"] = 0.5
            assert block.config["eps"] == 1e-5


        def test_cached_keys_are_a_copy():
            block = Block()
            cached_keys(block, 1).fill_(3.0)
            assert block.kv[0].sum() == 0


        def test_attached_defaults_are_a_copy():
            block = Block()
            attach_defaults(block)
            block.cfg["eps"] = 0.5
            assert DEFAULTS["eps"] == 1e-5


        def test_the_kept_input_survives_buffer_reuse():
            block = Block()
            buffer = torch.ones(2, 4)
            block(buffer)
            buffer.zero_()
            assert block.past.sum() == 8


        def test_prepare_keeps_the_model():
            model = torch.nn.Linear(2, 2)
            trainer = Trainer(model)
            trainer.prepare()
            with torch.no_grad():
                model.weight.zero_()
            assert trainer.model.weight.abs().sum() == 0
    ''',
}

# (old, new, test): the new code shares what the old code copied.
SHARED = {
    "a callable global's tensor": ("CACHE.cos[:n].clone()", "CACHE.cos[:n]",
                                   "rope_cos_is_a_copy"),
    "a callable argument's dict": ("dict(tok.vocab)", "tok.vocab", "vocab_is_a_copy"),
    "a slotted argument's tensor": ("cache.k[:n].clone()", "cache.k[:n]", "keys_are_a_copy"),
    "a deque's element": ("dict(history[-1])", "history[-1]", "latest_is_a_copy"),
    "a partial that keeps its argument": ("weight=weights.clone()", "weight=weights.float()",
                                          "loss_fn_keeps_its_weights"),
    "a module's config": ("dict(model.config)", "model.config", "exported_config_is_a_copy"),
    "a module's list of tensors": ("model.kv[0][:n].clone()", "model.kv[0][:n]",
                                   "cached_keys_are_a_copy"),
    "a module default attached to a module": ("model.cfg = dict(DEFAULTS)",
                                              "model.cfg = DEFAULTS",
                                              "attached_defaults_are_a_copy"),
    "an input a forward keeps": ("self.past = x.clone()", "self.past = x",
                                 "the_kept_input_survives_buffer_reuse"),
    "a callable object's model replaced by a copy": (
        "self.model.train()\n", "self.model = copy.deepcopy(self.model).train()\n",
        "prepare_keeps_the_model"),
}


def node(name: str) -> str:
    return f"tests/test_objects.py::test_{name}"


recorded, lib = copied_once(LIB, passed=10)


def test_sharing_what_an_object_holds_keeps_the_test(lib):
    for old, new, _ in SHARED.values():
        lib.edit("lib/objects.py", old, new)
    tests = lib.decisions()
    wrong = {case: tests[node(name)].get("not_pruned") or tests[node(name)]["decision"]
             for case, (_, _, name) in SHARED.items()
             if tests[node(name)]["decision"] != "selected"}
    assert not wrong, wrong
    nodes = {node(name) for _, _, name in SHARED.values()}
    assert failing(lib, *nodes) == nodes


def test_copies_made_by_other_code_are_pruned(lib):
    """The same copies by other code: nothing to keep the tests for."""
    lib.edit("lib/objects.py", "CACHE.cos[:n].clone()", "CACHE.cos[:n].detach().clone()")
    lib.edit("lib/objects.py", "dict(tok.vocab)", "{**tok.vocab}")
    lib.edit("lib/objects.py", "cache.k[:n].clone()", "cache.k[:n].detach().clone()")
    lib.edit("lib/objects.py", "self.past = x.clone()", "self.past = x.detach().clone()")
    tests = lib.decisions()
    for name in ("rope_cos_is_a_copy", "vocab_is_a_copy", "keys_are_a_copy",
                 "the_kept_input_survives_buffer_reuse"):
        assert tests[node(name)]["decision"] == "skipped", tests[node(name)]
