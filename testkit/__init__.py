"""Synthetic inputs shared by the tests and the benchmarks: tiny Hugging Face checkpoints, a
loopback file server with Range support, random GGML blocks. Never imported by the node."""
