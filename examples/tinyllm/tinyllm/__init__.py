"""tinyllm: a small decoder-only language-model training framework.

The package is deliberately small but complete: a filtered and packed data
pipeline, a Llama-style transformer (RMSNorm, RoPE, SwiGLU, optional top-k
sparse attention), a fused Triton cross-entropy kernel with a torch fallback,
and a deterministic trainer with checkpoint/resume.
"""

__version__ = "0.3.0"
