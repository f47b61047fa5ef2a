# FP8AMP.jl's tests, for a machine with Julia: `julia --project=bindings/julia -e 'using Pkg; Pkg.test()'`
# (FP8AMP_LIB=/path/to/libfp8amp.so.0 when the library is not on the loader's path).
# NOT RUN: written where no Julia toolchain could be installed (bindings/julia/README.md). ctest
# julia.wrappers parses this file and checks the fp8amp names it uses, nothing more.
using FP8AMP
using Test

@testset "FP8AMP.jl" begin
    @test library_version()[1] == FP8AMP.FP8AMP_VERSION_MAJOR

    ctx = Context(:cpu)

    @testset "quantize round trip" begin
        x = Float32[((i * 7919) % 2003 - 1001) / 173 for i in 0:31, _ in 1:16]
        tx = Tensor(ctx, x)
        @test size(tx) == (32, 16)
        meta = Scaling(ctx, recipe(mode = FP8AMP_SCALING_CURRENT), FP8AMP_DTYPE_E4M3)
        q = Tensor(ctx, FP8AMP_DTYPE_E4M3, 32, 16)
        set_scaling!(q, meta)
        quantize!(ctx, tx, q)
        back = Tensor(ctx, FP8AMP_DTYPE_F32, 32, 16)
        dequantize!(ctx, q, back)
        st = scale_state(meta)
        @test st.amax == maximum(abs.(x))
        y = Array(back)
        @test all(isfinite, y)
        @test all(abs.(y .- x) .<= max.(abs.(x) ./ 16, st.scale_inv / 1024))
        @test eltype(Array(q)) == UInt8
        @test Float32(Array(scale_inv(q))[]) == st.scale_inv
    end

    @testset "errors carry status and message" begin
        a = Tensor(ctx, FP8AMP_DTYPE_F32, 4, 4)
        b = Tensor(ctx, FP8AMP_DTYPE_F32, 3, 4)
        err = try
            cast!(ctx, a, b)
            nothing
        catch e
            e
        end
        @test err isa FP8AMPError
        @test err.status == FP8AMP_ERROR_SHAPE_MISMATCH
        @test occursin("fp8amp_cast", err.message)
        @test occursin("FP8AMP_ERROR_SHAPE_MISMATCH", sprint(showerror, err))
    end

    @testset "close once, then INVALID_HANDLE" begin
        t = Tensor(ctx, FP8AMP_DTYPE_F32, 2)
        close(t)
        close(t)                      # the second close finds no handle: nothing is destroyed twice
        err = try
            size(t)
            nothing
        catch e
            e
        end
        @test err isa FP8AMPError && err.status == FP8AMP_ERROR_INVALID_HANDLE
        for _ in 1:1000               # finalizers: handles destroyed by the GC, never twice
            Tensor(ctx, FP8AMP_DTYPE_F32, 8)
        end
        GC.gc(); GC.gc()
    end

    @testset "Linear and one O2 step" begin
        lin = Linear(ctx; in_features = 32, out_features = 24, weight_dtype = FP8AMP_DTYPE_F32,
                     policy = FP8AMP_GEMM_ALWAYS_FP8)
        w0 = randn(Float32, 32, 24) ./ 8
        copyto!(weight(lin), w0)
        x = Tensor(ctx, randn(Float32, 32, 16))
        y = Tensor(ctx, FP8AMP_DTYPE_F32, 24, 16)
        forward!(lin, x, y; training = true)
        @test all(isfinite, Array(y))
        dx = Tensor(ctx, FP8AMP_DTYPE_F32, 32, 16)
        backward!(lin, Tensor(ctx, randn(Float32, 24, 16)), dx)
        opt = Optimizer(ctx, FP8AMP_OPT_LEVEL_O2; lr = 1f-3)
        add_param!(opt, weight(lin), weight_grad(lin))
        add_param!(opt, bias(lin), bias_grad(lin))
        step!(opt)
        @test !found_inf(opt)
        @test Array(weight(lin)) != w0
        close(opt); close(lin)
    end
    close(ctx)
end
