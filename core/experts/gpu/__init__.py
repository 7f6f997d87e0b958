"""GPU compute backends behind the runtime's compute seam (core/experts/backends.py).

ops.py        the DeviceOps protocol a device implements, DeviceError, DeviceUnavailable
backend.py    GpuBackend: the host form and CPU fallback, the device-memory tier above it
cuda.py       CUDA via CuPy: cuBLAS GEMM for dense experts, GGML block dequant kernels
wgsl.py       WGSL via wgpu-py: compute shaders for dense and block-quantized experts

Neither CuPy nor wgpu is a default dependency: each device module imports its library
inside `open_device()` and raises DeviceUnavailable with the reason when it cannot.
"""
