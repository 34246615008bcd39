"""Data pipeline: tokenizer, quality filters, packing and sampling."""
