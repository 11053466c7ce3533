"""agentserve: serve LLM agents fast (DFlash speculative decoding on vLLM + Ray Serve)."""

__version__ = "0.1.0"
