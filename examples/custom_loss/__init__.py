"""A policy-loss surrogate plugged in by import path (see README.md)."""
