"""Serving engines: vLLM (production, CPU and GPU builds) and the registry of engine names
(registry.py); the fake for tests lives in agentserve_bench.fake_engine."""
