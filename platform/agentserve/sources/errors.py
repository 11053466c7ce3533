"""The errors of model resolution, in a module of their own so that both resolvers raise
them without importing each other: sources.models (bundled model, local dirs) hands Hugging
Face ids to hub, and hub raises the same ModelNotFoundError (an import circle otherwise).
Import them from here or from agentserve.sources.models (which re-exports them).
"""

from __future__ import annotations

__all__ = ["ModelConversionError", "ModelNotFoundError"]


class ModelNotFoundError(LookupError):
    """A model source names nothing usable here (no download is ever attempted)."""


class ModelConversionError(RuntimeError):
    """Converting the bundled GGUF produced something other than the expected model."""
