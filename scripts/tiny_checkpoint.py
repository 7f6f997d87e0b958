"""Write the tiny whole Qwen3-MoE of the README's quick start and serve it over HTTP with Range requests.

    .venv/bin/python -m scripts.tiny_checkpoint var/tiny-qwen3-moe --serve 8800

The model is testkit.checkpoints.qwen3_moe_whole, the one tests/e2e/test_walkthrough.py runs: a
Hugging Face layout (config.json + model.safetensors, hub tensor names, F32), 2 layers, each an MoE
of 4 experts with top-2 routing, d_model = d_ff = 256 (so q4_k_m stores real Q4_K/Q6_K blocks),
vocabulary 64, random weights, and beside them the text files a hub checkpoint carries
(testkit.text_files: a word-level tokenizer.json of made-up words "ba", "be", …, a ChatML chat
template, a generation_config.json), so text prompts and /v1 work too. `--serve PORT` serves the
folder on 127.0.0.1:PORT until Ctrl-C (Python's http.server does not answer Range requests, which
checkpoint readers need); without it, give the folder itself to `--checkpoint`.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from testkit.checkpoints import FileServer, qwen3_moe_whole
from testkit.text_files import write_text_files


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="where to write config.json and model.safetensors")
    parser.add_argument("--serve", type=int, metavar="PORT", help="then serve the folder on 127.0.0.1:PORT")
    args = parser.parse_args()
    model = qwen3_moe_whole(args.folder)
    write_text_files(model.root, vocab_size=model.config["vocab_size"])
    print(f"wrote {model.root.resolve()} ({sum(f.stat().st_size for f in model.root.iterdir())} bytes)", flush=True)
    if args.serve is None:
        return
    with FileServer(model.root, port=args.serve) as server:
        print(f"serving {server.url} (Ctrl-C to stop)", flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()
