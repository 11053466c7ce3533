"""Reliability scenarios: faults (replica killed, engine crash or hang, drain, flood,
soak), hostile input (explicit cases, hypothesis fuzz) and tenant isolation, on the fake
engine and on real vLLM replicas. Tests under tests/unit and tests/integration call these
functions and assert on their Outcome; run.py records their figures for the docs."""
