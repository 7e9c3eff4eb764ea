"""Measurements of trained runs and of the hardware: attention analysis and the throughput benchmark."""
