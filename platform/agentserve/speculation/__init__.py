"""Speculative decoding: which method, k and dtype (choice, calibration), how many tokens to
draft at each batch size (schedule), the hybrid n-gram + DFlash proposer plugged into vLLM
(hybrid_drafter, hybrid_block, hybrid_stats), and acceptance counted by batch size
(by_batch). Modules import what they need; this package imports nothing."""
