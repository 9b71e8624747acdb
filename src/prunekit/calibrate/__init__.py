"""The calibration runtime: statistics of layer inputs gathered by forward hooks, gradients for
Taylor, and the driver that calibrates a model whole or one block at a time.

Statistics are running sums, updated batch by batch: never a list of activations. Linears
that read the same input tensor (query, key and value; gate and up) share one accumulator,
found by identity in the first batch. The tokens a batch's ``attention_mask`` (a
mapping's, or a tuple's item the model's forward names so) masks out (padding) take no
part: each batch's mask (``batch_masks``) goes to ``InputStatistics.new_batch``, which
keeps only the kept tokens' rows of every token-shaped layer input, whole-model or block
by block. In sequential mode the model runs once up to its first block, whose inputs are
kept; then each block is calibrated on them, pruned, and run again to give the next
block's inputs: only one block's statistics exist at a time.

Across data-parallel ranks, each calibrating on its own batches, a `Reduce` (given from
above: prunekit.distributed.stats.Reducer over a process group) sums the statistics where
they are made, at the end of `calibrate` and `block_statistics`: every rank then holds
those of all the batches. An error a rank meets in calibration is held until that
reduction, where `Reduce.settle` makes every rank raise it (the protocol of
prunekit/distributed/agree.py). This package imports nothing of torch.distributed.

One job a module: `reduce` (the ranks), `batches` (running and checking batches),
`statistics` (the hooks and their running sums), `block_inputs` (a model's blocks and their
inputs), `driver` (`calibrate`, `block_statistics`), `gradients` (Taylor's), and
`layer_matrices` (each layer's weight seen as matrices, the view the statistics take).
The criteria of `prunekit.criteria` and `prunekit.structure.scoring` read what it gathers.
"""

from prunekit.calibrate.batches import (
    batch_error,
    batch_list,
    calls_back,
    evaluating,
    example_error,
    is_callers,
    run_batch,
    runs_op,
)
from prunekit.calibrate.block_inputs import (
    BlockCalls,
    Inputs,
    block_calls,
    block_list,
    cacheless,
    called_as,
    capture_block_inputs,
    next_inputs,
    own_hidden,
    run_block,
    with_hidden,
)
from prunekit.calibrate.driver import Wanted, block_statistics, calibrate
from prunekit.calibrate.gradients import (
    gradient_targets,
    gradients,
    output_loss,
    parameter,
    requiring_grad,
)
from prunekit.calibrate.reduce import Reduce, agree
from prunekit.calibrate.statistics import (
    InputStatistics,
    Stop,
    TokenCall,
    batch_masks,
    called_twice,
    input_features,
)

__all__ = [
    "BlockCalls",
    "InputStatistics",
    "Inputs",
    "Reduce",
    "Stop",
    "TokenCall",
    "Wanted",
    "agree",
    "batch_error",
    "batch_list",
    "batch_masks",
    "block_calls",
    "block_list",
    "block_statistics",
    "cacheless",
    "calibrate",
    "called_as",
    "called_twice",
    "calls_back",
    "capture_block_inputs",
    "evaluating",
    "example_error",
    "gradient_targets",
    "gradients",
    "input_features",
    "is_callers",
    "next_inputs",
    "output_loss",
    "own_hidden",
    "parameter",
    "requiring_grad",
    "run_batch",
    "run_block",
    "runs_op",
    "with_hidden",
]
