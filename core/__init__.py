"""The node's Django-free libraries: what the Django apps (apps/) and the CLI (cli/) build on.

Nothing here imports Django, Channels, Celery, ninja or a QUIC library's asyncio layer beyond
core/transport's adapter (import contracts `pure-cores` and `core-layers` in pyproject.toml).
Top to bottom (docs/architecture.md, "The layers"):

* experts/    the expert runtime: tiered cache, compute backends (CPU kernels, GPU devices), gating
* shardmap/   the shard map and dispatch planner over the gossip view
* transport/  QUIC frames, peers and connection pool (the peer door's wire)
* formats/    the bytes other nodes and files read: expert and gate payloads, activation rows
* metrics.py  the node's Prometheus metrics
* quantization/  GGML block formats (Q8_0, Q4_K, Q6_K), their encoders and decoders
* logs.py     logging with secrets redacted
* errors.py, durable_files.py, env.py   application errors, atomic files, settings from the environment
"""
