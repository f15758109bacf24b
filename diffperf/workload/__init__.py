"""Workload: what one device computes and communicates, per layer and per step (no hardware)."""
