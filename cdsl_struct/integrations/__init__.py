"""Bridges to the tools users already have.

- ``outlines_types``: Outlines output types (and the Python type forms Outlines accepts) as specs.
- ``transformers_processor``: a ``LogitsProcessor`` and ``StoppingCriteria`` for ``model.generate``.

Each module imports its third-party package lazily, so importing this package costs nothing.
"""
