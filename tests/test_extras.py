"""What the plain install leaves out fails with the feature's name and the install command."""

import sys

import pytest

from specdec_t5x.integration import extras, hf_convert


def test_need_imports_what_is_installed():
  assert extras.need('json', 'Anything').dumps([1]) == '[1]'


def test_a_missing_extra_names_the_feature_and_the_install(monkeypatch, tmp_path):
  monkeypatch.setitem(sys.modules, 'safetensors.numpy', None)  # import raises ImportError
  (tmp_path / 'model.safetensors').write_bytes(b'')
  with pytest.raises(ImportError, match=r"Reading a Hugging Face checkpoint needs the Python "
                                        r"package 'safetensors'.*pip install -e \"\.\[test\]\""):
    hf_convert._read_hf_weights(str(tmp_path))  # pylint: disable=protected-access
