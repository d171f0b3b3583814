/* Texture and surface objects on the simulated driver: made over arrays, linear and pitched
 * device memory, refused where the driver refuses them, read back and destroyed. Prints
 * key=value pairs (CUresults, and 1 where a descriptor came back as given). */
#include <stdio.h>
#include <string.h>

typedef unsigned long long CUdeviceptr, CUtexObject, CUsurfObject;
typedef void *CUcontext, *CUarray;
typedef struct { size_t Width, Height; int Format; unsigned NumChannels; } CUDA_ARRAY_DESCRIPTOR;
typedef struct { size_t Width, Height, Depth; int Format; unsigned NumChannels, Flags; } CUDA_ARRAY3D_DESCRIPTOR;
/* As cuda.h lays them out: 144, 104 and 112 bytes. */
typedef struct {
    int resType;
    union {
        struct { CUarray hArray; } array;
        struct { CUdeviceptr devPtr; int format; unsigned numChannels; size_t sizeInBytes; } linear;
        struct { CUdeviceptr devPtr; int format; unsigned numChannels; size_t width, height, pitchInBytes; } pitch2D;
        int reserved[32];
    } res;
    unsigned flags;
} CUDA_RESOURCE_DESC;
typedef struct {
    int addressMode[3], filterMode; unsigned flags, maxAnisotropy; int mipmapFilterMode;
    float mipmapLevelBias, minMipmapLevelClamp, maxMipmapLevelClamp, borderColor[4]; int reserved[12];
} CUDA_TEXTURE_DESC;
typedef struct { int format; size_t width, height, depth; unsigned firstMipmapLevel, lastMipmapLevel, firstLayer, lastLayer, reserved[16]; } CUDA_RESOURCE_VIEW_DESC;
int cuInit(unsigned);
int cuDevicePrimaryCtxRetain(CUcontext *, int);
int cuCtxSetCurrent(CUcontext);
int cuMemAlloc_v2(CUdeviceptr *, size_t);
int cuArrayCreate_v2(CUarray *, const CUDA_ARRAY_DESCRIPTOR *);
int cuArray3DCreate_v2(CUarray *, const CUDA_ARRAY3D_DESCRIPTOR *);
int cuTexObjectCreate(CUtexObject *, const CUDA_RESOURCE_DESC *, const CUDA_TEXTURE_DESC *, const CUDA_RESOURCE_VIEW_DESC *);
int cuTexObjectDestroy(CUtexObject);
int cuTexObjectGetResourceDesc(CUDA_RESOURCE_DESC *, CUtexObject);
int cuTexObjectGetTextureDesc(CUDA_TEXTURE_DESC *, CUtexObject);
int cuTexObjectGetResourceViewDesc(CUDA_RESOURCE_VIEW_DESC *, CUtexObject);
int cuSurfObjectCreate(CUsurfObject *, const CUDA_RESOURCE_DESC *);
int cuSurfObjectDestroy(CUsurfObject);
int cuSurfObjectGetResourceDesc(CUDA_RESOURCE_DESC *, CUsurfObject);

enum { ARRAY = 0, LINEAR = 2, PITCH2D = 3, FLOAT = 0x20, SURFACE_LDST = 0x02 };

static CUDA_RESOURCE_DESC linear(CUdeviceptr p, size_t bytes) {
    CUDA_RESOURCE_DESC r; memset(&r, 0, sizeof r);
    r.resType = LINEAR; r.res.linear.devPtr = p; r.res.linear.format = FLOAT;
    r.res.linear.numChannels = 1; r.res.linear.sizeInBytes = bytes;
    return r;
}

static CUDA_RESOURCE_DESC pitched(CUdeviceptr p, size_t width, size_t height, size_t pitch) {
    CUDA_RESOURCE_DESC r; memset(&r, 0, sizeof r);
    r.resType = PITCH2D; r.res.pitch2D.devPtr = p; r.res.pitch2D.format = FLOAT; r.res.pitch2D.numChannels = 1;
    r.res.pitch2D.width = width; r.res.pitch2D.height = height; r.res.pitch2D.pitchInBytes = pitch;
    return r;
}

int main(void) {
    CUcontext ctx; CUdeviceptr mem; CUarray plain, ldst;
    CUDA_ARRAY_DESCRIPTOR d2 = {64, 64, FLOAT, 1};
    CUDA_ARRAY3D_DESCRIPTOR d3 = {64, 64, 0, FLOAT, 1, SURFACE_LDST};
    if (cuInit(0) || cuDevicePrimaryCtxRetain(&ctx, 0) || cuCtxSetCurrent(ctx) || cuMemAlloc_v2(&mem, 1 << 20)
        || cuArrayCreate_v2(&plain, &d2) || cuArray3DCreate_v2(&ldst, &d3)) { printf("error=init\n"); return 1; }
    CUDA_TEXTURE_DESC td; memset(&td, 0, sizeof td);
    td.filterMode = 1; td.borderColor[2] = 0.5f;
    CUDA_RESOURCE_DESC ra; memset(&ra, 0, sizeof ra);
    ra.resType = ARRAY; ra.res.array.hArray = plain;
    CUtexObject tex = 0, t2 = 0; CUsurfObject surf = 0;
    int r = cuTexObjectCreate(&tex, &ra, &td, 0);
    printf("array=%d nonzero=%d ", r, tex != 0);
    CUDA_RESOURCE_DESC back; CUDA_TEXTURE_DESC tback; CUDA_RESOURCE_VIEW_DESC vback;
    cuTexObjectGetResourceDesc(&back, tex); cuTexObjectGetTextureDesc(&tback, tex);
    printf("resource_back=%d texture_back=%d no_view=%d ", memcmp(&back, &ra, sizeof ra) == 0,
           tback.filterMode == 1 && tback.borderColor[2] == 0.5f, cuTexObjectGetResourceViewDesc(&vback, tex));
    printf("no_texture_desc=%d ", cuTexObjectCreate(&t2, &ra, 0, 0));
    printf("surface_plain=%d ", cuSurfObjectCreate(&surf, &ra));
    ra.res.array.hArray = ldst;
    printf("surface_ldst=%d ", cuSurfObjectCreate(&surf, &ra));
    cuSurfObjectGetResourceDesc(&back, surf);
    printf("surface_back=%d ", back.res.array.hArray == ldst);
    CUDA_RESOURCE_DESC lin = linear(mem, 4096);
    printf("linear=%d surface_linear=%d ", cuTexObjectCreate(&t2, &lin, &td, 0), cuSurfObjectCreate(&surf, &lin));
    cuTexObjectDestroy(t2);
    lin = linear(mem + 4, 4096);
    printf("misaligned=%d ", cuTexObjectCreate(&t2, &lin, &td, 0));
    lin = linear(mem, 2 << 20);
    printf("past_allocation=%d ", cuTexObjectCreate(&t2, &lin, &td, 0));
    lin = linear(mem, 4096); lin.res.linear.numChannels = 3;
    printf("three_channels=%d ", cuTexObjectCreate(&t2, &lin, &td, 0));
    lin = linear(0x1000, 4096);
    printf("not_device_memory=%d ", cuTexObjectCreate(&t2, &lin, &td, 0));
    CUDA_RESOURCE_DESC p = pitched(mem, 100, 50, 512);
    printf("pitched=%d ", cuTexObjectCreate(&t2, &p, &td, 0));
    cuTexObjectDestroy(t2);
    p = pitched(mem, 100, 50, 400 + 4);
    printf("pitch_unaligned=%d ", cuTexObjectCreate(&t2, &p, &td, 0));
    p = pitched(mem, 200, 50, 512);
    printf("pitch_narrow=%d ", cuTexObjectCreate(&t2, &p, &td, 0));
    CUDA_RESOURCE_VIEW_DESC view; memset(&view, 0, sizeof view);
    view.format = 0x13; view.width = 64; view.height = 64;
    lin = linear(mem, 4096);
    printf("view_on_linear=%d ", cuTexObjectCreate(&t2, &lin, &td, &view));
    ra.res.array.hArray = plain;
    printf("view_on_array=%d ", cuTexObjectCreate(&t2, &ra, &td, &view));
    printf("view_back=%d ", cuTexObjectGetResourceViewDesc(&vback, t2) == 0 && vback.width == 64 && vback.format == 0x13);
    ra.res.array.hArray = (CUarray)0x1234;
    printf("no_such_array=%d ", cuTexObjectCreate(&t2, &ra, &td, 0));
    /* printf's arguments are evaluated in no set order: each call first. */
    int destroyed = cuTexObjectDestroy(tex), surface_destroyed = cuSurfObjectDestroy(surf);
    int again = cuTexObjectDestroy(tex), surface_again = cuSurfObjectDestroy(surf);
    int read_destroyed = cuTexObjectGetResourceDesc(&back, tex);
    printf("destroy=%d,%d again=%d,%d read_destroyed=%d\n", destroyed, surface_destroyed, again, surface_again,
           read_destroyed);
    return 0;
}
