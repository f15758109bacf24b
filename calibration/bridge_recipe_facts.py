"""The recipe facts of the Megatron-Bridge MoE and GPT-OSS rows in the CSV's `set` column
(`diffperf validate`'s per-row FIELD=VALUE facts), each read from the performance recipe of the
row's own container release (docs/accuracy-bridge.md, sections "MoE physics" and "Recipe facts
per container").

    python calibration/bridge_recipe_facts.py OUT.csv \
        [--facts overlap,layout,dispatch,attn,moe_act,recompute,quant_pad,waves,expert_loop,tp_ub,
                 te_quant,cudnn_norm,swizzle,host_sync]
    python calibration/bridge_recipe_facts.py data/megatron_bridge.csv   # the shipped CSV
    python calibration/bridge_moe_rows.py --csv OUT.csv          # per-row effect

1. `ep_overlap=1` where the row's performance recipe, *at the row's container release*, sets
   Megatron-Core's `overlap_moe_expert_parallel_comm = True` (the EP all-to-all of one
   micro-batch runs behind the computation of another). diffperf's `Parallel.ep_overlap` = 1
   lets the all-to-alls hide behind the layer's GEMM time (`predict._ep_parts`).
   Container -> Megatron-Bridge release (Megatron-Bridge `docs/versions1.json` and
   `docs/releases/software-versions.md`): 25.09 v0.1.0rc3, 25.11 v0.2.0, 26.02 v0.3.0,
   26.02.01 v0.3.1, 26.04 v0.4.0, 26.04.01 v0.4.2, 26.06 v0.5.0, 26.06.01 v0.5.1, 26.08
   v0.6.0. At each release the flag is the workload preset's `moe_a2a_overlap`
   (`scripts/performance/configs/<family>/*workload_base_configs.py`, applied by
   `utils/overrides.py` / `utils/helpers.py` as `overlap_moe_expert_parallel_comm = True`;
   25.09: `scripts/performance/run_script.py`, which turns it on for DeepSeek-V3 on H100 only;
   26.08: `src/megatron/bridge/perf_recipes/`, e.g. `_enable_deepseek_full_iteration_mxfp8`,
   `_enable_hybridep_full_iteration_mxfp8`, `_apply_gpt_oss_120b_full_iter_fp8mx_configs`).
   The preset of a row is the one of its model, GPU, precision whose GPUs, MBS, TP, PP and EP
   are the row's; where two variants (V1, V2) match, V2 (the 26.06 GPT-OSS GB200 MXFP8 rows ran
   at the 26.08 full-iteration recipe's speed, 2.83 vs 2.86 s); where none matches the printed
   layout (seven 25.11 GB300 / GB200 rows), every preset of that model, GPU and precision
   agrees. The first version of this file applied the snapshot's (067f987d, after 26.08)
   recipes to every container: 62 rows of 25.09-26.04.01 carried an overlap their release did
   not run (the MXFP8 Blackwell MoE recipes gained it with full-iteration CUDA graphs and the
   fused grouped MLP in 26.06) and 4 lacked one it did.
3. The `ep_dispatch` column (not the set column) of the rows whose release ran Megatron-Core's
   `alltoall` dispatcher where the snapshot's recipe runs the flex one (`ALLTOALL_BY_RELEASE`):
   at 25.11 (v0.2.0) and 26.02 (v0.3.0) the dispatcher is flex only when the workload preset
   names a backend (`apply_flex_dispatcher_backend`, `src/megatron/bridge/training/
   flex_dispatcher_backend.py`: it sets `moe_token_dispatcher_type = "flex"`; no backend, the
   recipe's alltoall), and from 26.02.01 (v0.3.1) to 26.06.01 (v0.5.1) Qwen3 235B-A22B's
   `qwen3_llm_pretrain.py` sets the type per GPU (DGX-B300: alltoall until v0.4.0, flex from
   v0.4.2; DGX-B200 and DGX-H100: alltoall). DeepSeek-V3 and GPT-OSS rows of 26.02.01+ and the
   25.09 rows keep the snapshot's dispatcher (not re-read; but see 3b). With the flex dispatcher's own
   data movement (`workload.flops.moe_permute_bytes`, `costs.collectives.
   hierarchical_all_to_all_s`) the dispatcher matters inside one NVLink domain too.
3b. (session 10, branch qwenmoe) Two more kinds of rows ran the alltoall dispatcher:
   - every token-drop row (`moe_token_drop` = 1: the 25.09 tables' "token drop" rows): the
     25.09 performance script (v0.1.0rc3 `scripts/performance/run_script.py`) calls
     `apply_moe_token_drop` for every Qwen3 recipe and for DeepSeek-V3 on B200 / GB200 (where it
     also turns DeepEP off: "Using token drop, disabling DeepEP"), and `apply_moe_token_drop`
     (`src/megatron/bridge/training/utils/moe_token_drop.py`) asserts
     `moe_token_dispatcher_type in ("alltoall", "alltoall_seq")` ("moe_expert_capacity_factor
     only works with alltoall token dispatcher"); Megatron-Core's capacity / pad path exists only
     in `MoEAlltoAllTokenDispatcher` (`drop_and_pad`). 9 rows, all 25.09 (`TOKEN_DROP_ALLTOALL`).
   - the 26.02 DGX-H100 Qwen3 30B-A3B row: its v0.3.0 preset (`QWEN3_30B_A3B_PRETRAIN_CONFIG_
     H100_FP8_CS_V1`) names `moe_flex_dispatcher_backend = "deepep"`, but Megatron-Bridge's
     `docs/releases/known-issues.md` (26.02): "DeepEP is not supported in the current NeMo
     framework 26.02 container ... which results in reduced DSv3 performance compared to ... 25.09
     ... on H100", and Megatron-Core raises ImportError ("DeepEP is not installed", core_v0.16.0
     `transformer/moe/token_dispatcher.py`) when the flex dispatcher's deepep backend is asked
     for without it; the only other dispatcher of that recipe is the Qwen3 provider's default
     `moe_token_dispatcher_type = "alltoall"` (`models/qwen/qwen_provider.py`). In
     `ALLTOALL_BY_RELEASE["26.02"]`.
2. DeepSeek-V3's pipeline layout (`pp_first_layers`, `pp_last_layers`: decoder layers on the
   first and the last device) from Megatron-Bridge's `_get_deepseek_v3_pipeline_layout`
   (recipes/deepseek/h100/deepseek_v3.py), which every DeepSeek-V3 performance recipe applies:
   (pp, vp) = (16, 1): [embedding + 4], 14 x [4], [1 + MTP + loss] -> first 4, last 1;
   (8, 2) and (8, 1): [E + 8 per device], last device 5 + MTP + loss -> 8, 5;
   (4, 4) and (4, 2): 16, 13; DGX-H100 (pp 8, vp 4) with the recipe's explicit layout
   "Et|(tt|)*30mL" (32 virtual stages: E + 1, 30 x 2, MTP + loss) -> 7, 6. Other (pp, vp)
   (GB300's (2, 8) and (2, 4), GB200's (8, 4) of 25.11) have no layout in the map and keep
   diffperf's automatic split.
4. `attn_tile=128` on the GPT-OSS 120B rows (the one model with sliding-window layers): its
   attention runs as Transformer Engine's FusedAttention (cuDNN F16_arbitrary_seqlen), which
   is the only fused backend for `softmax_type = learnable` (TE `attention/dot_product_
   attention/utils.py` get_attention_backend, v2.9 to v2.16: FlashAttention disabled for
   sinks; FusedAttention needs cuDNN >= 9.13.1, `common/fused_attn/fused_attn.cpp`), and every
   container of these rows ships cuDNN >= 9.13.1 (Megatron-Bridge docs/releases/software-
   versions.md: 25.11 9.13.1.26, 26.02 9.18.0.50, 26.04 9.20.0.48, 26.06 9.21.1.3). Megatron-
   Bridge's GPT-OSS bridge sets `window_size = (127, 0)`, `window_attn_skip_freq = 2`,
   `softmax_type = "learnable"` (models/gpt_oss/gpt_oss_bridge.py). A fused kernel skips only
   the score tiles no query of a row block sees (cuDNN's own sliding-window backward timings:
   cudnn-frontend PR #505); `workload.flops.attention_tile_kappas` counts them, 128 x 128
   tiles (flash-attention's head_dim-64 forward). docs/accuracy-gptoss.md.
5. `moe_eager_clamp_bias=1` on the GPT-OSS 120B rows of containers 25.11 to 26.04.01 (Megatron
   Core 0.15-0.17): `weighted_bias_quick_geglu_impl` clamps and concatenates the two fc1 halves in
   eager PyTorch before its fused activation, and `TEGroupedMLP._apply_bias` adds the fc2 bias per
   local expert in a Python loop (the fused op path, `use_transformer_engine_op_fuser`, first
   appears in core_v0.18.0); `Training.moe_eager_clamp_bias`, docs/accuracy-gptoss.md section
   "Expert MLP element-wise".
6. The recompute of each row as its release's recipe sets it (`RECOMPUTE_BY_RELEASE`; the CSV's
   `recompute` column and, in `set`, Megatron-Core's `recompute_modules` as the 0/1 fields
   `recompute_<module>` of workload.recompute, or `recompute_layer_frac` of full recompute).
   Per release: the workload preset's `recompute_modules` / `recompute_num_layers`
   (`scripts/performance/configs/<family>/*workload_base_configs.py`, applied by
   `utils/overrides.py` `_set_recompute_overrides`: modules -> granularity "selective",
   num_layers -> "full", method "block"); 25.09: `run_script.py` (DeepSeek-V3: H100
   ["mla_up_proj", "mlp"], GB200 ["mla_up_proj", "mlp", "moe_act"], else the recipe's
   selective with Megatron's default ["core_attn"]) and the `*_llm_pretrain.yaml` perf matrix;
   26.08: `src/megatron/bridge/perf_recipes/<family>/<gpu>/*.py`. The preset of a row is the
   one of its model, GPU and precision whose GPUs, GBS, MBS, TP, PP, CP, VP and EP are the
   row's (V2 where V1 and V2 both are candidates and only V2's GPUs and GBS match). At 25.11
   (v0.2.0) `set_recompute_overrides` sets only the modules, not the granularity: DeepSeek's
   perf script sets "selective", GPT-OSS's recipe leaves it None (Megatron-Core reads
   recompute_modules only under "selective"), so the 25.11 GPT-OSS rows recompute nothing.
   A preset's empty list (`recompute_modules = []`, the 26.06+ DeepSeek GB300 and GPT-OSS GB200
   MXFP8 full-iteration recipes) recomputes nothing: written as none. Qwen3 rows: the
   recipes set granularity None at every release (none). Llama: one row, 25.11 DGX-H100
   Llama 3 8B FP8-CS, recompute_num_layers 5 (full, block: the first 5 of the 32 layers of
   its one stage). docs/accuracy-bridge.md, "Session 10: selective recompute modules".
7. `moe_quant_pad=1` (session 10, branch dropless) on the FP8 / MXFP8 MoE rows that ran
   Megatron-Core's alltoall dispatcher dropless (`ep_dispatch` 0 after fact 3 / 3b,
   `moe_token_drop` 0) in containers 25.09-26.04.01 (Megatron Core 0.14-0.17: core_v0.14.0 for
   25.09, the 3rdparty/Megatron-LM commits Megatron-Bridge v0.2.0 / v0.3.0 / v0.4.0 / v0.4.2
   pin for the later ones): TEGroupedMLP pads the routed tokens per local expert to the
   quantized GEMM's alignment (Transformer Engine Fp8Padding) and strips the fc2 output
   (Fp8Unpadding) whenever the run quantizes, and both copy unless every expert's token count
   is already a multiple of 16 (32 for MXFP8): never under force-balanced dropless routing
   (the Qwen3 performance recipes set `moe_router_force_load_balancing = True`, "required for
   token dropless"), always aligned in the drop-and-pad rows (capacity x EP x TP tokens per
   expert). No recipe of these models sets `moe_router_padding_for_fp8` /
   `_for_quantization` (Megatron-Bridge v0.1.0rc3 ... v0.4.2; DeepSeek's sets it False), which
   would pad in the router instead. Not set on the flex rows: DeepEP's dispatch returns
   unaligned counts (Megatron-Core `fused_a2a.py` passes no `expert_alignment`) but HybridEP
   (core 0.16+, and Megatron-Bridge v0.2.0's pinned dev core) pads inside its dispatch
   (`pad_multiple`), and the CSV does not carry which backend a flex row ran.
   `Training.moe_quant_pad`, `workload.flops.moe_quant_pad_bytes`; docs/accuracy-bridge.md
   "Session 10: the dropless alltoall path".
8. `gemm_wave_split=1` (session 11, branch bridgewave) on every DGX-H100 row (system
   h100-sxm-80gb, every container): the GEMMs are cuBLAS(Lt)'s persistent Hopper kernels, one
   CTA per SM, and nothing in these runs reserves SMs for the communication beside them, so a
   GEMM beside an NCCL kernel (the distributed optimizer's overlapped gradient reduce-scatter
   and parameter all-gather, the EP all-to-all, DeepEP's kernels) runs a second wave
   (`Training.gemm_wave_split`, `schedule.overlap.overlap_sigma`). Transformer Engine (v2.7 in
   25.09, 2.9 in 25.11, 2.12 in 26.02, 2.14 in 26.04: Megatron-Bridge docs/releases/
   software-versions.md) gives cuBLASLt an SM target only when asked: `num_math_sms = sm_count
   - getenv("NVTE_EXT_MARGIN_SM", sm_count)` = 0 by default (pytorch/csrc/extensions/gemm.cpp
   `gemm`; cpp_extensions/gemm.py `general_grouped_gemm` for the MoE experts, the same), and
   common/gemm/cublaslt_gemm.cu sets CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET only when
   math_sm_count != 0 (read at TE v2.7, v2.9, v2.12, v2.14, v2.16). No Megatron-Bridge release
   (v0.1.0rc3 ... v0.5.0, snapshot 4ab94dfad) sets NVTE_EXT_MARGIN_SM: its performance scripts
   set only NVTE_{FWD,BWD}_LAYERNORM_SM_MARGIN (the norm kernels) and NCCL_CTA_POLICY /
   NCCL_NVLS_ENABLE. TE's userbuffers TP overlap sizes its own GEMMs (`tp_userbuffers_sigmas`).
   Hopper only: the wave split rests on Hopper's static tile schedule (NVIDIA/cutlass issue
   2471); Blackwell's CUTLASS GEMMs schedule tiles dynamically (cluster launch control), and
   no source read here says what Blackwell's cuBLAS kernels do beside NCCL: not set there.
9. `moe_expert_loop=1` (session 12, branch moelocal) on every MoE row of containers
   25.09-26.04.01 (BF16, FP8-CS, MXFP8): Megatron-Core's TEGroupedMLP (the providers set
   `moe_grouped_gemm = True`: Megatron-Bridge v0.1.0rc3 `deepseek_provider.py`,
   `qwen3_moe_bridge.py`; v0.2.0-v0.4.0 `qwen_provider.py`, `deepseek_v3_bridge.py`) builds
   Transformer Engine GroupedLinear layers, and TE 2.7 / 2.9 / 2.12 / 2.14 (25.09 / 25.11 /
   26.02 / 26.04) runs a GroupedLinear as one cuBLASLt GEMM per local expert round-robin over
   4 streams (`multi_stream_cublas_gemm`; the single-launch CUTLASS path only on Hopper under
   NVTE_USE_CUTLASS_GROUPED_GEMM, which no release sets) and quantizes each expert's slice
   with its own kernel (`split_quantize`, MXFP8 and FP8 current scaling: "Quantize kernels
   individually"). The performance scripts of these releases turn TE's op fuser off
   (v0.1.0rc3 run_script.py "Disabling model.use_transformer_engine_op_fuser";
   v0.2.0 utils/helpers.py, v0.3.0 / v0.4.0 utils/overrides.py). 26.06+ (Megatron Core
   0.18, TE 2.16; session 13, branch fp8cs, read per row): Megatron-Bridge v0.5.0 / v0.5.1
   `scripts/performance/configs/*/*_workload_base_configs.py` set `cutedsl_fused_grouped_mlp`
   on the GB200 / GB300 MXFP8 DeepSeek-V3, GPT-OSS 120B (V2) and Qwen3 235B-A22B (V2) configs
   and on Qwen3 30B-A3B GB200 / GB300 / B300 MXFP8; `utils/overrides.py` then turns TE's op
   fuser on and `perf_plugins.py` sets NVTE_CUTEDSL_FUSED_GROUPED_MLP=1, and TE 2.16's
   `ForwardGroupedMLP_CuTeGEMMSwiGLU_MXFP8` / `BackwardGroupedMLP_CuTeGEMMDSwiGLU_MXFP8`
   (pytorch/ops/fused/, sm100 family) run each grouped GEMM as one cuDNN-frontend kernel
   and quantize with one `tex.group_quantize`: no per-expert launches, no fact. The other
   26.06 MoE rows (DeepSeek-V3 and GPT-OSS 120B DGX-B300 MXFP8: their configs set no
   cutedsl flag and no op fuser; Qwen3 30B-A3B DGX-H100 FP8-CS) run TEGroupedMLP's TE
   `GroupedLinear` module, whose v2.16 forward / backward are still `split_quantize` +
   `general_grouped_gemm` (pytorch/module/grouped_linear.py): the fact is set.
   `Training.moe_expert_loop`, `workload.flops.moe_expert_loop_kernels`;
   docs/accuracy-bridge.md "Session 12: MoE on 8-GPU nodes".
10. `tp_userbuffers=1` (session 12, branch tpub) on the Llama rows whose release's performance
    recipe turns Transformer Engine's userbuffers TP overlap on: every Llama 3 70B / 3.1 405B
    recipe sets `tp_comm_overlap` with a userbuffers configuration on every GPU, False for
    NVFP4 (`cfg.comm_overlap.tp_comm_overlap = False if precision == "nvfp4" else ...`), and
    the FP8 configuration for every precision other than BF16 (`if precision == "bf16": ...
    else: userbuffers_fp8_...`): v0.2.0 `scripts/performance/configs/llama3{,1}/llama3{,1}_llm_
    pretrain.py`, v0.3.0-v0.5.0 `scripts/performance/configs/llama/llama3{,1}_llm_pretrain.py`
    (the base recipes' `CommOverlapConfig(tp_comm_overlap=True, ...)`); v0.1.0rc3 (25.09)
    `scripts/performance/run_script.py` builds the Llama recipes with their own
    `CommOverlapConfig(tp_comm_overlap=True, ...)` and sets `tp_comm_overlap_cfg` from
    `utils/helpers.py` COMM_OVERLAP_CONFIG_MAP (h100 / b200 / gb200, the FP8 entry for every FP8
    recipe). Megatron-Bridge keeps the overlap only with TP >= 2 and sequence parallelism
    (`training/comm_overlap.py` `_get_model_comm_overlap_cfgs`: "Disabling tensor parallel
    communication overlap due to TP size < 2 / sequence_parallel=False"). The four FP8
    configurations the recipes name (userbuffers_fp8_h100_h8192_tp4_mbs1_seqlen8192,
    _h100_h16384_tp8_cp2_mbs1_seqlen8192, _b200_h8192_tp2_mbs1_seqlen8192,
    _b200_h16384_tp4_cp2_mbs1_seqlen8192; GB200 / GB300 / B300 use the b200 ones) run the same
    methods, identical at v0.1.0rc3, v0.2.0, v0.5.0: ring exchange forward and for the output
    gradients, bulk for the backward's input re-gather and input-gradient reduce-scatter
    (`schedule.overlap.tp_userbuffers_block_s`). Llama 3 8B rows run TP 1 (nothing to set).
11. `lowp_te_quantizer=1` (session 13, branch fp8cs) on every FP8-CS and MXFP8 row: every
    release (25.09-26.08: Megatron Core 0.14-0.18, Transformer Engine 2.7-2.16) quantizes the
    linears' inputs with TE's quantizers driven by Megatron-Core's TE modules. TE's
    `Float8CurrentScalingQuantizer::quantize_impl` (pytorch/csrc/quantizer.cpp, v2.7 ... v2.16)
    runs the amax (a memset / `zero_amax_kernel` and `amax_kernel`, common/recipe/
    current_scaling.cu), `compute_scale_from_amax_kernel` and the cast: 4 kernels; a
    LayerNormLinear's norm (QKV, the dense fc1, MLA's q / kv up-projections) computes the amax
    inside the norm kernel (normalization.cpp, `quantize_with_amax` after `amax.zero_()`): 3, and
    no amax read. Megatron-Core (core_v0.14.0-0.18.0) calls `set_save_original_input` on
    linear_proj for every FP8 recipe but delayed scaling (transformer/attention.py,
    multi_latent_attention.py), on the shared experts' fc1 (moe/shared_experts.py) and on the
    routed experts' fc2 under recompute "moe_act" (moe/experts.py): TE keeps their 16-bit input
    and quantizes it again in the backward for the wgrad GEMM (module/linear.py,
    grouped_linear.py). `Training.lowp_te_quantizer`, `workload.flops.te_quantize_rows`;
    docs/accuracy-bridge.md "Session 13: kernel counts as TE launches them". Not set on the
    NVFP4 rows (TE's NVFP4 quantizer kernels, random Hadamard transform and 2D weight scaling,
    not read here) nor on BF16 rows (nothing quantized).
12. `te_cudnn_norm=1` (session 13, branch review13b) on the FP8-CS rows whose release's
    performance scripts leave `NVTE_NORM_FWD_USE_CUDNN=1` set: Megatron-Bridge v0.2.0-v0.5.1
    (25.11-26.06.01) put it in `utils/executors.py` PERF_ENV_VARS and `perf_plugins.py`
    `_set_model_specific_environment_variables` pops it (del_cudnn_ln) except for H100 Llama 3
    8B FP8-CS and GB200 / GB300 Llama 3 70B and Llama 3.1 405B FP8-CS (pretrain), and, from
    v0.3.0, GB200 / GB300 DeepSeek MXFP8. Transformer Engine 2.9-2.16's normalization.cpp takes
    the norm-fused amax (FUSED_NORM_AMAX_FP8) only without the variable, so these rows
    quantize QKV's and fc1's inputs with the full 4-kernel quantize and its amax read. 25.09
    (v0.1.0rc3) sets no such variable. Not set on the DeepSeek MXFP8 rows: under the variable
    their cuDNN norm writes MXFP8 itself (FULLY_FUSED), which `te_quantize_rows` does not model
    (the fact would not act). `Training.te_cudnn_norm`; docs/accuracy-bridge.md "Session 13:
    review of the TE kernel counts (branch `review13b`)".
13. `te_scale_swizzle` (session 13, branch bwquant) on the MXFP8 rows: Transformer Engine's
    MXFP8 scale swizzles before each GEMM. TE 2.7 (25.09) and 2.9 (25.11): both operands of
    every GEMM (`pytorch/csrc/extensions/gemm.cpp` `swizzle_scaling_factors`): value 1. TE 2.12
    (26.02, 26.02.01), 2.14 (26.04, 26.04.01), 2.16 (26.06, 26.06.01): only the weights and
    the tensors gathered under sequence parallelism (`swizzle_scales_for_gemm` skips scales
    the `optimize_for_gemm` quantizers wrote GEMM-ready): value 2. Not set on the 26.06+ rows
    with `cutedsl_fused_grouped_mlp` (TE's fused grouped MLP op, not read) nor on 26.08 (TE
    version not read). `Training.te_scale_swizzle`, `workload.flops.te_quantize_rows`;
    docs/accuracy-bridge.md "Session 13: Blackwell FP8 buffers and MXFP8 swizzles".
14. `moe_host_sync=1` (session 15, branch hostsync) on the dropless MoE rows of containers
    25.09-26.04.01 (Megatron Core 0.14-0.17): every dropless dispatcher blocks the host once
    per MoE layer forward, before the token dispatch. `alltoall` (MoEAlltoAllTokenDispatcher,
    core_v0.14.0-v0.17.0 `transformer/moe/token_dispatcher.py`): the split sizes and token
    counts go to the host on a side stream at `cuda_dtoh_point` and
    `_maybe_dtoh_and_synchronize` calls `self.d2h_event.synchronize()` at `cuda_sync_point`
    ("before_ep_alltoall" with ep > 1; the whole body under `if not self.drop_and_pad`);
    flex / DeepEP (`fused_a2a.py` `FusedDispatch.forward`: "the CPU will wait for GPU's signal
    to arrive", `num_recv_tokens_per_expert_list` a host list); flex / HybridEP (core 0.16 /
    0.17 `_HybridEPManager`: `num_permuted_tokens = None` when dropless, "will cause a CPU
    sync"; DeepEP hybrid-ep `csrc/hybrid_ep/executor/executor.cu` `dispatch_preprocess`:
    `cudaStreamSynchronize(args.stream)` before the dispatch kernel unless non_blocking). The
    backward pass has none (the saved host split sizes, the handle); full recompute re-runs
    the forward and its sync (priced: predict._layer_parts). TEGroupedMLP's
    `tokens_per_expert.tolist()` then reads a host tensor (no second sync). Not set on the
    drop-and-pad rows (`moe_token_drop` = 1: no dtoh, no sync) nor on 26.06+ rows (Megatron
    Core 0.18's full-iteration recipes budget `num_permuted_tokens` and cannot capture a
    sync; the three 26.06 TE GroupedLinear rows were not read for it). GPT-OSS's second sync
    (quick-GEGLU's `torch.tensor(linear_offset, device=...)`) is not in the fact.
    `Training.moe_host_sync`, `schedule.overlap.host_sync_regions_s`; docs/accuracy-bridge.md
    "Session 15: host syncs inside the MoE layer (branch `hostsync`)".
"""

from __future__ import annotations

import argparse
import csv
import io
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CSV = ROOT / "data" / "megatron_bridge.csv"

# container -> (model, system, precision, GPUs) of the rows whose release's performance recipe
# sets overlap_moe_expert_parallel_comm (read at the release tags, docstring item 1)
_FULL_ITER_MXFP8 = [  # 26.06+: full-iteration CUDA graph + hybridep + fused grouped MLP presets
    ("deepseek-v3", "gb200-nvl72", "mxfp8", "256"), ("deepseek-v3", "gb300-nvl72", "mxfp8", "256"),
    ("gpt-oss-120b", "gb200-nvl72", "mxfp8", "64"), ("gpt-oss-120b", "gb300-nvl72", "mxfp8", "64"),
    ("qwen3-235b-a22b", "gb200-nvl72", "mxfp8", "256"),
    ("qwen3-235b-a22b", "gb300-nvl72", "mxfp8", "256"),
    ("qwen3-30b-a3b", "gb200-nvl72", "mxfp8", "8"), ("qwen3-30b-a3b", "gb300-nvl72", "mxfp8", "8")]
_H100_235B = ("qwen3-235b-a22b", "h100-sxm-80gb", "fp8-current", "256")
_GB200_OSS_BF16 = ("gpt-oss-120b", "gb200-nvl72", "bf16", "64")
A2A_OVERLAP = {
    "25.09": [("deepseek-v3", "h100-sxm-80gb", "fp8-current", "1024")],
    "25.11": [("qwen3-235b-a22b", "dgx-b200", "mxfp8", "64"), _H100_235B,
              ("qwen3-30b-a3b", "h100-sxm-80gb", "fp8-current", "16")],
    "26.02": [("qwen3-235b-a22b", "dgx-b300", "mxfp8", "256"), _H100_235B,
              ("qwen3-30b-a3b", "h100-sxm-80gb", "fp8-current", "16")],
    "26.02.01": [_H100_235B],
    "26.04": [_GB200_OSS_BF16, _H100_235B],
    "26.04.01": [("deepseek-v3", "dgx-b200", "mxfp8", "256"), _GB200_OSS_BF16, _H100_235B],
    "26.06": _FULL_ITER_MXFP8 + [("qwen3-30b-a3b", "dgx-b300", "mxfp8", "8")],
    "26.06.01": _FULL_ITER_MXFP8,
    "26.08": _FULL_ITER_MXFP8,
}
# container -> (model, system, precision, GPUs) of the rows whose release ran the alltoall
# dispatcher though the snapshot's recipe runs flex (docstring item 3): their ep_dispatch is 0
ALLTOALL_BY_RELEASE = {
    "25.11": [("deepseek-v3", "dgx-b200", "mxfp8", "256"), ("qwen3-30b-a3b", "dgx-b200", "mxfp8", "8"),
              ("qwen3-30b-a3b", "h100-sxm-80gb", "fp8-current", "16")],
    "26.02": [("gpt-oss-120b", "dgx-b300", "bf16", "64"), ("qwen3-30b-a3b", "dgx-b200", "mxfp8", "8"),
              ("qwen3-30b-a3b", "h100-sxm-80gb", "fp8-current", "16"),  # no DeepEP in 26.02 (3b)
              ("qwen3-235b-a22b", "dgx-b300", "mxfp8", "256"),
              ("qwen3-235b-a22b", "dgx-b200", "mxfp8", "256")],
    "26.02.01": [("qwen3-235b-a22b", "dgx-b300", "mxfp8", "256")],
    "26.04": [("qwen3-235b-a22b", "dgx-b300", "mxfp8", "256")],
    "26.04.01": [("qwen3-235b-a22b", "dgx-b200", "mxfp8", "256")],
}
# token-drop rows (CSV moe_token_drop = 1) ran Megatron-Core's alltoall dispatcher: the only one
# with a capacity / pad path (docstring item 3b)
TOKEN_DROP_ALLTOALL = True
# container -> [((model, system, precision, GPUs), recompute facts)] (docstring item 6): a
# tuple of Megatron-Core recompute_modules (selective), or ("full", layer fraction)
_DS = "deepseek-v3"
_OSS_LN_ACT = [(("gpt-oss-120b", sys_, "bf16", "64"), ("layernorm", "moe_act"))
               for sys_ in ("gb200-nvl72", "dgx-b200", "h100-sxm-80gb")]
_MLA = ("mla_up_proj",)
RECOMPUTE_BY_RELEASE = {
    "25.09": [((_DS, "h100-sxm-80gb", "fp8-current", "1024"), ("mla_up_proj", "mlp")),
              ((_DS, "gb200-nvl72", "fp8-current", "256"), ("mla_up_proj", "mlp", "moe_act")),
              ((_DS, "dgx-b200", "fp8-current", "256"), ("core_attn",)),
              ((_DS, "dgx-b200", "mxfp8", "256"), ("core_attn",))],
    "25.11": [((_DS, "gb300-nvl72", "bf16", "256"), ("moe_act",)),
              ((_DS, "gb300-nvl72", "mxfp8", "256"), ("moe_act",)),
              ((_DS, "gb200-nvl72", "bf16", "256"), _MLA),
              ((_DS, "gb200-nvl72", "mxfp8", "256"), _MLA),
              ((_DS, "dgx-b200", "mxfp8", "256"), _MLA),
              (("llama3-8b", "h100-sxm-80gb", "fp8-current", "8"), ("full", 5.0 / 32.0))],
    "26.02": [((_DS, s_, "mxfp8", "256"), _MLA)
              for s_ in ("gb300-nvl72", "gb200-nvl72", "dgx-b300", "dgx-b200")] + _OSS_LN_ACT,
    "26.02.01": [((_DS, s_, "mxfp8", "256"), _MLA)
                 for s_ in ("gb300-nvl72", "gb200-nvl72", "dgx-b300", "dgx-b200")] + _OSS_LN_ACT,
    "26.04": [((_DS, "gb300-nvl72", "mxfp8", "256"), _MLA),
              ((_DS, "gb200-nvl72", "mxfp8", "256"), ("mlp",)),
              ((_DS, "dgx-b300", "mxfp8", "256"), _MLA),
              ((_DS, "dgx-b200", "mxfp8", "256"), _MLA)] + _OSS_LN_ACT,
    "26.04.01": [((_DS, "gb300-nvl72", "mxfp8", "256"), _MLA),
                 ((_DS, "gb200-nvl72", "mxfp8", "256"), ("mlp",)),
                 ((_DS, "dgx-b300", "mxfp8", "256"), _MLA),
                 ((_DS, "dgx-b200", "mxfp8", "256"), ("mla_up_proj", "mlp"))] + _OSS_LN_ACT,
    "26.06": [((_DS, "gb200-nvl72", "mxfp8", "256"), _MLA),
              ((_DS, "dgx-b300", "mxfp8", "256"), _MLA)],
    "26.06.01": [((_DS, "gb200-nvl72", "mxfp8", "256"), _MLA)],
    "26.08": [((_DS, "gb200-nvl72", "mxfp8", "256"), _MLA)],
}
# Megatron-Core's default recompute_modules (TransformerConfig.__post_init__)
DEFAULT_MODULES = ("core_attn",)
MODULES = ("core_attn", "mlp", "moe_act", "layernorm", "mla_up_proj", "shared_experts")
# the set-column fields this file writes (the others a row carries are kept)
OWNED = ("ep_overlap", "pp_first_layers", "pp_last_layers", "attn_tile",
         "moe_eager_clamp_bias", "moe_quant_pad", "recompute_layer_frac", "gemm_wave_split",
         "moe_expert_loop", "moe_host_sync",
         "tp_userbuffers", "lowp_te_quantizer", "te_cudnn_norm", "te_scale_swizzle",
         *(f"recompute_{m}" for m in MODULES))
# Models of the CSV with sliding-window layers, and the fused kernel's score tile (fact 4)
SLIDING_WINDOW_MODELS = ("gpt-oss-120b",)
ATTN_TILE = 128
# Containers whose Megatron Core (0.15-0.17) runs GPT-OSS's expert clamp and fc2 bias as eager
# kernels (fact 5)
EAGER_CLAMP_BIAS_CONTAINERS = ("25.11", "26.02", "26.02.01", "26.04", "26.04.01")
# Containers whose Megatron Core (0.14-0.17) pads a quantized run's unaligned expert token
# counts in TEGroupedMLP (fact 7), and the precisions that quantize the expert GEMMs
QUANT_PAD_CONTAINERS = ("25.09", "25.11", "26.02", "26.02.01", "26.04", "26.04.01")
QUANT_PAD_PRECISIONS = ("fp8-current", "fp8-delayed", "fp8-blockwise", "mxfp8", "nvfp4")
# Containers whose Transformer Engine (2.7-2.14) GroupedLinear runs one cuBLASLt GEMM and one
# quantize kernel per local expert, with Megatron-Bridge's performance scripts turning TE's op
# fuser off (fact 9), and the precisions whose quantizers split_quantize runs one by one
EXPERT_LOOP_CONTAINERS = ("25.09", "25.11", "26.02", "26.02.01", "26.04", "26.04.01")
EXPERT_LOOP_PRECISIONS = ("bf16", "fp8-current", "fp8-blockwise", "mxfp8")
# Containers whose Megatron Core (0.14-0.17) dropless dispatchers block the host once per MoE
# layer forward before the token dispatch (fact 14)
HOST_SYNC_CONTAINERS = ("25.09", "25.11", "26.02", "26.02.01", "26.04", "26.04.01")
# 26.06+ (Megatron-Bridge v0.5.x): the (model, system, precision) of the workload configs with
# cutedsl_fused_grouped_mlp (TE's fused grouped MLP: one kernel per grouped GEMM); the other
# MoE rows of these containers run the per-expert loop (fact 9)
FUSED_GROUPED_MLP_CONTAINERS = ("26.06", "26.06.01", "26.08")
FUSED_GROUPED_MLP = tuple((m, s, "mxfp8") for m in ("deepseek-v3", "gpt-oss-120b",
                                                    "qwen3-235b-a22b", "qwen3-30b-a3b")
                          for s in ("gb200-nvl72", "gb300-nvl72")) + (
    ("qwen3-30b-a3b", "dgx-b300", "mxfp8"),)
# Systems whose GEMMs are Hopper cuBLAS persistent kernels with no SM carve-out (fact 8)
WAVE_SPLIT_SYSTEMS = ("h100-sxm-80gb",)
# Models whose performance recipes turn TE userbuffers TP overlap on (fact 10), and the
# precisions whose recipes turn it off
TP_UB_MODELS = ("llama3-70b", "llama3.1-405b", "llama3-8b")
TP_UB_OFF_PRECISIONS = ("nvfp4",)
# Precisions whose rows quantize with Transformer Engine's FP8 quantizers as read (fact 11)
TE_QUANT_PRECISIONS = ("fp8-current", "mxfp8")
# Containers whose Megatron-Bridge (v0.2.0-v0.5.1) keeps NVTE_NORM_FWD_USE_CUDNN=1 for these
# (model, system, precision) (fact 12)
CUDNN_NORM_CONTAINERS = ("25.11", "26.02", "26.02.01", "26.04", "26.04.01", "26.06", "26.06.01")
CUDNN_NORM_ROWS = (("llama3-8b", "h100-sxm-80gb", "fp8-current"),
                   *((m, s, "fp8-current") for m in ("llama3-70b", "llama3.1-405b")
                     for s in ("gb200-nvl72", "gb300-nvl72")))
# Transformer Engine per container (Megatron-Bridge docs/releases/software-versions.md) ->
# te_scale_swizzle (fact 13): 1 = TE 2.7 / 2.9, 2 = TE 2.12-2.16
SWIZZLE_BY_CONTAINER = {"25.09": 1, "25.11": 1, "26.02": 2, "26.02.01": 2, "26.04": 2,
                        "26.04.01": 2, "26.06": 2, "26.06.01": 2}
# DeepSeek-V3 (pp, vp) -> (decoder layers on the first device, on the last device)
DSV3_LAYOUT = {("16", "1"): (4, 1), ("8", "2"): (8, 5), ("8", "1"): (8, 5),
               ("4", "4"): (16, 13), ("4", "2"): (16, 13)}
# DGX-H100's recipe passes its own layout "Et|(tt|)*30mL" (perf_recipes/deepseek/h100)
DSV3_H100_LAYOUT = (7, 6)


def ran_alltoall(row, facts) -> bool:
    """Whether the row ran Megatron-Core's alltoall dispatcher: its CSV ep_dispatch, as fact 3 /
    3b rewrite it when "dispatch" is among the facts."""
    key = (row["model"], row["system"], row["precision"], row["num_gpus"])
    if "dispatch" in facts and (key in ALLTOALL_BY_RELEASE.get(row["container"], ())
                                or (TOKEN_DROP_ALLTOALL and row["moe_token_drop"] == "1")):
        return True
    return row["ep_dispatch"] == "0"


def recompute_of(row, facts) -> tuple[str, list[str]]:
    """(the `recompute` column, its set-column facts) of one CSV row (docstring item 6)."""
    key = (row["model"], row["system"], row["precision"], row["num_gpus"])
    if "recompute" not in facts:
        return "none", []
    got = dict(RECOMPUTE_BY_RELEASE.get(row["container"], ()))
    if key not in got:
        return "none", []
    rec = got[key]
    if rec[0] == "full":
        return "full", [f"recompute_layer_frac={rec[1]:g}"]
    out = [f"recompute_{m}={int(m in rec)}" for m in MODULES
           if (m in rec) != (m in DEFAULT_MODULES)]
    return "selective", out


def row_facts(row, facts) -> list[str]:
    """The FIELD=VALUE facts of one CSV row (a dict of its columns)."""
    out = []
    key = (row["model"], row["system"], row["precision"], row["num_gpus"])
    if "overlap" in facts and key in A2A_OVERLAP.get(row["container"], ()):
        out.append("ep_overlap=1")
    if "attn" in facts and row["model"] in SLIDING_WINDOW_MODELS:
        out.append(f"attn_tile={ATTN_TILE}")
    if ("moe_act" in facts and row["model"] == "gpt-oss-120b"
            and row["container"] in EAGER_CLAMP_BIAS_CONTAINERS):
        out.append("moe_eager_clamp_bias=1")
    if ("quant_pad" in facts and float(row["moe_experts"] or 0) > 0
            and row["container"] in QUANT_PAD_CONTAINERS
            and row["precision"] in QUANT_PAD_PRECISIONS
            and row["moe_token_drop"] != "1" and ran_alltoall(row, facts)):
        out.append("moe_quant_pad=1")
    if ("expert_loop" in facts and float(row["moe_experts"] or 0) > 0
            and (row["container"] in EXPERT_LOOP_CONTAINERS
                 or (row["container"] in FUSED_GROUPED_MLP_CONTAINERS
                     and key[:3] not in FUSED_GROUPED_MLP))
            and row["precision"] in EXPERT_LOOP_PRECISIONS):
        out.append("moe_expert_loop=1")
    if ("host_sync" in facts and float(row["moe_experts"] or 0) > 0
            and row["container"] in HOST_SYNC_CONTAINERS and row["moe_token_drop"] != "1"):
        out.append("moe_host_sync=1")
    if "waves" in facts and row["system"] in WAVE_SPLIT_SYSTEMS:
        out.append("gemm_wave_split=1")
    if ("tp_ub" in facts and row["model"] in TP_UB_MODELS
            and row["precision"] not in TP_UB_OFF_PRECISIONS
            and int(row["tp"]) > 1 and row["sequence_parallel"] == "1"):
        out.append("tp_userbuffers=1")
    if "te_quant" in facts and row["precision"] in TE_QUANT_PRECISIONS:
        out.append("lowp_te_quantizer=1")
    if ("cudnn_norm" in facts and "te_quant" in facts and key[:3] in CUDNN_NORM_ROWS
            and row["container"] in CUDNN_NORM_CONTAINERS):
        out.append("te_cudnn_norm=1")
    if ("swizzle" in facts and "te_quant" in facts and row["precision"] == "mxfp8"
            and row["container"] in SWIZZLE_BY_CONTAINER
            and not (row["container"] in FUSED_GROUPED_MLP_CONTAINERS
                     and key[:3] in FUSED_GROUPED_MLP)):
        out.append(f"te_scale_swizzle={SWIZZLE_BY_CONTAINER[row['container']]}")
    if "layout" in facts and row["model"] == "deepseek-v3":
        lay = (DSV3_H100_LAYOUT if row["system"] == "h100-sxm-80gb"
               else DSV3_LAYOUT.get((row["pp"], row["vp"])))
        if lay:
            out += [f"pp_first_layers={lay[0]}", f"pp_last_layers={lay[1]}"]
    return out + recompute_of(row, facts)[1]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--facts",
                   default="overlap,layout,dispatch,attn,moe_act,recompute,quant_pad,waves,"
                           "expert_loop,tp_ub,te_quant,cudnn_norm,swizzle,host_sync")
    args = p.parse_args(argv)
    facts = set(args.facts.split(","))
    rows = list(csv.reader(CSV.open(newline="")))
    header = rows[0] if "set" in rows[0] else rows[0] + ["set"]
    col = header.index("set")
    n = 0
    for r in rows[1:]:
        row = dict(zip(rows[0], r))
        # keep the facts this file does not write; rewrite the ones it does
        kept = [f for f in row.get("set", "").split(";")
                if f and f.split("=")[0] not in OWNED]
        f = row_facts(row, facts) + kept
        if len(r) <= col:
            r.append("")
        r[col] = ";".join(f)
        if "dispatch" in facts and ran_alltoall(row, facts):
            r[rows[0].index("ep_dispatch")] = "0"
        r[rows[0].index("recompute")] = recompute_of(row, facts)[0]
        n += bool(f)
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows([header] + rows[1:])
    Path(args.out).write_text(buf.getvalue())
    print(f"{n} of {len(rows) - 1} rows with facts -> {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
