"""Stable public path of the T5 network (specdec_t5x.algorithm.network)."""
from specdec_t5x.algorithm.network import T5_1_1_SIZES, T5Config, Transformer, t5_1_1_config

__all__ = ['T5Config', 'Transformer', 'T5_1_1_SIZES', 't5_1_1_config']
