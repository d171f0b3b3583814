/* The virtual-memory API's release-while-mapped: each round creates CHUNK bytes, maps them,
 * and releases the handle while the mapping stays (the driver frees the memory only at the
 * last unmap). Prints how many rounds got memory ("mapped="), then unmaps everything and
 * prints whether CHUNK can be created again ("after_unmap="). Usage: vmm CHUNK ROUNDS [retain]
 *
 * With "retain", each round instead takes one more reference to the mapped allocation
 * (cuMemRetainAllocationHandle), releases the handle it created and unmaps it: the memory
 * stays, held by the retained handle alone. Prints how many rounds got memory ("held="), then
 * releases the retained handles and prints whether CHUNK can be created ("after_release="). */
#include <string.h>
#include <stdio.h>
#include <stdlib.h>

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef unsigned long long CUdeviceptr, CUmemGenericAllocationHandle;
typedef struct { int type; int id; } CUmemLocation;
typedef struct {
    int type; int requestedHandleTypes; CUmemLocation location; void *win32HandleMetaData;
    struct { unsigned char compressionType, gpuDirectRDMACapable; unsigned short usage; unsigned char reserved[4]; } allocFlags;
} CUmemAllocationProp;
typedef struct { CUmemLocation location; unsigned long long flags; } CUmemAccessDesc;

CUresult cuInit(unsigned);
CUresult cuDeviceGet(CUdevice *, int);
CUresult cuDevicePrimaryCtxRetain(CUcontext *, CUdevice);
CUresult cuCtxSetCurrent(CUcontext);
CUresult cuMemCreate(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long);
CUresult cuMemRelease(CUmemGenericAllocationHandle);
CUresult cuMemAddressReserve(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
CUresult cuMemMap(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
CUresult cuMemSetAccess(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
CUresult cuMemUnmap(CUdeviceptr, size_t);
CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *, void *);

int main(int argc, char **argv) {
    if (argc < 3) { fprintf(stderr, "usage: vmm CHUNK ROUNDS\n"); return 2; }
    size_t chunk = strtoull(argv[1], 0, 10);
    int rounds = atoi(argv[2]), mapped = 0;
    CUdevice dev;
    CUcontext ctx;
    if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) || cuCtxSetCurrent(ctx)) {
        printf("error=init\n");
        return 1;
    }
    CUmemAllocationProp prop = {0};
    prop.type = 1;          /* CU_MEM_ALLOCATION_TYPE_PINNED */
    prop.location.type = 1; /* CU_MEM_LOCATION_TYPE_DEVICE */
    prop.location.id = dev;
    CUmemAccessDesc access = {{1, dev}, 3};
    CUdeviceptr va[64];
    if (argc > 3 && strcmp(argv[3], "retain") == 0) {
        CUmemGenericAllocationHandle kept[64];
        int held = 0;
        for (int i = 0; i < rounds && i < 64; i++) {
            CUmemGenericAllocationHandle h;
            if (cuMemCreate(&h, chunk, &prop, 0)) break;
            if (cuMemAddressReserve(&va[i], chunk, 0, 0, 0) || cuMemMap(va[i], chunk, 0, h, 0)
                || cuMemSetAccess(va[i], chunk, &access, 1)
                || cuMemRetainAllocationHandle(&kept[i], (void *)va[i]) || cuMemRelease(h)
                || cuMemUnmap(va[i], chunk)) { printf("error=retain\n"); return 1; }
            held++;
        }
        printf("held=%d ", held);
        for (int i = 0; i < held; i++) cuMemRelease(kept[i]);
        CUmemGenericAllocationHandle again;
        printf("after_release=%d\n", cuMemCreate(&again, chunk, &prop, 0));
        return 0;
    }
    for (int i = 0; i < rounds && i < 64; i++) {
        CUmemGenericAllocationHandle h;
        if (cuMemCreate(&h, chunk, &prop, 0)) break;
        if (cuMemAddressReserve(&va[i], chunk, 0, 0, 0) || cuMemMap(va[i], chunk, 0, h, 0)
            || cuMemSetAccess(va[i], chunk, &access, 1)) { printf("error=map\n"); return 1; }
        cuMemRelease(h);
        mapped++;
    }
    printf("mapped=%d ", mapped);
    for (int i = 0; i < mapped; i++) cuMemUnmap(va[i], chunk);
    CUmemGenericAllocationHandle again;
    printf("after_unmap=%d\n", cuMemCreate(&again, chunk, &prop, 0));
    return 0;
}
