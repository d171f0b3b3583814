/* CUDA arrays on the simulated driver: 2-D and 3-D copies between host, device and arrays,
 * the 1-D array copies, descriptors, and copies that leave an array's extents. Prints
 * key=value pairs (1: the data came back as written; CUresults otherwise). */
#include <stdio.h>
#include <string.h>

typedef unsigned long long CUdeviceptr;
typedef void *CUcontext, *CUarray;
typedef struct { size_t Width, Height; int Format; unsigned NumChannels; } CUDA_ARRAY_DESCRIPTOR;
typedef struct { size_t Width, Height, Depth; int Format; unsigned NumChannels, Flags; } CUDA_ARRAY3D_DESCRIPTOR;
typedef struct {
    size_t srcXInBytes, srcY; int srcMemoryType; const void *srcHost; CUdeviceptr srcDevice; CUarray srcArray; size_t srcPitch;
    size_t dstXInBytes, dstY; int dstMemoryType; void *dstHost; CUdeviceptr dstDevice; CUarray dstArray; size_t dstPitch;
    size_t WidthInBytes, Height;
} CUDA_MEMCPY2D;
typedef struct {
    size_t srcXInBytes, srcY, srcZ, srcLOD; int srcMemoryType; const void *srcHost; CUdeviceptr srcDevice; CUarray srcArray; void *reserved0; size_t srcPitch, srcHeight;
    size_t dstXInBytes, dstY, dstZ, dstLOD; int dstMemoryType; void *dstHost; CUdeviceptr dstDevice; CUarray dstArray; void *reserved1; size_t dstPitch, dstHeight;
    size_t WidthInBytes, Height, Depth;
} CUDA_MEMCPY3D;
enum { HOST = 1, DEVICE = 2, ARRAY = 3 };
int cuInit(unsigned);
int cuDevicePrimaryCtxRetain(CUcontext *, int);
int cuCtxSetCurrent(CUcontext);
int cuMemAlloc_v2(CUdeviceptr *, size_t);
int cuMemcpyDtoH_v2(void *, CUdeviceptr, size_t);
int cuArrayCreate_v2(CUarray *, const CUDA_ARRAY_DESCRIPTOR *);
int cuArray3DCreate_v2(CUarray *, const CUDA_ARRAY3D_DESCRIPTOR *);
int cuArrayDestroy(CUarray);
int cuArrayGetDescriptor_v2(CUDA_ARRAY_DESCRIPTOR *, CUarray);
int cuArray3DGetDescriptor_v2(CUDA_ARRAY3D_DESCRIPTOR *, CUarray);
int cuMemcpy2D_v2(const CUDA_MEMCPY2D *);
int cuMemcpy3D_v2(const CUDA_MEMCPY3D *);
int cuMemcpyHtoA_v2(CUarray, size_t, const void *, size_t);
int cuMemcpyAtoH_v2(void *, CUarray, size_t, size_t);
int cuMemcpyAtoD_v2(CUdeviceptr, CUarray, size_t, size_t);
int cuMemcpyDtoA_v2(CUarray, size_t, CUdeviceptr, size_t);
int cuMemcpyAtoA_v2(CUarray, size_t, CUarray, size_t, size_t);

int main(void) {
    CUcontext ctx;
    if (cuInit(0) || cuDevicePrimaryCtxRetain(&ctx, 0) || cuCtxSetCurrent(ctx)) { printf("error=init\n"); return 1; }
    /* A 64 x 16 array of floats: rows of 256 bytes. */
    static float h[16][64], back[16][64], row[64];
    for (int y = 0; y < 16; y++) for (int x = 0; x < 64; x++) h[y][x] = (float)(y * 64 + x);
    CUarray a; CUdeviceptr d;
    CUDA_ARRAY_DESCRIPTOR desc = {64, 16, 0x20, 1};
    printf("create=%d ", cuArrayCreate_v2(&a, &desc));
    cuMemAlloc_v2(&d, sizeof h);
    CUDA_MEMCPY2D in = {0};
    in.srcMemoryType = HOST; in.srcHost = h; in.srcPitch = 256;
    in.dstMemoryType = ARRAY; in.dstArray = a;
    in.WidthInBytes = 256; in.Height = 16;
    CUDA_MEMCPY2D outc = {0};
    outc.srcMemoryType = ARRAY; outc.srcArray = a;
    outc.dstMemoryType = DEVICE; outc.dstDevice = d; outc.dstPitch = 256;
    outc.WidthInBytes = 256; outc.Height = 16;
    int r1 = cuMemcpy2D_v2(&in), r2 = cuMemcpy2D_v2(&outc);
    cuMemcpyDtoH_v2(back, d, sizeof back);
    printf("copy2d=%d,%d round_trip=%d ", r1, r2, memcmp(h, back, sizeof h) == 0);
    cuMemcpyAtoH_v2(row, a, 3 * 256, 256);
    printf("row3=%d ", memcmp(row, h[3], 256) == 0);
    for (int x = 0; x < 64; x++) row[x] = 7.0f;
    cuMemcpyHtoA_v2(a, 5 * 256, row, 256);
    memset(back, 0, sizeof back);
    cuMemcpyAtoD_v2(d, a, 0, sizeof back);
    cuMemcpyDtoH_v2(back, d, sizeof back);
    printf("row5=%d row4_kept=%d ", back[5][10] == 7.0f, memcmp(back[4], h[4], 256) == 0);
    CUarray a2;
    cuArrayCreate_v2(&a2, &desc);
    int aa = cuMemcpyAtoA_v2(a2, 0, a, 256, 512);
    cuMemcpyAtoH_v2(row, a2, 0, 256);
    int da = cuMemcpyDtoA_v2(a2, 256, d, 256);
    printf("atoa=%d,%d shifted=%d ", aa, da, memcmp(row, h[1], 256) == 0);
    CUDA_ARRAY_DESCRIPTOR got;
    cuArrayGetDescriptor_v2(&got, a);
    printf("desc=%zux%zu,%d ", got.Width, got.Height, (int)got.NumChannels);
    printf("past_end=%d ", cuMemcpyAtoH_v2(row, a, 16 * 256 - 128, 256));
    CUDA_MEMCPY2D wide = in;
    wide.WidthInBytes = 260; wide.srcPitch = 260;
    printf("too_wide=%d ", cuMemcpy2D_v2(&wide));
    /* An 8 x 4 x 3 array of bytes. */
    unsigned char v[3][4][8], w[3][4][8], part[2][2][4];
    for (int z = 0; z < 3; z++) for (int y = 0; y < 4; y++) for (int x = 0; x < 8; x++) v[z][y][x] = (unsigned char)(z * 32 + y * 8 + x);
    CUarray c3;
    CUDA_ARRAY3D_DESCRIPTOR d3 = {8, 4, 3, 0x01, 1, 0};
    printf("create3d=%d ", cuArray3DCreate_v2(&c3, &d3));
    CUDA_MEMCPY3D up = {0};
    up.srcMemoryType = HOST; up.srcHost = v; up.srcPitch = 8; up.srcHeight = 4;
    up.dstMemoryType = ARRAY; up.dstArray = c3;
    up.WidthInBytes = 8; up.Height = 4; up.Depth = 3;
    CUDA_MEMCPY3D down = {0};
    down.srcMemoryType = ARRAY; down.srcArray = c3;
    down.dstMemoryType = HOST; down.dstHost = w; down.dstPitch = 8; down.dstHeight = 4;
    down.WidthInBytes = 8; down.Height = 4; down.Depth = 3;
    int u = cuMemcpy3D_v2(&up), dn = cuMemcpy3D_v2(&down);
    printf("copy3d=%d,%d round_trip3d=%d ", u, dn, memcmp(v, w, sizeof v) == 0);
    CUDA_MEMCPY3D box = down;
    box.srcXInBytes = 2; box.srcY = 1; box.srcZ = 1;
    box.dstHost = part; box.dstPitch = 4; box.dstHeight = 2;
    box.WidthInBytes = 4; box.Height = 2; box.Depth = 2;
    int b = cuMemcpy3D_v2(&box);
    printf("box=%d box_ok=%d ", b, part[0][0][0] == v[1][1][2] && part[1][1][3] == v[2][2][5]);
    box.srcZ = 2;
    printf("box_past_end=%d ", cuMemcpy3D_v2(&box));
    CUDA_ARRAY3D_DESCRIPTOR got3;
    cuArray3DGetDescriptor_v2(&got3, c3);
    printf("desc3=%zux%zux%zu ", got3.Width, got3.Height, got3.Depth);
    cuArrayDestroy(c3);
    printf("destroyed=%d\n", cuMemcpyAtoH_v2(row, c3, 0, 8));
    return 0;
}
