"""Test helper, run as its own process: a Megatron-style tensor-parallel block on CPU ranks (gloo), dumped by llmcheck.

The model is an embedding, then two pre-norm blocks of attention and a SwiGLU MLP, built
from one seeded full-size model and sharded the way Megatron-LM shards it:

* ``q_proj``/``k_proj``/``v_proj``, ``gate_proj``/``up_proj`` are column-parallel: each rank
  holds the rows of its heads or features, so their outputs are split along the last dim;
* ``attn.core`` runs the attention of the rank's own heads;
* ``o_proj``/``down_proj`` are row-parallel: the inner ``local`` linear gives a partial sum,
  the module all-reduces it (its output is whole on every rank).

``--world 1`` runs the unsharded golden in one process. ``--defect-rank R --defect-module M``
scales rank R's shard of module M's weight by 1.05 (a wrong shard loaded on one rank).

    python tp_dump_run.py OUT --world 4 [--defect-rank 1 --defect-module layers.0.mlp.up_proj]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

HIDDEN, HEADS, FFN, VOCAB, LAYERS = 32, 4, 64, 64, 2
INPUT_IDS = [[1, 7, 42, 9, 3, 11]]


class ColumnParallelLinear(nn.Module):
    """The rows of a full linear's weight that this rank computes (its output features)."""

    def __init__(self, full: nn.Linear, rank: int, world: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(full.weight.detach().chunk(world, dim=0)[rank].clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight)


class RowParallelLinear(nn.Module):
    """The columns of a full linear's weight that this rank holds; the partial sums are all-reduced."""

    def __init__(self, full: nn.Linear, rank: int, world: int) -> None:
        super().__init__()
        columns = full.weight.detach().chunk(world, dim=1)[rank].clone()
        self.local = nn.Linear(columns.shape[1], columns.shape[0], bias=False)
        with torch.no_grad():
            self.local.weight.copy_(columns)
        self.world = world

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        partial_sum = self.local(x)
        reduced = partial_sum.clone()  # all_reduce works in place; the dumped partial sum stays as it was
        if self.world > 1:
            dist.all_reduce(reduced)
        return reduced


class CoreAttention(nn.Module):
    """Causal attention over this rank's heads: [batch, seq, heads*dim] in and out."""

    def __init__(self, local_heads: int) -> None:
        super().__init__()
        self.local_heads = local_heads

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        batch, seq, width = q.shape
        split = [t.view(batch, seq, self.local_heads, width // self.local_heads).transpose(1, 2) for t in (q, k, v)]
        out = F.scaled_dot_product_attention(*split, is_causal=True)
        return out.transpose(1, 2).reshape(batch, seq, width)


class Attention(nn.Module):
    def __init__(self, full: dict[str, nn.Linear], rank: int, world: int) -> None:
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj = (ColumnParallelLinear(full[n], rank, world) for n in "qkv")
        self.core = CoreAttention(HEADS // world)
        self.o_proj = RowParallelLinear(full["o"], rank, world)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.o_proj(self.core(self.q_proj(x), self.k_proj(x), self.v_proj(x)))


class MLP(nn.Module):
    def __init__(self, full: dict[str, nn.Linear], rank: int, world: int) -> None:
        super().__init__()
        self.gate_proj = ColumnParallelLinear(full["gate"], rank, world)
        self.up_proj = ColumnParallelLinear(full["up"], rank, world)
        self.down_proj = RowParallelLinear(full["down"], rank, world)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, full: dict[str, nn.Linear], rank: int, world: int) -> None:
        super().__init__()
        self.input_norm = nn.RMSNorm(HIDDEN)
        self.attn = Attention(full, rank, world)
        self.post_norm = nn.RMSNorm(HIDDEN)
        self.mlp = MLP(full, rank, world)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.input_norm(x))
        return x + self.mlp(self.post_norm(x))


class TensorParallelModel(nn.Module):
    def __init__(self, rank: int, world: int) -> None:
        super().__init__()
        torch.manual_seed(0)  # every rank builds the same full weights, then keeps its shard
        self.embed = nn.Embedding(VOCAB, HIDDEN)
        shapes = {
            "q": (HIDDEN, HIDDEN),
            "k": (HIDDEN, HIDDEN),
            "v": (HIDDEN, HIDDEN),
            "o": (HIDDEN, HIDDEN),
            "gate": (HIDDEN, FFN),
            "up": (HIDDEN, FFN),
            "down": (FFN, HIDDEN),
        }
        full_layers = [{name: nn.Linear(*shape, bias=False) for name, shape in shapes.items()} for _ in range(LAYERS)]
        self.layers = nn.ModuleList(Block(full, rank, world) for full in full_layers)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(input_ids)
        for layer in self.layers:
            x = layer(x)
        return x


def run_rank(
    rank: int, world: int, out: Path, init_file: str, defect_rank: int | None, defect_module: str | None
) -> None:
    """Build this rank's shard of the model, run one forward under llmcheck's capture."""
    from llmcheck import DumpConfig, register_hook

    torch.set_num_threads(1)
    if world > 1:
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    model = TensorParallelModel(rank, world).eval()
    if defect_module is not None and rank == defect_rank:
        module = dict(model.named_modules())[defect_module]
        target = module.local if isinstance(module, RowParallelLinear) else module
        with torch.no_grad():
            target.weight.mul_(1.05)
    with register_hook(model, DumpConfig(dump_path=str(out), token_range=[0], tensor_part=2)), torch.no_grad():
        model(torch.tensor(INPUT_IDS))
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--world", type=int, default=1)
    parser.add_argument("--defect-rank", type=int)
    parser.add_argument("--defect-module")
    args = parser.parse_args()
    if args.world == 1:
        run_rank(0, 1, args.out, "", args.defect_rank, args.defect_module)
        return
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as scratch:
        mp.spawn(
            run_rank,
            args=(args.world, args.out, str(Path(scratch) / "init"), args.defect_rank, args.defect_module),
            nprocs=args.world,
            join=True,
        )


if __name__ == "__main__":
    main()
