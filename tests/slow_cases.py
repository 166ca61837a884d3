"""Test cases that run in the slow part (CI's second run, or FUSEGRAD_SLOW=1) rather than a clone's test line, which
must stay within 10 minutes on 2 cores with an empty kernel cache: the longest cases of tests whose other cases, or
other tests named here, still cover the same code in the fast part. Node ids, or their prefix up to a '[' (every
case of that test). conftest.py marks them slow; each group's comment says what stays in the fast part."""

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
