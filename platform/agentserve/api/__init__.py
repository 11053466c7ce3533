"""OpenAI-compatible API pieces: errors, auth (API key -> tenant), quotas, request/response
shaping and SSE. No Ray here: the ingress app (agentserve.serve.ingress) composes them."""
