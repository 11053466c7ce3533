"""Serving engines: vLLM (production, CPU and GPU builds) and a fake for unit tests."""
