"""Names users choose from, kept in one light module (the CLI builds its parsers without importing torch)."""

METHODS = ("auto", "target", "speculative", "cdlh", "cdsl")
"""Decoders of ``Generator.generate(method=...)``."""
ENGINES = ("llguidance", "outlines-core")
"""Constraint engines, the order ``backend="auto"`` tries them in for most specs."""
BACKENDS = ("auto", *ENGINES)
"""What ``compile(backend=...)`` and the CLI's ``--backend`` accept."""
