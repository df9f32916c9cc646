"""extforge: CUDA extensions for PyTorch, built, audited, published and locked as conda packages."""

__version__ = "0.1.0"
