"""A plugin module that fails while importing (for the "error inside the user's module" message)."""

raise RuntimeError("boom while importing plugins_broken")
