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
    "test_dropin": "drop-in (torch prune)",
    "test_sequential_kinds": "prune_model(sequential=True) / prune_streamed",
    "test_saving": "save / load (pruned, compact)",
    "test_recovery": "recover",
    "test_distill": "Distiller / recover",
    "test_reconstruct": "reconstruct_blocks",
    "test_gradual": "GradualPruner.load_state_dict",
    "test_hf_resume": "GradualPruningCallback (resume)",
    "test_oneshot": "prune_model",
    "test_structure": "prune_channels / compact / rotate_hidden",
    "test_selection": "patterns/sharded/report",
    "test_distributed": "global pruning over ranks",
    "test_io": "prune_sharded / open_tensors",
    "test_schedule": "GradualPruner (resume)",
    "test_experts": "prune_channels(experts=...)",
    "test_patterns": "patterns / criteria",
    "test_rotation": "rotate_hidden",
    "test_cli": "prunekit prune / demo",
    "test_whole": "prune_model (selection)",
    "test_calibrated": "prune_model (calibrated) / compensate",
    "test_budget": "Budget / prune_channels(budget=)",
    "test_onnx": "export(format='onnx') inputs",
}

# "<test file>::<case id, or test name>" -> the bug it found (fixed since); found by running
# the suite against the sources before the fixes
BROKE: dict[str, str] = {
    # export (prunekit.export.api, hfcheck, gguf_check, companions)
    "test_export::[hf-inputs-float-nan]": "raw torch error from the check's forward (float ids)",
    "test_export::[hf-inputs-out-of-vocab]": "raw IndexError 'index out of range in self'",
    "test_export::[hf-inputs-negative]": "raw IndexError 'index out of range in self'",
    "test_export::[hf-inputs-empty]": "raw reshape error from the model",
    "test_export::[hf-inputs-complex]": "raw torch error (complex ids)",
    "test_export::[hf-inputs-meta]": "wrong diagnosis: 'outputs differ by inf' (meta ids)",
    "test_export::[hf-inputs-sparse]": "raw 'reshape is not implemented for sparse tensors'",
    "test_export::[gguf-inputs-meta]": "raw 'Tensor.item() cannot be called on meta tensors'",
    "test_export::[gguf-inputs-sparse]": "raw 'Could not run aten::min ... SparseCPU'",
    "test_export::[meta-hf]": "raw 'Cannot copy out of meta tensor' from safetensors",
    "test_export::[meta-gguf]": "raw 'Cannot copy out of meta tensor' from the writer",
    "test_export::[meta-deci]": "raw 'Cannot copy out of meta tensor'",
    "test_export::[nan-weights-gguf]": "misdiagnosed: 'read back has other values' (NaN weights)",
    "test_export::[hf-over-a-file]": "a file at path silently replaced by the folder",
    "test_export::[deci-over-a-file]": "a file at path silently replaced by the folder",
    "test_export::[gguf-over-a-folder]": "raw IsADirectoryError after all the work",
    "test_export::[hf-no-parent]": "raw FileNotFoundError from tempfile",
    "test_export::[gguf-no-parent]": "raw FileNotFoundError from tempfile",
    "test_export::[hf-is-the-source]": "the source folder silently replaced by the export",
    "test_export::[hf-inside-the-source]": "output written inside the source folder",
    "test_export::[gguf-inside-the-source]": "output written inside the source folder",
    "test_export::[hf-holds-the-source]": "the folder holding the source replaced whole",
    "test_export::[hf-empty-path]": "raw 'Device or resource busy' (path '' is the working folder)",
    "test_export::test_a_damaged_gguf_source_is_refused": "a GGUF reader's error, no source=",
    "test_export::[bfloat16-own]": "every half model refused: its half arithmetic vs float32",
    "test_export::[float16-as-float32]": "refused: the float16 model's outputs vs a float32 load",
    "test_export::test_gguf_refuses_a_query_bias": "a q bias llama.cpp loads as n_embd: no load",
    "test_export::[torch-masked-gguf]": "misdiagnosed: 'weight_orig' as a tensor gguf lacks",
    "test_export::test_onnx_of_a_float16_network": "refused: float32's tolerance for a half graph",
    "test_export::test_onnx_of_a_bfloat16_network": "raw onnxruntime INVALID_GRAPH after tracing",
    "test_export::test_gguf_f32_of_a_half_model": "refused: bfloat16 arithmetic vs a float32 load",
    "test_export::test_onnx_of_a_llama_from_a_batch_of_one": "batch fixed at 1; raw onnxruntime",
    # shrink (prunekit.tools.shrink, sources)
    "test_shrink::[kinds-str]": "kinds='channels' split into letters, the message showing them",
    "test_shrink::[calibration-blank]": "blank passages accepted, refused after loading",
    "test_shrink::[index-map-a-list]": "raw AttributeError 'list' object has no attribute 'values'",
    "test_shrink::[index-map-not-str]": "raw TypeError from a path join",
    "test_shrink::[shard-truncated]": "raw SafetensorError from transformers",
    "test_shrink::[weights-truncated]": "raw SafetensorError from transformers",
    "test_shrink::[weights-empty]": "raw SafetensorError from transformers",
    "test_shrink::[out-not-writable]": "raw OSError, after the whole pruning",
    "test_shrink::test_shrink_to_onnx": "every --format onnx failed at export (batch of one)",
    "test_shrink::test_shrink_of_a_bfloat16": "written in float32: 1.6x the bf16 source's bytes",
    # streamed (prunekit.io.streamed)
    "test_streamed::[batch-mask-all-zero]": "calibration with every attention_mask zero accepted",
    "test_streamed::[config-garbage]": "transformers' OSError, not a CheckpointError",
    "test_streamed::test_the_command_refuses_a_seed": "--seed with l1/ln read and ignored",
    # drop-in (prunekit.dropin, docs/guides/drop-in.md)
    "test_dropin::test_what_torch_accepts": "refused, but the guide's differences did not say",
    "test_dropin::test_a_model_pruned_by_torch": "kept _orig/_mask: no load into a plain copy",
    "test_dropin::test_is_pruned_and_remove": "torch's pruning: is_pruned False, remove refused",
    # prune_channels (prunekit.structure.stages.entry)
    "test_damping::[auto-empty-batch]": "compensation from an empty batch: silently no update",
    "test_damping::[mask-all-zero]": "compensation with every attention_mask zero accepted",
    # sequential calibration (prunekit.calibrate.block_calls, called_as)
    "test_sequential_kinds::[qwen2-sliding-wanda]": "full block calibrated with a sliding mask",
    "test_sequential_kinds::[qwen2-sliding-sparsegpt]": "full block calibrated with a sliding mask",
    "test_sequential_kinds::[gemma3-wanda]": "global block given the local mask and rotary",
    "test_sequential_kinds::[gemma3-sparsegpt]": "global block given the local mask and rotary",
    "test_sequential_kinds::test_layer_by_layer_uses_each_blocks_own_arguments": "block 0's mask",
    "test_sequential_kinds::test_streamed_equals_block_by_block_with_sliding_layers": (
        "prune_streamed: the sliding block pruned on the full block's mask"
    ),
    "test_sequential_kinds::test_compensation_runs_each_block_with_its_own_arguments": (
        "compensate=True ran the later block with block 0's mask"
    ),
    "test_sequential_kinds::test_reconstruction_runs_each_block_with_its_own_arguments": (
        "reconstruct_blocks trained the later block with block 0's mask"
    ),
    "test_sequential_kinds::test_a_streamed_shrink_with_sliding_layers": (
        "shrink_streamed compensated the sliding block on the full block's mask"
    ),
    "test_sequential_kinds::test_a_failure_of_the_recording_itself": (
        "block_calls took its own failure for the fallback: block 0's arguments, silently"
    ),
    "test_sequential_kinds::test_a_forward_that_reads_more_than_the_hidden_states": (
        "a block given block 0's arguments where the forward hands it another block's output"
    ),
    "test_sequential_kinds::test_such_a_forward_calling_a_block_again": (
        "no order check where the blocks cannot be passed through: block 0 run twice, silently"
    ),
    "test_sequential_kinds::test_t5_blocks": (
        "T5's later blocks calibrated without the position bias block 0 computes"
    ),
    "test_sequential_kinds::test_a_block_with_a_forward_of_its_own": (
        "raw TypeError from block_calls setting aside an instance forward (accelerate's hooks)"
    ),
    # structural pruning (prunekit.structure: graph, stages, compaction, rotation)
    "test_structure::test_a_buffer_met_in_forward_goes_with_its_channels": (
        "raw TypeError 'parameter 'scale' of Scaled is a buffer' (a buffer masked as a weight)"
    ),
    "test_structure::test_a_compacted_buffer_is_saved_and_loaded_at_its_width": (
        "no compaction at all: a buffer met in forward refused by the mask install"
    ),
    "test_structure::[nan-obs]": (
        "misdiagnosed: RuntimeError 'the input Hessian is not positive definite even damped'"
    ),
    "test_structure::[inf-obs]": (
        "misdiagnosed: RuntimeError 'the input Hessian is not positive definite even damped'"
    ),
    "test_structure::[huge-obs]": (
        "misdiagnosed: RuntimeError 'the input Hessian is not positive definite even damped'"
    ),
    "test_structure::[prune_channels]": (
        "raw RuntimeError 'index_add(): self, index and source expected to be in the same "
        "device' (a model on the meta device)"
    ),
    "test_structure::[compact]": "raw NotImplementedError 'Cannot copy out of meta tensor'",
    "test_structure::[rotate_hidden]": (
        "raw RuntimeError 'Tensor on device cpu is not on the expected device meta!'"
    ),
    "test_structure::[int]": "raw TypeError \"'int' object is not iterable\" (exclude=3)",
    "test_structure::[float]": "raw TypeError \"'float' object is not iterable\" (exclude=0.5)",
    "test_structure::[item-int]": "refused only when the model was traced, unnamed as exclude=",
    "test_structure::[old-name-int]": "raw TypeError \"'int' object is not iterable\" (ignore=3)",
    "test_structure::[not-in-model]": "'exclude holds Linear not in model': no expected",
    "test_structure::[Recurrent]": (
        "a layer run on the input and on its output: its input columns masked (the input's "
        "features zeroed in the first call); compact then failed, 'may fix a channel count'"
    ),
    "test_structure::[SharedWeight]": (
        "a Parameter of two layers masked along the columns the first reads the input with; "
        "compact then refused it"
    ),
    "test_structure::[SharedNorm]": (
        "a BatchNorm run on the input and on channels: its weight masked for both, silently"
    ),
    "test_structure::test_torchs_encoder_layers_compact_with_heads_or_width_cut": (
        "nn.TransformerEncoderLayer with heads or hidden cut never compacted: its eval fast "
        "path ran the compacted attention ('qkv_weight first dim to be 3x embed_dim')"
    ),
    "test_structure::test_a_compacted_multihead_attention_is_loaded_into_a_fresh_model": (
        "load_compacted refused it: 'is a MultiheadAttention but was saved as a "
        "CompactMultiheadAttention; expected the same classes'"
    ),
    "test_structure::[empty-channel_groups]": (
        "traced an empty batch: no layer read any channel, the output layer's channels prunable"
    ),
    "test_structure::[empty-prune_channels]": (
        "an empty batch traced: the model's output units masked, silently"
    ),
    "test_structure::[empty-compact]": (
        "misdiagnosed: 'its code may fix a channel count' (mat1 and mat2 shapes, 0 rows)"
    ),
    "test_structure::[empty-compact-dict]": (
        "misdiagnosed: 'its code may fix a channel count' (mat1 and mat2 shapes, 0 rows)"
    ),
    "test_structure::[nan-row]": "misdiagnosed: 'the compacted model differs from the masked "
    "one by nan' (example inputs holding NaN)",
    "test_structure::[inf-row]": "misdiagnosed: 'the compacted model differs from the masked "
    "one by nan' (example inputs holding inf)",
    "test_structure::test_a_cut_width_is_loaded_into_a_fresh_model_with_its_norms_epsilon": (
        "a rotated, cut model loaded into a fresh one kept the fresh norms' epsilon: outputs "
        "off by 4e-4 (15 % at eps 0.05), no error"
    ),
    "test_structure::test_a_cut_of_qwen3_warns_that_from_pretrained": (
        "no warning: from_pretrained rebuilt Qwen3's query/key norms with the scaled epsilon"
    ),
    # depth (prunekit.structure.depth.scores, states)
    "test_depth::[criterion-complex]": "raw 'cannot be converted to type double' (complex)",
    "test_depth::[inputs-meta]": "misdiagnosed: 'its forward does more with its blocks'",
    # checkpoints (prunekit.io.checkpoint, io.files, structure.saving)
    "test_saving::[list-": "raw AttributeError 'list' object has no attribute 'shape'",
    "test_saving::[number-orig-": "raw AttributeError 'int' object has no attribute 'shape'",
    "test_saving::[int-key-": "raw AttributeError 'int' object has no attribute 'endswith'",
    "test_saving::[meta-": "torch's copy error after the other entries were loaded",
    "test_saving::[sparse-": "torch's copy error after the other entries were loaded",
    "test_saving::[quantized-": "torch's copy error after the other entries were loaded",
    "test_saving::[nested-": "raw RuntimeError 'NestedTensorImpl doesn't support sizes'",
    "test_saving::test_a_model_with_extra_state_loads_its_own_state_dict": (
        "raw AttributeError 'dict' object has no attribute 'shape'"
    ),
    "test_saving::test_save_pruned_and_load_pruned_keep_extra_state": (
        "load_pruned refused the file save_pruned had written"
    ),
    "test_saving::test_extra_state_is_refused_by_safetensors_before_a_file_changes": (
        "raw AttributeError 'dict' object has no attribute 'detach'"
    ),
    "test_saving::test_save_compacted_refuses_extra_state_by_module_before_writing": (
        "raw AttributeError 'dict' object has no attribute 'detach'"
    ),
    "test_saving::test_save_pruned_refuses_a_model_on_the_meta_device[False-pruned.pt]": (
        "a file of meta tensors written, which load_pruned refused"
    ),
    "test_saving::test_save_pruned_refuses_a_model_on_the_meta_device[True-pruned.pt]": (
        "a file of meta tensors written, which load_pruned refused"
    ),
    "test_saving::test_save_pruned_refuses_a_model_on_the_meta_device[False-pruned.safe": (
        "raw NotImplementedError 'Cannot copy out of meta tensor'"
    ),
    "test_saving::test_save_pruned_refuses_a_model_on_the_meta_device[True-pruned.safe": (
        "raw NotImplementedError 'Cannot copy out of meta tensor'"
    ),
    "test_saving::test_save_compacted_refuses_a_model_on_the_meta_device": (
        "raw NotImplementedError 'Cannot copy out of meta tensor'"
    ),
    # recover, Distiller (prunekit.schedule.recovery, distill)
    "test_recovery::[2-": "misdiagnosed: 'a smaller lr' for a batch holding NaN or inf",
    "test_recovery::test_a_value_not_finite_deep_in_a_batch_is_named": (
        "a NaN two levels into a batch (a keyword's tuple of tuples) named no batch"
    ),
    "test_distill::test_a_student_equal_to_its_teacher_has_a_loss_of_zero": (
        "an encoder-decoder teacher decoded the shifted source, not the student's target"
    ),
    "test_distill::test_the_average_leaves_out_the_targets_padding": (
        "an encoder-decoder's logits averaged by the source's attention_mask"
    ),
    "test_distill::test_hidden_states_of_a_model_whose_forward_takes_none_are_refused": (
        "misdiagnosed: 'invalid batches: batch 0 fails in the student's forward'"
    ),
    # GradualPruner (prunekit.schedule.state)
    "test_gradual::test_a_mask_holding_other_values_than_0_and_1_is_refused": (
        "a mask of 0.5, NaN, 2 or -1 read as 'kept'"
    ),
    "test_distill::test_hidden_states_of_an_encoder_decoder_are_refused_for_what_they_are": (
        "misdiagnosed: 'expected the student called with output_hidden_states=True'"
    ),
    # prune_model (prunekit.whole)
    "test_oneshot::test_globs_given_as_an_iterator_select_what_they_name": (
        "read empty after its check: include pruned every weight, exclude left out none"
    ),
    "test_oneshot::test_blocks_called_out_of_turn_are_refused_block_by_block": (
        "blocks called reversed, skipped or twice (again after the last one too): each "
        "calibrated on other inputs, silently"
    ),
    "test_oneshot::test_a_pruned_block_called_again_after_the_last_pruned_one_is_refused": (
        "a pruned block run again after the last pruned one: calibrated on its first call"
    ),
    "test_oneshot::test_taylor_refuses_a_tensor_the_loss_gives_no_gradient": (
        "no gradient ranked as all zeros: the first half of the tensor pruned, by index"
    ),
    "test_oneshot::test_a_layer_called_twice_in_a_block_is_refused_layer_by_layer": (
        "sequential='layers' calibrated a layer run twice on its first call alone, silently"
    ),
    "test_oneshot::test_a_global_count_is_a_count_over_all_the_tensors": (
        "a global count above one tensor's entries refused as too many for that tensor"
    ),
    "test_oneshot::test_one_block_at_several_places_is_refused_for_that": (
        "misdiagnosed: 'never ran on the calibration data' (one block listed thrice)"
    ),
    "test_oneshot::test_sparsegpts_settings_are_checked_when_the_config_is_made": (
        "Config(damp=-1 / nan, blocksize=0) made; refused only at the first layer pruned"
    ),
    "test_oneshot::test_a_residual_added_in_place_is_calibrated_as_one_added_anew[False-": (
        "x += ...: later blocks' first layers took block 0's statistics (one tensor, 'shared')"
    ),
    "test_oneshot::test_a_residual_added_in_place_is_calibrated_as_one_added_anew[True-": (
        "x += ...: block 0 run for its outputs on the input its statistics run added to"
    ),
    # prune_model's selection and plain methods (prunekit.whole.model, targets)
    "test_whole::test_a_loss_beside_a_method_without_data_is_refused": (
        "loss= with l1, random or ln read and ignored (refused with pattern='row')"
    ),
    "test_whole::test_a_shared_module_left_out_under_one_of_its_names_is_refused": (
        "a module at two paths excluded under one: pruned under the other, silently"
    ),
    "test_whole::test_the_unstructured_pattern_as_an_object_prunes_as_its_name": (
        "pattern=Unstructured() refused as not 'unstructured' (ln, prune_state_dict)"
    ),
    "test_whole::test_scope_and_its_old_name_that_disagree_are_refused[layer-True]": (
        "scope='layer' with global_pruning=True pruned globally, a FutureWarning alone"
    ),
    "test_whole::test_a_config_prunes_as_its_keywords_over_ranks_and_alone": (
        "Config's defaulted sequential kept for other ranks: refused over a process_group "
        "('layers'), block by block alone (ranks=True), where the keywords prune"
    ),
    "test_whole::test_a_calibration_option_beside_a_method_without_data_is_refused": (
        "sequential= or progress= with l1, random or ln read and silently ignored"
    ),
    # the command line (prunekit.tools.cli, calibrate)
    "test_cli::[single-inside]": "a model folder pruned into a folder inside it: input changed",
    "test_cli::[single-holds]": (
        "a model folder pruned into the folder holding it: that folder copied and swapped"
    ),
    "test_cli::test_a_model_folder_pruned_over_an_earlier_output_holds_only_the_new_weights[sh": (
        "old shards and index kept beside the new model.safetensors: report read the old"
    ),
    "test_cli::test_a_plot_inside_the_model_folder_reported_is_refused": (
        "report DIR --plot DIR/model.safetensors wrote the PNG over the weights, status 0"
    ),
    "test_cli::test_a_calibration_option_of_a_method_without_calibration_is_refused": (
        "--window/--windows with l1, random or ln read and silently ignored"
    ),
    "test_cli::test_a_demo_option_of_the_other_demo_is_refused": (
        "--distill without --llm, or the CNN demo's options with it, read and ignored"
    ),
    # selections (prunekit.patterns, structure.stages.shares, io.sharded, report)
    "test_selection::test_a_global_share_under_round_to_removes_what_was_asked[0.25-4]": (
        "4 of the 8 channels asked removed: each layer's share rounded down on its own"
    ),
    "test_selection::test_a_global_share_under_round_to_removes_what_was_asked[0.25-8]": (
        "none of the 8 channels asked removed: each layer's share rounded down on its own"
    ),
    "test_selection::test_a_global_share_under_round_to_removes_what_was_asked[0.3-": (
        "fewer channels removed than round_to allows: each layer's share rounded on its own"
    ),
    "test_selection::test_a_global_share_under_round_to_removes_what_was_asked[0.5-": (
        "fewer channels removed than round_to allows: each layer's share rounded on its own"
    ),
    **{
        "test_selection::test_a_global_share_over_uneven_widths_is_the_nearest_the_steps_allow"
        f"[{case}]": (
            "fewer channels than whole steps allow: each layer's share rounded on its own"
        )
        for case in (
            "0.1-2",
            "0.1-4",
            "0.1-8",
            "0.25-2",
            "0.25-3",
            "0.25-4",
            "0.25-8",
            "0.5-2",
            "0.5-4",
            "0.5-8",
        )
    },
    "test_selection::test_a_global_share_passes_a_layers_last_channel_to_the_next_in_rank": (
        "13 of the 14 channels asked: the channel a layer keeps was dropped from the count"
    ),
    "test_selection::test_channel_norms_past_the_range_of_16_bits_still_rank[1-torch.float16]": (
        "finite float16 weights refused: 'the channel norms hold inf' (L1 sums past 65504)"
    ),
    **{
        f"test_selection::test_channels_ranked_by_integer_importance_scores[{n}]": (
            "raw 'linalg.vector_norm: Expected a floating point ... Got Long' (int scores)"
        )
        for n in ("1", "2", "inf", "-inf", "fro")
    },
    "test_selection::test_report_names_a_tensor_it_cannot_count[meta]": (
        "raw 'Tensor.item() cannot be called on meta tensors'"
    ),
    "test_selection::test_report_names_a_tensor_it_cannot_count[sparse]": (
        "raw 'Cannot access storage of SparseTensorImpl'"
    ),
    "test_selection::test_report_names_a_tensor_it_cannot_count[mask-of-another-shape]": (
        "raw 'The size of tensor a (4) must match the size of tensor b (5)'"
    ),
    "test_selection::test_report_of_a_model_on_the_meta_device_names_its_first_tensor": (
        "raw 'Tensor.item() cannot be called on meta tensors'"
    ),
    "test_selection::test_prune_model_refuses_a_model_it_cannot_report_before_pruning": (
        "the layer pruned, then the report's raw error: a failed call changed the model"
    ),
    **{
        f"test_selection::test_a_saved_mask_of_another_shape_is_refused_as_in_memory[{case}]": (
            "raw 'The size of tensor a (12) must match the size of tensor b (4)'"
            if case.startswith("(4,)")
            else "a 12-entry mask of another shape applied flat, silently (kept so)"
        )
        for case in [
            *(
                f"{shape}-left-{scope}"
                for shape in ("(12,)", "(2, 6)", "(4,)")
                for scope in ("layer", "global")
            ),
            *(f"{shape}-pruned-global" for shape in ("(12,)", "(2, 6)", "(4,)")),
        ]
    },
    "test_selection::test_one_rank_refuses_a_count_above_all_entries_by_the_function": (
        "the refusal named L1Unstructured, not global_unstructured, the function called"
    ),
    "test_selection::test_what_lies_behind_a_mask_does_not_compete[": (
        "PerRow/NM refused NaN or inf where the mask is 0 (entries that do not compete)"
    ),
    **{
        f"test_selection::test_a_tied_weight_in_a_state_dict_is_ranked_once[{count}]": (
            "a tied weight ranked under each name: counted twice, its names masked apart"
        )
        for count in (1, 3, 4)
    },
    "test_selection::test_a_tied_weight_drawn_at_random_gets_one_draw": (
        "a tied weight drawn once per name: two masks for one weight"
    ),
    # routed experts (prunekit.structure.scoring.expert_criteria)
    "test_experts::test_padding_an_attention_mask_leaves_out_does_not_rank_the_experts": (
        "the pad tokens counted: frequency and REAP moved toward the pad token's experts"
    ),
    "test_experts::test_a_padded_batch_among_unpadded_ones_counts_its_tokens_only": (
        "a padded batch's pad tokens counted among the routed tokens"
    ),
    "test_experts::test_pruning_experts_on_padded_calibration_masks_those_unpadded_": (
        "other experts masked than the same tokens without padding choose"
    ),
    "test_experts::test_an_attention_mask_of_another_shape_is_refused_naming_the_batch": (
        "a mask of another shape than the tokens accepted (not read at all)"
    ),
    "test_experts::test_a_batch_the_model_cannot_take_is_named_as_the_other_criteria_": (
        "raw IndexError 'index out of range in self', no batch named ('frequency', 'reap')"
    ),
    "test_experts::test_a_mask_of_as_many_entries_in_another_shape_is_refused": (
        "a transposed mask read flat as the tokens' (as many entries, other tokens left out)"
    ),
    # rotate_hidden's calibration (prunekit.structure.rotation.pca, core.example_inputs)
    "test_rotation::test_a_mask_of_as_many_entries_in_another_shape_is_refused[": (
        "a transposed or reshaped mask read flat as the tokens' (padding counted, tokens left out)"
    ),
    # a criterion's own channel scores (prunekit.patterns.channels)
    "test_patterns::test_channel_scores_that_cannot_be_ranked_are_refused[nan]": (
        "a NaN channel score ranked as the largest: its channel kept, another pruned"
    ),
    "test_patterns::test_channel_scores_that_cannot_be_ranked_are_refused[inf]": (
        "an infinite channel score ranked, where infinite entry scores are refused"
    ),
    "test_patterns::test_channel_scores_that_cannot_be_ranked_are_refused[-inf]": (
        "a -inf channel score ranked as the smallest: its channel pruned, silently"
    ),
    "test_patterns::test_channel_scores_of_another_shape_are_refused_naming_the_criterion[too": (
        "raw RuntimeError \"shape '[4, 1]' is invalid for input of size 2\""
    ),
    "test_patterns::test_channel_scores_of_another_shape_are_refused_naming_the_criterion[2-d": (
        "a (1, 4) tensor of channel scores read flat, silently"
    ),
    "test_patterns::test_channel_scores_that_are_no_tensor_are_refused_naming_the_criterion": (
        "raw AttributeError 'list' object has no attribute 'reshape'"
    ),
    "test_patterns::test_integer_importance_scores_rank_a_tensor_pruned_before[": (
        "raw RuntimeError 'value cannot be converted to type int64_t without overflow' "
        "(PerRow, NM on a tensor with a mask)"
    ),
    "test_patterns::test_wanda_ranks_finite_inputs_whose_squares_pass_float32": (
        "a finite input of 1e30 refused: its square summed in float32 made the norm inf"
    ),
    # GradualPruningCallback (prunekit.schedule.hf_callback)
    "test_hf_resume::test_a_checkpoint_whose_mask_is_no_mask_is_refused_on_resume": (
        "a checkpoint's mask of 0.5, NaN or 2 read as 'kept' on resume (made bool unchecked)"
    ),
    # reconstruct_blocks (prunekit.structure.compensation.reconstruct)
    "test_reconstruct::test_labels_in_the_batches_leave_the_head_training_towards_the_logits": (
        "the head trained towards the reference's loss (a labelled output's first tensor)"
    ),
    # global_unstructured over ranks (prunekit.dropin.across_ranks)
    "test_distributed::test_what_lies_behind_a_mask_does_not_compete_across_ranks": (
        "NaN or inf in entries pruned before: every rank refused what one process prunes"
    ),
    "test_distributed::test_importance_scores_behind_a_mask_do_not_compete_across_ranks": (
        "NaN scores where the mask pruned: every rank refused what one process prunes"
    ),
    "test_distributed::[negative]": "'L1Unstructured: invalid amount=-1': no global_unstructured",
    "test_distributed::[nan]": "'L1Unstructured: invalid amount=nan': no global_unstructured",
    "test_distributed::[bool]": "'global_unstructured: L1Unstructured: L1Unstructured: ...'",
    "test_distributed::test_a_bug_in_a_methods_constructor_is_not_made_the_callers_error": (
        "a TypeError from inside a method's constructor rewrapped as the caller's TypeError"
    ),
    **{
        "test_distributed::test_a_statistic_without_dense_values_is_named_on_every_rank"
        f"[{w}-{k}]": (
            f"raw torch error ({k}) on its rank, a RuntimeError elsewhere, the statistic unnamed"
        )
        for w in ("summed", "weighted")
        for k in ("meta", "sparse", "nested")
    },
    "test_distributed::[scores-meta]": "a segmentation fault in the selection (meta scores)",
    "test_distributed::[scores-sparse]": "raw 'reshape is not implemented for sparse tensors'",
    "test_distributed::[scores-bool]": "'Magnitude.scores returned Tensor of dtype torch.bool'",
    "test_distributed::[scores-complex]": "'Magnitude.scores returned ... torch.complex64'",
    "test_distributed::test_a_parameter_on_the_meta_device_is_refused_over_ranks": (
        "a segmentation fault in the selection (a parameter on the meta device)"
    ),
    "test_distributed::test_integer_importance_scores_rank_as_in_one_process": (
        "refused: 'Magnitude.scores returned Tensor of dtype torch.int64', the scores unnamed"
    ),
    "test_distributed::[f64-scores-of-f32]": (
        "float64 scores ranked as float32 (the tensor's dtype): ties, other entries pruned"
    ),
    "test_distributed::[f32-scores-of-bf16]": (
        "float32 scores read as 16-bit: raw 'The size of tensor a (15) must match ... (30)'"
    ),
    "test_distributed::test_prune_model_over_ranks_names_itself_and_the_path": (
        "prune_model over ranks: refusals named global_unstructured (not called), no path"
    ),
    # sharded checkpoints (prunekit.io.mapped, io.sharded)
    "test_io::test_a_folder_written_again_is_read_as_it_is_now": (
        "the replaced file's memory map reused (by path and offset): the old values, silently"
    ),
    "test_io::test_a_folder_written_again_is_pruned_from_what_it_holds_now": (
        "prune_sharded pruned the replaced files' values (a held tensor's map reused)"
    ),
    "test_io::test_a_global_pruning_ranks_what_a_saved_mask_left_as_in_memory": (
        "NaN or inf where a saved mask pruned: refused, though prune_state_dict prunes it"
    ),
    # GradualPruner's state (prunekit.schedule.state)
    "test_schedule::[above-final]": (
        "amount 0.95 of a pruner to 0.8 loaded: every later update pruned past final_amount"
    ),
    "test_schedule::[bool]": "amount=True loaded as 1.0",
    "test_schedule::test_a_state_missing_some_masks_is_refused": (
        "a state without fc1's mask loaded: fc1 left unpruned at the state's sparsity"
    ),
    "test_schedule::test_a_state_without_masks_past_the_first_update_is_refused": (
        "a state of amount 0.8 without masks loaded: the model stayed dense, no update came"
    ),
    "test_schedule::test_what_lies_behind_a_mask_does_not_change_the_next_update[global-": (
        "NaN or inf behind a mask, scope='global': misdiagnosed 'cannot rank several tensors "
        "together ... expected scope='layer'' (the layer scope ranks the others)"
    ),
    "test_schedule::test_a_state_of_another_pattern_is_refused": (
        "a state of rows or N:M loaded into another pattern's pruner (the set-up left it out)"
    ),
    "test_io::test_a_saved_mask_that_is_no_mask_is_named_with_its_value_and_place": (
        "\"'a.weight_mask' holds values other than 0 and 1\": no value, no index, no expected"
    ),
    # the calibrated criteria and compensation (prunekit.dropin, criteria.sparsegpt,
    # structure.stages.channel_config, structure.compensation.damping)
    **{
        f"test_calibrated::[masked-before-{where}-{value}-taylor-": (
            "NaN/inf reaching Taylor's scores on a model pruned before: a shape error 'saliency "
            "of shape (16, 8); expected the tensor's shape (96,)', not the value named"
        )
        for where in ("input", "weight")
        for value in ("nan", "inf", "-inf")
    },
    "test_calibrated::test_scores_of_a_tensor_pruned_before_that_cannot_be_ranked_are_named": (
        "Taylor's saliency or Wanda's norms holding NaN on a tensor pruned before: a shape "
        "error (the entries left gathered flat for a criterion that scores by shape)"
    ),
    "test_calibrated::test_taylor_scores_nan_only_where_pruned_before_rank_the_entries_left": (
        "NaN only at entries pruned before: refused with a shape error instead of ranking"
    ),
    "test_calibrated::test_sparsegpt_of_batches_of_any_length_is_sparsegpt_of_their_tokens": (
        "the guide's sparsegpt_prune(weight, hessian, 0.5, pattern): raw AttributeError "
        "'float' object has no attribute 'owner'"
    ),
    "test_calibrated::test_sparsegpt_prune_alone_takes_the_amount_prune_model_takes": (
        "sparsegpt_prune with a float or int amount: raw AttributeError (an Amount only)"
    ),
    "test_calibrated::test_sparsegpt_refuses_a_weight_tied_across_two_layers": (
        "SparseGPT on a weight tied across two layers: the first's update silently made the "
        "second's calibration error 0.184 against 0.115 for the same masks, no update"
    ),
    "test_calibrated::test_compensation_of_a_weight_tied_to_another_layer_is_refused": (
        "compensating 'down' tied to 'down2' moved down2 unchecked: calibration error 0.210 "
        "(True), 0.438 ('reference') against 0.190 without compensation"
    ),
    "test_calibrated::test_a_reader_the_calibration_never_runs_is_named_not_left_silently": (
        "a layer reading removed units that no calibration batch runs: left without an "
        "update, without a word"
    ),
    "test_calibrated::[amount-float32]": "prune_channels(amount=np.float32(0.5)) refused",
    "test_calibrated::[heads-float32]": "prune_channels(heads=np.float32(0.5)) refused",
    "test_calibrated::[round_to-int64]": "prune_channels(round_to=np.int64(4)) refused",
    "test_calibrated::[damping-float32]": "prune_channels(damping=np.float32(0.25)) refused",
    # ONNX export's example inputs (prunekit.export.onnx)
    "test_onnx::[nan]": "traced and written, then 'differs from the model's by nan': misdiagnosed",
    "test_onnx::[nan-keyword]": "traced, then misdiagnosed as a difference of nan",
    "test_onnx::[inf]": "accepted: the check compared infinities, nothing",
    "test_onnx::[empty-batch]": "accepted: 'checked' with a difference of 0 on no value",
    "test_onnx::[meta]": "raw 'Tensor on device cpu is not on the expected device meta!'",
    "test_onnx::[ints-for-a-float-model]": "raw 'mat1 and mat2 must have the same dtype'",
    "test_onnx::[wrong-width]": "raw 'mat1 and mat2 shapes cannot be multiplied'",
    # budgets (prunekit.structure.stages.meet_budget)
    "test_budget::test_a_floor_glob_that_matches_no_group_is_refused": (
        "Budget(floor={'*self-attn*': 0.5}) (a typo for self_attn): silently no floor at all"
    ),
}


def broke(nodeid: str) -> bool:
    """Whether the case `nodeid` is one of BROKE."""
    name = nodeid.split("::")[0].rsplit("/", 1)[-1].removesuffix(".py")
    return any(key.split("::")[0] == name and key.split("::")[1] in nodeid for key in BROKE)


def entry_point(nodeid: str) -> str:
    """The entry point of the case `nodeid` (its test file's)."""
    name = nodeid.split("::")[0].rsplit("/", 1)[-1].removesuffix(".py")
    return ENTRY_POINTS.get(name, name)
