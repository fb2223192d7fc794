"""GPU paths that are not defaults (issue 29): switched on by a key, kept out of the main path."""
