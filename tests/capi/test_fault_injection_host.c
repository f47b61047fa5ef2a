/* Fault injection of host memory: every host allocation a call makes fails once, in turn (issue 22).
 *
 * test_fault_injection.c fails the allocations made through the context's allocator hook; this file
 * fails the host ones: malloc, calloc, realloc, aligned_alloc, posix_memalign and memalign, which the
 * executable defines over glibc's __libc_* functions (so the library's operator new, which calls
 * malloc, throws std::bad_alloc), and pthread_create (a worker thread that cannot start). Only the
 * library call under test is armed: CMocka and the checks run unarmed. For a Linear forward, a Linear
 * backward, an optimizer add_param, step and load, and k = 0, 1, 2, ... until a call completes with no
 * refusal, each k checks:
 *   - the call returned FP8AMP_ERROR_OUT_OF_MEMORY (a refused thread start: SUCCESS is fine too, the
 *     library may do that share of the work on the calling thread) with a message from that function;
 *   - it changed nothing: the bytes of every output (y, dx), parameter (weight, its scale_inv slot,
 *     bias), gradient, every scaling meta's state and the optimizer's save() are those of before;
 *   - a retry succeeds, and the run continues to exactly the bytes of a run that never failed.
 * Also: a forward that fails while an earlier training forward is saved keeps that one (a backward of
 * it right after the failure gives the bytes of a run with no failed forward in between), and a
 * Linear large enough for the CPU GEMM to want worker threads (when the machine has two cores or
 * more). Those workers are a persistent pool, started by the process's first such GEMM (here an
 * unrefused reference run) and kept, so refused worker starts are tested by test_gemm_pool.c, which
 * refuses the pool's first start. The device memory goes through the arena hook
 * of fault_rig.h, shared with test_fault_injection.c (CPU: new blocks filled with 0xFF, so unwritten
 * memory shows), unarmed.
 *
 * Interposing malloc needs glibc and a process without a sanitizer's allocator: under AddressSanitizer
 * or ThreadSanitizer (FP8AMP_SANITIZE) the interposers are not compiled and the tests skip with a
 * message. Fresh random data.
 *
 * CUDA variants: on a CUDA context the CUDA runtime, the driver and cuBLASLt allocate host memory
 * inside kernel launches and matmuls, which fp8amp cannot move before its first launch; a refusal
 * there is a CUDA/cuBLAS error after device work was queued (docs/api.md 1.1's one exception). So on
 * CUDA a refusal whose message is not fp8amp's own "out of host memory" (std::bad_alloc) is counted
 * and reported, not checked (cuBLASLt lets a refused allocation inside cublasLtMatmul out as
 * std::bad_alloc; kernels/cuda/gemm.cu names it as cuBLASLt's); fp8amp's own allocations are checked
 * as on the CPU. The CUDA variants are opt-in (FP8AMP_TEST_HOST_FAULTS_CUDA=1; SKIPPED otherwise):
 * on an H100 (driver 580.159, CUDA 13.0, 2026-11-25) they found cuBLASLt's std::bad_alloc, then hung
 * once refusals reached further into the CUDA runtime and driver, which do not all survive a refused
 * malloc. Run them by hand, with a timeout, after changing how fp8amp calls CUDA. */
#if !defined(_GNU_SOURCE)
#define _GNU_SOURCE /* RTLD_NEXT */
#endif
#include "fault_rig.h" /* the arena allocator, the snapshots and the Linear rig, shared with test_fault_injection.c */

#if defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || __has_feature(memory_sanitizer)
#define HOST_FAULTS_SANITIZED 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define HOST_FAULTS_SANITIZED 1
#endif
#if defined(__GLIBC__) && !defined(HOST_FAULTS_SANITIZED)
#define HOST_FAULTS 1
#endif

/* ---- the host allocator with an injected failure ------------------------------------------------ */

static int h_armed;          /* count host allocations and thread starts, refuse number h_fail_at */
static long h_calls, h_fail_at;
static int h_injected, h_thread_refused;
static long h_threads;       /* thread starts while armed */

#if HOST_FAULTS
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <unistd.h>

extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);
extern void __libc_free(void *);

/* FP8AMP_TEST_HOST_FAULTS_TRACE=1: each refused allocation prints the call stack that made it (to
 * find an allocation made after a call changed state; resolve the library's frames with addr2line).
 * backtrace() allocates only on its first call, which main makes unarmed. */
#include <execinfo.h>
static int h_trace;

/* Worker threads of the library may allocate too: the counter is atomic. */
static int h_take(void) {
    if (!__atomic_load_n(&h_armed, __ATOMIC_SEQ_CST)) return 0;
    if (__atomic_fetch_add(&h_calls, 1, __ATOMIC_SEQ_CST) == h_fail_at) {
        __atomic_store_n(&h_injected, 1, __ATOMIC_SEQ_CST);
        if (h_trace) {
            void *frames[48];
            static const char head[] = "-- refused host allocation, called from:\n";
            if (write(2, head, sizeof head - 1) < 0) return 1;
            backtrace_symbols_fd(frames, backtrace(frames, 48), 2);
        }
        return 1;
    }
    return 0;
}

void *malloc(size_t n) { return h_take() ? NULL : __libc_malloc(n); }
void *calloc(size_t a, size_t b) { return h_take() ? NULL : __libc_calloc(a, b); }
void *realloc(void *p, size_t n) { return h_take() ? NULL : __libc_realloc(p, n); }
void *memalign(size_t align, size_t n) { return h_take() ? NULL : __libc_memalign(align, n); }
void *aligned_alloc(size_t align, size_t n) { return h_take() ? NULL : __libc_memalign(align, n); }
int posix_memalign(void **out, size_t align, size_t n) {
    void *p;
    if (align < sizeof(void *) || (align & (align - 1)) != 0) return EINVAL;
    if (h_take()) return ENOMEM;
    p = __libc_memalign(align, n);
    if (!p) return ENOMEM;
    *out = p;
    return 0;
}
void free(void *p) { __libc_free(p); }

typedef int (*pthread_create_fn)(pthread_t *, const pthread_attr_t *, void *(*)(void *), void *);
static pthread_create_fn real_pthread_create; /* resolved in main, unarmed (dlsym may allocate) */

int pthread_create(pthread_t *thread, const pthread_attr_t *attr, void *(*start)(void *), void *arg) {
    if (__atomic_load_n(&h_armed, __ATOMIC_SEQ_CST)) {
        __atomic_fetch_add(&h_threads, 1, __ATOMIC_SEQ_CST);
        if (h_take()) {
            __atomic_store_n(&h_thread_refused, 1, __ATOMIC_SEQ_CST);
            return EAGAIN;
        }
    }
    return real_pthread_create(thread, attr, start, arg);
}

static void resolve_pthread_create(void) {
    void *sym = dlsym(RTLD_NEXT, "pthread_create");
    assert_non_null(sym);
    memcpy(&real_pthread_create, &sym, sizeof sym); /* an object pointer to a function pointer, portably */
}
#endif

static void arm(long fail_at) {
    h_calls = 0;
    h_fail_at = fail_at;
    h_injected = 0;
    h_thread_refused = 0;
    h_threads = 0;
    __atomic_store_n(&h_armed, 1, __ATOMIC_SEQ_CST);
}

static void disarm(void) { __atomic_store_n(&h_armed, 0, __ATOMIC_SEQ_CST); }

/* The CUDA variants are opt-in (see the top of the file). */
static void require_cuda_opt_in(fp8amp_device dev) {
    const char *env = getenv("FP8AMP_TEST_HOST_FAULTS_CUDA");
    if (dev.type != FP8AMP_DEVICE_CUDA || (env && strcmp(env, "1") == 0)) return;
    print_message("the CUDA runtime and driver do not all survive a refused malloc (a run hung on an H100): "
                  "set FP8AMP_TEST_HOST_FAULTS_CUDA=1 to run the CUDA variant (see the top of "
                  "test_fault_injection_host.c)\n");
    skip();
}

static void require_interposer(void) {
#if !HOST_FAULTS
    print_message("host-allocation injection needs glibc's malloc without a sanitizer's allocator "
                  "(AddressSanitizer/ThreadSanitizer replace malloc): skipping\n");
    skip();
#endif
}

/* ---- the cases ------------------------------------------------------------------------------------ */

/* A layer large enough that the CPU GEMM starts worker threads (kernels/cpu/gemm.cpp: more than 2^20
 * multiply-adds per thread) for the thread cases (kSmall, in fault_rig.h, for the full matrix). */
static const dims_t kThreads = {256, 256, 16, 32};

/* The case names of the messages (kOpNames, the functions, name the messages' source). */
static const char *const kCaseNames[] = {"forward", "backward", "step", "load", "add_param",
                                         "forward over a saved forward", "forward_fp8"};

/* OP_FORWARD_OVER_SAVED, after a failed forward: the saved forward is still there to be backed. */
static void back_the_saved_forward(rig_t *r) {
    const fp8amp_status st = fp8amp_linear_backward(r->lin, r->dy1, r->dx1, 1);
    if (st != FP8AMP_SUCCESS)
        fail_msg("the backward of the saved forward, after a failed forward: %s: %s", fp8amp_status_name(st),
                 fp8amp_last_error_message());
}

static void fault_case(fp8amp_device dev, op_t op, dims_t dm, const cfg_t *cfgs, size_t ncfgs) {
    fp8amp_context arena_ctx;
    fp8amp_tensor arena_tensor;
    arena_t *a = arena_open(dev, (size_t)16 << 20, &arena_ctx, &arena_tensor);
    data_t *d = make_data(dm);

    for (size_t c = 0; c < ncfgs; ++c) {
        for (int warm = 0; warm < 2; ++warm) {
            const cfg_t *cfg = &cfgs[c];
            const char *how = warm ? "warm" : "fresh";
            if (!op_applies(op, cfg)) continue;
            extra_t x = {NULL, 0};
            snap_t want, before;
            rig_t r;
            long k, allocations, threads, refused = 0, runtime = 0;
            fp8amp_status st;

            /* The reference: a run with no failure, counting the operation's host allocations. */
            rig_make(&r, a, dev, cfg, d);
            run_prefix(&r, op, cfg, warm, &x);
            if (op == OP_FORWARD_OVER_SAVED) back_the_saved_forward(&r); /* what the failed runs do */
            arm(-1);
            st = run_op(&r, op, &x);
            disarm();
            EXPECT_OK(st);
            allocations = h_calls;
            threads = h_threads;
            finish_reference(&r, a, op, &want, 1);

            for (k = 0;; ++k) {
                int compare = 1;
                rig_make(&r, a, dev, cfg, d);
                run_prefix(&r, op, cfg, warm, &x);
                rig_snap(&r, &before, 1);
                arm(k);
                st = run_op(&r, op, &x);
                disarm();
                if (!h_injected) {
                    if (st != FP8AMP_SUCCESS)
                        fail_msg("%s (%s): no allocation refused, yet %s: %s", kCaseNames[op], cfg->name,
                                 fp8amp_status_name(st), fp8amp_last_error_message());
                    /* OP_FORWARD_OVER_SAVED's reference backs the saved forward first */
                    compare = op != OP_FORWARD_OVER_SAVED;
                } else if (st == FP8AMP_SUCCESS) {
                    /* a refused worker-thread start (its std::thread state or pthread_create): the
                     * library did that share itself, and the results must be those of the reference */
                    ++refused;
                    compare = op != OP_FORWARD_OVER_SAVED;
                } else if (dev.type == FP8AMP_DEVICE_CUDA && !strstr(fp8amp_last_error_message(), "out of host memory")) {
                    /* refused inside the CUDA runtime/driver/cuBLASLt: a CUDA error after work was
                     * queued, whose state is unspecified (api.md 1.1); this run is not compared */
                    if (st != FP8AMP_ERROR_OUT_OF_MEMORY && st != FP8AMP_ERROR_CUDA && st != FP8AMP_ERROR_CUBLAS)
                        fail_msg("%s (%s, %s): host allocation %ld refused, yet %s: %s", kCaseNames[op], cfg->name, how,
                                 k, fp8amp_status_name(st), fp8amp_last_error_message());
                    ++runtime;
                    snap_free(&before);
                    rig_free(&r);
                    continue;
                } else {
                    if (st != FP8AMP_ERROR_OUT_OF_MEMORY)
                        fail_msg("%s (%s, %s): host allocation %ld refused, yet %s: %s", kCaseNames[op], cfg->name, how,
                                 k, fp8amp_status_name(st), fp8amp_last_error_message());
                    if (!message_from(kOpNames[op])) fail_msg("message: %s", fp8amp_last_error_message());
                    expect_unchanged(&r, &before, kCaseNames[op], k, 1);
                    if (op == OP_FORWARD_OVER_SAVED) back_the_saved_forward(&r);
                    st = run_op(&r, op, &x); /* the retry */
                    if (st != FP8AMP_SUCCESS)
                        fail_msg("%s (%s, %s): the retry after host allocation %ld failed: %s: %s", kCaseNames[op],
                                 cfg->name, how, k, fp8amp_status_name(st), fp8amp_last_error_message());
                }
                finish_run(&r, a, op, kCaseNames[op], k, &want, compare, &before, 1);
                if (!h_injected) break;
            }
            print_message("%s, %s, %s Linear [%lld x %lld, %lld rows]: %ld host allocation(s) (%ld thread start(s)), "
                          "each refused in turn; %ld refusal(s) absorbed, %ld inside the CUDA runtime\n",
                          kCaseNames[op], cfg->name, how, (long long)dm.N, (long long)dm.K, (long long)dm.M2,
                          allocations, threads, refused, runtime);
            snap_free(&want);
            free(x.ckpt);
        }
    }
    free_data(d);
    arena_close(a, arena_ctx, arena_tensor);
}

#define N_CONFIGS (sizeof kConfigs / sizeof kConfigs[0])

#define HOST_FAULT_TEST(fn, op)                                                                    \
    static void fn(void **state) {                                                                 \
        require_variant(state);                                                                    \
        require_cuda_opt_in(variant_device(state));                                                \
        require_interposer();                                                                      \
        fault_case(variant_device(state), op, kSmall, kConfigs, N_CONFIGS);                        \
    }

HOST_FAULT_TEST(test_forward_host_faults, OP_FORWARD)
HOST_FAULT_TEST(test_forward_over_saved_host_faults, OP_FORWARD_OVER_SAVED)
HOST_FAULT_TEST(test_forward_fp8_host_faults, OP_FORWARD_FP8)
HOST_FAULT_TEST(test_backward_host_faults, OP_BACKWARD)
HOST_FAULT_TEST(test_add_param_host_faults, OP_ADD_PARAM)
HOST_FAULT_TEST(test_step_host_faults, OP_STEP)
HOST_FAULT_TEST(test_load_host_faults, OP_LOAD)

/* A layer whose CPU GEMMs start worker threads (given two cores or more): each thread start, and each
 * allocation around it, is refused in turn. The FP8 path and the non-FP8 path. */
static void test_thread_host_faults(void **state) {
    const cfg_t kThreadConfigs[2] = {kConfigs[0], kConfigs[3]};
    require_variant(state);
    require_cuda_opt_in(variant_device(state));
    require_interposer();
    fault_case(variant_device(state), OP_FORWARD, kThreads, kThreadConfigs, 2);
    fault_case(variant_device(state), OP_BACKWARD, kThreads, kThreadConfigs, 2);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        DEVICE_TESTS(test_forward_host_faults),
        DEVICE_TESTS(test_forward_over_saved_host_faults),
        DEVICE_TESTS(test_forward_fp8_host_faults),
        DEVICE_TESTS(test_backward_host_faults),
        DEVICE_TESTS(test_add_param_host_faults),
        DEVICE_TESTS(test_step_host_faults),
        DEVICE_TESTS(test_load_host_faults),
        DEVICE_TESTS(test_thread_host_faults),
    };
#if HOST_FAULTS
    resolve_pthread_create();
    {
        const char *trace = getenv("FP8AMP_TEST_HOST_FAULTS_TRACE");
        void *frame[1];
        h_trace = trace && *trace && strcmp(trace, "0") != 0;
        if (h_trace) (void)backtrace(frame, 1); /* loads what backtrace needs, unarmed */
    }
#endif
    return cmocka_run_group_tests(tests, test_setup_rng, NULL);
}
