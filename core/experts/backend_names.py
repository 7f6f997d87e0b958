"""The names of the compute backends an operator can choose (TENZRO_EXPERT_BACKEND); no imports,
so the CLI can offer them without loading numpy (core/experts/selection.py does the choosing)."""

CPU_CHOICES = ("cpu", "cpu-numba", "cpu-numpy")
GPU_CHOICES = ("cuda", "wgsl")
CHOICES = ("auto", *CPU_CHOICES, *GPU_CHOICES)
