"""Test cases that run in the slow part (CI's second run, or FUSEGRAD_SLOW=1) rather than a clone's test line, which
must stay within 10 minutes on 2 cores with an empty kernel cache: the longest cases of tests whose other cases, or
other tests named here, still cover the same code in the fast part. Node ids, or their prefix up to a '[' (every
case of that test). conftest.py marks them slow; each group's comment says what stays in the fast part.

SAMPLED names parametrized tests whose cases the fast part samples: of the cases not named in SLOW_CASES, in collection
order, the first and every fourth after it stay; the rest run in the slow part. A key is a test's node id up to its
'[', or a longer prefix of its case ids (one backend's cases)."""

import pytest

# what this file names that a collection of the whole suite did not find (conftest.py sets it; test_slow_cases.py asks)
UNMATCHED = pytest.StashKey[list]()

SLOW_CASES = {
    # a whole decode step per format; the fused kernels each against numpy stay (test_quant_avx2's other tests)
    "tests/models/test_quant_avx2.py::test_a_llama_decode_step_through_the_fused_kernels_equals_the_kernel_per_linear[Q4_K]",
    # the first-thread cases compile; the two-thread ones of the same shapes stay
    "tests/models/test_quant_avx2.py::test_the_stacked_avx2_matvec_equals_each_matrix_own[Q4_K-2-512-1]",
    "tests/models/test_quant_avx2.py::test_the_stacked_avx2_matvec_equals_each_matrix_own[Q4_K-1-768-1]",
    # the other model cases against transformers stay (llama-f32, the quantized ones, the decode-step check)
    "tests/models/test_llama.py::test_logits_and_greedy_tokens_match_transformers[qwen3moe-f32]",
    "tests/models/test_llama.py::test_f32_decode_logits_match_transformers[False]",
    # long and odd lengths; the shorter cases of each attention test stay
    "tests/tensor_ops/test_attention.py::test_blocked_heads_one_at_a_time_against_torch[q_shape3-kv_shape3-mask_shape3-kw3]",
    "tests/tensor_ops/test_attention.py::test_blocked_heads_one_at_a_time_against_torch[q_shape0-kv_shape0-None-kw0]",
    "tests/tensor_ops/test_attention.py::test_sdpa_against_torch[qs4-129-2-80-kw4]",
    "tests/tensor_ops/test_attention.py::test_sdpa_against_torch[qs6-33-2-64-kw6]",
    "tests/tensor_ops/test_attention.py::test_blocked_backward_odd_lengths_against_torch[qs3-129-2-kw3]",
    "tests/tensor_ops/test_attention.py::test_sdpa_in_realized_blocks_against_torch[qs0-7-3-32-kw0]",
    "tests/models/test_generate_attention.py::test_a_causal_chunk_attends_in_query_blocks_over_a_growing_cache[384]",
    # deep graphs: the add chains, the backward chain, the pickle and the UOp-level ones stay
    "tests/schedule/test_deep_graphs.py::test_where_nesting_matches_numpy",
    "tests/schedule/test_deep_graphs.py::test_mixed_ops_chain_matches_numpy",
    "tests/schedule/test_deep_graphs.py::test_wide_sum_of_many_tensors",
    "tests/schedule/test_deep_graphs.py::test_movement_chain_matches_numpy",
    # 64-bit and long-row sorts; the 32-bit and short ones stay
    "tests/tensor_ops/test_sorting.py::test_sort_every_dtype_is_stable[network-float64]",
    "tests/tensor_ops/test_sorting.py::test_sort_every_dtype_is_stable[network-int64]",
    "tests/tensor_ops/test_sorting.py::test_sort_every_dtype_is_stable[network-uint64]",
    "tests/tensor_ops/test_sorting.py::test_sort_nan_inf_and_signed_zero_long_rows",
    # CL's compiles (PoCL) are the slowest: the CPU and LLVM cases of these tests stay, and test_cl.py
    "tests/codegen/test_opt_regressions.py::test_relu_of_square_matmul_sum[CL-300]",
    "tests/codegen/test_opt_regressions.py::test_relu_of_square_matmul_sum[CL-256]",
    "tests/codegen/test_opt_regressions.py::test_matmul_of_an_exp_has_torchs_weight_gradient[CL-64-256-10]",
    "tests/runtime/test_backend_ops.py::test_op[CL-cumsum-float32]",
    "tests/runtime/test_backend_ops.py::test_op[CL-softmax-float32]",
    "tests/runtime/test_backend_ops.py::test_op[CL-matmul-float32]",
    # nvcc on every kernel of the suite: tests/renderer/test_cstyle.py's PTX compile stays
    "tests/runtime/test_cuda_compile.py::test_every_kernel_compiles_to_ptx_and_cubin",
    # the 12-layer model; the per-part trace test of the same model stays
    "tests/models/test_gpt2_function.py::test_a_12_layer_forward_compiles_the_kernels_of_a_1_layer_forward",
    # cold-cache compiles of a second shape (the clone's line neared 10 minutes): the "-one" masks, the other shapes
    # of each attention test, the other half-precision cases, the 200-token cache and the 2-block Q4_K stack stay
    "tests/tensor_ops/test_attention.py::test_sdpa_masks[float gqa-many]",
    "tests/tensor_ops/test_attention.py::test_sdpa_masks[bool per head-many]",
    "tests/tensor_ops/test_attention.py::test_sdpa_in_realized_blocks_against_torch[qs1-7-3-32-kw1]",
    "tests/tensor_ops/test_attention.py::test_sdpa_half_inputs_accumulate_in_float32[False-dtype0-0.003]",
    "tests/tensor_ops/test_attention.py::test_blocked_backward_odd_lengths_against_torch[qs0-129-2-kw0]",
    "tests/tensor_ops/test_attention.py::test_blocked_heads_one_at_a_time_against_torch[q_shape1-kv_shape1-None-kw1]",
    "tests/models/test_generate_attention.py::test_a_causal_chunk_attends_in_query_blocks_over_a_growing_cache[256]",
    "tests/models/test_quant_avx2.py::test_the_stacked_avx2_matvec_equals_each_matrix_own[Q4_K-1-768-2]",
    # the float32 and rank cases stay; the bfloat16 emulated matmul and the average pool stay
    "tests/tensor_ops/test_sorting.py::test_sort_nan_inf_and_signed_zero_like_torch[network-13-float64]",
    "tests/runtime/test_emulated_ops.py::test_op_suite_emulated_matches_native[CPU-matmul-float16]",
    "tests/codegen/test_conv_layouts.py::test_conv_output_is_stored_before_a_pool[max_pool2d]",
    # the server's completion, streaming, error and cancel tests stay; this one times a first token
    "tests/models/test_llm_server.py::test_usage_reports_the_time_to_first_token",
    # the longest cold cases of tests with cases left (a fresh clone's line measured 552 to 624 s): the 4-head odd
    # backward, the 129-length realized blocks, the other SVD shapes, three Keccak variants, the two-thread Q8_0
    # stacks, the 5-step scan and the CPU and LLVM gram matrices stay
    "tests/tensor_ops/test_attention.py::test_blocked_backward_odd_lengths_against_torch[qs1-129-2-kw1]",
    "tests/tensor_ops/test_attention.py::test_sdpa_in_realized_blocks_against_torch[qs6-23-None-32-kw6]",
    "tests/tensor_ops/test_linalg.py::test_svd[shape5-True]",
    "tests/tensor_ops/test_sorting.py::test_keccak_against_hashlib[sha3_256]",
    "tests/models/test_quant_avx2.py::test_the_stacked_avx2_matvec_equals_each_matrix_own[Q8_0-1-768-1]",
    "tests/models/test_quant_avx2.py::test_the_stacked_avx2_matvec_equals_each_matrix_own[Q8_0-3-64-1]",
    "tests/tensor_ops/test_reduce.py::test_scan_gradients[300]",
    "tests/codegen/test_opt_regressions.py::test_gram_matrix_sum_of_a_narrow_input[CL]",
}

# every case of these compiles kernels of its own shape or dtype: a fresh clone's test line measured 590 and 631 s on
# 2 cores with an empty kernel cache (2026-12-07), ~1170 worker-seconds, a third of them in the C compiler. A quarter
# of each test's cases keeps every test (and every dtype and shape family, spread by the stride) in the fast part
SAMPLE_EVERY = 4
SAMPLED = (
    # the op suite on the backends whose compiles are slowest (PoCL, LLVM); its CPU cases all stay
    "tests/runtime/test_backend_ops.py::test_op[CL-",
    "tests/runtime/test_backend_ops.py::test_op[LLVM-",
    "tests/codegen/test_conv_kernels.py::test_conv_forward_and_backward_equal_torch",
    "tests/codegen/test_conv_kernels.py::test_conv_kernels_have_no_division_in_the_innermost_loop",
    "tests/codegen/test_conv_kernels.py::test_small_convnet_forward_and_backward_equal_torch",
    "tests/codegen/test_conv_kernels.py::test_strided_conv_input_gradient_kernels_never_divide",
    "tests/codegen/test_conv_kernels.py::test_strided_conv_transpose_equals_torch_and_never_divides",
    "tests/codegen/test_conv_layouts.py::test_conv_over_taps_sums_its_channels_in_blocks",
    "tests/codegen/test_conv_layouts.py::test_relaid_conv_forward_and_backward_equal_torch",
    "tests/codegen/test_conv_layouts.py::test_window_columns_forward_and_backward_equal_torch",
    "tests/codegen/test_depthwise.py::test_window_is_unrolled_and_the_row_left_to_the_compiler",
    "tests/codegen/test_lane_sums.py::test_lane_column_sums_match_float64_and_noopt",
    "tests/codegen/test_matmul_grad_opts.py::test_matmul_forward_backward_equal_noopt_and_torch",
    "tests/codegen/test_opt_regressions.py::test_matmul_of_an_exp_has_torchs_weight_gradient",
    "tests/codegen/test_opt_regressions.py::test_relu_of_square_matmul_sum",
    "tests/codegen/test_opt_regressions.py::test_short_reduce_tile_with_a_fused_row_operand",
    "tests/codegen/test_opts.py::test_transposed_copies_run_in_8x8_tiles_and_equal_numpy",
    "tests/codegen/test_tile_blocks.py::test_one_axis_reduce_tiles_one_vector_of_long_rows_and_equal_torch",
    "tests/engine/test_jit.py::test_jitted_training_matches_eager_and_torch",
    "tests/models/test_generate_attention.py::test_attention_matches_reference",
    "tests/models/test_llama.py::test_quantized_matmul_is_one_kernel_over_the_blocks",
    "tests/models/test_llama.py::test_quantized_matrix_values_match_gguf_dequantize",
    "tests/models/test_quant_avx2.py::test_the_avx2_matvec_equals_numpy_on_the_dequantized_weights",
    "tests/models/test_quant_avx2.py::test_the_avx2_matvec_with_the_norm_and_the_residual_inside_equals_numpy",
    "tests/models/test_quant_avx2.py::test_the_f32_matvec_equals_numpy",
    "tests/models/test_quant_avx2.py::test_the_swiglu_avx2_matvec_equals_numpy",
    "tests/models/test_quant_dot.py::test_integer_matvec_equals_dequantized_float_math_within_the_activation_error",
    "tests/models/test_quant_gemm.py::test_avx2_panels_equal_gguf_dequantize",
    "tests/models/test_quant_gemm.py::test_quantized_gemm_equals_numpy_dequantize_then_matmul",
    "tests/nn/test_decode_attention.py::test_decode_attention_equals_a_float64_softmax_at_every_position",
    "tests/nn/test_layers.py::test_conv2d",
    "tests/nn/test_layers.py::test_norm_layers",
    "tests/nn/test_optim.py::test_placed_parameters_match_single_device",
    "tests/nn/test_state_fuzz.py::test_fuzz_loaders_never_crash_or_change_globals",
    "tests/onnx/test_ops_detection.py::test_roi_align_matches_onnxruntime",
    "tests/renderer/test_vector_math.py::test_vector_max_and_min_equal_torch_and_noopt",
    "tests/runtime/test_backend_ops.py::test_cast",
    "tests/runtime/test_buffers.py::test_values_correct_whatever_the_memory_held",
    "tests/runtime/test_cpu_flags.py::test_casts_between_every_pair_of_dtypes_run_on_cpu",
    "tests/runtime/test_emulated_ops.py::test_fp8_arithmetic_emulated_matches_native",
    "tests/runtime/test_emulated_ops.py::test_op_suite_emulated_matches_native",
    "tests/runtime/test_emulated_ops.py::test_op_suite_in_int64_emulated_matches_native",
    "tests/runtime/test_emulated_wide_ints.py::test_int64_emulated_matches_native",
    "tests/runtime/test_emulated_wide_ints.py::test_uint64_emulated_matches_native",
    "tests/schedule/test_multi.py::test_reduce_over_and_across_shard_axis",
    "tests/tensor/test_ops_core.py::test_dtype_cast",
    "tests/tensor/test_ops_core.py::test_dtype_max_reduce",
    "tests/tensor/test_ops_core.py::test_int_floordiv_mod",
    "tests/tensor/test_ops_core.py::test_unary_dtypes",
    "tests/tensor_ops/test_attention.py::test_sdpa_against_torch",
    "tests/tensor_ops/test_custom_kernel.py::test_blocked_gemm",
    "tests/tensor_ops/test_elementwise.py::test_bitcast",
    "tests/tensor_ops/test_elementwise.py::test_bitwise",
    "tests/tensor_ops/test_elementwise.py::test_shifts",
    "tests/tensor_ops/test_elementwise.py::test_unary_dtypes",
    "tests/tensor_ops/test_elementwise.py::test_unary_forward_and_grad",
    "tests/tensor_ops/test_elementwise.py::test_unary_special_values",
    "tests/tensor_ops/test_elementwise.py::test_unary_views_and_edge_shapes",
    "tests/tensor_ops/test_indexing.py::test_scatter_reduce_dtypes",
    "tests/tensor_ops/test_linalg.py::test_panel_matmul_values_and_gradients",
    "tests/tensor_ops/test_linalg.py::test_qr",
    "tests/tensor_ops/test_linalg.py::test_svd",
    "tests/tensor_ops/test_max_pool_dim_by_dim.py::test_values_and_gradient_equal_torch",
    "tests/tensor_ops/test_movement.py::test_diagonal",
    "tests/tensor_ops/test_movement.py::test_pad_modes",
    "tests/tensor_ops/test_movement.py::test_pad_modes_views",
    "tests/tensor_ops/test_movement.py::test_roll",
    "tests/tensor_ops/test_movement.py::test_split",
    "tests/tensor_ops/test_movement.py::test_triangle",
    "tests/tensor_ops/test_movement.py::test_unfold",
    "tests/tensor_ops/test_nn.py::test_avg_pool",
    "tests/tensor_ops/test_nn.py::test_conv",
    "tests/tensor_ops/test_nn.py::test_conv_transpose",
    "tests/tensor_ops/test_nn.py::test_interpolate_2d",
    "tests/tensor_ops/test_nn.py::test_max_pool_with_indices",
    "tests/tensor_ops/test_nn.py::test_sdpa",
    "tests/tensor_ops/test_nn.py::test_sparse_categorical_crossentropy",
    "tests/tensor_ops/test_nn.py::test_tiled_max_pool_gradient_goes_to_the_tap_torch_picks",
    "tests/tensor_ops/test_reduce.py::test_argmax_argmin_first_occurrence",
    "tests/tensor_ops/test_reduce.py::test_max_min_every_dtype",
    "tests/tensor_ops/test_reduce.py::test_mean_var_std_dtypes",
    "tests/tensor_ops/test_reduce.py::test_reductions_of_views",
    "tests/tensor_ops/test_reduce.py::test_scans_of_views",
    "tests/tensor_ops/test_sorting.py::test_sort_every_dtype_is_stable",
    "tests/test_dtype_fp8.py::test_elementwise_in_float32_rounded_back",
    "tests/test_dtype_fp8.py::test_gradients_run_like_half",
    "tests/test_dtype_fp8.py::test_kernel_cast_float32_to_fp8_bit_exact",
    "tests/test_dtype_fp8.py::test_kernel_cast_fp8_to_every_dtype",
)
