"""Benchmarks of diffusers_var_accel (FLOP counts, latency); run them as scripts or import their functions."""
