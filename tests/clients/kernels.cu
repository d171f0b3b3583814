// A CUDA program as nvcc builds it: kernels and global variables registered with the
// runtime, kernels launched with the triple-chevron syntax, variables written and read back
// through their symbols, memory from cudaMalloc until the runtime says it is out.
// Prints key=value pairs on one line; with "hold" after the chunk size, then keeps its
// context and modules until stdin closes.
#include <cstdio>
#include <cstring>
#include <vector>

__device__ int table[256];
__constant__ float factor;
#ifdef EXTRA_GLOBAL_BYTES
// A global as large as a tenant cares to declare (-DEXTRA_GLOBAL_BYTES=N): the driver
// allocates it when it loads the module, through no allocation call.
__device__ char extra[EXTRA_GLOBAL_BYTES];
#define TOUCH_EXTRA(i) (extra[i] = 1)
#else
#define TOUCH_EXTRA(i) 0
#endif

#ifdef LOCAL_ARRAY_BYTES
// A kernel whose threads each need a LOCAL_ARRAY_BYTES array of local memory
// (-DLOCAL_ARRAY_BYTES=N): at its launch the driver grows the context's stack to that for
// every thread that can be resident, through no allocation call.
__global__ void deep(int *p, int n) {
    volatile char a[LOCAL_ARRAY_BYTES];
    for (int i = 0; i < LOCAL_ARRAY_BYTES; i += 64) a[i] = (char)(i + n);
    p[threadIdx.x] = a[n % LOCAL_ARRAY_BYTES];
}
#endif

__global__ void fill(int *p, int v) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    p[i] = v + table[0] * (int)factor;
    TOUCH_EXTRA(i);
}
// Texture and surface objects over an array, as image code and the CUDA samples use them.
__global__ void sample(cudaTextureObject_t t, cudaSurfaceObject_t s, float *out) {
    float v = tex2D<float>(t, threadIdx.x + 0.5f, 0.5f);
    surf2Dwrite(v + 1.0f, s, threadIdx.x * (int)sizeof(float), 1);
    out[threadIdx.x] = v;
}
__global__ void scale(float *p, float k, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] *= k;
}

int main(int argc, char **argv) {
    size_t chunk = argc > 1 ? strtoull(argv[1], 0, 10) : (64u << 20);
    // As the CUDA samples begin (findCudaDevice): the device chosen, then asked back. The
    // CUDA 11 runtime makes the device's primary context current before anything retains it.
    int device = -1;
    cudaError_t set_device = cudaSetDevice(0);
    cudaError_t get_device = cudaGetDevice(&device);
    size_t free_bytes = 0, total = 0;
    cudaMemGetInfo(&free_bytes, &total);
    int *ints = 0;
    cudaError_t malloc_result = cudaMalloc(&ints, 1 << 20);
    fill<<<1024, 256>>>(ints, 7);
    cudaError_t launch = cudaGetLastError();
    scale<<<(1 << 18) / 256, 256>>>((float *)ints, 2.0f, 1 << 18);
    cudaError_t launch2 = cudaGetLastError();
#ifdef LOCAL_ARRAY_BYTES
    deep<<<1, 32>>>(ints, 3);
    printf("local=%s ", cudaGetErrorName(cudaGetLastError()));
#endif
    cudaError_t sync = cudaDeviceSynchronize();
    int rows[256], back[256] = {0};
    for (int i = 0; i < 256; i++) rows[i] = i * 3;
    float two = 2.0f;
    cudaError_t to_symbol = cudaMemcpyToSymbol(table, rows, sizeof rows);
    cudaError_t to_constant = cudaMemcpyToSymbol(factor, &two, sizeof two);
    cudaError_t from_symbol = cudaMemcpyFromSymbol(back, table, sizeof back);
    size_t symbol_size = 0;
    cudaGetSymbolSize(&symbol_size, table);
    int roundtrip = 1;
    for (int i = 0; i < 256; i++) roundtrip &= back[i] == rows[i];
    // A 64 x 64 array made for surface loads and stores, read through a texture object and
    // written through a surface object; both destroyed, and the array freed, before the fill.
    cudaChannelFormatDesc channel = cudaCreateChannelDesc<float>();
    cudaArray_t array = 0;
    cudaError_t texture = cudaMallocArray(&array, &channel, 64, 64, cudaArraySurfaceLoadStore);
    cudaResourceDesc resource;
    memset(&resource, 0, sizeof resource);
    resource.resType = cudaResourceTypeArray;
    resource.res.array.array = array;
    cudaTextureDesc sampling;
    memset(&sampling, 0, sizeof sampling);
    sampling.filterMode = cudaFilterModeLinear;
    sampling.readMode = cudaReadModeElementType;
    cudaTextureObject_t tex = 0;
    cudaSurfaceObject_t surf = 0;
    if (texture == cudaSuccess) texture = cudaCreateTextureObject(&tex, &resource, &sampling, 0);
    if (texture == cudaSuccess) texture = cudaCreateSurfaceObject(&surf, &resource);
    if (texture == cudaSuccess) {
        sample<<<1, 64>>>(tex, surf, (float *)ints);
        texture = cudaDeviceSynchronize();
    }
    if (texture == cudaSuccess) texture = cudaDestroyTextureObject(tex);
    if (texture == cudaSuccess) texture = cudaDestroySurfaceObject(surf);
    if (texture == cudaSuccess) texture = cudaFreeArray(array);
    cudaFree(ints);
    std::vector<void *> held;
    cudaError_t stop;
    for (;;) {
        void *p = 0;
        stop = cudaMalloc(&p, chunk);
        if (stop != cudaSuccess) break;
        held.push_back(p);
    }
    for (void *p : held) cudaFree(p);
    printf("set_device=%s get_device=%s device=%d ", cudaGetErrorName(set_device),
           cudaGetErrorName(get_device), device);
    printf("total=%zu free=%zu malloc=%s launch=%s launch2=%s sync=%s symbols=%s,%s,%s symbol_size=%zu "
           "roundtrip=%d texture=%s chunks=%zu error=%s\n",
           total, free_bytes, cudaGetErrorName(malloc_result), cudaGetErrorName(launch),
           cudaGetErrorName(launch2), cudaGetErrorName(sync), cudaGetErrorName(to_symbol),
           cudaGetErrorName(to_constant), cudaGetErrorName(from_symbol), symbol_size, roundtrip,
           cudaGetErrorName(texture), held.size(),
           cudaGetErrorName(stop));
    if (argc > 2 && !strcmp(argv[2], "hold")) {
        fflush(stdout);
        while (getchar() != EOF) {}
    }
    return 0;
}
