"""onnxruntime's session config keys, for checking a `bench --setting` key before it is sent.

onnxruntime takes any key into its session config and ignores one it does not know, without a
word: `--setting session.intra_op.allow_spining=0` timed the default and put it in the table as
a setting of its own. These are the keys its C API header lists
(onnxruntime_session_options_config_keys.h, as of the 1.2x releases, with older names still
read by older builds). A key close to one of them is a typo and refused; another key is passed
on with a note (a newer onnxruntime may know it), as are the execution providers' own ("ep.").
"""

from __future__ import annotations

import difflib

KNOWN = frozenset({
    "session.disable_prepacking", "session.use_env_allocators", "session.load_model_format",
    "session.save_model_format", "session.set_denormal_as_zero", "session.disable_quant_qdq",
    "session.enable_quant_qdq", "session.disable_double_qdq_remover",
    "session.enable_quant_qdq_cleanup", "optimization.enable_gelu_approximation",
    "optimization.enable_cast_chain_elimination", "session.disable_aot_function_inlining",
    "optimization.memory_optimizer_config", "optimization.enable_memory_probe_recompute_config",
    "optimization.disable_specified_optimizers", "session.graph_optimizations_loop_level",
    "session.use_device_allocator_for_initializers", "session.inter_op.allow_spinning",
    "session.intra_op.allow_spinning", "session.use_ort_model_bytes_directly",
    "session.use_ort_model_bytes_for_initializers", "session.qdqisint8allowed",
    "session.x64quantprecision", "optimization.minimal_build_optimizations",
    "ep.nnapi.partitioning_stop_ops", "session.dynamic_block_base",
    "session.force_spinning_stop", "session.strict_shape_type_inference",
    "session.allow_released_opsets_only", "session.node_partition_config_file",
    "session.intra_op_thread_affinities", "session.debug_layout_transformation",
    "session.disable_cpu_ep_fallback", "session.optimized_model_external_initializers_file_name",
    "session.optimized_model_external_initializers_min_size_in_bytes",
    "session.model_external_initializers_file_folder_path",
    "session.save_external_prepacked_constant_initializers",
    "session.collect_node_memory_stats_to_file", "session.resource_cuda_partitioning_settings",
    "ep.context_enable", "ep.context_file_path", "ep.context_embed_mode",
    "ep.context_node_name_prefix", "ep.share_ep_contexts", "ep.stop_share_ep_contexts",
    "ep.context_model_external_initializers_file_name",
    "mlas.enable_gemm_fastmath_arm64_bfloat16", "mlas.use_lut_gemm",
    "session.qdq_matmulnbits_accuracy_level", "session.disable_model_compile",
    "session.fail_on_suboptimal_compiled_model", "session.record_ep_graph_assignment_info",
})


def typo_of(key: str) -> str | None:
    """The known key `key` is a misspelling of (close to one, not one itself), or None."""
    if key in KNOWN:
        return None
    close = difflib.get_close_matches(key, KNOWN, n=1, cutoff=0.85)
    return close[0] if close else None


def unknown(key: str) -> bool:
    """Neither a key onnxruntime's header lists nor an execution provider's own ("ep.")."""
    return key not in KNOWN and not key.startswith("ep.")
