"""The CPU backend's kernels for the decode path (x86-64, XLA FFI), and what chooses them.

Three words, one meaning each:

* storage dtype: how packed weights are held. Float32 panels, or bfloat16 panels for
  weights that bfloat16 holds exactly (a model restored from a bfloat16 checkpoint): half
  the bytes, widened back to the very float32 values.
* arithmetic: what multiplies. Float32 arithmetic (`f32.py`: float32 activations times
  float32 or bfloat16-stored panels, fused multiply-adds in float32) or bfloat16 arithmetic
  (`bf16.py`: `vdpbf16ps`, bfloat16 x bfloat16 -> float32 over pair panels, kernel mode
  'packed_bf16' for bfloat16 networks).
* bfloat16 attention: a bfloat16 network's cached attention with T5X's bfloat16 roundings
  (`attention.cached_attention_bf16`).

A packed layer's entry names its format (`matmul.PackedKernel.panel_format`: 'f32_panels',
'bf16_panels', 'pair_panels'); `matmul.apply` dispatches on it. Which format each layer
gets is decided in one place, `modes.panel_format`, from the kernel mode, the network's
dtype and the layer's role; `packing.py` builds the decode variables from it.

Modules: `build.py` (compiling `kernels/*.cc` into one library, the FFI registration, why
the kernels are off), `modes.py` (kernel modes and the trace-time switches), `f32.py` and
`bf16.py` (the two arithmetics), `matmul.py` (the format tag and the one dispatch),
`row_kernels.py` (argmax, softmax and draw per logits row), `attention.py` (cached
attention), `packing.py` (the decode variables per params), `info.py` (/proc/cpuinfo).
"""
