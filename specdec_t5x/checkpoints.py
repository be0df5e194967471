"""Stable public path of checkpoint reading/writing (specdec_t5x.integration.checkpoints)."""
from specdec_t5x.integration.checkpoints import load_params, save_params

__all__ = ['load_params', 'save_params']
