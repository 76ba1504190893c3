"""Tests of the JAX trainer."""
