"""Examples that can be imported from the repository root (``examples.<name>``)."""
