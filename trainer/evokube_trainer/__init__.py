"""evokube trainer: evolutionary reinforcement learning in JAX."""
