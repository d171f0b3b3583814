/* A CUDA driver API client written against the declarations of cuda.h, linked with
 * -lcuda: it proves the simulated libcuda.so.1 has the real C ABI.
 *
 * usage: cuda_client ORDINAL BYTES
 * Prints one line of key=value facts, then holds its allocation until stdin closes. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct CUctx_st *CUcontext;
typedef struct { char bytes[16]; } CUuuid;

CUresult cuInit(unsigned int flags);
CUresult cuDriverGetVersion(int *version);
CUresult cuDeviceGetCount(int *count);
CUresult cuDeviceGet(CUdevice *device, int ordinal);
CUresult cuDeviceGetName(char *name, int len, CUdevice dev);
CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev);
CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev);
CUresult cuDeviceGetAttribute(int *pi, int attrib, CUdevice dev);
CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev);
CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize);
CUresult cuMemFree_v2(CUdeviceptr dptr);
CUresult cuMemGetInfo_v2(size_t *free, size_t *total);
CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n);
CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n);
CUresult cuGetErrorName(CUresult error, const char **str);
CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
                             unsigned long long flags, int *symbolStatus);

int main(int argc, char **argv) {
    if (argc != 3) { fprintf(stderr, "usage: cuda_client ORDINAL BYTES\n"); return 64; }
    int ordinal = atoi(argv[1]);
    size_t want = strtoull(argv[2], NULL, 10);
    int version = 0, count = 0, sms = 0;
    CUresult rc = cuInit(0);
    if (rc != 0) { printf("init=%d\n", rc); return 1; }
    cuDriverGetVersion(&version);
    cuDeviceGetCount(&count);
    CUdevice dev;
    if (cuDeviceGet(&dev, ordinal) != 0) { printf("count=%d device=invalid\n", count); return 2; }
    char name[64]; size_t total = 0;
    CUuuid uuid;
    cuDeviceGetName(name, sizeof name, dev);
    cuDeviceGetUuid_v2(&uuid, dev);
    cuDeviceTotalMem_v2(&total, dev);
    cuDeviceGetAttribute(&sms, 16 /* CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT */, dev);
    CUcontext ctx;
    cuCtxCreate_v2(&ctx, 0, dev);
    size_t free_before = 0, free_after = 0, t = 0;
    cuMemGetInfo_v2(&free_before, &t);

    /* The allocation goes through cuGetProcAddress, as the CUDA 12 runtime does. */
    CUresult (*alloc)(CUdeviceptr *, size_t) = NULL;
    int status = -1;
    cuGetProcAddress_v2("cuMemAlloc", (void **)&alloc, 12000, 0, &status);
    CUdeviceptr p = 0;
    rc = alloc ? alloc(&p, want) : 999;
    const char *err = "";
    cuGetErrorName(rc, &err);
    int roundtrip = 0;
    if (rc == 0) {
        const char msg[] = "hello device";
        char back[sizeof msg] = {0};
        cuMemcpyHtoD_v2(p, msg, sizeof msg);
        cuMemcpyDtoH_v2(back, p, sizeof msg);
        roundtrip = memcmp(msg, back, sizeof msg) == 0;
    }
    cuMemGetInfo_v2(&free_after, &t);
    printf("version=%d count=%d name=%s uuid0=%02x sms=%d total=%zu free_before=%zu "
           "proc_status=%d alloc=%s free_after=%zu roundtrip=%d\n",
           version, count, name, (unsigned char)uuid.bytes[0], sms, total, free_before,
           status, err, free_after, roundtrip);
    fflush(stdout);
    while (getchar() != EOF) {}
    if (rc == 0) cuMemFree_v2(p);
    return 0;
}
