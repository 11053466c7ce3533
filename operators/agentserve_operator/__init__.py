"""Kubernetes operator for AgentServe resources."""
