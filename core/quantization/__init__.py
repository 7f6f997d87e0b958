"""GGML block formats (Q8_0, Q4_K, Q6_K; F32/F16/BF16 dense), one kernel class per format in
`registry.KERNELS`: quantize and dequantize whole tensors, byte-exact with llama.cpp's encoders
and gguf's decoder; Q8_0 rows for activations on the wire (activations); quant presets (presets).
"""
