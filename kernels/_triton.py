"""Triton, or a stand-in where it is not installed (a laptop, macOS, a CPU-only CI image).

The torch references serve CPU tensors without Triton, so FastCI's pruning and the CLI work
anywhere torch does; only launching a kernel needs the real thing, and says so.
"""

from __future__ import annotations

try:
    import triton
    import triton.language as tl
    from triton.runtime.jit import JITFunction

    AVAILABLE = True
except ImportError:  # pragma: no cover - exercised where Triton is absent
    AVAILABLE = False

    class _Placeholder:
        """Any attribute (tl.float32, tl.constexpr): a name, for module-level tables."""

        def __init__(self, name: str) -> None:
            self._name = name

        def __getattr__(self, name: str) -> "_Placeholder":
            return _Placeholder(f"{self._name}.{name}")

        def __call__(self, *_args, **_kwargs) -> "_Placeholder":
            return self  # tl.constexpr(C) at module level

        def __repr__(self) -> str:
            return f"<{self._name}: Triton is not installed>"

    class _Kernel:
        def __init__(self, fn) -> None:
            self.fn = fn

        def __getitem__(self, grid):
            raise RuntimeError("Triton is not installed: `pip install triton` to launch "
                               f"{self.fn.__name__} (the torch path serves CPU tensors)")

    class _TritonStandIn(_Placeholder):
        @staticmethod
        def jit(fn=None, **_):
            return _Kernel(fn) if fn is not None else _Kernel

        @staticmethod
        def cdiv(a: int, b: int) -> int:
            return -(-a // b)

    triton = _TritonStandIn("triton")
    tl = _Placeholder("triton.language")
    JITFunction = _Kernel

__all__ = ["AVAILABLE", "JITFunction", "tl", "triton"]
