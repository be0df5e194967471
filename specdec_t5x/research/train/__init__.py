"""Training the demo family and draft heads: one loop, its data, objective, optimiser and resumable state."""
