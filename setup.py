"""Build the optional C extensions; everything else is in pyproject.toml.

* core.experts._quant_matmul (core/experts/_quant_matmul.c): integer SIMD matmuls and
  dequantizers over GGML blocks for quantized experts; without it the expert backend falls
  back to the numba kernels (core/experts/numba_matmul.py).
* core.quantization._kquant_encoders (core/quantization/_kquant_encoders.c): llama.cpp's
  reference Q4_K/Q6_K encoders; without it core.quantization uses its numpy encoders, which
  write the same bytes.  -ffp-contract=off keeps every multiply and add separately rounded,
  as the reference's bytes require.
* core.quantization._q8_rows (core/quantization/_q8_rows.c): the Q8_0 activation codec of the
  wire in one pass per direction; without it core.quantization.activations uses the numpy/numba
  path, which writes the same bytes.
* apps.receipts._q8_sketch (apps/receipts/_q8_sketch.c): the receipt sketch of Q8_0 answers;
  without it apps.receipts.topk_kernel's numba kernel computes the same bytes.

All are optional at build time (no compiler: the install still succeeds) and at run time.
"""

from setuptools import Extension, setup

setup(ext_modules=[
    Extension("core.experts._quant_matmul", ["core/experts/_quant_matmul.c"], extra_compile_args=["-O3"],
              optional=True),
    Extension("core.quantization._kquant_encoders", ["core/quantization/_kquant_encoders.c"],
              depends=["core/quantization/f16_bits.h"],
              extra_compile_args=["-O3", "-ffp-contract=off", "-fno-math-errno", "-pthread"],
              extra_link_args=["-pthread"], optional=True),
    Extension("core.quantization._q8_rows", ["core/quantization/_q8_rows.c"], depends=["core/quantization/f16_bits.h"],
              extra_compile_args=["-O3", "-ffp-contract=off", "-fno-math-errno"], optional=True),
    Extension("apps.receipts._q8_sketch", ["apps/receipts/_q8_sketch.c"], extra_compile_args=["-O3"], optional=True),
])
