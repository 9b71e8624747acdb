"""Which entry point each hostile case exercises (by its test file), and the cases that broke
before their fixes, each with the bug it showed (kept: the tally at the end of a run prints
them, and a case listed here must pass now)."""

from __future__ import annotations

# test file -> the entry point its cases call
ENTRY_POINTS = {
    "test_export": "export",
    "test_shrink": "shrink / prunekit shrink",
    "test_streamed": "prune_streamed / prunekit prune",
    "test_damping": "prune_channels(damping='auto')",
    "test_depth": "blocks / load_compacted",
}

# a part of a case's id -> the bug it found (fixed since); found by running the suite against
# the sources before the fixes
BROKE: dict[str, str] = {
    # export (prunekit.export.api, hfcheck, gguf_check, companions)
    "[hf-inputs-float-nan]": "raw torch error from the check's forward (float ids)",
    "[hf-inputs-out-of-vocab]": "raw IndexError 'index out of range in self'",
    "[hf-inputs-negative]": "raw IndexError 'index out of range in self'",
    "[hf-inputs-empty]": "raw reshape error from the model",
    "[hf-inputs-complex]": "raw torch error (complex ids)",
    "[hf-inputs-meta]": "wrong diagnosis: 'outputs differ by inf' (meta ids)",
    "[hf-inputs-sparse]": "raw 'reshape is not implemented for sparse tensors'",
    "[gguf-inputs-meta]": "raw 'Tensor.item() cannot be called on meta tensors'",
    "[gguf-inputs-sparse]": "raw 'Could not run aten::min ... SparseCPU'",
    "[meta-hf]": "raw 'Cannot copy out of meta tensor' from safetensors",
    "[meta-gguf]": "raw 'Cannot copy out of meta tensor' from the writer",
    "[meta-deci]": "raw 'Cannot copy out of meta tensor'",
    "[nan-weights-gguf]": "wrong diagnosis: 'read back has other values' for NaN weights",
    "[hf-over-a-file]": "a file at path silently replaced by the folder",
    "[deci-over-a-file]": "a file at path silently replaced by the folder",
    "[gguf-over-a-folder]": "raw IsADirectoryError after all the work",
    "[hf-no-parent]": "raw FileNotFoundError from tempfile",
    "[gguf-no-parent]": "raw FileNotFoundError from tempfile",
    "[hf-is-the-source]": "the source folder silently replaced by the export",
    "[hf-inside-the-source]": "output written inside the source folder",
    "[gguf-inside-the-source]": "output written inside the source folder",
    "[hf-holds-the-source]": "the folder holding the source replaced whole",
    "[hf-empty-path]": "raw 'Device or resource busy' (path '' is the working folder)",
    "test_a_damaged_gguf_source_is_refused": "a GGUF reader's error without naming source",
    # shrink (prunekit.tools.shrink, sources)
    "[kinds-str]": "kinds='channels' split into letters, the message showing them",
    "[calibration-blank]": "blank passages accepted, refused only after loading the model",
    "[index-map-a-list]": "raw AttributeError 'list' object has no attribute 'values'",
    "[index-map-not-str]": "raw TypeError from a path join",
    "[shard-truncated]": "raw SafetensorError from transformers",
    "[weights-truncated]": "raw SafetensorError from transformers",
    "[weights-empty]": "raw SafetensorError from transformers",
    "[out-not-writable]": "raw OSError, after the whole pruning",
    # streamed (prunekit.io.streamed)
    "[batch-mask-all-zero]": "calibration with every attention_mask zero accepted",
    "[config-garbage]": "transformers' OSError, not a CheckpointError",
    # prune_channels (prunekit.structure.prune)
    "[auto-empty-batch]": "compensation from an empty batch: silently no update",
    "[mask-all-zero]": "compensation with every attention_mask zero accepted",
    # depth (prunekit.structure.depth.scores, states)
    "[criterion-complex]": "raw 'value cannot be converted to type double' (complex score)",
    "[inputs-meta]": "wrong diagnosis: 'its forward does more with its blocks' (meta inputs)",
}


def entry_point(nodeid: str) -> str:
    """The entry point of the case `nodeid` (its test file's)."""
    name = nodeid.split("::")[0].rsplit("/", 1)[-1].removesuffix(".py")
    return ENTRY_POINTS.get(name, name)
