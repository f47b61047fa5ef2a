"""
    FP8AMP

Julia bindings of fp8amp's C API (`libfp8amp.so.0`). Two layers:

- the raw layer, `src/libfp8amp_api.jl`, generated from `fp8amp.h` by `bindings/julia/generate.py`:
  one function per C function (`fp8amp_tensor_create(ctx, dtype, ndim, shape, out)` ...), the enums
  as constants, the option structs as isbits `struct`s with the C layout, the handles as `Ptr`s;
- this file: `check` (a failed call throws `FP8AMPError(status, message)`), handle objects
  (`Context`, `Tensor`, `Scaling`, `Linear`, `Optimizer`) whose finalizers destroy the C handle
  exactly once, and a few Julia-shaped functions over them.

NOT RUN: no Julia toolchain could be installed where this was written. The generated layer is
checked against the header by `bindings/julia/check.py` (ctest `julia.wrappers`); this file has
never been executed. See bindings/julia/README.md.

Memory order: fp8amp tensors are row-major, Julia arrays column-major. A Julia array of size
`(d1, d2, ..., dn)` holds the same bytes as an fp8amp tensor of shape `[dn, ..., d2, d1]`, so every
function here takes and returns Julia-order dims and reverses them for the C API (a weight
`[out, in]` in C is a `in × out` matrix in Julia).
"""
module FP8AMP

using Libdl

# ccall resolves this name through the loader: __init__ loads the library first (by its SONAME or
# by the path in ENV["FP8AMP_LIB"]), and the loader then finds that copy by its SONAME.
const libfp8amp = "libfp8amp.so.0"

include("libfp8amp_api.jl")

export FP8AMPError, check, Context, Tensor, Scaling, Linear, Optimizer, library_version,
       quantize!, dequantize!, cast!, forward!, forward_fp8!, choose_gemm, backward!, add_param!, step!, found_inf,
       weight, bias, weight_grad, bias_grad, scale_inv, set_scaling!, set_scale!, scale_state, recipe, dtype

# ---- loading --------------------------------------------------------------------------------

const _handle = Ref{Ptr{Cvoid}}(C_NULL)

function __init__()
    path = get(ENV, "FP8AMP_LIB", libfp8amp)
    _handle[] = Libdl.dlopen(path, Libdl.RTLD_NOW | Libdl.RTLD_GLOBAL)
    v = Int(fp8amp_version())
    # The header this file was generated from is FP8AMP_VERSION: the major must match (a new major
    # is a new ABI), and the library may not be older (it would lack functions or fields).
    if v ÷ 10000 != FP8AMP_VERSION_MAJOR || (v ÷ 100) % 100 < FP8AMP_VERSION_MINOR
        error("FP8AMP: $(path) is libfp8amp $(v ÷ 10000).$((v ÷ 100) % 100).$(v % 100); these bindings " *
              "were generated from the $(FP8AMP_VERSION_MAJOR).$(FP8AMP_VERSION_MINOR) header")
    end
    return nothing
end

"The loaded library's version as (major, minor, patch)."
function library_version()
    v = Int(fp8amp_version())
    return (v ÷ 10000, (v ÷ 100) % 100, v % 100)
end

# ---- errors ---------------------------------------------------------------------------------

"""
    FP8AMPError(status, message)

A failed fp8amp call: `status` is the `fp8amp_status` value (`FP8AMP_ERROR_SHAPE_MISMATCH`, ...),
`message` the library's text for it (`"fp8amp_quantize: ..."`).
"""
struct FP8AMPError <: Exception
    status::fp8amp_status
    message::String
end

status_name(s::Integer) = unsafe_string(fp8amp_status_name(fp8amp_status(s)))

Base.showerror(io::IO, e::FP8AMPError) = print(io, "FP8AMPError: ", status_name(e.status), ": ", e.message)

"""
    check(status)

Throws `FP8AMPError(status, message)` unless `status == FP8AMP_SUCCESS`. The message is the calling
thread's (fp8amp keeps it per thread), read before anything can yield this task to another thread.
A finalizer that the string's allocation lets run only destroys handles, which succeeds and leaves
the message as it is (a successful fp8amp call does not change it).
"""
@inline function check(status::Integer)
    status == FP8AMP_SUCCESS && return nothing
    throw(FP8AMPError(fp8amp_status(status), unsafe_string(fp8amp_last_error_message())))
end

# ---- option structs: the library's defaults, then the caller's fields ---------------------------

# A copy of an immutable struct with some fields replaced (the structs mirror C and are immutable).
function _with(x::T; kw...) where {T}
    return T((haskey(kw, f) ? convert(fieldtype(T, f), kw[f]) : getfield(x, f) for f in fieldnames(T))...)
end

"""
    recipe(; fields...)

An `fp8amp_recipe` with the library's defaults (`fp8amp_recipe_init`), then the given fields, e.g.
`recipe(mode = FP8AMP_SCALING_CURRENT, margin = 1)`.
"""
function recipe(; kw...)
    r = Ref{fp8amp_recipe}()
    check(fp8amp_recipe_init(r, sizeof(fp8amp_recipe)))
    return _with(r[]; kw...)
end

# A keyword argument named `recipe` would shadow the function in its own default: this name does not.
_default_recipe() = recipe()

# ---- handles --------------------------------------------------------------------------------

# Every handle object holds its C handle and destroys it once: close() and the finalizer both go
# through _release!, which clears the field before calling destroy, so the second caller finds NULL.
abstract type Handle end

function _release!(x::Handle, destroy)
    h = x.handle
    h == C_NULL && return FP8AMP_SUCCESS
    x.handle = typeof(h)(C_NULL)
    return destroy(h)
end

# In a finalizer nothing may be thrown; a destroy of a live handle this object owns cannot fail.
_finalizer(destroy) = x -> (_release!(x, destroy); nothing)

Base.close(x::Handle) = check(_release!(x, _destroy_fn(x)))

function _live(x::Handle)
    x.handle == C_NULL && throw(FP8AMPError(FP8AMP_ERROR_INVALID_HANDLE, "$(typeof(x)) is closed"))
    return x.handle
end

# The objects themselves are passed to the generated functions: ccall converts each to its handle
# (Base.unsafe_convert below, after every type is defined) and keeps the object rooted until the C
# function returns (cconvert's result is), so a finalizer cannot destroy a handle between reading
# it and the call. Only an object of the handle's own kind converts: a Tensor where a context is
# expected is a MethodError, not a wrong handle.

"""
    Context(device = :cpu, index = 0)

An fp8amp context on the CPU (`:cpu`) or a CUDA device (`:cuda`, `index` its ordinal).
"""
mutable struct Context <: Handle
    handle::fp8amp_context
    function Context(device::Symbol = :cpu, index::Integer = 0)
        devtype = device === :cpu ? FP8AMP_DEVICE_CPU : device === :cuda ? FP8AMP_DEVICE_CUDA :
                  throw(ArgumentError("device must be :cpu or :cuda, not :$(device)"))
        out = Ref{fp8amp_context}(C_NULL)
        check(fp8amp_context_create(fp8amp_device(devtype, Int32(index)), out))
        return finalizer(_finalizer(fp8amp_context_destroy), new(out[]))
    end
end
_destroy_fn(::Context) = fp8amp_context_destroy

"""
    Tensor(ctx, dtype, dims...)

A new tensor of `dtype` (`FP8AMP_DTYPE_F32`, ...) with Julia-order `dims` (stored as the row-major C
shape `reverse(dims)`). `owner` keeps Julia memory alive for a tensor wrapping it.
"""
mutable struct Tensor <: Handle
    handle::fp8amp_tensor
    owner::Any
    function Tensor(h::fp8amp_tensor, owner = nothing)
        return finalizer(_finalizer(fp8amp_tensor_destroy), new(h, owner))
    end
end
_destroy_fn(::Tensor) = fp8amp_tensor_destroy

function Tensor(ctx::Context, dt::Integer, dims::Integer...)
    shape = Int64[reverse(dims)...]
    out = Ref{fp8amp_tensor}(C_NULL)
    check(fp8amp_tensor_create(ctx, fp8amp_dtype(dt), Int32(length(shape)), shape, out))
    return Tensor(out[])
end

# The Julia element type that holds a dtype's bytes: codes for the formats Julia lacks.
function _eltype(dt)
    dt == FP8AMP_DTYPE_F32 && return Float32
    dt == FP8AMP_DTYPE_F16 && return Float16
    dt == FP8AMP_DTYPE_BF16 && return UInt16   # the BF16 bit patterns
    (dt == FP8AMP_DTYPE_E4M3 || dt == FP8AMP_DTYPE_E5M2) && return UInt8  # FP8 codes
    throw(ArgumentError("unknown fp8amp_dtype $(dt)"))
end

"""
    Tensor(ctx, a::Array)

A new tensor holding a copy of `a` (`Float32` → F32, `Float16` → F16); its dims are `size(a)`.
"""
function Tensor(ctx::Context, a::Array{T}) where {T<:Union{Float32,Float16}}
    t = Tensor(ctx, T === Float32 ? FP8AMP_DTYPE_F32 : FP8AMP_DTYPE_F16, size(a)...)
    copyto!(t, a)
    return t
end

function dtype(t::Tensor)
    out = Ref{fp8amp_dtype}(0)
    check(fp8amp_tensor_dtype(t, out))
    return out[]
end

function Base.size(t::Tensor)
    n = Ref{Int32}(0)
    check(fp8amp_tensor_ndim(t, n))
    shape = zeros(Int64, max(Int(n[]), 1))
    check(fp8amp_tensor_shape(t, n[], shape))
    return Tuple(Int.(reverse(shape[1:n[]])))
end

function _nbytes(t::Tensor)
    out = Ref{Csize_t}(0)
    check(fp8amp_tensor_nbytes(t, out))
    return Int(out[])
end

"Copies host data into the tensor: an array of its element type (`_eltype`) and byte size."
function Base.copyto!(t::Tensor, a::Array)
    T = _eltype(dtype(t))
    eltype(a) === T || throw(ArgumentError("the tensor holds $(T) elements, the array $(eltype(a))"))
    sizeof(a) == _nbytes(t) || throw(DimensionMismatch("the array has $(sizeof(a)) bytes, the tensor $(_nbytes(t))"))
    check(fp8amp_tensor_copy_from_host(t, a, Csize_t(sizeof(a))))   # ccall roots t and a
    return t
end

"A host copy of the tensor, of Julia-order dims (FP8 and BF16 as their codes)."
function Base.Array(t::Tensor)
    a = Array{_eltype(dtype(t))}(undef, size(t)...)
    check(fp8amp_tensor_copy_to_host(t, a, Csize_t(sizeof(a))))
    return a
end

"A new tensor handle to the scale_inv this tensor's data was written with (F32, 0-d)."
function scale_inv(t::Tensor)
    out = Ref{fp8amp_tensor}(C_NULL)
    check(fp8amp_tensor_scale_inv(t, out))
    return Tensor(out[])
end

"""
    Scaling(ctx, recipe = recipe(), dtype = FP8AMP_DTYPE_E4M3)

A scaling meta (scale, amax history) for tensors of one scaled dtype.
"""
mutable struct Scaling <: Handle
    handle::fp8amp_scaling
    function Scaling(h::fp8amp_scaling)
        return finalizer(_finalizer(fp8amp_scaling_destroy), new(h))
    end
end
_destroy_fn(::Scaling) = fp8amp_scaling_destroy

function Scaling(ctx::Context, r::fp8amp_recipe = recipe(), dt::Integer = FP8AMP_DTYPE_E4M3)
    out = Ref{fp8amp_scaling}(C_NULL)
    check(fp8amp_scaling_create(ctx, Ref(r), fp8amp_dtype(dt), out))
    return Scaling(out[])
end

set_scale!(s::Scaling, scale::Real) = check(fp8amp_scaling_set_scale(s, Float32(scale)))
set_scaling!(t::Tensor, s::Union{Scaling,Nothing}) =
    check(fp8amp_tensor_set_scaling(t, s === nothing ? fp8amp_scaling(C_NULL) : s))

"The meta's (scale, scale_inv, amax)."
function scale_state(s::Scaling)
    scale, si, amax = Ref{Cfloat}(0), Ref{Cfloat}(0), Ref{Cfloat}(0)
    check(fp8amp_scaling_get(s, scale, si, amax))
    return (scale = scale[], scale_inv = si[], amax = amax[])
end

quantize!(ctx::Context, src::Tensor, dst::Tensor) = check(fp8amp_quantize(ctx, src, dst))
dequantize!(ctx::Context, src::Tensor, dst::Tensor) = check(fp8amp_dequantize(ctx, src, dst))
cast!(ctx::Context, src::Tensor, dst::Tensor) = check(fp8amp_cast(ctx, src, dst))

# ---- the FP8 Linear -------------------------------------------------------------------------

"""
    Linear(ctx; in_features, out_features, bias = true, weight_dtype = FP8AMP_DTYPE_BF16,
           wgrad_dtype = FP8AMP_DTYPE_E4M3, policy = FP8AMP_GEMM_AUTO, recipe = recipe())

`y = x W^T + b` on FP8 GEMMs. In Julia order, x is `in × batch` and y `out × batch`.
"""
mutable struct Linear <: Handle
    handle::fp8amp_linear
    function Linear(ctx::Context; in_features::Integer, out_features::Integer, bias::Bool = true,
                    weight_dtype::Integer = FP8AMP_DTYPE_BF16, wgrad_dtype::Integer = FP8AMP_DTYPE_E4M3,
                    policy::Integer = FP8AMP_GEMM_AUTO, recipe::fp8amp_recipe = _default_recipe())
        d = Ref{fp8amp_linear_desc}()
        check(fp8amp_linear_desc_init(d, sizeof(fp8amp_linear_desc)))
        d[] = _with(d[]; in_features = in_features, out_features = out_features, has_bias = Int32(bias),
                    weight_dtype = weight_dtype, wgrad_dtype = wgrad_dtype, policy = policy, recipe = recipe)
        out = Ref{fp8amp_linear}(C_NULL)
        check(fp8amp_linear_create(ctx, d, out))
        return finalizer(_finalizer(fp8amp_linear_destroy), new(out[]))
    end
end
_destroy_fn(::Linear) = fp8amp_linear_destroy

function _linear_tensor(lin::Linear, getter)
    out = Ref{fp8amp_tensor}(C_NULL)
    check(getter(lin, out))
    return Tensor(out[])
end
"New handles to the Linear's parameters and gradients (each destroyed by its own finalizer)."
weight(lin::Linear) = _linear_tensor(lin, fp8amp_linear_weight)
bias(lin::Linear) = _linear_tensor(lin, fp8amp_linear_bias)
weight_grad(lin::Linear) = _linear_tensor(lin, fp8amp_linear_weight_grad)
bias_grad(lin::Linear) = _linear_tensor(lin, fp8amp_linear_bias_grad)

forward!(lin::Linear, x::Tensor, y::Tensor; training::Bool = false) =
    check(fp8amp_linear_forward(lin, x, y, Int32(training)))
"The GEMM a forward of `rows` rows of a wide input would run now (`fp8amp_linear_choose_gemm`)."
function choose_gemm(lin::Linear, rows::Integer; training::Bool = true)
    out = Ref{fp8amp_gemm_kind}(0)
    check(fp8amp_linear_choose_gemm(lin, Int64(rows), Int32(training), out))
    return out[]
end
"y = x8 W^T + b from an E4M3 `x8` the caller quantized, e.g. bound to the Linear's INPUT meta (`fp8amp_linear_forward_fp8`)."
forward_fp8!(lin::Linear, x8::Tensor, y::Tensor; training::Bool = false) =
    check(fp8amp_linear_forward_fp8(lin, x8, y, Int32(training)))
backward!(lin::Linear, dy::Tensor, dx::Union{Tensor,Nothing}; accumulate::Bool = false) =
    check(fp8amp_linear_backward(lin, dy, dx === nothing ? fp8amp_tensor(C_NULL) : dx,
                                 Int32(accumulate)))

# ---- the optimizer --------------------------------------------------------------------------

"""
    Optimizer(ctx, level = FP8AMP_OPT_LEVEL_O1; fields...)

Adam/AdamW with the state dtypes of an optimization level (`fp8amp_opt_level_adam_init`), then
the given `fp8amp_adam_desc` fields (`lr = 1f-3`, `weight_decay = 0`, ...). The optimizer keeps the
Julia objects of its parameters and gradients alive.
"""
mutable struct Optimizer <: Handle
    handle::fp8amp_optimizer
    params::Vector{Tuple{Tensor,Tensor}}
    function Optimizer(ctx::Context, level::Integer = FP8AMP_OPT_LEVEL_O1; kw...)
        d = Ref{fp8amp_adam_desc}()
        check(fp8amp_opt_level_adam_init(fp8amp_opt_level(level), d, sizeof(fp8amp_adam_desc)))
        d[] = _with(d[]; kw...)
        out = Ref{fp8amp_optimizer}(C_NULL)
        check(fp8amp_optimizer_create(ctx, d, out))
        return finalizer(_finalizer(fp8amp_optimizer_destroy), new(out[], Tuple{Tensor,Tensor}[]))
    end
end
_destroy_fn(::Optimizer) = fp8amp_optimizer_destroy

for (J, H) in ((Context, fp8amp_context), (Tensor, fp8amp_tensor), (Scaling, fp8amp_scaling),
               (Linear, fp8amp_linear), (Optimizer, fp8amp_optimizer))
    @eval Base.cconvert(::Type{$H}, x::$J) = x
    @eval Base.unsafe_convert(::Type{$H}, x::$J) = _live(x)
end

function add_param!(opt::Optimizer, param::Tensor, grad::Tensor)
    check(fp8amp_optimizer_add_param(opt, param, grad))
    push!(opt.params, (param, grad))
    return opt
end

"One step; `lr` overrides the desc's for this step."
function step!(opt::Optimizer; lr::Union{Real,Nothing} = nothing, grad_scale_inv::Real = 1)
    a = Ref{fp8amp_adam_step_args}()
    check(fp8amp_adam_step_args_init(a, sizeof(fp8amp_adam_step_args)))
    a[] = _with(a[]; lr = lr === nothing ? -1.0f0 : Float32(lr), grad_scale_inv = Float32(grad_scale_inv))
    return check(fp8amp_optimizer_step(opt, a))
end

function found_inf(opt::Optimizer)
    out = Ref{Int32}(0)
    check(fp8amp_optimizer_get_found_inf(opt, out))
    return out[] != 0
end

end # module
