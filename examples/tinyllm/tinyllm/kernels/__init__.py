"""Fused kernels (Triton) with torch reference implementations."""
