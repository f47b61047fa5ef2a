//! Raw declarations of fp8amp's C API (`capi/include/fp8amp/fp8amp.h`), one for one.
//!
//! Written by hand in bindgen's conventions (C enums are integer type aliases plus constants, so
//! that a value a newer library returns is never an invalid Rust enum; opaque handles are pointers
//! to zero-sized `#[repr(C)]` structs) and checked against the header by `tests/header.rs`: every
//! `FP8AMP_API` function (name, parameter and return types), every struct (fields, their types and
//! order; `sizeof` and `offsetof` from a C compiler), every enum constant and every integer
//! `#define`. A header change that this file does not follow fails `cargo test`.
//!
//! Everything here is `unsafe` and follows the C contract (docs/api.md section 1). Use the safe
//! crate `fp8amp` unless you need a function it does not wrap.
//!
//! Linking: `build.rs` links `libfp8amp` from `FP8AMP_LIB_DIR`, else from pkg-config's `fp8amp`
//! (`PKG_CONFIG_PATH=<prefix>/lib/pkgconfig`), else from the linker's default paths.
#![allow(non_camel_case_types, non_upper_case_globals)]

// `std::os::raw`, not `core::ffi`: the latter's integer aliases are newer than Rust 1.63 (Debian 12).
pub use std::os::raw::{c_char, c_uint, c_void};
// An enum whose values are all non-negative is `unsigned int` to gcc and clang; `tests/header.rs`
// checks that every enum here has this type and the header's values.

// ---- statuses -------------------------------------------------------------------------------
pub type fp8amp_status = c_uint;
pub const FP8AMP_SUCCESS: fp8amp_status = 0;
pub const FP8AMP_ERROR_INVALID_ARGUMENT: fp8amp_status = 1;
pub const FP8AMP_ERROR_INVALID_HANDLE: fp8amp_status = 2;
pub const FP8AMP_ERROR_SHAPE_MISMATCH: fp8amp_status = 3;
pub const FP8AMP_ERROR_DTYPE_MISMATCH: fp8amp_status = 4;
pub const FP8AMP_ERROR_DEVICE_MISMATCH: fp8amp_status = 5;
pub const FP8AMP_ERROR_OUT_OF_MEMORY: fp8amp_status = 6;
pub const FP8AMP_ERROR_NOT_SUPPORTED: fp8amp_status = 7;
pub const FP8AMP_ERROR_CUDA: fp8amp_status = 8;
pub const FP8AMP_ERROR_CUBLAS: fp8amp_status = 9;
pub const FP8AMP_ERROR_NCCL: fp8amp_status = 10;
pub const FP8AMP_ERROR_CORRUPT_DATA: fp8amp_status = 11;
pub const FP8AMP_ERROR_INTERNAL: fp8amp_status = 12;
pub const FP8AMP_ERROR_COMM: fp8amp_status = 13;

// ---- dtypes and devices ---------------------------------------------------------------------
pub type fp8amp_dtype = c_uint;
pub const FP8AMP_DTYPE_F32: fp8amp_dtype = 0;
pub const FP8AMP_DTYPE_F16: fp8amp_dtype = 1;
pub const FP8AMP_DTYPE_BF16: fp8amp_dtype = 2;
pub const FP8AMP_DTYPE_E4M3: fp8amp_dtype = 3;
pub const FP8AMP_DTYPE_E5M2: fp8amp_dtype = 4;

pub type fp8amp_device_type = c_uint;
pub const FP8AMP_DEVICE_CPU: fp8amp_device_type = 1;
pub const FP8AMP_DEVICE_CUDA: fp8amp_device_type = 2;

#[repr(C)]
#[derive(Debug, Copy, Clone, PartialEq, Eq)]
pub struct fp8amp_device {
    /// `type` in C (a Rust keyword).
    pub type_: fp8amp_device_type,
    pub index: i32,
}

// ---- opaque handles -------------------------------------------------------------------------
macro_rules! opaque {
    ($($s:ident => $h:ident),* $(,)?) => {$(
        #[repr(C)]
        pub struct $s {
            _private: [u8; 0],
        }
        pub type $h = *mut $s;
    )*};
}
opaque!(
    fp8amp_context_s => fp8amp_context,
    fp8amp_tensor_s => fp8amp_tensor,
    fp8amp_scaling_s => fp8amp_scaling,
    fp8amp_linear_s => fp8amp_linear,
    fp8amp_optimizer_s => fp8amp_optimizer,
    fp8amp_grad_scaler_s => fp8amp_grad_scaler,
    fp8amp_comm_s => fp8amp_comm,
);

/// DLPack's versioned managed tensor, declared and not defined by the header (`fp8amp/dlpack.h`).
#[repr(C)]
pub struct DLManagedTensorVersioned {
    _private: [u8; 0],
}

pub type fp8amp_alloc_fn = Option<
    unsafe extern "C" fn(
        user_data: *mut c_void,
        nbytes: usize,
        device: fp8amp_device,
        stream: *mut c_void,
    ) -> *mut c_void,
>;
pub type fp8amp_free_fn = Option<
    unsafe extern "C" fn(
        user_data: *mut c_void,
        ptr: *mut c_void,
        nbytes: usize,
        device: fp8amp_device,
        stream: *mut c_void,
    ),
>;

pub const FP8AMP_MAX_NDIM: i32 = 8;
pub const FP8AMP_MAX_AMAX_HISTORY: i32 = 65536;
pub const FP8AMP_NO_MASTER: i32 = -1;
pub const FP8AMP_MAX_STATE_BLOCK: i32 = 8192;
pub const FP8AMP_COMM_UNIQUE_ID_BYTES: i32 = 128;

// ---- recipes and scaling --------------------------------------------------------------------
pub type fp8amp_format = c_uint;
pub const FP8AMP_FORMAT_E4M3: fp8amp_format = 0;
pub const FP8AMP_FORMAT_HYBRID: fp8amp_format = 1;

pub type fp8amp_scaling_mode = c_uint;
pub const FP8AMP_SCALING_DELAYED: fp8amp_scaling_mode = 0;
pub const FP8AMP_SCALING_CURRENT: fp8amp_scaling_mode = 1;

pub type fp8amp_amax_algo = c_uint;
pub const FP8AMP_AMAX_MAX: fp8amp_amax_algo = 0;
pub const FP8AMP_AMAX_MOST_RECENT: fp8amp_amax_algo = 1;

#[repr(C)]
#[derive(Debug, Copy, Clone, PartialEq, Eq)]
pub struct fp8amp_recipe {
    pub struct_size: u32,
    pub format: fp8amp_format,
    pub mode: fp8amp_scaling_mode,
    pub margin: i32,
    pub interval: i32,
    pub amax_history_len: i32,
    pub amax_algo: fp8amp_amax_algo,
    pub power_of_two_scales: i32,
}

#[repr(C)]
#[derive(Debug, Copy, Clone, PartialEq, Eq)]
pub struct fp8amp_scaling_stats {
    pub quantized: u64,
    pub saturated: u64,
    pub underflowed: u64,
}

// ---- the Linear -----------------------------------------------------------------------------
pub type fp8amp_gemm_policy = c_uint;
pub const FP8AMP_GEMM_AUTO: fp8amp_gemm_policy = 0;
pub const FP8AMP_GEMM_ALWAYS_FP8: fp8amp_gemm_policy = 1;
pub const FP8AMP_GEMM_NEVER_FP8: fp8amp_gemm_policy = 2;

pub type fp8amp_gemm_kind = c_uint;
pub const FP8AMP_GEMM_KIND_NONE: fp8amp_gemm_kind = 0;
pub const FP8AMP_GEMM_KIND_FP8: fp8amp_gemm_kind = 1;
pub const FP8AMP_GEMM_KIND_BF16: fp8amp_gemm_kind = 2;
pub const FP8AMP_GEMM_KIND_F32: fp8amp_gemm_kind = 3;

pub type fp8amp_linear_role = c_uint;
pub const FP8AMP_ROLE_INPUT: fp8amp_linear_role = 0;
pub const FP8AMP_ROLE_WEIGHT: fp8amp_linear_role = 1;
pub const FP8AMP_ROLE_GRAD_OUTPUT: fp8amp_linear_role = 2;
pub const FP8AMP_ROLE_WEIGHT_GRAD: fp8amp_linear_role = 3;
pub const FP8AMP_ROLE_WEIGHT_STORAGE: fp8amp_linear_role = 4;

#[repr(C)]
#[derive(Debug, Copy, Clone, PartialEq, Eq)]
pub struct fp8amp_linear_desc {
    pub struct_size: u32,
    pub in_features: i64,
    pub out_features: i64,
    pub has_bias: i32,
    pub weight_dtype: fp8amp_dtype,
    pub wgrad_dtype: fp8amp_dtype,
    pub recipe: fp8amp_recipe,
    pub policy: fp8amp_gemm_policy,
    pub graph_replay: i32,
}

// ---- the optimizer and the loss scaler ------------------------------------------------------
pub type fp8amp_opt_level = c_uint;
pub const FP8AMP_OPT_LEVEL_O1: fp8amp_opt_level = 1;
pub const FP8AMP_OPT_LEVEL_O2: fp8amp_opt_level = 2;
pub const FP8AMP_OPT_LEVEL_O3: fp8amp_opt_level = 3;

#[repr(C)]
#[derive(Debug, Copy, Clone, PartialEq)]
pub struct fp8amp_adam_desc {
    pub struct_size: u32,
    pub adamw: i32,
    pub lr: f32,
    pub beta1: f32,
    pub beta2: f32,
    pub eps: f32,
    pub weight_decay: f32,
    pub maximize: i32,
    pub exp_avg_dtype: fp8amp_dtype,
    pub exp_avg_sq_dtype: fp8amp_dtype,
    pub master_dtype: i32,
    pub state_block_size: i32,
    pub max_grad_norm: f32,
    pub master_rounding: i32,
    pub rounding_seed: u32,
}

pub type fp8amp_master_rounding = c_uint;
pub const FP8AMP_MASTER_ROUND_NEAREST: fp8amp_master_rounding = 0;
pub const FP8AMP_MASTER_ROUND_STOCHASTIC: fp8amp_master_rounding = 1;

pub const FP8AMP_MASTER_DEFAULT: i32 = -2;

#[repr(C)]
#[derive(Debug, Copy, Clone, PartialEq)]
pub struct fp8amp_param_desc {
    pub struct_size: u32,
    pub master_dtype: i32,
    pub master_init: fp8amp_tensor,
}

#[repr(C)]
#[derive(Debug, Copy, Clone, PartialEq)]
pub struct fp8amp_param_state {
    pub struct_size: u32,
    pub has_master: i32,
    pub step: i64,
    pub exp_avg: fp8amp_tensor,
    pub exp_avg_scale_inv: fp8amp_tensor,
    pub exp_avg_sq: fp8amp_tensor,
    pub exp_avg_sq_scale_inv: fp8amp_tensor,
    pub master: fp8amp_tensor,
    pub master_scale_inv: fp8amp_tensor,
    pub param_meta_history: fp8amp_tensor,
    pub param_meta_scale: f32,
    pub param_meta_amax: f32,
    pub param_meta_updates: i64,
}

#[repr(C)]
#[derive(Debug, Copy, Clone, PartialEq)]
pub struct fp8amp_adam_step_args {
    pub struct_size: u32,
    pub lr: f32,
    pub lr_device: *const f32,
    pub grad_scale_inv: f32,
    pub scaler: fp8amp_grad_scaler,
}

#[repr(C)]
#[derive(Debug, Copy, Clone, PartialEq)]
pub struct fp8amp_grad_scaler_desc {
    pub struct_size: u32,
    pub init_scale: f32,
    pub growth_factor: f32,
    pub backoff_factor: f32,
    pub growth_interval: i32,
    pub hysteresis: i32,
}

#[repr(C)]
#[derive(Debug, Copy, Clone, PartialEq)]
pub struct fp8amp_grad_scaler_state {
    pub scale: f32,
    pub growth_tracker: i32,
    pub hysteresis_left: i32,
}

// ---- communicators --------------------------------------------------------------------------
#[repr(C)]
#[derive(Copy, Clone)]
pub struct fp8amp_comm_unique_id {
    pub internal: [c_char; 128],
}

#[repr(C)]
#[derive(Debug, Copy, Clone, PartialEq, Eq)]
pub struct fp8amp_comm_reduce_desc {
    pub struct_size: u32,
    pub wire_dtype: fp8amp_dtype,
    pub average: i32,
    pub check: i32,
}

// ---- fused normalization and activations (0.4.0) ----------------------------------------------------------------
pub type fp8amp_norm_kind = c_uint;
pub const FP8AMP_NORM_LAYERNORM: fp8amp_norm_kind = 0;
pub const FP8AMP_NORM_RMSNORM: fp8amp_norm_kind = 1;

#[repr(C)]
#[derive(Debug, Copy, Clone, PartialEq)]
pub struct fp8amp_norm_desc {
    pub struct_size: u32,
    pub kind: fp8amp_norm_kind,
    pub eps: f32,
    pub zero_centered_gamma: i32,
}

pub type fp8amp_activation = c_uint;
pub const FP8AMP_ACTIVATION_GELU_TANH: fp8amp_activation = 0;
pub const FP8AMP_ACTIVATION_SILU: fp8amp_activation = 1;
pub const FP8AMP_ACTIVATION_SWIGLU: fp8amp_activation = 2;

// ---- functions, in the header's order -------------------------------------------------------
extern "C" {
    pub fn fp8amp_version() -> u32;
    pub fn fp8amp_status_name(status: fp8amp_status) -> *const c_char;
    pub fn fp8amp_last_error_message() -> *const c_char;
    pub fn fp8amp_dtype_size(dtype: fp8amp_dtype) -> usize;
    pub fn fp8amp_dtype_name(dtype: fp8amp_dtype) -> *const c_char;
    pub fn fp8amp_device_count(type_: fp8amp_device_type, count: *mut i32) -> fp8amp_status;
    pub fn fp8amp_context_create(device: fp8amp_device, out: *mut fp8amp_context) -> fp8amp_status;
    pub fn fp8amp_context_destroy(ctx: fp8amp_context) -> fp8amp_status;
    pub fn fp8amp_context_device(ctx: fp8amp_context, out: *mut fp8amp_device) -> fp8amp_status;
    pub fn fp8amp_context_set_stream(ctx: fp8amp_context, cuda_stream: *mut c_void) -> fp8amp_status;
    pub fn fp8amp_context_get_stream(ctx: fp8amp_context, cuda_stream: *mut *mut c_void) -> fp8amp_status;
    pub fn fp8amp_context_set_allocator(
        ctx: fp8amp_context,
        alloc_fn: fp8amp_alloc_fn,
        free_fn: fp8amp_free_fn,
        user_data: *mut c_void,
    ) -> fp8amp_status;
    pub fn fp8amp_context_synchronize(ctx: fp8amp_context) -> fp8amp_status;
    pub fn fp8amp_context_scratch_bytes(ctx: fp8amp_context, bytes: *mut usize) -> fp8amp_status;
    pub fn fp8amp_context_release_scratch(ctx: fp8amp_context) -> fp8amp_status;
    pub fn fp8amp_tensor_create(
        ctx: fp8amp_context,
        dtype: fp8amp_dtype,
        ndim: i32,
        shape: *const i64,
        out: *mut fp8amp_tensor,
    ) -> fp8amp_status;
    pub fn fp8amp_tensor_wrap(
        ctx: fp8amp_context,
        dtype: fp8amp_dtype,
        ndim: i32,
        shape: *const i64,
        data: *mut c_void,
        out: *mut fp8amp_tensor,
    ) -> fp8amp_status;
    pub fn fp8amp_tensor_rebind(t: fp8amp_tensor, data: *mut c_void, ndim: i32, shape: *const i64) -> fp8amp_status;
    pub fn fp8amp_tensor_destroy(t: fp8amp_tensor) -> fp8amp_status;
    pub fn fp8amp_tensor_dtype(t: fp8amp_tensor, out: *mut fp8amp_dtype) -> fp8amp_status;
    pub fn fp8amp_tensor_ndim(t: fp8amp_tensor, out: *mut i32) -> fp8amp_status;
    pub fn fp8amp_tensor_shape(t: fp8amp_tensor, capacity: i32, shape: *mut i64) -> fp8amp_status;
    pub fn fp8amp_tensor_numel(t: fp8amp_tensor, out: *mut i64) -> fp8amp_status;
    pub fn fp8amp_tensor_nbytes(t: fp8amp_tensor, out: *mut usize) -> fp8amp_status;
    pub fn fp8amp_tensor_data(t: fp8amp_tensor, out: *mut *mut c_void) -> fp8amp_status;
    pub fn fp8amp_tensor_device(t: fp8amp_tensor, out: *mut fp8amp_device) -> fp8amp_status;
    pub fn fp8amp_tensor_copy_from_host(t: fp8amp_tensor, src: *const c_void, nbytes: usize) -> fp8amp_status;
    pub fn fp8amp_tensor_copy_to_host(t: fp8amp_tensor, dst: *mut c_void, nbytes: usize) -> fp8amp_status;
    pub fn fp8amp_tensor_from_dlpack(
        ctx: fp8amp_context,
        managed: *mut DLManagedTensorVersioned,
        out: *mut fp8amp_tensor,
    ) -> fp8amp_status;
    pub fn fp8amp_tensor_to_dlpack(t: fp8amp_tensor, out: *mut *mut DLManagedTensorVersioned) -> fp8amp_status;
    pub fn fp8amp_cast(ctx: fp8amp_context, src: fp8amp_tensor, dst: fp8amp_tensor) -> fp8amp_status;
    pub fn fp8amp_recipe_init(recipe: *mut fp8amp_recipe, size: usize) -> fp8amp_status;
    pub fn fp8amp_recipe_init_default(recipe: *mut fp8amp_recipe) -> fp8amp_status;
    pub fn fp8amp_scaling_create(
        ctx: fp8amp_context,
        recipe: *const fp8amp_recipe,
        fp8_dtype: fp8amp_dtype,
        out: *mut fp8amp_scaling,
    ) -> fp8amp_status;
    pub fn fp8amp_scaling_destroy(s: fp8amp_scaling) -> fp8amp_status;
    pub fn fp8amp_scaling_update(s: fp8amp_scaling) -> fp8amp_status;
    pub fn fp8amp_scaling_update_many(ctx: fp8amp_context, n: i32, metas: *const fp8amp_scaling) -> fp8amp_status;
    pub fn fp8amp_scaling_get(s: fp8amp_scaling, scale: *mut f32, scale_inv: *mut f32, amax: *mut f32)
        -> fp8amp_status;
    pub fn fp8amp_scaling_amax_tensor(s: fp8amp_scaling, out: *mut fp8amp_tensor) -> fp8amp_status;
    pub fn fp8amp_scaling_get_history(s: fp8amp_scaling, capacity: i32, history: *mut f32) -> fp8amp_status;
    pub fn fp8amp_scaling_set_scale(s: fp8amp_scaling, scale: f32) -> fp8amp_status;
    pub fn fp8amp_scaling_enable_stats(s: fp8amp_scaling, enable: i32) -> fp8amp_status;
    pub fn fp8amp_scaling_get_stats(s: fp8amp_scaling, stats: *mut fp8amp_scaling_stats) -> fp8amp_status;
    pub fn fp8amp_scaling_reset_stats(s: fp8amp_scaling) -> fp8amp_status;
    pub fn fp8amp_tensor_set_scaling(t: fp8amp_tensor, s: fp8amp_scaling) -> fp8amp_status;
    pub fn fp8amp_tensor_scale_inv(t: fp8amp_tensor, out: *mut fp8amp_tensor) -> fp8amp_status;
    pub fn fp8amp_quantize(ctx: fp8amp_context, src: fp8amp_tensor, dst: fp8amp_tensor) -> fp8amp_status;
    pub fn fp8amp_quantize_transpose(
        ctx: fp8amp_context,
        src: fp8amp_tensor,
        dst: fp8amp_tensor,
        dst_t: fp8amp_tensor,
    ) -> fp8amp_status;
    pub fn fp8amp_dequantize(ctx: fp8amp_context, src: fp8amp_tensor, dst: fp8amp_tensor) -> fp8amp_status;
    pub fn fp8amp_amax(ctx: fp8amp_context, t: fp8amp_tensor, amax: *mut f32) -> fp8amp_status;
    pub fn fp8amp_linear_desc_init(desc: *mut fp8amp_linear_desc, size: usize) -> fp8amp_status;
    pub fn fp8amp_linear_desc_init_default(desc: *mut fp8amp_linear_desc) -> fp8amp_status;
    pub fn fp8amp_linear_create(
        ctx: fp8amp_context,
        desc: *const fp8amp_linear_desc,
        out: *mut fp8amp_linear,
    ) -> fp8amp_status;
    pub fn fp8amp_linear_destroy(lin: fp8amp_linear) -> fp8amp_status;
    pub fn fp8amp_linear_weight(lin: fp8amp_linear, out: *mut fp8amp_tensor) -> fp8amp_status;
    pub fn fp8amp_linear_bias(lin: fp8amp_linear, out: *mut fp8amp_tensor) -> fp8amp_status;
    pub fn fp8amp_linear_weight_grad(lin: fp8amp_linear, out: *mut fp8amp_tensor) -> fp8amp_status;
    pub fn fp8amp_linear_bias_grad(lin: fp8amp_linear, out: *mut fp8amp_tensor) -> fp8amp_status;
    pub fn fp8amp_linear_scaling(
        lin: fp8amp_linear,
        role: fp8amp_linear_role,
        out: *mut fp8amp_scaling,
    ) -> fp8amp_status;
    pub fn fp8amp_linear_weight_changed(lin: fp8amp_linear) -> fp8amp_status;
    pub fn fp8amp_linear_forward(
        lin: fp8amp_linear,
        x: fp8amp_tensor,
        y: fp8amp_tensor,
        training: i32,
    ) -> fp8amp_status;
    pub fn fp8amp_linear_choose_gemm(
        lin: fp8amp_linear,
        rows: i64,
        training: i32,
        out: *mut fp8amp_gemm_kind,
    ) -> fp8amp_status;
    pub fn fp8amp_linear_forward_fp8(
        lin: fp8amp_linear,
        x8: fp8amp_tensor,
        y: fp8amp_tensor,
        training: i32,
    ) -> fp8amp_status;
    pub fn fp8amp_linear_backward(
        lin: fp8amp_linear,
        dy: fp8amp_tensor,
        dx: fp8amp_tensor,
        accumulate_wgrad: i32,
    ) -> fp8amp_status;
    pub fn fp8amp_linear_release_buffers(lin: fp8amp_linear) -> fp8amp_status;
    pub fn fp8amp_linear_set_lean(lin: fp8amp_linear, lean: i32) -> fp8amp_status;
    pub fn fp8amp_linear_get_lean(lin: fp8amp_linear, out: *mut i32) -> fp8amp_status;
    pub fn fp8amp_linear_memory_bytes(lin: fp8amp_linear, out: *mut usize) -> fp8amp_status;
    pub fn fp8amp_linear_gemm_kind(lin: fp8amp_linear, out: *mut fp8amp_gemm_kind) -> fp8amp_status;
    pub fn fp8amp_linear_graph_replays(lin: fp8amp_linear, out: *mut u64) -> fp8amp_status;
    pub fn fp8amp_adam_desc_init(desc: *mut fp8amp_adam_desc, size: usize) -> fp8amp_status;
    pub fn fp8amp_adam_desc_init_default(desc: *mut fp8amp_adam_desc) -> fp8amp_status;
    pub fn fp8amp_opt_level_adam_init(
        level: fp8amp_opt_level,
        desc: *mut fp8amp_adam_desc,
        size: usize,
    ) -> fp8amp_status;
    pub fn fp8amp_opt_level_adam_config(level: fp8amp_opt_level, desc: *mut fp8amp_adam_desc) -> fp8amp_status;
    pub fn fp8amp_optimizer_create(
        ctx: fp8amp_context,
        desc: *const fp8amp_adam_desc,
        out: *mut fp8amp_optimizer,
    ) -> fp8amp_status;
    pub fn fp8amp_optimizer_destroy(opt: fp8amp_optimizer) -> fp8amp_status;
    pub fn fp8amp_optimizer_add_param(
        opt: fp8amp_optimizer,
        param: fp8amp_tensor,
        grad: fp8amp_tensor,
    ) -> fp8amp_status;
    pub fn fp8amp_param_desc_init(desc: *mut fp8amp_param_desc, size: usize) -> fp8amp_status;
    pub fn fp8amp_optimizer_add_param_ex(
        opt: fp8amp_optimizer,
        param: fp8amp_tensor,
        grad: fp8amp_tensor,
        desc: *const fp8amp_param_desc,
    ) -> fp8amp_status;
    pub fn fp8amp_adam_step_args_init(args: *mut fp8amp_adam_step_args, size: usize) -> fp8amp_status;
    pub fn fp8amp_adam_step_args_init_default(args: *mut fp8amp_adam_step_args) -> fp8amp_status;
    pub fn fp8amp_optimizer_step(opt: fp8amp_optimizer, args: *const fp8amp_adam_step_args) -> fp8amp_status;
    pub fn fp8amp_optimizer_get_found_inf(opt: fp8amp_optimizer, found_inf: *mut i32) -> fp8amp_status;
    pub fn fp8amp_optimizer_get_step(opt: fp8amp_optimizer, step: *mut i64) -> fp8amp_status;
    pub fn fp8amp_optimizer_get_grad_norm(opt: fp8amp_optimizer, norm: *mut f32) -> fp8amp_status;
    pub fn fp8amp_optimizer_num_params(opt: fp8amp_optimizer, count: *mut i32) -> fp8amp_status;
    pub fn fp8amp_optimizer_state_bytes(opt: fp8amp_optimizer, bytes: *mut usize) -> fp8amp_status;
    pub fn fp8amp_optimizer_save(
        opt: fp8amp_optimizer,
        buffer: *mut c_void,
        capacity: usize,
        size: *mut usize,
    ) -> fp8amp_status;
    pub fn fp8amp_optimizer_load(opt: fp8amp_optimizer, data: *const c_void, size: usize) -> fp8amp_status;
    pub fn fp8amp_param_state_init(state: *mut fp8amp_param_state, size: usize) -> fp8amp_status;
    pub fn fp8amp_optimizer_param_state(opt: fp8amp_optimizer, index: i32, out: *mut fp8amp_param_state) -> fp8amp_status;
    pub fn fp8amp_optimizer_set_param_state(
        opt: fp8amp_optimizer,
        index: i32,
        state: *const fp8amp_param_state,
    ) -> fp8amp_status;
    pub fn fp8amp_optimizer_set_step(opt: fp8amp_optimizer, step: i64) -> fp8amp_status;
    pub fn fp8amp_grad_scaler_desc_init(desc: *mut fp8amp_grad_scaler_desc, size: usize) -> fp8amp_status;
    pub fn fp8amp_grad_scaler_desc_init_default(desc: *mut fp8amp_grad_scaler_desc) -> fp8amp_status;
    pub fn fp8amp_grad_scaler_create(
        ctx: fp8amp_context,
        desc: *const fp8amp_grad_scaler_desc,
        out: *mut fp8amp_grad_scaler,
    ) -> fp8amp_status;
    pub fn fp8amp_grad_scaler_destroy(scaler: fp8amp_grad_scaler) -> fp8amp_status;
    pub fn fp8amp_grad_scaler_get_scale(scaler: fp8amp_grad_scaler, scale: *mut f32) -> fp8amp_status;
    pub fn fp8amp_grad_scaler_scale_device_ptr(scaler: fp8amp_grad_scaler, scale: *mut *const f32) -> fp8amp_status;
    pub fn fp8amp_grad_scaler_get_state(
        scaler: fp8amp_grad_scaler,
        state: *mut fp8amp_grad_scaler_state,
    ) -> fp8amp_status;
    pub fn fp8amp_grad_scaler_set_state(
        scaler: fp8amp_grad_scaler,
        state: *const fp8amp_grad_scaler_state,
    ) -> fp8amp_status;
    pub fn fp8amp_grad_scaler_update(scaler: fp8amp_grad_scaler, opt: fp8amp_optimizer) -> fp8amp_status;
    pub fn fp8amp_opt_level_init(
        level: fp8amp_opt_level,
        linear_desc: *mut fp8amp_linear_desc,
        linear_size: usize,
        adam_desc: *mut fp8amp_adam_desc,
        adam_size: usize,
    ) -> fp8amp_status;
    pub fn fp8amp_opt_level_config(
        level: fp8amp_opt_level,
        linear_desc: *mut fp8amp_linear_desc,
        adam_desc: *mut fp8amp_adam_desc,
    ) -> fp8amp_status;
    pub fn fp8amp_comm_unique_id_create(ctx: fp8amp_context, id: *mut fp8amp_comm_unique_id) -> fp8amp_status;
    pub fn fp8amp_comm_create(
        ctx: fp8amp_context,
        id: *const fp8amp_comm_unique_id,
        nranks: i32,
        rank: i32,
        out: *mut fp8amp_comm,
    ) -> fp8amp_status;
    pub fn fp8amp_comm_adopt(ctx: fp8amp_context, native: *mut c_void, out: *mut fp8amp_comm) -> fp8amp_status;
    pub fn fp8amp_comm_destroy(comm: fp8amp_comm) -> fp8amp_status;
    pub fn fp8amp_comm_abort(comm: fp8amp_comm) -> fp8amp_status;
    pub fn fp8amp_comm_rank(comm: fp8amp_comm, rank: *mut i32) -> fp8amp_status;
    pub fn fp8amp_comm_size(comm: fp8amp_comm, nranks: *mut i32) -> fp8amp_status;
    pub fn fp8amp_comm_set_timeout(comm: fp8amp_comm, seconds: f64) -> fp8amp_status;
    pub fn fp8amp_comm_get_saturated(comm: fp8amp_comm, count: *mut u64) -> fp8amp_status;
    pub fn fp8amp_comm_reduce_desc_init(desc: *mut fp8amp_comm_reduce_desc, size: usize) -> fp8amp_status;
    pub fn fp8amp_comm_all_reduce(
        comm: fp8amp_comm,
        n: i32,
        inputs: *const fp8amp_tensor,
        outputs: *const fp8amp_tensor,
        desc: *const fp8amp_comm_reduce_desc,
    ) -> fp8amp_status;
    pub fn fp8amp_comm_reduce_scatter(
        comm: fp8amp_comm,
        input: fp8amp_tensor,
        output: fp8amp_tensor,
        desc: *const fp8amp_comm_reduce_desc,
    ) -> fp8amp_status;
    pub fn fp8amp_comm_all_gather(
        comm: fp8amp_comm,
        input: fp8amp_tensor,
        output: fp8amp_tensor,
        output_scale_inv: fp8amp_tensor,
        desc: *const fp8amp_comm_reduce_desc,
    ) -> fp8amp_status;
    pub fn fp8amp_optimizer_set_shard(opt: fp8amp_optimizer, comm: fp8amp_comm) -> fp8amp_status;
    pub fn fp8amp_optimizer_shard_range(
        opt: fp8amp_optimizer,
        index: i32,
        begin: *mut i64,
        count: *mut i64,
    ) -> fp8amp_status;
    pub fn fp8amp_norm_desc_init(desc: *mut fp8amp_norm_desc, size: usize) -> fp8amp_status;
    pub fn fp8amp_norm_forward(
        ctx: fp8amp_context,
        desc: *const fp8amp_norm_desc,
        x: fp8amp_tensor,
        gamma: fp8amp_tensor,
        beta: fp8amp_tensor,
        y: fp8amp_tensor,
        y_t: fp8amp_tensor,
        mean: fp8amp_tensor,
        rstd: fp8amp_tensor,
    ) -> fp8amp_status;
    pub fn fp8amp_norm_backward(
        ctx: fp8amp_context,
        desc: *const fp8amp_norm_desc,
        dy: fp8amp_tensor,
        x: fp8amp_tensor,
        gamma: fp8amp_tensor,
        mean: fp8amp_tensor,
        rstd: fp8amp_tensor,
        dx: fp8amp_tensor,
        dgamma: fp8amp_tensor,
        dbeta: fp8amp_tensor,
    ) -> fp8amp_status;
    pub fn fp8amp_activation_forward(
        ctx: fp8amp_context,
        kind: fp8amp_activation,
        x: fp8amp_tensor,
        y: fp8amp_tensor,
        y_t: fp8amp_tensor,
    ) -> fp8amp_status;
    pub fn fp8amp_activation_backward(
        ctx: fp8amp_context,
        kind: fp8amp_activation,
        dy: fp8amp_tensor,
        x: fp8amp_tensor,
        dx: fp8amp_tensor,
        dx_t: fp8amp_tensor,
    ) -> fp8amp_status;
}
