"""Model components: norms, rotary embeddings, attention, feed-forward, transformer."""
