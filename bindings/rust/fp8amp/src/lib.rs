//! Safe Rust API of fp8amp, the FP8 mixed-precision training library.
//!
//! Every fallible call returns [`Result<T>`](Result), whose [`Error`] carries the library's status
//! and its message (`"function: what is wrong"`, read from the calling thread right after the
//! failure). A failed call changes nothing, as in C. Handles are RAII values: dropping one destroys
//! its C handle exactly once.
//!
//! ```no_run
//! use fp8amp::{Context, Dtype, Recipe, Scaling, Tensor};
//! # fn main() -> fp8amp::Result<()> {
//! let ctx = Context::cpu()?;
//! let x = Tensor::new(&ctx, Dtype::F32, &[2, 3])?;
//! x.copy_from_host(&[0.5f32, -1.0, 2.0, 3.25, -7.0, 100.0])?;
//! let meta = Scaling::new(&ctx, &Recipe::default(), Dtype::E4M3)?;
//! meta.set_scale(2.0)?;
//! let q = Tensor::new(&ctx, Dtype::E4M3, &[2, 3])?;
//! q.set_scaling(Some(&meta))?;
//! ctx.quantize(&x, &q)?;
//! let mut codes = [0u8; 6];
//! q.copy_to_host(&mut codes)?;
//! # Ok(()) }
//! ```
//!
//! # Threads
//!
//! The C contract (docs/api.md 1.5): *a context, and the objects made with it, are used by one
//! thread at a time; different contexts are independent.* The types encode it:
//!
//! - [`Context`] is `Send` (it may move to another thread: the library has no thread affinity) and
//!   not `Sync` (two threads must not use it at once: its stream, allocator and scratch are not
//!   locked).
//! - Every object made with a context ([`Tensor`], [`Scaling`], [`Linear`], [`Optimizer`],
//!   [`GradScaler`]) borrows it (`'c`) and is neither `Send` nor `Sync`. So all of a context's
//!   objects stay on the thread that holds the borrow, and the context cannot move while they
//!   live. To work on several threads, make one context per thread (they may all be live at
//!   once); to hand a context over, drop its objects first.
//!
//! This is stricter than C in one way: C lets a context's handle be destroyed before its tensors;
//! here the borrow makes the context outlive them.
//!
//! The compiler enforces each rule (these examples must not compile; `cargo test` checks it):
//!
//! ```compile_fail
//! // a tensor cannot go to another thread (its context stays here)
//! let ctx = fp8amp::Context::cpu().unwrap();
//! let t = fp8amp::Tensor::new(&ctx, fp8amp::Dtype::F32, &[4]).unwrap();
//! std::thread::spawn(move || t.numel().unwrap());
//! ```
//!
//! ```compile_fail
//! // two threads cannot share one context
//! fn shared<T: Sync>(_: &T) {}
//! let ctx = fp8amp::Context::cpu().unwrap();
//! shared(&ctx);
//! ```
//!
//! ```compile_fail
//! // a context cannot move (or drop) while its objects live
//! let ctx = fp8amp::Context::cpu().unwrap();
//! let t = fp8amp::Tensor::new(&ctx, fp8amp::Dtype::F32, &[4]).unwrap();
//! std::thread::spawn(move || drop(ctx));
//! t.numel().unwrap();
//! ```
//!
//! ```
//! // a context alone moves to another thread and works there
//! let ctx = fp8amp::Context::cpu().unwrap();
//! std::thread::spawn(move || {
//!     let t = fp8amp::Tensor::new(&ctx, fp8amp::Dtype::F32, &[4]).unwrap();
//!     assert_eq!(t.numel().unwrap(), 4);
//! }).join().unwrap();
//! ```
//!
//! # Host data
//!
//! Host copies take slices of an [`Element`] type: `f32` for F32 tensors, `u16` (the bits) for F16
//! and BF16, `u8` for the raw bytes of any tensor (FP8 codes). A slice whose element type does not
//! fit the tensor's dtype is refused with [`Status::DtypeMismatch`]; a slice of the wrong length
//! with the library's own [`Status::ShapeMismatch`].
#![warn(missing_docs)]

use std::ffi::CStr;
use std::fmt;
use std::marker::PhantomData;
use std::os::raw::c_void;
use std::ptr;

pub use fp8amp_sys as sys;

// ---- errors ---------------------------------------------------------------------------------

/// An fp8amp status other than success (`fp8amp_status`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Status {
    /// NULL pointer, bad enum, bad size, read-only target, ...
    InvalidArgument,
    /// A destroyed, foreign or wrong-kind handle.
    InvalidHandle,
    /// Shapes (or byte sizes) that do not match.
    ShapeMismatch,
    /// Dtypes that do not match.
    DtypeMismatch,
    /// Objects of different devices in one call.
    DeviceMismatch,
    /// Host or device memory could not be allocated.
    OutOfMemory,
    /// This build, machine or library version cannot do it (the message says why).
    NotSupported,
    /// The CUDA runtime failed.
    Cuda,
    /// cuBLAS(Lt) failed.
    Cublas,
    /// NCCL failed.
    Nccl,
    /// A checkpoint or other serialized input is corrupt.
    CorruptData,
    /// A defect inside the library.
    Internal,
    /// A communicator's transport failed or timed out.
    Comm,
    /// A status this binding does not know (a newer library).
    Other(u32),
}

impl Status {
    /// The status of a raw value; `None` for `FP8AMP_SUCCESS`.
    pub fn from_raw(raw: sys::fp8amp_status) -> Option<Status> {
        use Status::*;
        Some(match raw {
            sys::FP8AMP_SUCCESS => return None,
            sys::FP8AMP_ERROR_INVALID_ARGUMENT => InvalidArgument,
            sys::FP8AMP_ERROR_INVALID_HANDLE => InvalidHandle,
            sys::FP8AMP_ERROR_SHAPE_MISMATCH => ShapeMismatch,
            sys::FP8AMP_ERROR_DTYPE_MISMATCH => DtypeMismatch,
            sys::FP8AMP_ERROR_DEVICE_MISMATCH => DeviceMismatch,
            sys::FP8AMP_ERROR_OUT_OF_MEMORY => OutOfMemory,
            sys::FP8AMP_ERROR_NOT_SUPPORTED => NotSupported,
            sys::FP8AMP_ERROR_CUDA => Cuda,
            sys::FP8AMP_ERROR_CUBLAS => Cublas,
            sys::FP8AMP_ERROR_NCCL => Nccl,
            sys::FP8AMP_ERROR_CORRUPT_DATA => CorruptData,
            sys::FP8AMP_ERROR_INTERNAL => Internal,
            sys::FP8AMP_ERROR_COMM => Comm,
            other => Other(other),
        })
    }

    /// The raw `fp8amp_status` value.
    pub fn to_raw(self) -> sys::fp8amp_status {
        use Status::*;
        match self {
            InvalidArgument => sys::FP8AMP_ERROR_INVALID_ARGUMENT,
            InvalidHandle => sys::FP8AMP_ERROR_INVALID_HANDLE,
            ShapeMismatch => sys::FP8AMP_ERROR_SHAPE_MISMATCH,
            DtypeMismatch => sys::FP8AMP_ERROR_DTYPE_MISMATCH,
            DeviceMismatch => sys::FP8AMP_ERROR_DEVICE_MISMATCH,
            OutOfMemory => sys::FP8AMP_ERROR_OUT_OF_MEMORY,
            NotSupported => sys::FP8AMP_ERROR_NOT_SUPPORTED,
            Cuda => sys::FP8AMP_ERROR_CUDA,
            Cublas => sys::FP8AMP_ERROR_CUBLAS,
            Nccl => sys::FP8AMP_ERROR_NCCL,
            CorruptData => sys::FP8AMP_ERROR_CORRUPT_DATA,
            Internal => sys::FP8AMP_ERROR_INTERNAL,
            Comm => sys::FP8AMP_ERROR_COMM,
            Other(v) => v,
        }
    }

    /// The library's name of the status, e.g. `"FP8AMP_ERROR_SHAPE_MISMATCH"`.
    pub fn name(self) -> String {
        // SAFETY: fp8amp_status_name returns a static string for any value (never NULL).
        unsafe { cstr_to_string(sys::fp8amp_status_name(self.to_raw())) }
    }
}

/// A failed call: the library's status and its message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    /// What kind of failure.
    pub status: Status,
    /// `"function: what is wrong"`, naming the argument.
    pub message: String,
}

impl Error {
    /// An error raised by this binding itself, before the library was called.
    fn binding(status: Status, message: String) -> Error {
        Error { status, message }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.status.name(), self.message)
    }
}

impl std::error::Error for Error {}

/// `std::result::Result` with this crate's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

unsafe fn cstr_to_string(p: *const std::os::raw::c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    CStr::from_ptr(p).to_string_lossy().into_owned()
}

/// Turns a status into a Result, reading the thread-local message at once (it is valid only until
/// the next fp8amp call on this thread).
fn check(status: sys::fp8amp_status) -> Result<()> {
    match Status::from_raw(status) {
        None => Ok(()),
        Some(s) => Err(Error {
            status: s,
            // SAFETY: never NULL; a thread-local string valid until the next call on this thread,
            // copied here before any other fp8amp call.
            message: unsafe { cstr_to_string(sys::fp8amp_last_error_message()) },
        }),
    }
}

/// The loaded library's version, `major * 10000 + minor * 100 + patch`.
pub fn version() -> u32 {
    // SAFETY: no arguments, never fails.
    unsafe { sys::fp8amp_version() }
}

// ---- small enums ----------------------------------------------------------------------------

macro_rules! c_enum {
    ($(#[$m:meta])* $name:ident : $raw:ty { $($(#[$vm:meta])* $v:ident = $c:path),* $(,)? }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name { $($(#[$vm])* $v),* }
        impl $name {
            /// The raw C value.
            pub fn to_raw(self) -> $raw { match self { $($name::$v => $c),* } }
            /// The value of a raw C value; `None` for a value this binding does not know.
            pub fn from_raw(raw: $raw) -> Option<$name> {
                $(if raw == $c { return Some($name::$v); })*
                None
            }
        }
    };
}

c_enum!(
    /// Element types (`fp8amp_dtype`).
    Dtype: sys::fp8amp_dtype {
        /// float32.
        F32 = sys::FP8AMP_DTYPE_F32,
        /// IEEE half.
        F16 = sys::FP8AMP_DTYPE_F16,
        /// bfloat16.
        BF16 = sys::FP8AMP_DTYPE_BF16,
        /// float8 e4m3fn: max 448, no infinities.
        E4M3 = sys::FP8AMP_DTYPE_E4M3,
        /// float8 e5m2: max 57344, IEEE infinities and NaNs.
        E5M2 = sys::FP8AMP_DTYPE_E5M2,
    }
);

impl Dtype {
    /// Bytes per element.
    pub fn size(self) -> usize {
        // SAFETY: a pure getter of a constant.
        unsafe { sys::fp8amp_dtype_size(self.to_raw()) }
    }
}

c_enum!(
    /// Device kinds (`fp8amp_device_type`).
    DeviceType: sys::fp8amp_device_type {
        /// The CPU backend (the reference).
        Cpu = sys::FP8AMP_DEVICE_CPU,
        /// A CUDA GPU.
        Cuda = sys::FP8AMP_DEVICE_CUDA,
    }
);

c_enum!(
    /// Which formats a recipe uses (`fp8amp_format`).
    Format: sys::fp8amp_format {
        /// E4M3 everywhere.
        E4M3 = sys::FP8AMP_FORMAT_E4M3,
        /// E4M3 forward, E5M2 for output gradients.
        Hybrid = sys::FP8AMP_FORMAT_HYBRID,
    }
);

c_enum!(
    /// How a meta's scale is chosen (`fp8amp_scaling_mode`).
    ScalingMode: sys::fp8amp_scaling_mode {
        /// From the amax history of earlier steps.
        Delayed = sys::FP8AMP_SCALING_DELAYED,
        /// From the tensor's own amax in the same call.
        Current = sys::FP8AMP_SCALING_CURRENT,
    }
);

c_enum!(
    /// How the amax history is reduced (`fp8amp_amax_algo`).
    AmaxAlgo: sys::fp8amp_amax_algo {
        /// The largest amax in the window.
        Max = sys::FP8AMP_AMAX_MAX,
        /// The newest amax only.
        MostRecent = sys::FP8AMP_AMAX_MOST_RECENT,
    }
);

c_enum!(
    /// FP8 or wider GEMMs in a Linear (`fp8amp_gemm_policy`).
    GemmPolicy: sys::fp8amp_gemm_policy {
        /// FP8 where it pays and the shape allows it.
        Auto = sys::FP8AMP_GEMM_AUTO,
        /// FP8 always (NOT_SUPPORTED where it cannot run).
        AlwaysFp8 = sys::FP8AMP_GEMM_ALWAYS_FP8,
        /// BF16 (CUDA) or F32 (CPU) GEMMs.
        NeverFp8 = sys::FP8AMP_GEMM_NEVER_FP8,
    }
);

c_enum!(
    /// Which GEMM a Linear's last forward ran (`fp8amp_gemm_kind`).
    GemmKind: sys::fp8amp_gemm_kind {
        /// No forward yet.
        None = sys::FP8AMP_GEMM_KIND_NONE,
        /// FP8 operands.
        Fp8 = sys::FP8AMP_GEMM_KIND_FP8,
        /// BF16 operands (CUDA).
        Bf16 = sys::FP8AMP_GEMM_KIND_BF16,
        /// F32 operands (CPU, NEVER_FP8).
        F32 = sys::FP8AMP_GEMM_KIND_F32,
    }
);

c_enum!(
    /// A Linear's scaling metas (`fp8amp_linear_role`).
    Role: sys::fp8amp_linear_role {
        /// x.
        Input = sys::FP8AMP_ROLE_INPUT,
        /// The FP8 copy of W.
        Weight = sys::FP8AMP_ROLE_WEIGHT,
        /// dY.
        GradOutput = sys::FP8AMP_ROLE_GRAD_OUTPUT,
        /// The E4M3 weight gradient.
        WeightGrad = sys::FP8AMP_ROLE_WEIGHT_GRAD,
        /// The meta an F16 or E4M3 weight is bound to.
        WeightStorage = sys::FP8AMP_ROLE_WEIGHT_STORAGE,
    }
);

c_enum!(
    /// MS-AMP's optimization levels (`fp8amp_opt_level`).
    OptLevel: sys::fp8amp_opt_level {
        /// F32 Adam state.
        O1 = sys::FP8AMP_OPT_LEVEL_O1,
        /// E4M3 m + F16 v, block-scaled.
        O2 = sys::FP8AMP_OPT_LEVEL_O2,
        /// O2 plus E4M3 weights with F16 masters.
        O3 = sys::FP8AMP_OPT_LEVEL_O3,
    }
);

fn known<T>(v: Option<T>, what: &str, raw: u32) -> Result<T> {
    v.ok_or_else(|| {
        Error::binding(
            Status::NotSupported,
            format!("fp8amp (Rust): the library returned {} = {}, which this binding does not know", what, raw),
        )
    })
}

/// A device: its kind and index (`fp8amp_device`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Device {
    /// CPU or CUDA.
    pub kind: DeviceType,
    /// 0 for the CPU; the CUDA ordinal.
    pub index: i32,
}

impl Device {
    /// The CPU device.
    pub const CPU: Device = Device { kind: DeviceType::Cpu, index: 0 };
    /// CUDA device `index`.
    pub fn cuda(index: i32) -> Device {
        Device { kind: DeviceType::Cuda, index }
    }
    fn to_raw(self) -> sys::fp8amp_device {
        sys::fp8amp_device { type_: self.kind.to_raw(), index: self.index }
    }
    fn from_raw(d: sys::fp8amp_device) -> Result<Device> {
        Ok(Device { kind: known(DeviceType::from_raw(d.type_), "a device type", d.type_)?, index: d.index })
    }
    /// How many devices of this kind there are (the CPU: 1; CUDA: 0 without a GPU or a CUDA build).
    pub fn count(kind: DeviceType) -> Result<i32> {
        let mut n = 0;
        // SAFETY: n is a valid out pointer.
        check(unsafe { sys::fp8amp_device_count(kind.to_raw(), &mut n) })?;
        Ok(n)
    }
}

// ---- the context ----------------------------------------------------------------------------

/// A device, the stream its work is issued on and the allocator that serves its memory
/// (`fp8amp_context`). Destroyed on drop.
///
/// `Send` but not `Sync`: see [the crate docs](crate#threads).
pub struct Context {
    raw: sys::fp8amp_context,
}

// SAFETY: the C contract lets a context (and its objects) be used from any thread, one thread at a
// time (docs/api.md 1.5). Moving the Context moves that one thread; it is not Sync, so two threads
// never use it at once, and it can only move while no object borrows it.
unsafe impl Send for Context {}

impl Context {
    /// A context on `device` (`fp8amp_context_create`). A CUDA device in a build without CUDA or
    /// on a machine without a GPU gives [`Status::NotSupported`] with the reason.
    pub fn new(device: Device) -> Result<Context> {
        let mut raw = ptr::null_mut();
        // SAFETY: raw is a valid out pointer, written only on success.
        check(unsafe { sys::fp8amp_context_create(device.to_raw(), &mut raw) })?;
        Ok(Context { raw })
    }

    /// A context on the CPU backend.
    pub fn cpu() -> Result<Context> {
        Context::new(Device::CPU)
    }

    /// The context's device.
    pub fn device(&self) -> Result<Device> {
        let mut d = sys::fp8amp_device { type_: 0, index: 0 };
        // SAFETY: a live handle and a valid out pointer.
        check(unsafe { sys::fp8amp_context_device(self.raw, &mut d) })?;
        Device::from_raw(d)
    }

    /// Waits for the work issued on the context's stream; where asynchronous CUDA failures surface.
    pub fn synchronize(&self) -> Result<()> {
        // SAFETY: a live handle.
        check(unsafe { sys::fp8amp_context_synchronize(self.raw) })
    }

    /// Converts `src` into `dst` (same shape), rounding to nearest even, saturating into FP8
    /// (`fp8amp_cast`).
    pub fn cast(&self, src: &Tensor<'_>, dst: &Tensor<'_>) -> Result<()> {
        // SAFETY: live handles; the library checks kinds, shapes and devices.
        check(unsafe { sys::fp8amp_cast(self.raw, src.raw, dst.raw) })
    }

    /// `dst = fp8(src * scale)` with dst's meta, recording amax into it (`fp8amp_quantize`).
    pub fn quantize(&self, src: &Tensor<'_>, dst: &Tensor<'_>) -> Result<()> {
        // SAFETY: live handles.
        check(unsafe { sys::fp8amp_quantize(self.raw, src.raw, dst.raw) })
    }

    /// Quantize into `dst` and its transpose `dst_t` in one pass (`fp8amp_quantize_transpose`).
    pub fn quantize_transpose(&self, src: &Tensor<'_>, dst: &Tensor<'_>, dst_t: &Tensor<'_>) -> Result<()> {
        // SAFETY: live handles.
        check(unsafe { sys::fp8amp_quantize_transpose(self.raw, src.raw, dst.raw, dst_t.raw) })
    }

    /// `dst = src * scale_inv` with src's scale_inv (`fp8amp_dequantize`).
    pub fn dequantize(&self, src: &Tensor<'_>, dst: &Tensor<'_>) -> Result<()> {
        // SAFETY: live handles.
        check(unsafe { sys::fp8amp_dequantize(self.raw, src.raw, dst.raw) })
    }

    /// max |t| (synchronizes; NaN gives NaN) (`fp8amp_amax`).
    pub fn amax(&self, t: &Tensor<'_>) -> Result<f32> {
        let mut a = 0f32;
        // SAFETY: live handles, a valid out pointer.
        check(unsafe { sys::fp8amp_amax(self.raw, t.raw, &mut a) })?;
        Ok(a)
    }

    /// The raw handle, still owned by this Context.
    pub fn as_raw(&self) -> sys::fp8amp_context {
        self.raw
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: the handle is ours and destroyed once. It cannot fail for a live handle; a status
        // here could not be reported anyway (objects it made keep what they need alive).
        unsafe { sys::fp8amp_context_destroy(self.raw) };
    }
}

impl fmt::Debug for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Context").field("raw", &self.raw).finish()
    }
}

// ---- tensors --------------------------------------------------------------------------------

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for u16 {}
    impl Sealed for u8 {}
}

/// Host element types for tensor copies: plain data whose every bit pattern is a valid value.
pub trait Element: sealed::Sealed + Copy {
    /// Whether a tensor of `dtype` may be copied to or from a slice of this type.
    fn fits(dtype: Dtype) -> bool;
    /// The name used in error messages.
    const NAME: &'static str;
}
impl Element for f32 {
    fn fits(d: Dtype) -> bool {
        d == Dtype::F32
    }
    const NAME: &'static str = "f32";
}
/// The bits of F16 or BF16 values.
impl Element for u16 {
    fn fits(d: Dtype) -> bool {
        d == Dtype::F16 || d == Dtype::BF16
    }
    const NAME: &'static str = "u16";
}
/// Raw bytes: any dtype (FP8 codes, or the little-endian bytes of wider values).
impl Element for u8 {
    fn fits(_: Dtype) -> bool {
        true
    }
    const NAME: &'static str = "u8";
}

/// A tensor handle (`fp8amp_tensor`): memory on the context's device with a dtype and a shape.
/// Destroyed on drop (the memory lives on while something else, e.g. a Linear, still holds it).
///
/// Operations take `&Tensor` even where they write it: a Tensor is a handle, like a file, and the
/// library checks overlaps itself. Not `Send`/`Sync`: see [the crate docs](crate#threads).
pub struct Tensor<'c> {
    raw: sys::fp8amp_tensor,
    _ctx: PhantomData<&'c Context>,
}

impl<'c> Tensor<'c> {
    /// A new tensor of `dtype` and `shape` (every extent >= 1; `&[]` is a scalar), contents
    /// unspecified until written (`fp8amp_tensor_create`).
    pub fn new(ctx: &'c Context, dtype: Dtype, shape: &[i64]) -> Result<Tensor<'c>> {
        if shape.len() > sys::FP8AMP_MAX_NDIM as usize {
            return Err(Error::binding(
                Status::InvalidArgument,
                format!(
                    "Tensor::new: shape has {} dimensions, more than FP8AMP_MAX_NDIM = {}",
                    shape.len(),
                    sys::FP8AMP_MAX_NDIM
                ),
            ));
        }
        let mut raw = ptr::null_mut();
        // SAFETY: shape has shape.len() entries; raw is a valid out pointer.
        check(unsafe {
            sys::fp8amp_tensor_create(ctx.raw, dtype.to_raw(), shape.len() as i32, shape.as_ptr(), &mut raw)
        })?;
        Ok(Tensor { raw, _ctx: PhantomData })
    }

    /// A new tensor holding `data` (F32, of `shape`).
    pub fn from_f32(ctx: &'c Context, shape: &[i64], data: &[f32]) -> Result<Tensor<'c>> {
        let t = Tensor::new(ctx, Dtype::F32, shape)?;
        t.copy_from_host(data)?;
        Ok(t)
    }

    /// Takes ownership of a raw handle (destroyed on drop).
    ///
    /// # Safety
    /// `raw` must be a tensor handle that nothing else will destroy, made with a context that
    /// `'c` keeps alive and uses on this thread only.
    pub unsafe fn from_raw(raw: sys::fp8amp_tensor) -> Tensor<'c> {
        Tensor { raw, _ctx: PhantomData }
    }

    /// The raw handle, still owned by this Tensor.
    pub fn as_raw(&self) -> sys::fp8amp_tensor {
        self.raw
    }

    /// Gives up ownership: the handle is not destroyed on drop.
    pub fn into_raw(self) -> sys::fp8amp_tensor {
        let raw = self.raw;
        std::mem::forget(self);
        raw
    }

    /// Its dtype.
    pub fn dtype(&self) -> Result<Dtype> {
        let mut d = 0;
        // SAFETY: live handle, valid out pointer.
        check(unsafe { sys::fp8amp_tensor_dtype(self.raw, &mut d) })?;
        known(Dtype::from_raw(d), "a dtype", d)
    }

    /// Its extents (empty for a scalar).
    pub fn shape(&self) -> Result<Vec<i64>> {
        let mut shape = [0i64; sys::FP8AMP_MAX_NDIM as usize];
        let mut ndim = 0i32;
        // SAFETY: live handle; shape has FP8AMP_MAX_NDIM entries, the most a tensor has.
        check(unsafe { sys::fp8amp_tensor_ndim(self.raw, &mut ndim) })?;
        check(unsafe { sys::fp8amp_tensor_shape(self.raw, sys::FP8AMP_MAX_NDIM, shape.as_mut_ptr()) })?;
        Ok(shape[..ndim as usize].to_vec())
    }

    /// Its number of elements (1 for a scalar).
    pub fn numel(&self) -> Result<i64> {
        let mut n = 0;
        // SAFETY: live handle, valid out pointer.
        check(unsafe { sys::fp8amp_tensor_numel(self.raw, &mut n) })?;
        Ok(n)
    }

    /// Its size in bytes.
    pub fn nbytes(&self) -> Result<usize> {
        let mut n = 0;
        // SAFETY: live handle, valid out pointer.
        check(unsafe { sys::fp8amp_tensor_nbytes(self.raw, &mut n) })?;
        Ok(n)
    }

    /// The device of its memory.
    pub fn device(&self) -> Result<Device> {
        let mut d = sys::fp8amp_device { type_: 0, index: 0 };
        // SAFETY: live handle, valid out pointer.
        check(unsafe { sys::fp8amp_tensor_device(self.raw, &mut d) })?;
        Device::from_raw(d)
    }

    fn check_element<T: Element>(&self, what: &str) -> Result<()> {
        let d = self.dtype()?;
        if T::fits(d) {
            Ok(())
        } else {
            Err(Error::binding(
                Status::DtypeMismatch,
                format!("Tensor::{}: a slice of {} cannot hold a {:?} tensor (f32: F32; u16: F16/BF16 bits; u8: any, raw bytes)",
                        what, T::NAME, d),
            ))
        }
    }

    /// Copies `src` into the tensor (synchronous). `src` must hold exactly the tensor's bytes
    /// ([`Status::ShapeMismatch`] otherwise) in an [`Element`] type that fits its dtype.
    pub fn copy_from_host<T: Element>(&self, src: &[T]) -> Result<()> {
        self.check_element::<T>("copy_from_host")?;
        // SAFETY: src is valid for size_of_val(src) bytes; the library reads no more than that
        // (it refuses a size that differs from the tensor's).
        check(unsafe {
            sys::fp8amp_tensor_copy_from_host(self.raw, src.as_ptr() as *const c_void, std::mem::size_of_val(src))
        })
    }

    /// Copies the tensor into `dst` (synchronous; waits for the context's queued work). `dst` must
    /// hold exactly the tensor's bytes ([`Status::ShapeMismatch`] otherwise).
    pub fn copy_to_host<T: Element>(&self, dst: &mut [T]) -> Result<()> {
        self.check_element::<T>("copy_to_host")?;
        // SAFETY: dst is valid for writes of size_of_val(dst) bytes, the only size the library
        // accepts; every bit pattern is a valid T.
        check(unsafe {
            sys::fp8amp_tensor_copy_to_host(self.raw, dst.as_mut_ptr() as *mut c_void, std::mem::size_of_val(dst))
        })
    }

    /// The tensor's contents as a new vector of `T` (see [`copy_to_host`](Self::copy_to_host)).
    pub fn to_vec<T: Element + Default>(&self) -> Result<Vec<T>> {
        self.check_element::<T>("to_vec")?;
        let n = self.nbytes()? / std::mem::size_of::<T>();
        let mut v = vec![T::default(); n];
        self.copy_to_host(&mut v)?;
        Ok(v)
    }

    /// Binds an E4M3, E5M2 or F16 tensor to a scaling meta (`None` unbinds)
    /// (`fp8amp_tensor_set_scaling`).
    pub fn set_scaling(&self, meta: Option<&Scaling<'_>>) -> Result<()> {
        let s = meta.map_or(ptr::null_mut(), |m| m.raw);
        // SAFETY: live handles (or NULL, which unbinds).
        check(unsafe { sys::fp8amp_tensor_set_scaling(self.raw, s) })
    }

    /// A new handle to a bound (or once-bound) tensor's scale_inv: an F32 scalar tensor sharing
    /// those 4 bytes (`fp8amp_tensor_scale_inv`).
    pub fn scale_inv(&self) -> Result<Tensor<'c>> {
        let mut raw = ptr::null_mut();
        // SAFETY: live handle, valid out pointer; the new handle is ours.
        check(unsafe { sys::fp8amp_tensor_scale_inv(self.raw, &mut raw) })?;
        Ok(Tensor { raw, _ctx: PhantomData })
    }

    /// The scale_inv value the tensor's data was written with (reads [`scale_inv`](Self::scale_inv)).
    pub fn scale_inv_value(&self) -> Result<f32> {
        let si = self.scale_inv()?;
        let mut v = [0f32];
        si.copy_to_host(&mut v)?;
        Ok(v[0])
    }
}

impl Drop for Tensor<'_> {
    fn drop(&mut self) {
        // SAFETY: the handle is ours and destroyed once (into_raw forgets self).
        unsafe { sys::fp8amp_tensor_destroy(self.raw) };
    }
}

impl fmt::Debug for Tensor<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tensor")
            .field("raw", &self.raw)
            .field("dtype", &self.dtype().ok())
            .field("shape", &self.shape().ok())
            .finish()
    }
}

// ---- recipes and scaling metas --------------------------------------------------------------

/// A scaling recipe (`fp8amp_recipe`). [`Recipe::default`] is the library's default (HYBRID,
/// delayed scaling, margin 0, interval 1, a history of 1024, MAX).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Recipe {
    /// E4M3 or HYBRID.
    pub format: Format,
    /// Delayed or current scaling.
    pub mode: ScalingMode,
    /// 0..127.
    pub margin: i32,
    /// Recompute the scale every `interval` updates; >= 1.
    pub interval: i32,
    /// 1..FP8AMP_MAX_AMAX_HISTORY.
    pub amax_history_len: i32,
    /// MAX or MOST_RECENT.
    pub amax_algo: AmaxAlgo,
    /// Round scales down to powers of two.
    pub power_of_two_scales: bool,
}

impl Recipe {
    fn from_raw(r: &sys::fp8amp_recipe) -> Result<Recipe> {
        Ok(Recipe {
            format: known(Format::from_raw(r.format), "a recipe format", r.format)?,
            mode: known(ScalingMode::from_raw(r.mode), "a scaling mode", r.mode)?,
            margin: r.margin,
            interval: r.interval,
            amax_history_len: r.amax_history_len,
            amax_algo: known(AmaxAlgo::from_raw(r.amax_algo), "an amax algorithm", r.amax_algo)?,
            power_of_two_scales: r.power_of_two_scales != 0,
        })
    }

    /// The C struct (struct_size set).
    pub fn to_raw(&self) -> sys::fp8amp_recipe {
        sys::fp8amp_recipe {
            struct_size: std::mem::size_of::<sys::fp8amp_recipe>() as u32,
            format: self.format.to_raw(),
            mode: self.mode.to_raw(),
            margin: self.margin,
            interval: self.interval,
            amax_history_len: self.amax_history_len,
            amax_algo: self.amax_algo.to_raw(),
            power_of_two_scales: self.power_of_two_scales as i32,
        }
    }

    /// The library's defaults with current scaling.
    pub fn current() -> Recipe {
        Recipe { mode: ScalingMode::Current, ..Recipe::default() }
    }
}

impl Default for Recipe {
    fn default() -> Recipe {
        // SAFETY: zeroed is a valid fp8amp_recipe (integers); init fills it from our sizeof.
        let mut r: sys::fp8amp_recipe = unsafe { std::mem::zeroed() };
        let st = unsafe { sys::fp8amp_recipe_init(&mut r, std::mem::size_of::<sys::fp8amp_recipe>()) };
        // Cannot fail with our own sizeof and a valid pointer; the library's defaults are values
        // this binding knows (tests/header.rs keeps the enums equal to the header's).
        check(st).and_then(|_| Recipe::from_raw(&r)).expect("fp8amp_recipe_init with this crate's sizeof")
    }
}

/// The state of a scaling meta.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ScalingState {
    /// The scale quantize multiplies by.
    pub scale: f32,
    /// 1 / scale.
    pub scale_inv: f32,
    /// The latest recorded amax.
    pub amax: f32,
}

/// Saturation / underflow counters of a meta (`fp8amp_scaling_stats`).
pub type ScalingStats = sys::fp8amp_scaling_stats;

/// A scaling meta (`fp8amp_scaling`): a scale, its inverse and an amax history for one FP8 (or
/// scaled F16) dtype. Destroyed on drop (tensors bound to it keep it alive).
pub struct Scaling<'c> {
    raw: sys::fp8amp_scaling,
    _ctx: PhantomData<&'c Context>,
}

impl<'c> Scaling<'c> {
    /// A meta for `dtype` (E4M3, E5M2 or F16) following `recipe` (`fp8amp_scaling_create`).
    pub fn new(ctx: &'c Context, recipe: &Recipe, dtype: Dtype) -> Result<Scaling<'c>> {
        let r = recipe.to_raw();
        let mut raw = ptr::null_mut();
        // SAFETY: valid pointers; the new handle is ours.
        check(unsafe { sys::fp8amp_scaling_create(ctx.raw, &r, dtype.to_raw(), &mut raw) })?;
        Ok(Scaling { raw, _ctx: PhantomData })
    }

    /// The raw handle, still owned by this Scaling.
    pub fn as_raw(&self) -> sys::fp8amp_scaling {
        self.raw
    }

    /// Recomputes the scale from the amax history (`fp8amp_scaling_update`).
    pub fn update(&self) -> Result<()> {
        // SAFETY: live handle.
        check(unsafe { sys::fp8amp_scaling_update(self.raw) })
    }

    /// Updates several metas of one context in one call (`fp8amp_scaling_update_many`).
    pub fn update_many(ctx: &Context, metas: &[&Scaling<'_>]) -> Result<()> {
        let raws: Vec<sys::fp8amp_scaling> = metas.iter().map(|m| m.raw).collect();
        if raws.len() > i32::MAX as usize {
            return Err(Error::binding(Status::InvalidArgument, "Scaling::update_many: too many metas".into()));
        }
        // SAFETY: raws has raws.len() live handles.
        check(unsafe { sys::fp8amp_scaling_update_many(ctx.raw, raws.len() as i32, raws.as_ptr()) })
    }

    /// Scale, scale_inv and amax (synchronizes) (`fp8amp_scaling_get`).
    pub fn get(&self) -> Result<ScalingState> {
        let (mut s, mut si, mut a) = (0f32, 0f32, 0f32);
        // SAFETY: live handle, valid out pointers.
        check(unsafe { sys::fp8amp_scaling_get(self.raw, &mut s, &mut si, &mut a) })?;
        Ok(ScalingState { scale: s, scale_inv: si, amax: a })
    }

    /// A new handle to the amax recorded since the last update, where it lives: a read-only F32
    /// scalar tensor sharing the meta's memory, live, valid past the meta (`fp8amp_scaling_amax_tensor`).
    /// A NaN or an inf recorded reads as +inf. For device-side reads where [`get`](Self::get) would
    /// synchronize.
    pub fn amax_tensor(&self) -> Result<Tensor<'c>> {
        let mut raw = ptr::null_mut();
        // SAFETY: live handle, valid out pointer; the new handle is ours.
        check(unsafe { sys::fp8amp_scaling_amax_tensor(self.raw, &mut raw) })?;
        Ok(Tensor { raw, _ctx: PhantomData })
    }

    /// Sets the scale (and scale_inv = 1/scale) (`fp8amp_scaling_set_scale`).
    pub fn set_scale(&self, scale: f32) -> Result<()> {
        // SAFETY: live handle.
        check(unsafe { sys::fp8amp_scaling_set_scale(self.raw, scale) })
    }

    /// The amax history, `len` entries (the recipe's amax_history_len)
    /// (`fp8amp_scaling_get_history`).
    pub fn history(&self, len: usize) -> Result<Vec<f32>> {
        let mut h = vec![0f32; len];
        let cap = i32::try_from(len)
            .map_err(|_| Error::binding(Status::InvalidArgument, "Scaling::history: len too large".into()))?;
        // SAFETY: h has `cap` entries.
        check(unsafe { sys::fp8amp_scaling_get_history(self.raw, cap, h.as_mut_ptr()) })?;
        Ok(h)
    }

    /// Turns the saturation/underflow counters on or off (`fp8amp_scaling_enable_stats`).
    pub fn enable_stats(&self, enable: bool) -> Result<()> {
        // SAFETY: live handle.
        check(unsafe { sys::fp8amp_scaling_enable_stats(self.raw, enable as i32) })
    }

    /// Reads the counters (`fp8amp_scaling_get_stats`).
    pub fn stats(&self) -> Result<ScalingStats> {
        let mut st = ScalingStats { quantized: 0, saturated: 0, underflowed: 0 };
        // SAFETY: live handle, valid out pointer.
        check(unsafe { sys::fp8amp_scaling_get_stats(self.raw, &mut st) })?;
        Ok(st)
    }

    /// Sets the counters to zero (`fp8amp_scaling_reset_stats`).
    pub fn reset_stats(&self) -> Result<()> {
        // SAFETY: live handle.
        check(unsafe { sys::fp8amp_scaling_reset_stats(self.raw) })
    }
}

impl Drop for Scaling<'_> {
    fn drop(&mut self) {
        // SAFETY: the handle is ours and destroyed once.
        unsafe { sys::fp8amp_scaling_destroy(self.raw) };
    }
}

// ---- the Linear -----------------------------------------------------------------------------

/// How to make a [`Linear`] (`fp8amp_linear_desc`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinearDesc {
    /// K, >= 1.
    pub in_features: i64,
    /// N, >= 1.
    pub out_features: i64,
    /// An F32 bias.
    pub has_bias: bool,
    /// F32, F16 (scaled), BF16 or E4M3 (O3).
    pub weight_dtype: Dtype,
    /// E4M3, F32 or BF16.
    pub wgrad_dtype: Dtype,
    /// The recipe of its metas.
    pub recipe: Recipe,
    /// FP8 or wider GEMMs.
    pub policy: GemmPolicy,
    /// CUDA: replay repeated calls as one graph launch.
    pub graph_replay: bool,
}

impl LinearDesc {
    /// The library's defaults for a Linear `in_features -> out_features` (`fp8amp_linear_desc_init`).
    pub fn new(in_features: i64, out_features: i64) -> Result<LinearDesc> {
        // SAFETY: zeroed is valid for this plain-data struct; init fills it from our sizeof.
        let mut d: sys::fp8amp_linear_desc = unsafe { std::mem::zeroed() };
        check(unsafe { sys::fp8amp_linear_desc_init(&mut d, std::mem::size_of::<sys::fp8amp_linear_desc>()) })?;
        d.in_features = in_features;
        d.out_features = out_features;
        LinearDesc::from_raw(&d)
    }

    fn from_raw(d: &sys::fp8amp_linear_desc) -> Result<LinearDesc> {
        Ok(LinearDesc {
            in_features: d.in_features,
            out_features: d.out_features,
            has_bias: d.has_bias != 0,
            weight_dtype: known(Dtype::from_raw(d.weight_dtype), "a dtype", d.weight_dtype)?,
            wgrad_dtype: known(Dtype::from_raw(d.wgrad_dtype), "a dtype", d.wgrad_dtype)?,
            recipe: Recipe::from_raw(&d.recipe)?,
            policy: known(GemmPolicy::from_raw(d.policy), "a GEMM policy", d.policy)?,
            graph_replay: d.graph_replay != 0,
        })
    }

    /// The C struct (struct_size set).
    pub fn to_raw(&self) -> sys::fp8amp_linear_desc {
        sys::fp8amp_linear_desc {
            struct_size: std::mem::size_of::<sys::fp8amp_linear_desc>() as u32,
            in_features: self.in_features,
            out_features: self.out_features,
            has_bias: self.has_bias as i32,
            weight_dtype: self.weight_dtype.to_raw(),
            wgrad_dtype: self.wgrad_dtype.to_raw(),
            recipe: self.recipe.to_raw(),
            policy: self.policy.to_raw(),
            graph_replay: self.graph_replay as i32,
        }
    }
}

/// Presets of an optimization level for a Linear `in_features -> out_features` and its Adam
/// (`fp8amp_opt_level_init`: MS-AMP's table, docs/design.md 1).
pub fn opt_level_config(level: OptLevel, in_features: i64, out_features: i64) -> Result<(LinearDesc, AdamDesc)> {
    // SAFETY: zeroed plain-data structs; init fills them from our sizeofs.
    let mut l: sys::fp8amp_linear_desc = unsafe { std::mem::zeroed() };
    let mut a: sys::fp8amp_adam_desc = unsafe { std::mem::zeroed() };
    check(unsafe {
        sys::fp8amp_opt_level_init(level.to_raw(), &mut l, std::mem::size_of_val(&l), &mut a, std::mem::size_of_val(&a))
    })?;
    l.in_features = in_features;
    l.out_features = out_features;
    Ok((LinearDesc::from_raw(&l)?, AdamDesc::from_raw(&a)?))
}

/// An FP8 Linear layer, `y = x W^T + b` (`fp8amp_linear`). Destroyed on drop; tensors and metas
/// obtained from it stay valid.
pub struct Linear<'c> {
    raw: sys::fp8amp_linear,
    _ctx: PhantomData<&'c Context>,
}

impl<'c> Linear<'c> {
    /// A Linear on `ctx` (`fp8amp_linear_create`); its weight and bias are unspecified until
    /// written through [`weight`](Self::weight) and [`bias`](Self::bias).
    pub fn new(ctx: &'c Context, desc: &LinearDesc) -> Result<Linear<'c>> {
        let d = desc.to_raw();
        let mut raw = ptr::null_mut();
        // SAFETY: valid pointers; the new handle is ours.
        check(unsafe { sys::fp8amp_linear_create(ctx.raw, &d, &mut raw) })?;
        Ok(Linear { raw, _ctx: PhantomData })
    }

    /// The raw handle, still owned by this Linear.
    pub fn as_raw(&self) -> sys::fp8amp_linear {
        self.raw
    }

    fn tensor(
        &self,
        f: unsafe extern "C" fn(sys::fp8amp_linear, *mut sys::fp8amp_tensor) -> sys::fp8amp_status,
    ) -> Result<Tensor<'c>> {
        let mut raw = ptr::null_mut();
        // SAFETY: live handle, valid out pointer; the new handle is ours.
        check(unsafe { f(self.raw, &mut raw) })?;
        Ok(Tensor { raw, _ctx: PhantomData })
    }

    /// A new handle to the weight, `[out, in]` of weight_dtype. Writes through it (host copies,
    /// casts, the optimizer) are seen by the next forward.
    pub fn weight(&self) -> Result<Tensor<'c>> {
        self.tensor(sys::fp8amp_linear_weight)
    }
    /// A new handle to the bias, `[out]` F32 ([`Status::InvalidArgument`] without a bias).
    pub fn bias(&self) -> Result<Tensor<'c>> {
        self.tensor(sys::fp8amp_linear_bias)
    }
    /// A new handle to the weight gradient, `[out, in]` of wgrad_dtype.
    pub fn weight_grad(&self) -> Result<Tensor<'c>> {
        self.tensor(sys::fp8amp_linear_weight_grad)
    }
    /// A new handle to the bias gradient, `[out]` F32.
    pub fn bias_grad(&self) -> Result<Tensor<'c>> {
        self.tensor(sys::fp8amp_linear_bias_grad)
    }

    /// A new handle to one of its scaling metas (`fp8amp_linear_scaling`).
    pub fn scaling(&self, role: Role) -> Result<Scaling<'c>> {
        let mut raw = ptr::null_mut();
        // SAFETY: live handle, valid out pointer; the new handle is ours.
        check(unsafe { sys::fp8amp_linear_scaling(self.raw, role.to_raw(), &mut raw) })?;
        Ok(Scaling { raw, _ctx: PhantomData })
    }

    /// Tells the Linear its weight or bias was written behind its back (`fp8amp_linear_weight_changed`).
    pub fn weight_changed(&self) -> Result<()> {
        // SAFETY: live handle.
        check(unsafe { sys::fp8amp_linear_weight_changed(self.raw) })
    }

    /// `y = x W^T + b`; `training` keeps x (in FP8) for [`backward`](Self::backward)
    /// (`fp8amp_linear_forward`).
    pub fn forward(&self, x: &Tensor<'_>, y: &Tensor<'_>, training: bool) -> Result<()> {
        // SAFETY: live handles; the library checks shapes, dtypes, devices and overlaps.
        check(unsafe { sys::fp8amp_linear_forward(self.raw, x.raw, y.raw, training as i32) })
    }

    /// The GEMM a forward of `rows` rows of a wide input would run now: the policy's choice
    /// (`fp8amp_linear_choose_gemm`); a fused front asks it before writing the input in FP8.
    pub fn choose_gemm(&self, rows: i64, training: bool) -> Result<GemmKind> {
        let mut k = 0;
        // SAFETY: live handle, valid out pointer.
        check(unsafe { sys::fp8amp_linear_choose_gemm(self.raw, rows, training as i32, &mut k) })?;
        known(GemmKind::from_raw(k), "a GEMM kind", k)
    }

    /// `y = x W^T + b` from an E4M3 `x8` the caller quantized (a fused norm or activation writing
    /// into a tensor bound to this Linear's INPUT meta), read with its own scale_inv; training keeps
    /// the Linear's own copy for the backward (`fp8amp_linear_forward_fp8`).
    pub fn forward_fp8(&self, x8: &Tensor<'_>, y: &Tensor<'_>, training: bool) -> Result<()> {
        // SAFETY: live handles; the library checks dtypes, shapes, devices and overlaps.
        check(unsafe { sys::fp8amp_linear_forward_fp8(self.raw, x8.raw, y.raw, training as i32) })
    }

    /// Backward of the last training forward: writes `dx` (if given), the weight gradient and the
    /// bias gradient, added to the earlier ones when `accumulate_wgrad` (`fp8amp_linear_backward`).
    pub fn backward(&self, dy: &Tensor<'_>, dx: Option<&Tensor<'_>>, accumulate_wgrad: bool) -> Result<()> {
        let dx = dx.map_or(ptr::null_mut(), |t| t.raw);
        // SAFETY: live handles (dx may be NULL: no input gradient).
        check(unsafe { sys::fp8amp_linear_backward(self.raw, dy.raw, dx, accumulate_wgrad as i32) })
    }

    /// Gives back what the Linear keeps between calls beyond its parameters and gradients, at a
    /// step boundary (`fp8amp_linear_release_buffers`: docs/linear.md section 2).
    pub fn release_buffers(&self) -> Result<()> {
        // SAFETY: live handle.
        check(unsafe { sys::fp8amp_linear_release_buffers(self.raw) })
    }

    /// How much the Linear keeps between calls: 0 (everything until the step), 1 (its FP8 weight
    /// copies in the context's scratch, the saved input freed by its backward), 2 (also no FP32
    /// weight-gradient sum when not accumulating) (`fp8amp_linear_set_lean`: docs/linear.md section 5).
    pub fn set_lean(&self, lean: i32) -> Result<()> {
        // SAFETY: live handle.
        check(unsafe { sys::fp8amp_linear_set_lean(self.raw, lean) })
    }

    /// The Linear's lean level (`fp8amp_linear_get_lean`).
    pub fn lean(&self) -> Result<i32> {
        let mut n = 0;
        // SAFETY: live handle, valid out pointer.
        check(unsafe { sys::fp8amp_linear_get_lean(self.raw, &mut n) })?;
        Ok(n)
    }

    /// The bytes of the context's memory the Linear's own tensors hold now
    /// (`fp8amp_linear_memory_bytes`).
    pub fn memory_bytes(&self) -> Result<usize> {
        let mut n = 0;
        // SAFETY: live handle, valid out pointer.
        check(unsafe { sys::fp8amp_linear_memory_bytes(self.raw, &mut n) })?;
        Ok(n)
    }

    /// Which GEMM the last forward ran.
    pub fn gemm_kind(&self) -> Result<GemmKind> {
        let mut k = 0;
        // SAFETY: live handle, valid out pointer.
        check(unsafe { sys::fp8amp_linear_gemm_kind(self.raw, &mut k) })?;
        known(GemmKind::from_raw(k), "a GEMM kind", k)
    }

    /// How many calls ran as one CUDA graph launch (0 on the CPU).
    pub fn graph_replays(&self) -> Result<u64> {
        let mut n = 0;
        // SAFETY: live handle, valid out pointer.
        check(unsafe { sys::fp8amp_linear_graph_replays(self.raw, &mut n) })?;
        Ok(n)
    }
}

impl Drop for Linear<'_> {
    fn drop(&mut self) {
        // SAFETY: the handle is ours and destroyed once.
        unsafe { sys::fp8amp_linear_destroy(self.raw) };
    }
}

// ---- the optimizer --------------------------------------------------------------------------

/// Adam / AdamW hyperparameters and state dtypes (`fp8amp_adam_desc`). Make one with
/// [`AdamDesc::new`] (the library's defaults) or [`AdamDesc::opt_level`], then change fields.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamDesc {
    /// AdamW (decoupled decay) rather than Adam (L2 in the gradient).
    pub adamw: bool,
    /// Learning rate, >= 0.
    pub lr: f32,
    /// In [0, 1).
    pub beta1: f32,
    /// In [0, 1).
    pub beta2: f32,
    /// >= 0.
    pub eps: f32,
    /// >= 0.
    pub weight_decay: f32,
    /// Ascend instead of descend.
    pub maximize: bool,
    /// m: F32 or E4M3.
    pub exp_avg_dtype: Dtype,
    /// v: F32 or F16.
    pub exp_avg_sq_dtype: Dtype,
    /// `None` or `Some(Dtype::F16)` (O3's master copy).
    pub master_dtype: Option<Dtype>,
    /// Elements per state scale (a power of two in 128..8192), or 0: one per tensor.
    pub state_block_size: i32,
    /// Global gradient-norm clipping; 0 = off.
    pub max_grad_norm: f32,
    /// How a step rounds the value of record -- the F16 master copies, and BF16/F16 parameters that
    /// have none: nearest (false, the default) or stochastic (true; docs/numerics.md 6.3).
    pub stochastic_master_rounding: bool,
    /// The seed of stochastic rounding: one seed gives identical bytes on CPU and CUDA.
    pub rounding_seed: u32,
}

impl AdamDesc {
    /// The library's defaults: AdamW, lr 1e-3, F32 state (`fp8amp_adam_desc_init`).
    pub fn new() -> Result<AdamDesc> {
        // SAFETY: zeroed plain data; init fills it from our sizeof.
        let mut d: sys::fp8amp_adam_desc = unsafe { std::mem::zeroed() };
        check(unsafe { sys::fp8amp_adam_desc_init(&mut d, std::mem::size_of_val(&d)) })?;
        AdamDesc::from_raw(&d)
    }

    /// The preset of an optimization level (`fp8amp_opt_level_adam_init`).
    pub fn opt_level(level: OptLevel) -> Result<AdamDesc> {
        // SAFETY: as above.
        let mut d: sys::fp8amp_adam_desc = unsafe { std::mem::zeroed() };
        check(unsafe { sys::fp8amp_opt_level_adam_init(level.to_raw(), &mut d, std::mem::size_of_val(&d)) })?;
        AdamDesc::from_raw(&d)
    }

    fn from_raw(d: &sys::fp8amp_adam_desc) -> Result<AdamDesc> {
        Ok(AdamDesc {
            adamw: d.adamw != 0,
            lr: d.lr,
            beta1: d.beta1,
            beta2: d.beta2,
            eps: d.eps,
            weight_decay: d.weight_decay,
            maximize: d.maximize != 0,
            exp_avg_dtype: known(Dtype::from_raw(d.exp_avg_dtype), "a dtype", d.exp_avg_dtype)?,
            exp_avg_sq_dtype: known(Dtype::from_raw(d.exp_avg_sq_dtype), "a dtype", d.exp_avg_sq_dtype)?,
            master_dtype: if d.master_dtype == sys::FP8AMP_NO_MASTER {
                None
            } else {
                Some(known(Dtype::from_raw(d.master_dtype as u32), "a master dtype", d.master_dtype as u32)?)
            },
            state_block_size: d.state_block_size,
            max_grad_norm: d.max_grad_norm,
            stochastic_master_rounding: d.master_rounding == sys::FP8AMP_MASTER_ROUND_STOCHASTIC as i32,
            rounding_seed: d.rounding_seed,
        })
    }

    /// The C struct (struct_size set).
    pub fn to_raw(&self) -> sys::fp8amp_adam_desc {
        sys::fp8amp_adam_desc {
            struct_size: std::mem::size_of::<sys::fp8amp_adam_desc>() as u32,
            adamw: self.adamw as i32,
            lr: self.lr,
            beta1: self.beta1,
            beta2: self.beta2,
            eps: self.eps,
            weight_decay: self.weight_decay,
            maximize: self.maximize as i32,
            exp_avg_dtype: self.exp_avg_dtype.to_raw(),
            exp_avg_sq_dtype: self.exp_avg_sq_dtype.to_raw(),
            master_dtype: self.master_dtype.map_or(sys::FP8AMP_NO_MASTER, |d| d.to_raw() as i32),
            state_block_size: self.state_block_size,
            max_grad_norm: self.max_grad_norm,
            master_rounding: if self.stochastic_master_rounding {
                sys::FP8AMP_MASTER_ROUND_STOCHASTIC as i32
            } else {
                sys::FP8AMP_MASTER_ROUND_NEAREST as i32
            },
            rounding_seed: self.rounding_seed,
        }
    }
}

/// One step's arguments (`fp8amp_adam_step_args`, without the device-side lr pointer).
#[derive(Clone, Copy, Default)]
pub struct StepArgs<'a, 'c> {
    /// This step's learning rate; `None`: the desc's.
    pub lr: Option<f32>,
    /// Multiplies every gradient (e.g. 1 / world size); `None`: 1.
    pub grad_scale_inv: Option<f32>,
    /// Divide gradients by this loss scaler's scale and update it from the step's found_inf.
    pub scaler: Option<&'a GradScaler<'c>>,
}

/// Adam / AdamW over a list of parameters with low-precision state (`fp8amp_optimizer`).
/// Destroyed on drop.
pub struct Optimizer<'c> {
    raw: sys::fp8amp_optimizer,
    _ctx: PhantomData<&'c Context>,
}

/// One parameter's Adam state ([`Optimizer::param_state`], `fp8amp_param_state`): tensors viewing
/// the optimizer's memory (read-only; `None` where the parameter has no such part) and the
/// parameter's meta state when it is scaled (O3's E4M3 weights).
pub struct ParamState<'c> {
    /// Whether the parameter has an F16 master copy.
    pub has_master: bool,
    /// The optimizer's step count.
    pub step: i64,
    /// m: F32 (O1) or E4M3 (O2/O3).
    pub exp_avg: Tensor<'c>,
    /// E4M3 m's block scales (`None` at O1).
    pub exp_avg_scale_inv: Option<Tensor<'c>>,
    /// v: F32 (O1) or F16 (O2/O3).
    pub exp_avg_sq: Tensor<'c>,
    /// F16 v's block scales (`None` at O1).
    pub exp_avg_sq_scale_inv: Option<Tensor<'c>>,
    /// The F16 master copy, if any.
    pub master: Option<Tensor<'c>>,
    /// The master's block scales, if any.
    pub master_scale_inv: Option<Tensor<'c>>,
    /// A copy of a scaled parameter's meta's amax history (newest first), if scaled.
    pub param_meta_history: Option<Tensor<'c>>,
    /// That meta's scale.
    pub param_meta_scale: f32,
    /// The amax that meta recorded since its last update.
    pub param_meta_amax: f32,
    /// That meta's update count.
    pub param_meta_updates: i64,
}

/// What [`Optimizer::set_param_state`] writes into one parameter's state (`fp8amp_param_state` as
/// `fp8amp_optimizer_set_param_state` takes it). Each part in one of two forms: its stored dtype with
/// its block scale tensor (copied bit-exactly: what [`Optimizer::param_state`] gave round-trips), or
/// F32/BF16/F16 values with `None` scales (quantized with the optimizer's own block scaling).
pub struct ParamStateIn<'a, 'c> {
    /// m (required).
    pub exp_avg: &'a Tensor<'c>,
    /// m's block scales (stored form) or `None` (values).
    pub exp_avg_scale_inv: Option<&'a Tensor<'c>>,
    /// v (required).
    pub exp_avg_sq: &'a Tensor<'c>,
    /// v's block scales or `None`.
    pub exp_avg_sq_scale_inv: Option<&'a Tensor<'c>>,
    /// The master copy: required for a parameter that has one, `None` otherwise.
    pub master: Option<&'a Tensor<'c>>,
    /// The master's block scales or `None`.
    pub master_scale_inv: Option<&'a Tensor<'c>>,
    /// A scaled parameter's meta state to restore: its amax history (F32, newest first), scale,
    /// recorded amax and update count; `None` leaves the meta as it is.
    pub param_meta: Option<(&'a Tensor<'c>, f32, f32, i64)>,
}

impl<'a, 'c> ParamStateIn<'a, 'c> {
    /// The state `st` holds (a [`ParamState`] read from this or another optimizer), parts and meta.
    pub fn from_state(st: &'a ParamState<'c>) -> ParamStateIn<'a, 'c> {
        ParamStateIn {
            exp_avg: &st.exp_avg,
            exp_avg_scale_inv: st.exp_avg_scale_inv.as_ref(),
            exp_avg_sq: &st.exp_avg_sq,
            exp_avg_sq_scale_inv: st.exp_avg_sq_scale_inv.as_ref(),
            master: st.master.as_ref(),
            master_scale_inv: st.master_scale_inv.as_ref(),
            param_meta: st.param_meta_history.as_ref().map(|h| (h, st.param_meta_scale, st.param_meta_amax,
                                                                 st.param_meta_updates)),
        }
    }
}

impl<'c> Optimizer<'c> {
    /// An optimizer on `ctx` (`fp8amp_optimizer_create`).
    pub fn new(ctx: &'c Context, desc: &AdamDesc) -> Result<Optimizer<'c>> {
        let d = desc.to_raw();
        let mut raw = ptr::null_mut();
        // SAFETY: valid pointers; the new handle is ours.
        check(unsafe { sys::fp8amp_optimizer_create(ctx.raw, &d, &mut raw) })?;
        Ok(Optimizer { raw, _ctx: PhantomData })
    }

    /// The raw handle, still owned by this Optimizer.
    pub fn as_raw(&self) -> sys::fp8amp_optimizer {
        self.raw
    }

    /// Registers a parameter and its gradient (the optimizer keeps them alive)
    /// (`fp8amp_optimizer_add_param`).
    pub fn add_param(&self, param: &Tensor<'_>, grad: &Tensor<'_>) -> Result<()> {
        // SAFETY: live handles.
        check(unsafe { sys::fp8amp_optimizer_add_param(self.raw, param.raw, grad.raw) })
    }

    /// One step (`fp8amp_optimizer_step`); a non-finite gradient skips it (see [`found_inf`](Self::found_inf)).
    pub fn step(&self, args: &StepArgs<'_, '_>) -> Result<()> {
        // SAFETY: zeroed plain data; init fills the defaults from our sizeof.
        let mut a: sys::fp8amp_adam_step_args = unsafe { std::mem::zeroed() };
        check(unsafe { sys::fp8amp_adam_step_args_init(&mut a, std::mem::size_of_val(&a)) })?;
        if let Some(lr) = args.lr {
            a.lr = lr;
        }
        if let Some(g) = args.grad_scale_inv {
            a.grad_scale_inv = g;
        }
        if let Some(s) = args.scaler {
            a.scaler = s.raw;
        }
        // SAFETY: live handles; lr_device stays NULL.
        check(unsafe { sys::fp8amp_optimizer_step(self.raw, &a) })
    }

    /// Whether the last step found a non-finite gradient and skipped the update.
    pub fn found_inf(&self) -> Result<bool> {
        let mut f = 0;
        // SAFETY: live handle, valid out pointer.
        check(unsafe { sys::fp8amp_optimizer_get_found_inf(self.raw, &mut f) })?;
        Ok(f != 0)
    }

    /// Parameter `index`'s state (`fp8amp_optimizer_param_state`): read-only views of the
    /// optimizer's own memory in its stored dtypes, live (a later step shows through them) and each
    /// keeping its memory alive past the optimizer.
    pub fn param_state(&self, index: usize) -> Result<ParamState<'c>> {
        if index > i32::MAX as usize {
            return Err(Error::binding(Status::InvalidArgument, format!("Optimizer::param_state: index {} is too large", index)));
        }
        // SAFETY: zeroed plain data (NULL handles); init sets struct_size from our sizeof.
        let mut s: sys::fp8amp_param_state = unsafe { std::mem::zeroed() };
        check(unsafe { sys::fp8amp_param_state_init(&mut s, std::mem::size_of_val(&s)) })?;
        // SAFETY: live handle, valid out struct; the handles it receives are ours.
        check(unsafe { sys::fp8amp_optimizer_param_state(self.raw, index as i32, &mut s) })?;
        let own = |raw: sys::fp8amp_tensor| if raw.is_null() { None } else { Some(Tensor { raw, _ctx: PhantomData }) };
        let (m, v) = (own(s.exp_avg), own(s.exp_avg_sq));
        let rest = (own(s.exp_avg_scale_inv), own(s.exp_avg_sq_scale_inv), own(s.master), own(s.master_scale_inv),
                    own(s.param_meta_history));
        match (m, v) {
            (Some(exp_avg), Some(exp_avg_sq)) => Ok(ParamState {
                has_master: s.has_master != 0,
                step: s.step,
                exp_avg,
                exp_avg_scale_inv: rest.0,
                exp_avg_sq,
                exp_avg_sq_scale_inv: rest.1,
                master: rest.2,
                master_scale_inv: rest.3,
                param_meta_history: rest.4,
                param_meta_scale: s.param_meta_scale,
                param_meta_amax: s.param_meta_amax,
                param_meta_updates: s.param_meta_updates,
            }),
            _ => Err(Error::binding(Status::Internal, "Optimizer::param_state: the library returned no m or v".into())),
        }
    }

    /// Writes parameter `index`'s m, v and master from `state` (`fp8amp_optimizer_set_param_state`):
    /// everything is checked first, so an error changes nothing. The parameter's own values and the
    /// step count ([`set_step`](Self::set_step)) are left alone. Synchronizes.
    pub fn set_param_state(&self, index: usize, state: &ParamStateIn<'_, '_>) -> Result<()> {
        if index > i32::MAX as usize {
            return Err(Error::binding(Status::InvalidArgument,
                                      format!("Optimizer::set_param_state: index {} is too large", index)));
        }
        // SAFETY: zeroed plain data (NULL handles); init sets struct_size from our sizeof.
        let mut s: sys::fp8amp_param_state = unsafe { std::mem::zeroed() };
        check(unsafe { sys::fp8amp_param_state_init(&mut s, std::mem::size_of_val(&s)) })?;
        let raw = |t: Option<&Tensor<'_>>| t.map_or(ptr::null_mut(), |t| t.raw);
        s.exp_avg = state.exp_avg.raw;
        s.exp_avg_scale_inv = raw(state.exp_avg_scale_inv);
        s.exp_avg_sq = state.exp_avg_sq.raw;
        s.exp_avg_sq_scale_inv = raw(state.exp_avg_sq_scale_inv);
        s.master = raw(state.master);
        s.master_scale_inv = raw(state.master_scale_inv);
        if let Some((history, scale, amax, updates)) = state.param_meta {
            s.param_meta_history = history.raw;
            s.param_meta_scale = scale;
            s.param_meta_amax = amax;
            s.param_meta_updates = updates;
        }
        // SAFETY: live handles (borrowed for the call); the library copies from them and keeps none.
        check(unsafe { sys::fp8amp_optimizer_set_param_state(self.raw, index as i32, &s) })
    }

    /// Sets the step count (`fp8amp_optimizer_set_step`: the next step's bias corrections use
    /// `step + 1`), e.g. after [`set_param_state`](Self::set_param_state) from another optimizer.
    pub fn set_step(&self, step: i64) -> Result<()> {
        // SAFETY: live handle.
        check(unsafe { sys::fp8amp_optimizer_set_step(self.raw, step) })
    }

    /// Steps taken (skipped steps not counted).
    pub fn step_count(&self) -> Result<i64> {
        let mut s = 0;
        // SAFETY: live handle, valid out pointer.
        check(unsafe { sys::fp8amp_optimizer_get_step(self.raw, &mut s) })?;
        Ok(s)
    }

    /// The last step's global gradient norm (when clipping is on).
    pub fn grad_norm(&self) -> Result<f32> {
        let mut n = 0f32;
        // SAFETY: live handle, valid out pointer.
        check(unsafe { sys::fp8amp_optimizer_get_grad_norm(self.raw, &mut n) })?;
        Ok(n)
    }

    /// Number of registered parameters.
    pub fn num_params(&self) -> Result<i32> {
        let mut n = 0;
        // SAFETY: live handle, valid out pointer.
        check(unsafe { sys::fp8amp_optimizer_num_params(self.raw, &mut n) })?;
        Ok(n)
    }

    /// Bytes of state the optimizer holds.
    pub fn state_bytes(&self) -> Result<usize> {
        let mut n = 0;
        // SAFETY: live handle, valid out pointer.
        check(unsafe { sys::fp8amp_optimizer_state_bytes(self.raw, &mut n) })?;
        Ok(n)
    }

    /// A checkpoint of the optimizer (`fp8amp_optimizer_save`).
    pub fn save(&self) -> Result<Vec<u8>> {
        let mut size = 0usize;
        // SAFETY: NULL buffer asks for the size.
        check(unsafe { sys::fp8amp_optimizer_save(self.raw, ptr::null_mut(), 0, &mut size) })?;
        let mut buf = vec![0u8; size];
        let mut written = 0usize;
        // SAFETY: buf has `size` bytes.
        check(unsafe {
            sys::fp8amp_optimizer_save(self.raw, buf.as_mut_ptr() as *mut c_void, buf.len(), &mut written)
        })?;
        buf.truncate(written);
        Ok(buf)
    }

    /// Restores a checkpoint made by [`save`](Self::save) (`fp8amp_optimizer_load`).
    pub fn load(&self, data: &[u8]) -> Result<()> {
        // SAFETY: data is valid for data.len() bytes.
        check(unsafe { sys::fp8amp_optimizer_load(self.raw, data.as_ptr() as *const c_void, data.len()) })
    }
}

impl Drop for Optimizer<'_> {
    fn drop(&mut self) {
        // SAFETY: the handle is ours and destroyed once.
        unsafe { sys::fp8amp_optimizer_destroy(self.raw) };
    }
}

/// Dynamic loss scaler settings (`fp8amp_grad_scaler_desc`, the C struct).
pub type GradScalerDesc = sys::fp8amp_grad_scaler_desc;
/// A loss scaler's state (`fp8amp_grad_scaler_state`, the C struct).
pub type GradScalerState = sys::fp8amp_grad_scaler_state;

/// A dynamic loss scaler with growth, backoff and hysteresis (`fp8amp_grad_scaler`). Destroyed on drop.
pub struct GradScaler<'c> {
    raw: sys::fp8amp_grad_scaler,
    _ctx: PhantomData<&'c Context>,
}

impl<'c> GradScaler<'c> {
    /// The library's default settings (`fp8amp_grad_scaler_desc_init`).
    pub fn default_desc() -> Result<GradScalerDesc> {
        // SAFETY: zeroed plain data; init fills it from our sizeof.
        let mut d: GradScalerDesc = unsafe { std::mem::zeroed() };
        check(unsafe { sys::fp8amp_grad_scaler_desc_init(&mut d, std::mem::size_of::<GradScalerDesc>()) })?;
        Ok(d)
    }

    /// A loss scaler on `ctx` (`fp8amp_grad_scaler_create`).
    pub fn new(ctx: &'c Context, desc: &GradScalerDesc) -> Result<GradScaler<'c>> {
        let mut d = *desc;
        d.struct_size = std::mem::size_of::<GradScalerDesc>() as u32;
        let mut raw = ptr::null_mut();
        // SAFETY: valid pointers; the new handle is ours.
        check(unsafe { sys::fp8amp_grad_scaler_create(ctx.raw, &d, &mut raw) })?;
        Ok(GradScaler { raw, _ctx: PhantomData })
    }

    /// The current loss scale (synchronizes).
    pub fn scale(&self) -> Result<f32> {
        let mut s = 0f32;
        // SAFETY: live handle, valid out pointer.
        check(unsafe { sys::fp8amp_grad_scaler_get_scale(self.raw, &mut s) })?;
        Ok(s)
    }

    /// The full state (synchronizes).
    pub fn state(&self) -> Result<GradScalerState> {
        let mut st = GradScalerState { scale: 0.0, growth_tracker: 0, hysteresis_left: 0 };
        // SAFETY: live handle, valid out pointer.
        check(unsafe { sys::fp8amp_grad_scaler_get_state(self.raw, &mut st) })?;
        Ok(st)
    }

    /// Restores a state (checked against the desc's domain).
    pub fn set_state(&self, state: &GradScalerState) -> Result<()> {
        // SAFETY: live handle, valid pointer.
        check(unsafe { sys::fp8amp_grad_scaler_set_state(self.raw, state) })
    }

    /// Updates the scale from `opt`'s last found_inf (when the step did not already).
    pub fn update(&self, opt: &Optimizer<'_>) -> Result<()> {
        // SAFETY: live handles.
        check(unsafe { sys::fp8amp_grad_scaler_update(self.raw, opt.raw) })
    }
}

impl Drop for GradScaler<'_> {
    fn drop(&mut self) {
        // SAFETY: the handle is ours and destroyed once.
        unsafe { sys::fp8amp_grad_scaler_destroy(self.raw) };
    }
}

// The README's Rust examples run as doctests, so the documented program stays true.
#[doc = include_str!("../../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
