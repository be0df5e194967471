"""Stable public path of the cheap draft sources (specdec_t5x.algorithm.drafts)."""
from specdec_t5x.algorithm.drafts import BigramDraft, CopyDraft, SparseBigramDraft, UnigramDraft

__all__ = ['UnigramDraft', 'BigramDraft', 'SparseBigramDraft', 'CopyDraft']
