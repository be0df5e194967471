"""specdec_t5x: exact speculative decoding (Leviathan et al., ICML 2023) for T5 in JAX."""

from specdec_t5x.algorithm.api import GenerateOutput, generate
from specdec_t5x.algorithm.config import DecodeConfig, GammaPolicy
from specdec_t5x.algorithm.stats import DecodeStats

__all__ = ['generate', 'GenerateOutput', 'DecodeConfig', 'GammaPolicy', 'DecodeStats']
