/* Allocator hooks for the C tests that count the bytes a CPU context holds live (host memory,
 * 256-byte aligned): fp8amp_context_set_allocator(ctx, count_alloc, count_free, &counter). Shared by
 * test_scratch_pool.c and test_linear_release.c. */
#ifndef FP8AMP_TEST_BYTE_COUNTER_H
#define FP8AMP_TEST_BYTE_COUNTER_H

#include <stdlib.h>

#include "fp8amp/fp8amp.h"

typedef struct {
    size_t live;
    int allocs, frees;
} byte_counter;

static void *count_alloc(void *user, size_t nbytes, fp8amp_device device, void *stream) {
    void *p = NULL;
    (void)device;
    (void)stream;
    byte_counter *c = (byte_counter *)user;
    if (posix_memalign(&p, 256, nbytes ? nbytes : 1) != 0) return NULL;
    c->live += nbytes;
    c->allocs++;
    return p;
}

static void count_free(void *user, void *ptr, size_t nbytes, fp8amp_device device, void *stream) {
    (void)device;
    (void)stream;
    byte_counter *c = (byte_counter *)user;
    c->live -= nbytes;
    c->frees++;
    free(ptr);
}

#endif
