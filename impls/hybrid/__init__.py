"""Hybrid parallelism: the validated device mesh (DP x PP x TP x SP) and the 3D step.

`Mesh` lays ranks out on the grid, validates the degrees against the world size and the
model, and hands out one `Communicator` per axis over explicit process groups that it
owns. `HybridTrainer` trains a GPT on a mesh: tensor-parallel inside each pipeline stage,
pipelined over pp, gradients averaged over dp.
"""

from impls.hybrid.mesh import AXES, Mesh
from impls.hybrid.step import HybridStepResult, HybridTrainer

__all__ = ["AXES", "HybridStepResult", "HybridTrainer", "Mesh"]
