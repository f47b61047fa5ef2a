// CPU reference for fp8amp_cast: every element goes through float32 (which holds every value of the
// five dtypes exactly) and is rounded once into the destination by the shared codec.
#include <cstring>

#include "convert.hpp"
#include "kernels.hpp"

namespace fp8amp::kernels::cpu {

void cast(const void *src, fp8amp_dtype src_dtype, void *dst, fp8amp_dtype dst_dtype, size_t n) {
    if (src_dtype == dst_dtype) {
        std::memmove(dst, src, n * fp8amp_dtype_size(src_dtype));
        return;
    }
    with_store(dst, dst_dtype, [&](auto store) { for_each_value(src, src_dtype, n, store); });
}

}  // namespace fp8amp::kernels::cpu
