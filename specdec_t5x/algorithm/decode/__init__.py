"""The decoding loops: their shared core, the chain (Algorithm 1), drafting, draft trees."""
