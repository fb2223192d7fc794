"""A document's way through the daemon: its admission, its run from source to sidecars, the retry
rule, duplicates, what becomes of its source once done, and the hooks told of it.
"""
