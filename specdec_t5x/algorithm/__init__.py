"""The algorithm layer: T5 network, sampling rule, decoding loops, drafts, theory.

Imports only jax, flax, numpy (and this layer); no seqio, gin, TensorFlow or torch.
"""
