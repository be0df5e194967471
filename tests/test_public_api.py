"""The import paths outside code relies on (ARCHITECTURE.md, "Public paths") stay put and name the
layered objects themselves, so gin files and user code see one class, not a copy."""

import importlib

import pytest

PUBLIC = {
    'specdec_t5x': ('generate', 'specdec_t5x.algorithm.api'),
    'specdec_t5x.network': ('T5Config Transformer', 'specdec_t5x.algorithm.network'),
    'specdec_t5x.drafts': ('UnigramDraft BigramDraft SparseBigramDraft CopyDraft',
                           'specdec_t5x.algorithm.drafts'),
    'specdec_t5x.checkpoints': ('load_params save_params', 'specdec_t5x.integration.checkpoints'),
    'specdec_t5x.tasks': ('register_tasks', 'specdec_t5x.integration.tasks'),
    'specdec_t5x.models': ('SpeculativeEncoderDecoderModel', 'specdec_t5x.integration.models'),
    'specdec_t5x.infer': ('main infer', 'specdec_t5x.integration.infer'),
}


@pytest.mark.parametrize('public', sorted(PUBLIC))
def test_public_names_are_the_layered_objects(public):
  names, home = PUBLIC[public]
  mod, real = importlib.import_module(public), importlib.import_module(home)
  for name in names.split():
    assert getattr(mod, name) is getattr(real, name), f'{public}.{name}'


def test_importing_public_tasks_registers_the_tasks():
  import seqio  # pylint: disable=g-import-not-at-top
  tasks = importlib.import_module('specdec_t5x.tasks')
  for name in tasks.TASK_NAMES:
    assert name in seqio.TaskRegistry.names()
