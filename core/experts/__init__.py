"""The expert-host runtime: experts held in a byte-bounded memory tier over a disk tier
(tiered_cache), computed by a backend behind one seam (backends: the CPU's compiled and numba
kernels; gpu/: CUDA and WGSL devices; selection picks one), gates that route rows (gating), and
the throughput meter. `runtime.ExpertRuntime` is the face the worker uses.
"""
