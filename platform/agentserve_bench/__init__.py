"""Benchmarks and the offline autoscaling lab, beside the runtime (agentserve).

`agentserve bench speculative | sampling | autoscale | overhead` print and save measured
figures (docs/benchmarks.md, docs/benchmarks/*.json); autoscale/ holds the trace
generator, the discrete-event simulator that drives agentserve.autoscale.policy, the
policy comparison and the latency-model fit. This package imports agentserve; agentserve
never imports it (its CLI finds `bench` through the `agentserve.commands` entry point).
"""
