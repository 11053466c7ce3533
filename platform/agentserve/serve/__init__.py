"""Serving: the FastAPI ingress app (testable without Ray), model replicas, Ray Serve app."""
