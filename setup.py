"""specdec_t5x: exact speculative decoding (Leviathan et al., 2023) for T5 / T5X in JAX.

Install:   pip install -e .            (the package and the demo: README command 1)
Tests:     pip install -e ".[test]"    (adds the test and peer stacks: README command 2, .ci/run)
"""
from setuptools import find_packages, setup

setup(
    name="specdec_t5x",
    version="0.1.0",
    description="Exact speculative decoding for T5X encoder-decoder models in JAX.",
    packages=find_packages(include=["specdec_t5x", "specdec_t5x.*"]),
    # The CPU kernels' sources: compiled into one library on first use (algorithm/cpu/build.py).
    package_data={"specdec_t5x.algorithm.cpu": ["kernels/*.cc", "kernels/*.h"]},
    python_requires=">=3.10",
    install_requires=[
        "jax>=0.4.30",
        "flax>=0.8",
        "optax",
        "gin-config",
        "orbax-checkpoint",
        "seqio",
        "tensorflow-datasets",
        "sentencepiece",
        "numpy",
        "msgpack",
        "tensorstore",
        "etils[epath]",  # gs:// (and local) model files, as T5X and Orbax read them
        "tqdm",
        "sacrebleu",
        "rouge-score",
        "matplotlib",
    ],
    extras_require={
        # torch is pinned to the CPU build: an unpinned torch pulls a multi-GB CUDA build.
        # pytest-xdist: the suite runs on both cores (-n 2); -m "not slow and not timing"
        # keeps the fast set (tests/conftest.py registers the markers).
        # gcp-storage-emulator, cryptography: a local GCS for gs:// checkpoints
        # (tests/gcs_emulator.py, tests/test_remote_checkpoints.py). ctranslate2: the
        # peer benchmark's CPU engine (compare_decodes.py --experiment=peers, tests/test_peers.py).
        "test": ["pytest", "pytest-xdist", "scipy", "torch==2.13.0", "transformers", "safetensors",
                 "gcp-storage-emulator", "cryptography", "ctranslate2"],
    },
)
