"""Stable public path of the T5X-facing model (specdec_t5x.integration.models)."""
from specdec_t5x.integration.models import SpeculativeEncoderDecoderModel

__all__ = ['SpeculativeEncoderDecoderModel']
