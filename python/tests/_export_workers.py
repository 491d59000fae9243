"""Worker processes for the hub-export tests (test_export_hub.py): ranks of a job that saves a sharded state over Gloo
and then exports it, together, as a Hugging Face safetensors directory (spawned, so they live in a module)."""

from __future__ import annotations

import traceback

import numpy as np

# A transformer-like state: (name, global shape, dtype name, how the ranks split it).
LAYERS = 3
HIDDEN, FFN, VOCAB = 48, 80, 101


def hub_state():
    """The global arrays every rank derives its pieces from: bf16 matrices, f32 norms, an f16 head, an int64 buffer,
    and optimizer state that the export leaves out."""
    import ml_dtypes

    rng = np.random.default_rng(2024)
    bf16 = ml_dtypes.bfloat16
    out = {"model.embed_tokens.weight": rng.standard_normal((VOCAB, HIDDEN)).astype(bf16)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        out[p + "self_attn.qkv.weight"] = rng.standard_normal((3 * HIDDEN, HIDDEN)).astype(bf16)
        out[p + "mlp.up.weight"] = rng.standard_normal((FFN, HIDDEN)).astype(bf16)
        out[p + "mlp.down.weight"] = rng.standard_normal((HIDDEN, FFN)).astype(bf16)
        out[p + "norm.weight"] = rng.standard_normal(HIDDEN).astype(np.float32)
    out["model.norm.weight"] = rng.standard_normal(HIDDEN).astype(np.float32)
    out["lm_head.weight"] = rng.standard_normal((VOCAB, HIDDEN)).astype(np.float16)
    out["model.rotary.positions"] = np.arange(64, dtype=np.int64)
    for name in list(out):
        if name.endswith("mlp.up.weight"):
            out["optim.exp_avg." + name] = rng.standard_normal(out[name].shape).astype(np.float32)
    return out


def split(n, parts, k):
    base, extra = divmod(n, parts)
    lo = k * base + min(k, extra)
    return lo, lo + base + (1 if k < extra else 0)


def rank_pieces(rank, world, state):
    """This rank's view of `state` as distckpt leaves: 2-D tensors by rows (down projections by columns), 1-D ones
    replicated on every rank (written once)."""
    import distckpt

    pieces = {}
    for name, a in state.items():
        if a.ndim == 2 and name.endswith("down.weight"):
            c0, c1 = split(a.shape[1], world, rank)
            pieces[name] = distckpt.Shard(a[:, c0:c1], a.shape, (0, c0))
        elif a.ndim == 2:
            r0, r1 = split(a.shape[0], world, rank)
            pieces[name] = distckpt.Shard(a[r0:r1], a.shape, (r0, 0))
        else:
            pieces[name] = a
    return pieces


def save_rank(rank, world, rendezvous, path):
    import distckpt

    with distckpt.comm.gloo(rank, world, rendezvous=rendezvous, prefix="save", timeout=60) as comm:
        distckpt.save(rank_pieces(rank, world, hub_state()), path, comm=comm, timeout=60,
                      user_metadata={"framework": "test"})  # fmt: skip
    return None


def export_rank(rank, world, rendezvous, ckpt, out, rename, max_shard, fail_rank=-1):
    """Exports collectively; returns (this rank's progress total, its last reported count, the paths returned)."""
    import distckpt

    seen = [0, 0]

    def progress(done, total):
        if rank == fail_rank and done > 0:
            raise RuntimeError(f"rank {rank} gives up")
        seen[:] = [done, total]

    with distckpt.comm.gloo(rank, world, rendezvous=rendezvous, prefix="export", timeout=60) as comm:
        try:
            files = distckpt.export_safetensors(ckpt, out, max_shard, rename=rename, comm=comm, timeout=60,
                                                progress=progress, buffer_size="64KiB", io_threads=2)  # fmt: skip
        except Exception as e:  # noqa: BLE001 - the parent checks what each rank raised
            return {"error": type(e).__name__, "message": str(e)}
    return {"total": seen[1], "done": seen[0], "files": files}


def llama_config():
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, tie_word_embeddings=False)  # fmt: skip


def llama_state():
    """A tiny Llama's weights, the same on every rank (seeded), as numpy arrays."""
    import torch
    from transformers import LlamaForCausalLM

    torch.manual_seed(7)
    model = LlamaForCausalLM(llama_config())
    return {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}


def save_llama_rank(rank, world, rendezvous, path):
    """A training job's checkpoint of the tiny Llama: its weights under "module." (a wrapper's prefix) sharded by rows,
    plus optimizer state the hub has no use for."""
    import distckpt

    weights = llama_state()
    state = {"module": {}, "optim": {}}
    for name, a in weights.items():
        if a.ndim == 2:
            r0, r1 = split(a.shape[0], world, rank)
            state["module"][name] = distckpt.Shard(a[r0:r1], a.shape, (r0, 0))
            state["optim"][name] = distckpt.Shard(np.zeros_like(a[r0:r1]), a.shape, (r0, 0))
        else:
            state["module"][name] = a
    with distckpt.comm.gloo(rank, world, rendezvous=rendezvous, prefix="save", timeout=60) as comm:
        distckpt.save(state, path, comm=comm, timeout=60)
    return None


def run(fn, rank, world, args, results):
    """Runs ``fn(rank, world, *args)`` and puts ``(rank, error text or None, its return value)`` on ``results``."""
    try:
        results.put((rank, None, fn(rank, world, *args)))
    except BaseException:  # noqa: BLE001 - reported to the parent, which fails the test
        results.put((rank, traceback.format_exc(), None))
