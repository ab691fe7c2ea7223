"""A group baseline plugged in by import path (see README.md)."""
