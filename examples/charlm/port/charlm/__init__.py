"""charlm in JAX: the character-level MLP language model, ported from the PyTorch reference."""
