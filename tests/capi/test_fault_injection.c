/* Fault injection: every allocation a call makes fails once, in turn (issue 22).
 *
 * The allocations go through the public hook (fp8amp_context_set_allocator) to an allocator that
 * serves blocks from one arena tensor (made with the built-in allocator, so the same test serves
 * device memory on CUDA) and refuses its k-th call while armed. For a Linear forward, a Linear
 * backward, an optimizer step and an optimizer load, and k = 0, 1, 2, ... until a call completes with
 * no refusal, each k checks:
 *   - the call returned FP8AMP_ERROR_OUT_OF_MEMORY with a message from that function;
 *   - it changed nothing: the bytes of every output (y, dx), parameter (weight, its scale_inv slot,
 *     bias), gradient, every scaling meta's state (scale, scale_inv, amax, history) and the
 *     optimizer's state as fp8amp_optimizer_save writes it are those of before the call;
 *   - a retry without failure succeeds, and the run continues (the rest of the forward/backward,
 *     another forward/backward, a step) to exactly the bytes of a run that never failed.
 * The Linear cases (forward, forward_fp8 from an input quantized with the INPUT meta, backward) run
 * for BF16, scaled F16 (O1/O2) and E4M3 (O3) weights on the FP8 path, and F32 /
 * BF16 weight gradients on the non-FP8 path, and for lean Linears (fp8amp_linear_set_lean levels 1
 * and 2: W8, W8^T and the FP32 sum in the context's scratch), each on a fresh Linear (first call:
 * every cache is made) and on a warm one whose next call has more rows (buffers re-made larger).
 *
 * Covered: allocations through the context's hook (tensors, the Linear's buffers and the context's
 * scratch, scale_inv slots, the GEMM workspace on CUDA). Host allocations (std::bad_alloc, turned
 * into OUT_OF_MEMORY by the boundary guard) are not injected here: test_fault_injection_host.c does. The optimizer step and load make
 * no allocation through the hook (the loop checks that and reports the count). Also: an optimizer
 * add_param (its state and device-side list are allocated; a failure must leave the optimizer as it
 * was, which save() shows). CPU here; the CUDA
 * variant runs the same cases when a GPU is present (SKIPPED otherwise). Fresh random data. */
#include "fault_rig.h" /* the arena allocator, the snapshots and the Linear rig, shared with the host test */

static void fault_case(fp8amp_device dev, op_t op) {
    fp8amp_context arena_ctx;
    fp8amp_tensor arena_tensor;
    arena_t *a = arena_open(dev, (size_t)8 << 20, &arena_ctx, &arena_tensor);
    data_t *d = make_data(kSmall);

    for (size_t c = 0; c < sizeof kConfigs / sizeof kConfigs[0]; ++c) {
        for (int warm = 0; warm < 2; ++warm) {
            const cfg_t *cfg = &kConfigs[c];
            extra_t x = {NULL, 0};
            if (!op_applies(op, cfg)) continue;
            snap_t want, before;
            rig_t r;
            long k, allocations;
            fp8amp_status st;

            /* The reference: a run with no failure, counting the operation's allocations. */
            rig_make(&r, a, dev, cfg, d);
            run_prefix(&r, op, cfg, warm, &x);
            arena_arm(a, -1);
            EXPECT_OK(run_op(&r, op, &x));
            allocations = a->calls;
            arena_disarm(a);
            finish_reference(&r, a, op, &want, 0);

            for (k = 0;; ++k) {
                rig_make(&r, a, dev, cfg, d);
                run_prefix(&r, op, cfg, warm, &x);
                rig_snap(&r, &before, 0);
                arena_arm(a, k);
                st = run_op(&r, op, &x);
                arena_disarm(a);
                if (!a->injected) {
                    if (st != FP8AMP_SUCCESS)
                        fail_msg("%s (%s): no allocation refused, yet %s: %s", kOpNames[op], cfg->name,
                                 fp8amp_status_name(st), fp8amp_last_error_message());
                    assert_int_equal(k, allocations);
                } else {
                    if (st != FP8AMP_ERROR_OUT_OF_MEMORY)
                        fail_msg("%s (%s, %s): allocation %ld refused, yet %s: %s", kOpNames[op], cfg->name,
                                 warm ? "warm" : "fresh", k, fp8amp_status_name(st), fp8amp_last_error_message());
                    assert_true(message_from(kOpNames[op]));
                    expect_unchanged(&r, &before, kOpNames[op], k, 0);
                    st = run_op(&r, op, &x); /* the retry */
                    if (st != FP8AMP_SUCCESS)
                        fail_msg("%s (%s, %s): the retry after allocation %ld failed: %s: %s", kOpNames[op], cfg->name,
                                 warm ? "warm" : "fresh", k, fp8amp_status_name(st), fp8amp_last_error_message());
                }
                finish_run(&r, a, op, kOpNames[op], k, &want, 1, &before, 0);
                if (!a->injected) break;
            }
            print_message("%s, %s, %s Linear: %ld allocation(s) through the hook, each failed in turn\n",
                          kOpNames[op], cfg->name, warm ? "warm" : "fresh", allocations);
            snap_free(&want);
            free(x.ckpt);
        }
    }
    free_data(d);
    arena_close(a, arena_ctx, arena_tensor);
}

static void test_forward_faults(void **state) {
    require_variant(state);
    fault_case(variant_device(state), OP_FORWARD);
}

static void test_forward_fp8_faults(void **state) {
    require_variant(state);
    fault_case(variant_device(state), OP_FORWARD_FP8);
}

static void test_backward_faults(void **state) {
    require_variant(state);
    fault_case(variant_device(state), OP_BACKWARD);
}

static void test_step_faults(void **state) {
    require_variant(state);
    fault_case(variant_device(state), OP_STEP);
}

static void test_load_faults(void **state) {
    require_variant(state);
    fault_case(variant_device(state), OP_LOAD);
}

static void test_add_param_faults(void **state) {
    require_variant(state);
    fault_case(variant_device(state), OP_ADD_PARAM);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        DEVICE_TESTS(test_forward_faults),
        DEVICE_TESTS(test_forward_fp8_faults),
        DEVICE_TESTS(test_backward_faults),
        DEVICE_TESTS(test_step_faults),
        DEVICE_TESTS(test_load_faults),
        DEVICE_TESTS(test_add_param_faults),
    };
    return cmocka_run_group_tests(tests, test_setup_rng, NULL);
}
