"""The 3D training step: data x pipeline x tensor parallelism on one `Mesh`.

Megatron-LM's PTD-P (Narayanan et al., 2021, arXiv 2104.04473, section 2.3) composes the
three axes, and each one needs only its own communicator (`HybridTrainer` says how).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from functools import partial

import torch
from torch import Tensor, nn

from impls.collectives import all_reduce, broadcast, check_algorithm
from impls.comm import TrafficCounters
from impls.data_parallel import OptimizerFactory, shard_batch
from impls.hybrid.mesh import Mesh
from impls.models import GPT, split_into_stages
from impls.pipeline import PipelineExecutor, StepResult, build_plan
from impls.pipeline.tied import EmbeddingGroup
from impls.tensor_parallel import parallelize_gpt, vocab_parallel_cross_entropy

__all__ = ["HybridStepResult", "HybridTrainer"]


@dataclass
class HybridStepResult:
    """What one `HybridTrainer.step` did on this rank."""

    loss: float  # the whole batch's mean loss before the update, the same on every rank
    pipeline: StepResult  # this rank's pipeline record (its loss: this replica's share only)
    dp_traffic: TrafficCounters = field(default_factory=TrafficCounters)  # gradient averaging


class HybridTrainer:
    """Trains this rank's TP shard of one pipeline stage of `model` on `mesh`.

    `model` is the same full GPT on every rank (built from one seed); it is sharded in
    place and this rank keeps stage `mesh.coords()["pp"]` of it. `optimizer` receives the
    stage's parameters and returns a `torch.optim.Optimizer`. A step takes the global batch
    of `global_batch_size` sequences of `seq_len` tokens (default: the model's), the same
    on every rank: replica d trains on its d-th 1/dp, in `microbatches` micro-batches, with
    pipeline `schedule`; gradients are averaged over dp with `all_reduce` `algorithm`.

    Every check runs before any process group is touched, naming the key: the mesh against
    the model (`Mesh.check_model`), the batch split, and the two things the step does not
    coordinate across ranks — dropout masks (TP ranks would draw different ones for their
    replicated activations). A tied embedding (`GPTConfig.tie_embeddings`) split over pp
    stages has its gradient summed over the first and last stage's ranks (Megatron's
    embedding group, `impls.pipeline.tied`) before the dp average: each TP rank sums its
    own vocabulary shard with the same TP position on the other end of the pipeline.

    - **TP** (`tp` group): every block is split by `impls.tensor_parallel.parallelize_gpt` —
      heads and MLP columns/rows, vocab-parallel embedding and LM head. The activations
      between blocks come out of `g` replicated on every TP rank of a stage.
    - **PP** (`pp` group): the TP-sharded GPT is cut into `pp` stages
      (`impls.models.split_into_stages`) and run by `impls.pipeline.PipelineExecutor` with any
      one-stage-per-rank schedule (1F1B by default). A pp group holds the ranks with the same
      dp and tp coordinates, so each TP rank sends its (replicated) activation to the TP rank
      with the same tp coordinate in the next stage: t parallel copies of the pipeline, one per
      tp coordinate, that never talk to each other through the executor. The last stage's loss
      is `vocab_parallel_cross_entropy` over the TP group, so the logits are never gathered.
    - **DP** (`dp` group): each pipeline replica trains on its 1/dp share of the batch;
      after the pipeline step the gradients (summed over micro-batches, each scaled by 1/M by
      the executor) are averaged over dp with one all-reduce of all of them, so every replica
      holds the gradient of the whole batch's mean loss and takes the same optimizer step.

    Sharded parameters need no TP reduction: each TP rank owns its shard's gradient, and the
    replicated ones (LayerNorms, position embedding, row biases) get identical gradients on
    every TP rank because their inputs and output gradients are replicated.
    """

    def __init__(
        self,
        model: GPT,
        mesh: Mesh,
        optimizer: OptimizerFactory,
        *,
        global_batch_size: int,
        microbatches: int,
        seq_len: int | None = None,
        schedule: str = "1f1b",
        algorithm: str = "ring",
    ) -> None:
        cfg = model.cfg
        seq_len = cfg.seq_len if seq_len is None else seq_len
        _check_config(model, mesh, global_batch_size, microbatches, seq_len, algorithm)
        plan = build_plan(schedule, mesh.size("pp"), microbatches)
        self.mesh, self.algorithm = mesh, algorithm
        self.batch_shape = (global_batch_size, seq_len)  # the executor's buffers are sized by it
        self.tp_comm = mesh.communicator("tp")
        self.pp_comm = mesh.communicator("pp")
        self.dp_comm = mesh.communicator("dp")
        self.model = parallelize_gpt(model, self.tp_comm)
        self.stage_index = self.pp_comm.rank
        self.stage = split_into_stages(self.model, mesh.size("pp"))[self.stage_index]
        self.params = [p for p in self.stage.parameters() if p.requires_grad]
        self.optimizer = optimizer(self.params)
        micro_batch = global_batch_size // (mesh.size("dp") * microbatches)
        self.executor = PipelineExecutor(
            self.pp_comm,
            {self.stage_index: self.stage},
            plan,
            num_stages=mesh.size("pp"),
            microbatches=microbatches,
            loss_fn=partial(vocab_parallel_cross_entropy, comm=self.tp_comm),
            activation_shape=(micro_batch, seq_len, cfg.d_model),
        )
        self.embedding_group = None
        if cfg.tie_embeddings and mesh.size("pp") > 1:
            self.embedding_group = EmbeddingGroup.of_executor(self.executor)

    def named_parameters(self) -> list[tuple[str, nn.Parameter]]:
        """This rank's trained parameters under their names in the full model."""
        mine = {id(p) for p in self.params}
        return [(n, p) for n, p in self.model.named_parameters() if id(p) in mine]

    def step(
        self,
        inputs: Tensor,
        targets: Tensor,
        *,
        compute_guard: Callable[[], AbstractContextManager] | None = None,
    ) -> HybridStepResult:
        """One training step on the global batch; every rank of the mesh calls it together.

        `compute_guard` is handed to the pipeline executor, which enters it around each of
        this rank's compute actions (a profiler's hook: see `PipelineExecutor.step`).
        """
        for key, batch in (("inputs", inputs), ("targets", targets)):
            if tuple(batch.shape) != self.batch_shape:
                raise ValueError(
                    f"{key} has shape {tuple(batch.shape)}; this trainer was built for "
                    f"(global_batch_size, seq_len) = {self.batch_shape}"
                )
        dp, dp_rank = self.mesh.size("dp"), self.dp_comm.rank
        for p in self.params:
            p.grad = None
        result = self.executor.step(
            shard_batch(inputs, dp_rank, dp),
            shard_batch(targets, dp_rank, dp),
            compute_guard=compute_guard,
        )
        if self.embedding_group is not None:  # the head's part meets the embedding's
            self.embedding_group.all_reduce_gradients()
        # The replica's loss travels with its gradients: one all-reduce averages both.
        replica_loss = torch.tensor([result.loss or 0.0], device=self.dp_comm.device)
        with self.dp_comm.measure() as traffic:
            loss = self._average_over_dp(replica_loss)
        self.optimizer.step()
        if self.mesh.size("pp") > 1:  # only the last stage computed it
            broadcast(loss, self.pp_comm, src=self.mesh.size("pp") - 1)
        return HybridStepResult(loss=loss.item(), pipeline=result, dp_traffic=traffic)

    def _average_over_dp(self, replica_loss: Tensor) -> Tensor:
        """Average every gradient and the loss over the dp group in one flat all-reduce."""
        for p in self.params:
            if p.grad is None:  # unused this step: every replica must still send its slot
                p.grad = torch.zeros_like(p)
        if self.mesh.size("dp") == 1:
            return replica_loss
        grads = [p.grad for p in self.params]
        flat = torch.cat([g.reshape(-1) for g in grads] + [replica_loss])
        all_reduce(flat, self.dp_comm, op="avg", algorithm=self.algorithm)
        offset = 0
        for g in grads:
            g.copy_(flat[offset : offset + g.numel()].view_as(g))
            offset += g.numel()
        return flat[offset:]


def _check_config(
    model: GPT, mesh: Mesh, global_batch_size: int, microbatches: int, seq_len: int, algorithm: str
) -> None:
    cfg = model.cfg
    if mesh.size("sp") != 1:
        raise ValueError(
            f"HybridTrainer: sp={mesh.size('sp')}: the 3D step splits no sequence; allowed sp: 1"
        )
    mesh.check_model(
        n_heads=cfg.n_heads, d_model=cfg.d_model, vocab=cfg.vocab_size, n_layers=cfg.n_layers
    )
    check_algorithm(algorithm)
    for key, value in {
        "global_batch_size": global_batch_size,
        "microbatches": microbatches,
        "seq_len": seq_len,
    }.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"HybridTrainer: {key}={value!r} must be an int >= 1")
    if seq_len > cfg.seq_len:
        raise ValueError(
            f"HybridTrainer: seq_len={seq_len} exceeds GPTConfig.seq_len={cfg.seq_len}"
        )
    shares = mesh.size("dp") * microbatches
    if global_batch_size % shares:
        raise ValueError(
            f"HybridTrainer: global_batch_size={global_batch_size} must be divisible by "
            f"dp={mesh.size('dp')} x microbatches={microbatches} = {shares}, so that every "
            "micro-batch of every replica is equal and the averaged loss is the batch mean"
        )
    if cfg.dropout > 0:
        raise ValueError(
            f"GPTConfig.dropout={cfg.dropout}: the 3D step draws no coordinated dropout "
            "masks across TP ranks; allowed: 0.0"
        )
