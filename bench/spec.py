"""The benchmark state: a transformer-like training state (bf16 weights + two fp32 Adam moments per parameter).

Sharded tensors (embeddings, qkv, mlp.up, lm_head) are split by rows on the saving ranks and by columns on the
loading ranks; replicated ones (attn.out, mlp.down, norms: about a quarter of the bytes) are whole on every saving
rank (data parallel) and split by rows on the loading ranks. Dimensions are multiples of 12 so that 4 and 3 ranks
split them evenly. bench_worker.cc and peers.py read the same spec file, so both systems move identical bytes.

Spec file: one tensor per line, "<name> <dtype> <replicated 0|1> <dim0> [<dim1>]".
"""

DTYPE_BYTES = {"BF16": 2, "F32": 4}


def make_spec(target_bytes):
    """Tensors whose total size is close to target_bytes (at least one layer)."""
    d = 1536 if target_bytes >= 1 << 30 else 768 if target_bytes >= 256 << 20 else 384
    v = 21 * d
    per_layer = 10 * 12 * d * d  # 12 d^2 elements per layer, 10 bytes per element (bf16 + 2 x f32)
    layers = max(1, round((target_bytes - 10 * 2 * v * d) / per_layer))
    out = []

    def param(name, shape, replicated):
        out.append(("model." + name, "BF16", replicated, shape))
        out.append(("optim.exp_avg." + name, "F32", replicated, shape))
        out.append(("optim.exp_avg_sq." + name, "F32", replicated, shape))

    param("embed.weight", (v, d), False)
    for layer in range(layers):
        p = "layers.%d." % layer
        param(p + "attn.qkv.weight", (3 * d, d), False)
        param(p + "attn.out.weight", (d, d), True)
        param(p + "mlp.up.weight", (4 * d, d), False)
        param(p + "mlp.down.weight", (d, 4 * d), True)
        param(p + "norm1.weight", (d,), True)
        param(p + "norm2.weight", (d,), True)
    param("final_norm.weight", (d,), True)
    param("lm_head.weight", (v, d), False)
    return out


def nbytes(entry):
    _, dtype, _, shape = entry
    n = DTYPE_BYTES[dtype]
    for s in shape:
        n *= s
    return n


def write_spec(path, spec):
    with open(path, "w") as f:
        for name, dtype, rep, shape in spec:
            f.write("%s %s %d %s\n" % (name, dtype, int(rep), " ".join(str(s) for s in shape)))


def read_spec(path):
    out = []
    with open(path) as f:
        for line in f:
            if not line.strip() or line.startswith("#"):
                continue
            parts = line.split()
            out.append((parts[0], parts[1], parts[2] == "1", tuple(int(x) for x in parts[3:])))
    return out


def part(shape, dim, n, k):
    """Box (offsets, lengths) of part k of n along dim: torch.chunk's rule, as DTensor's Shard uses."""
    size = -(-shape[dim] // n)
    lo = min(shape[dim], size * k)
    hi = min(shape[dim], size * (k + 1))
    off = [0] * len(shape)
    ln = list(shape)
    off[dim] = lo
    ln[dim] = hi - lo
    return off, ln


def save_box(entry, world, rank):
    _, _, rep, shape = entry
    return ([0] * len(shape), list(shape)) if rep else part(shape, 0, world, rank)


def load_box(entry, world, rank):
    _, _, rep, shape = entry
    return part(shape, 0, world, rank) if rep else part(shape, len(shape) - 1, world, rank)
