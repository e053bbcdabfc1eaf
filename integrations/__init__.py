"""Framework integrations (Lightning, Hugging Face, Accelerate) that drive the same agent.

Importing this package imports no framework; each integration module imports its own.
"""

__all__: list[str] = []
