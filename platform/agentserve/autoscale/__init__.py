"""SLA autoscaling: latency model, pure policy, Ray Serve adapter, trace-replay simulator."""
