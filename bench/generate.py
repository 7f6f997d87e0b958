"""Whole-model generation benchmark: greedy decode over real nodes on loopback against one process.

    .venv/bin/python -m bench.generate [--quick] [--vocab N]

What is measured, and how. A synthetic Hugging Face-layout checkpoint of a 2-layer Qwen3-MoE with
Qwen3-30B-A3B's widths (hidden 2048, 32 query / 4 KV heads of 128, q/k RMSNorm, RoPE theta 1e6, 128
routed experts of d_ff 768, top-8 softmax with norm_topk_prob) is written to a temp dir: config.json
and model.safetensors with the dense tensors in BF16 under their hub names (embeddings, attention,
norms, the MoE gates, LM head), small-magnitude random (~1/sqrt(fan_in)). The 256 experts are not in
the checkpoint: they are Q8_0 expert payload files (core.formats.expert_payload.encode_expert_payload
of random f32 weights), the realistic format of a holder. The vocabulary is smaller than the real
151,936 by default (see VOCAB below: the LM head, the same work in both runs, would otherwise be
~80% of a decode step with 2 of the 48 layers and hide what is measured); `--vocab 151936` runs
the real one, and the run prints what the full-vocab LM head alone costs here.

Distributed: five real node processes (`tenzro node run`, testkit.nodes) on a redis-server of their
own, as bench/forward.py starts them: a router that loads the dense part and the gates
(`tenzro_moeLoadDense {model_id, checkpoint}`) and holds no expert, so every (token, expert) pair
crosses the wire, and four holders, expert e of each layer on holder e % 4 (replication 1: a speed
benchmark; failover is tested elsewhere). Once the router's shard map shows every expert held,
`tenzro_moeGenerate` runs a 32-token prompt to `max_new_tokens` (stop_at_eos false) with Q8_0 and
with f32 activations on the wire; TTFT and decode tokens/s are the generation record's
(`ttft_ms`: the prefill; `decode_tokens_per_s`: decoded tokens over the decode's wall time, which
includes writing each step to the record). The reference is the same model in this process:
apps.generation.model.WholeModel with ExpertRuntime.forward_local holding all 256 experts (the same
payloads), timed as greedy_generate runs it (one prefill, then one token a step through the KV
cache), interleaved with the distributed generations so drift hits both alike.

Where decode time goes, from the decode steps of the records (each step's `ms` and its MoE layers'
`ms`, each layer's holders' `compute_ms`, the compute their moe/execute answers reported): router
dense compute = step ms - sum of the MoE layers' ms; holder compute = per layer, the largest
compute_ms of one holder (the critical path, if the holders ran side by side); network = the rest of
each layer's ms (gate and plan on the router, codec, QUIC, the holders' queueing, combine); between
steps = decode wall time - sum of step ms (the record's writes). All processes share this machine's
cores, so the holders' compute competes with the router and the transport as it would on one host.
"""

from __future__ import annotations

import os

# As bench/forward.py: OpenBLAS threads that spin after each call would starve the node processes.
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse
import shutil
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

import testkit.nodes
from apps.catalog.checkpoint import CheckpointReader
from apps.catalog.shapes import shape_from_config
from apps.catalog.slicing import gate_payload_for_layer
from apps.generation.model import WholeModel
from apps.generation.spec import spec_from_config
from apps.generation.weights import dense_tensor_shapes, load_dense_weights
from core.experts.runtime import ExpertRuntime
from core.formats.expert_payload import encode_expert_payload
from testkit.checkpoints import f32_to_bf16_bits, write_checkpoint
from testkit.nodes import TOKEN, NodeProcess
from testkit.redis_server import RedisNode, private_redis

from .forward import N_HOLDERS, NODE_ENV, _stop
from .report import headline, print_table, write_results

MODEL_ID = "bench/qwen3-30b-a3b-2layers"
N_LAYERS, REAL_LAYERS = 2, 48
D_MODEL, D_FF, N_EXPERTS, TOP_K = 2048, 768, 128, 8
REAL_VOCAB = 151_936
# The LM head keeps the share of a decode step it has in the real 48-layer model: 151,936 x 2/48,
# rounded up to a multiple of 64. With the real vocab and 2 layers, the embedding and LM head are
# 2.5 GB of f32 on the router and ~80% of a decode step, the same in both runs: the ratio this
# benchmark exists for would mostly measure a matvec both sides share.
VOCAB = -(-REAL_VOCAB * N_LAYERS // REAL_LAYERS // 64) * 64  # 6336
PROMPT_TOKENS = 32
WIRES = ("q8_0", "f32")


def model_config(vocab: int) -> dict[str, Any]:
    """Qwen3-30B-A3B's config.json (Qwen/Qwen3-30B-A3B), 2 layers and `vocab` tokens."""
    return {
        "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "attention_bias": False,
        "attention_dropout": 0.0, "bos_token_id": min(151_643, vocab - 2), "eos_token_id": min(151_645, vocab - 1),
        "decoder_sparse_step": 1, "head_dim": 128, "hidden_act": "silu", "hidden_size": D_MODEL,
        "initializer_range": 0.02, "intermediate_size": 6144, "max_position_embeddings": 40_960,
        "max_window_layers": N_LAYERS, "mlp_only_layers": [], "moe_intermediate_size": D_FF, "norm_topk_prob": True,
        "num_attention_heads": 32, "num_experts": N_EXPERTS, "num_experts_per_tok": TOP_K,
        "num_hidden_layers": N_LAYERS, "num_key_value_heads": 4, "output_router_logits": False,
        "rms_norm_eps": 1e-6, "rope_scaling": None, "rope_theta": 1_000_000.0, "router_aux_loss_coef": 0.001,
        "sliding_window": None, "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_cache": True,
        "use_sliding_window": False, "vocab_size": vocab,
    }


# -- the checkpoint and the expert payloads ----------------------------------------------------------


def write_model(root: Path, vocab: int, rng: np.random.Generator) -> tuple[Path, list[Path]]:
    """(checkpoint folder, the 2 x 128 Q8_0 expert payload files)."""
    config = model_config(vocab)
    spec = spec_from_config(config, model_id=MODEL_ID)
    tensors: dict[str, tuple[str, np.ndarray]] = {}
    for name, shape in dense_tensor_shapes(spec).items():
        if name.endswith("norm.weight"):  # RMSNorm weights near 1, as trained ones are
            w = 1.0 + 0.05 * rng.standard_normal(shape, dtype=np.float32)
        else:
            w = rng.standard_normal(shape, dtype=np.float32) / np.float32(np.sqrt(shape[-1]))
        tensors[name] = ("BF16", f32_to_bf16_bits(w))
    for layer in spec.moe_layers:
        w = rng.standard_normal((N_EXPERTS, D_MODEL), dtype=np.float32) / np.float32(np.sqrt(D_MODEL))
        tensors[f"model.layers.{layer}.mlp.gate.weight"] = ("BF16", f32_to_bf16_bits(w))
    folder = write_checkpoint(root / "checkpoint", config, tensors)

    # Drawing 1.2 G normals would take minutes on 2 cores: every expert's projections are windows of
    # one pool at random offsets, with a random sign, then really quantized to Q8_0.
    pool = rng.standard_normal(1 << 24, dtype=np.float32)
    experts = root / "experts"
    experts.mkdir()
    paths = []
    for layer in spec.moe_layers:
        for e in range(N_EXPERTS):
            def w(rows: int, cols: int) -> np.ndarray:
                start = int(rng.integers(0, pool.size - rows * cols))
                sign = np.float32(rng.choice((-1.0, 1.0)) / np.sqrt(cols))
                return pool[start: start + rows * cols].reshape(rows, cols) * sign

            payload = encode_expert_payload(gate=w(D_FF, D_MODEL), up=w(D_FF, D_MODEL), down=w(D_MODEL, D_FF),
                                            quant="Q8_0", model_id=MODEL_ID, layer=layer, expert=e)
            path = experts / f"l{layer}e{e}.safetensors"
            path.write_bytes(payload)
            paths.append(path)
    return folder, paths


def holder_of(path: Path) -> int:
    """Expert e of every layer lives on holder e % 4 (file names l{layer}e{expert})."""
    return int(path.stem.split("e")[1]) % N_HOLDERS


# -- the one-process reference ------------------------------------------------------------------------


class Local:
    """WholeModel + ExpertRuntime.forward_local with all 256 experts: greedy_generate, timed per step."""

    def __init__(self, folder: Path, experts: list[Path], data_dir: Path) -> None:
        with CheckpointReader.open(folder) as reader:
            spec = spec_from_config(reader.config, model_id=MODEL_ID)
            weights = load_dense_weights(reader, spec)
            shape = shape_from_config(MODEL_ID, reader.config)
            gates = [gate_payload_for_layer(reader, shape, layer, model_id=MODEL_ID) for layer in spec.moe_layers]
        self.model = WholeModel(weights)
        self.runtime = ExpertRuntime(data_dir=data_dir, memory_budget_bytes=16 << 30)
        for payload in gates:
            self.runtime.gate_load(payload=payload)
        for path in experts:
            self.runtime.expert_load(payload=path.read_bytes(), stored_at=path)
        self.moe_s = 0.0

    def _moe(self, layer: int, x: np.ndarray) -> np.ndarray:
        start = time.perf_counter()
        y = self.runtime.forward_local(model_id=MODEL_ID, layer=layer, hidden=x)
        self.moe_s += time.perf_counter() - start
        return y

    def generate(self, prompt: list[int], max_new: int) -> dict[str, Any]:
        """greedy_generate's steps, each timed: (tokens, ttft_ms, decode tokens/s, decode step ms and MoE ms)."""
        cache = self.model.new_cache()
        ids, tokens, steps = np.asarray(prompt, dtype=np.int64), [], []
        for _ in range(max_new):
            self.moe_s, start = 0.0, time.perf_counter()
            logits = self.model.forward(ids, cache, self._moe, last_only=True)
            tokens.append(int(np.argmax(logits[-1])))
            steps.append(((time.perf_counter() - start) * 1e3, self.moe_s * 1e3))
            ids = np.array([tokens[-1]], dtype=np.int64)
        decode = steps[1:]
        return {"tokens": tokens, "ttft_ms": steps[0][0],
                "decode_tokens_per_s": len(decode) / (sum(s for s, _ in decode) / 1e3) if decode else None,
                "decode_step_ms": [s for s, _ in decode], "decode_moe_ms": [m for _, m in decode]}


# -- the distributed side -----------------------------------------------------------------------------


def start_nodes(work: Path, redis_host: str, nodes: list[NodeProcess]) -> None:
    """Router, then four holders, on databases 1-5 of a Redis server of their own, started in parallel.
    Each is in `nodes` before it starts, so that a start that fails still stops the others."""
    # Five nodes compiling and migrating at once on a shared 2-core machine can take longer than the
    # tests' 90 s: testkit.nodes reads this at each wait.
    testkit.nodes.START_TIMEOUT_S = max(testkit.nodes.START_TIMEOUT_S, 300.0)
    router = RedisNode(data_dir=work / "router", redis_db=1, redis_host=redis_host)
    nodes.append(router)
    nodes.extend(RedisNode(data_dir=work / f"holder{i}", redis_db=2 + i, redis_host=redis_host, peers=[router.url])
                 for i in range(N_HOLDERS))
    with ThreadPoolExecutor(len(nodes)) as pool:
        list(pool.map(lambda n: n.start(**NODE_ENV), nodes))


def load(nodes: list[NodeProcess], folder: Path, experts: list[Path]) -> dict[str, Any]:
    """Dense part and gates on the router; each holder loads its experts, all at once."""
    router, holders = nodes[0], nodes[1:]
    work: dict[int, list[Path]] = {i: [] for i in range(N_HOLDERS)}
    for path in experts:
        work[holder_of(path)].append(path)

    def load_holder(i: int) -> None:
        for path in work[i]:
            answer = holders[i].rpc("tenzro_moeExpertLoad", {"path": str(path)}, token=TOKEN, timeout=120)
            assert "result" in answer, answer

    with ThreadPoolExecutor(N_HOLDERS + 1) as pool:
        dense = pool.submit(router.rpc, "tenzro_moeLoadDense", {"model_id": MODEL_ID, "checkpoint": str(folder)},
                            token=TOKEN, timeout=600)
        list(pool.map(load_holder, range(N_HOLDERS)))
        answer = dense.result()
    assert "result" in answer, answer
    return answer["result"]


def wait_converged(router: NodeProcess, n_experts: int, timeout_s: float = 180.0) -> float:
    """Seconds until the router's shard map shows every expert held, each holder with a QUIC door."""
    started, seen = time.monotonic(), 0
    while time.monotonic() - started < timeout_s:
        shard = router.result("tenzro_moeShardMap", {"model_id": MODEL_ID})["holders"]
        seen = len(shard)
        if seen == n_experts and all(e["holders"] and all(h["quic_endpoint"] for h in e["holders"]) for e in shard):
            return time.monotonic() - started
        time.sleep(1.0)
    raise RuntimeError(f"the router saw {seen} of {n_experts} experts held within {timeout_s} s")


def generate(router: NodeProcess, prompt: list[int], max_new: int, wire: str) -> dict[str, Any]:
    answer = router.rpc("tenzro_moeGenerate", {"model_id": MODEL_ID, "prompt_ids": prompt, "max_new_tokens": max_new,
                                               "stop_at_eos": False, "wire": wire, "wait": True},
                        token=TOKEN, timeout=600)
    assert "result" in answer, str(answer)[:500]
    record = answer["result"]
    assert record["state"] == "done", record.get("error")
    return record


@dataclass
class Split:
    """Decode time summed over decode steps (ms): where it went."""

    wall: float = 0.0  # decoded tokens / decode_tokens_per_s
    steps: float = 0.0
    moe_layers: float = 0.0
    holder_critical: float = 0.0  # per layer, the largest compute_ms of one holder
    holder_total: float = 0.0  # every holder's compute_ms
    unreported: int = 0  # holders whose answers carried no compute_ms

    def add(self, record: dict[str, Any]) -> None:
        decode = [s for s in record["steps"] if s["phase"] == "decode"]
        if not decode:
            return
        self.wall += len(decode) / record["decode_tokens_per_s"] * 1e3
        for step in decode:
            self.steps += step["ms"]
            for layer in step["layers"]:
                self.moe_layers += layer["ms"]
                computes = [h.get("compute_ms") for h in layer["holders"]]
                self.unreported += sum(c is None for c in computes)
                present = [c for c in computes if c is not None]
                self.holder_critical += max(present, default=0.0)
                self.holder_total += sum(present)

    def shares(self) -> dict[str, float]:
        return {"router_dense": (self.steps - self.moe_layers) / self.wall,
                "holder_compute": self.holder_critical / self.wall,
                "network": (self.moe_layers - self.holder_critical) / self.wall,
                "between_steps": (self.wall - self.steps) / self.wall}


# -- main ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    quick: bool
    vocab: int
    max_new: int
    rounds: int  # each round: one local generation, then one distributed per wire

    @classmethod
    def of(cls, quick: bool, vocab: int) -> Plan:
        return cls(quick, vocab, 8, 1) if quick else cls(quick, vocab, 16, 3)


def lm_head_ms(vocab: int, repeats: int = 5) -> float:
    """Median ms of one token's LM head (f32 [1, 2048] @ [vocab, 2048].T) in this process."""
    head = np.full((vocab, D_MODEL), 0.01, dtype=np.float32)
    x = np.ones((1, D_MODEL), dtype=np.float32)
    samples = []
    for _ in range(repeats + 1):
        start = time.perf_counter()
        x @ head.T
        samples.append(time.perf_counter() - start)
    return statistics.median(samples[1:]) * 1e3


def variants(local: Local, holder: NodeProcess, plan: Plan, full_head_ms: float, head_ms: float) -> dict[str, Any]:
    status = holder.result("tenzro_moeExpertStatus", {"live": True})
    blas = np.__config__.CONFIG.get("Build Dependencies", {}).get("blas", {})
    return {
        "local backend": f"{local.runtime.backend.name} (cpu kernel {local.runtime.backend.cpu_kernel})",
        "holder backend": f"{status['backend']} (cpu kernel {status['cpu_kernel']})",
        "experts": f"Q8_0 payloads, {N_LAYERS} x {N_EXPERTS} of d_ff {D_FF}, d_model {D_MODEL}, top-{TOP_K}",
        "dense weights": "BF16 in the checkpoint, f32 in memory (router and reference)",
        "f32 matmul": f"numpy {np.__version__}, BLAS {blas.get('name', '?')} {blas.get('version', '')}".strip(),
        "vocab_size": (f"{plan.vocab:,}" if plan.vocab == REAL_VOCAB else
                       f"{plan.vocab:,} (DEVIATION from the real {REAL_VOCAB:,}: {REAL_VOCAB:,} x {N_LAYERS}/"
                       f"{REAL_LAYERS} layers, so the LM head keeps its real share of a step)"),
        "LM head per token here": f"{head_ms:.3g} ms at vocab {plan.vocab:,}; {full_head_ms:.3g} ms at {REAL_VOCAB:,} "
                                  "(the same in both runs)",
        "replication": f"1 (expert e on holder e % {N_HOLDERS}; the router holds none)",
        "prompt / new tokens": f"{PROMPT_TOKENS} / {plan.max_new}, {plan.rounds} round(s), stop_at_eos false",
        "cores": os.cpu_count(),
        "load average (1, 5, 15 min) at start": " ".join(f"{x:.1f}" for x in os.getloadavg()),
    }


def run(plan: Plan, work: Path, redis_host: str, nodes: list[NodeProcess]) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    t0 = time.monotonic()
    folder, experts = write_model(work / "model", plan.vocab, rng)
    t_written = time.monotonic()
    start_nodes(work, redis_host, nodes)
    router, holders = nodes[0], nodes[1:]
    t_started = time.monotonic()
    dense = load(nodes, folder, experts)
    t_loaded = time.monotonic()
    local = Local(folder, experts, work / "local")
    converged = wait_converged(router, len(experts))
    setup = {"written_s": t_written - t0, "nodes_started_s": t_started - t_written, "loaded_s": t_loaded - t_started,
             "converged_after_s": converged, "dense_bytes": dense["dense_bytes"]}
    print(f"setup: checkpoint + {len(experts)} Q8_0 payloads {setup['written_s']:.0f} s, {len(nodes)} nodes started "
          f"{setup['nodes_started_s']:.0f} s, dense part ({dense['dense_bytes'] / 1e6:.0f} MB f32) and experts loaded "
          f"{setup['loaded_s']:.0f} s, every expert seen by the router {converged:.0f} s later")
    facts = variants(local, holders[0], plan, lm_head_ms(REAL_VOCAB), lm_head_ms(plan.vocab))
    print_table("Variants that ran", ["what", "value"], [[k, v] for k, v in facts.items()])

    prompt = [int(t) for t in rng.integers(0, plan.vocab, PROMPT_TOKENS)]
    local.generate(prompt, 2)  # warm: kernels, page cache
    for wire in WIRES:  # warm: QUIC connections, the hedging book's per-holder latencies
        generate(router, prompt, 2, wire)
    runs: dict[str, list[dict[str, Any]]] = {"local": [], **{w: [] for w in WIRES}}
    for _ in range(plan.rounds):
        runs["local"].append(local.generate(prompt, plan.max_new))
        for wire in WIRES:
            runs[wire].append(generate(router, prompt, plan.max_new, wire))
    return {"quick": plan.quick, "vocab_size": plan.vocab, "setup": setup, "variants": facts,
            **tables(runs, plan), "load_average_at_end": os.getloadavg()}


def tables(runs: dict[str, list[dict[str, Any]]], plan: Plan) -> dict[str, Any]:
    ref = runs["local"]
    ref_ttft = statistics.median(r["ttft_ms"] for r in ref)
    ref_tps = statistics.median(r["decode_tokens_per_s"] for r in ref)
    want = ref[0]["tokens"]
    rows = [["one process", "-", ref_ttft, "1.00x", ref_tps, ref_tps, "1.00x", f"{len(want)}/{len(want)}"]]
    record: dict[str, Any] = {"local": {"ttft_ms": ref_ttft, "decode_tokens_per_s": ref_tps, "runs": ref}}
    splits: dict[str, Split] = {}
    for wire in WIRES:
        recs = runs[wire]
        ttft = statistics.median(r["ttft_ms"] for r in recs)
        tps = statistics.median(r["decode_tokens_per_s"] for r in recs)
        # decode tok/s from the steps alone (leaving out the record's writes between steps)
        steps_tps = statistics.median(
            (len(r["steps"]) - 1) / (sum(s["ms"] for s in r["steps"][1:]) / 1e3) for r in recs)
        same = min(sum(a == b for a, b in zip(r["tokens"], want, strict=True)) for r in recs)
        rows.append([f"router + {N_HOLDERS} holders", wire, ttft, f"{ttft / ref_ttft:.2f}x",
                     tps, steps_tps, f"{tps / ref_tps:.2f}x", f"{same}/{len(want)}"])
        splits[wire] = split = Split()
        for r in recs:
            split.add(r)
        record[wire] = {"ttft_ms": ttft, "decode_tokens_per_s": tps, "decode_tokens_per_s_steps": steps_tps,
                        "one_process_ttft_ms": ref_ttft, "one_process_decode_tokens_per_s": ref_tps,
                        "tokens_equal_local": same, "split_ms": split.__dict__, "shares": split.shares(),
                        "records": recs}
    print_table(
        f"1. Greedy generation, Qwen3-MoE with Qwen3-30B-A3B widths, {N_LAYERS} layers, vocab {plan.vocab:,}, "
        f"Q8_0 experts: {PROMPT_TOKENS}-token prompt, {plan.max_new} new tokens; medians over {plan.rounds} "
        "round(s); distributed = tenzro_moeGenerate's record (decode tok/s includes the record's writes between "
        "steps; 'steps only' leaves them out); ratios distributed / one process",
        ["run", "wire", "TTFT ms", "TTFT ratio", "decode tok/s", "decode tok/s (steps only)", "decode ratio",
         "tokens = one process (worst round)"], rows)

    ref_steps = sum(sum(r["decode_step_ms"]) for r in ref)
    ref_moe = sum(sum(r["decode_moe_ms"]) for r in ref)
    split_rows = [["one process", "-", ref_steps / sum(len(r["decode_step_ms"]) for r in ref),
                   f"{(ref_steps - ref_moe) / ref_steps:.0%}", f"{ref_moe / ref_steps:.0%} (forward_local)", "-", "-",
                   "-"]]
    for wire, s in splits.items():
        sh = s.shares()
        n_steps = sum(len(r["steps"]) - 1 for r in runs[wire])
        split_rows.append([f"router + {N_HOLDERS} holders", wire, s.wall / n_steps, f"{sh['router_dense']:.0%}",
                           f"{sh['holder_compute']:.0%} (all holders: {s.holder_total / n_steps:.3g} ms/token)",
                           f"{sh['network']:.0%}", f"{sh['between_steps']:.0%}",
                           s.unreported or "-"])
    print_table(
        "2. Decode time per token and where it went: router dense compute = step ms - Σ MoE layer ms; holder "
        "compute = per MoE layer the largest compute_ms one holder reported (the critical path), summed; network "
        "= the rest of the MoE layers' ms (gate and plan, codec, QUIC, queueing, combine); between steps = the "
        "record's writes; shares of the decode wall time",
        ["run", "wire", "ms / token", "router dense", "holder compute", "network + dispatch", "between steps",
         "holders without compute_ms"], split_rows)
    return {"generation": record}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="8 new tokens, 1 round (a smoke run)")
    parser.add_argument("--vocab", type=int, default=VOCAB,
                        help=f"vocab_size (default {VOCAB:,}; {REAL_VOCAB:,} is Qwen3-30B-A3B's, 2.5 GB f32 "
                             "of embedding and LM head on the router and in this process)")
    args = parser.parse_args()
    plan = Plan.of(args.quick, args.vocab)
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="tenzro-bench-generate-"))
    nodes: list[NodeProcess] = []
    try:
        with private_redis() as redis_host:
            try:
                results = run(plan, work, redis_host, nodes)
                results["wall_s"] = time.monotonic() - started
                print(f"\nload average (1, 5, 15 min) at the end: {' '.join(f'{x:.1f}' for x in os.getloadavg())}; "
                      f"ran {results['wall_s']:.0f} s")
                write_results("generate", results, [
                    h for wire, g in results["generation"].items() if wire != "local" for h in (
                        headline(f"generation TTFT, {wire} wire", g["ttft_ms"], "ms", reference="one process",
                                 reference_value=g["one_process_ttft_ms"]),
                        headline(f"generation decode, {wire} wire", g["decode_tokens_per_s"], "tokens/s",
                                 reference="one process", reference_value=g["one_process_decode_tokens_per_s"]))])
            finally:
                with ThreadPoolExecutor(max(1, len(nodes))) as pool:
                    list(pool.map(_stop, nodes))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
