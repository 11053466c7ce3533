"""The offline autoscaling lab: seeded traces (trace.py), a discrete-event simulator that
runs the live policy on the same inputs (simulate.py), the policy comparison behind
docs/autoscaling.md (compare.py, bench.py) and the latency-model fit (fit_bench.py)."""
