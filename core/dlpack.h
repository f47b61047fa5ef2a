/* DLPack 1.1 versioned structs, declared from the DLPack specification (dmlc/dlpack, include/dlpack/
 * dlpack.h, v1.1). The distribution's libdlpack-dev is 0.6, which has neither the versioned structs
 * nor the FP8 type codes, so fp8amp declares the few it needs here, in C so that the C tests can
 * play a DLPack producer/consumer with the same declarations. Layouts and values are the
 * specification's; only what fp8amp uses is declared. */
#ifndef FP8AMP_DLPACK_H
#define FP8AMP_DLPACK_H

#include <stdint.h>

#define DLPACK_MAJOR_VERSION 1
#define DLPACK_MINOR_VERSION 1
#define DLPACK_FLAG_BITMASK_READ_ONLY (1ULL << 0)
#define DLPACK_FLAG_BITMASK_IS_COPIED (1ULL << 1)

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    uint32_t major;
    uint32_t minor;
} DLPackVersion;

/* A C producer may store any device type in DLDevice (DLPack has more than these: kDLHexagon 16,
 * kDLMAIA 17, ...). In C++ a load of a value outside an unfixed enum's range (here 0..15) is
 * undefined behaviour, so C++ gets the enum with its underlying type fixed (the same int32 ABI),
 * which makes every int32 a valid value. */
#ifdef __cplusplus
typedef enum : int32_t {
#else
typedef enum {
#endif
    kDLCPU = 1,
    kDLCUDA = 2,
    kDLCUDAHost = 3,
    kDLCUDAManaged = 13,
} DLDeviceType;

typedef struct {
    DLDeviceType device_type;
    int32_t device_id;
} DLDevice;

typedef enum {
    kDLInt = 0U,
    kDLUInt = 1U,
    kDLFloat = 2U,
    kDLBfloat = 4U,
    kDLFloat8_e4m3fn = 10U,
    kDLFloat8_e5m2 = 12U,
} DLDataTypeCode;

typedef struct {
    uint8_t code;
    uint8_t bits;
    uint16_t lanes;
} DLDataType;

typedef struct {
    void *data;
    DLDevice device;
    int32_t ndim;
    DLDataType dtype;
    int64_t *shape;
    int64_t *strides;
    uint64_t byte_offset;
} DLTensor;

typedef struct DLManagedTensorVersioned {
    DLPackVersion version;
    void *manager_ctx;
    void (*deleter)(struct DLManagedTensorVersioned *self);
    uint64_t flags;
    DLTensor dl_tensor;
} DLManagedTensorVersioned;

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif /* FP8AMP_DLPACK_H */
