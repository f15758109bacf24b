"""Costs: convert FLOPs, bytes and message volumes into seconds on a System."""
