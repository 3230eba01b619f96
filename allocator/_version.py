"""The package's version (``allocator.__version__``), in a module of its own so
that the modules below the package's face can read it (allocator/_core/clients.py)
without importing back up; the build reads it here too (pyproject.toml)."""

__version__ = "0.1.0"
