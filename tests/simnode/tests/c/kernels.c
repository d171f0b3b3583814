/* What CUDA 12.3 and 12.4 drivers tell about a module's kernels, and their notifications.
 * Prints key=value pairs. */
#include <stddef.h>
#include <stdio.h>

typedef void *CUcontext, *CUmodule, *CUfunction, *CUlibrary, *CUkernel, *CUasyncCallbackHandle;
typedef void (*CUasyncCallback)(void *, void *, CUasyncCallbackHandle);
int cuInit(unsigned);
int cuDevicePrimaryCtxRetain(CUcontext *, int);
int cuCtxSetCurrent(CUcontext);
int cuModuleLoadData(CUmodule *, const void *);
int cuLibraryLoadData(CUlibrary *, const void *, void *, void *, unsigned, void *, void *, unsigned);
int cuLibraryGetKernel(CUkernel *, CUlibrary, const char *);
int cuModuleGetFunctionCount(unsigned *, CUmodule);
int cuModuleEnumerateFunctions(CUfunction *, unsigned, CUmodule);
int cuLibraryGetKernelCount(unsigned *, CUlibrary);
int cuFuncGetName(const char **, CUfunction);
int cuKernelGetName(const char **, CUkernel);
int cuFuncIsLoaded(int *, CUfunction);
int cuFuncLoad(CUfunction);
int cuModuleGetFunction(CUfunction *, CUmodule, const char *);
int cuFuncGetParamInfo(CUfunction, size_t, size_t *, size_t *);
int cuKernelGetParamInfo(CUkernel, size_t, size_t *, size_t *);
int cuDeviceRegisterAsyncNotification(int, CUasyncCallback, void *, CUasyncCallbackHandle *);
int cuDeviceUnregisterAsyncNotification(int, CUasyncCallbackHandle);
int cuGetProcAddress_v2(const char *, void **, int, unsigned long long, int *);

static void never(void *info, void *data, CUasyncCallbackHandle h) { (void)info; (void)data; (void)h; }

int main(void) {
    static const char image[] = ".version 7.0\n.target sm_86\n.address_size 64\n"
                                ".visible .entry beta() { ret; }\n.visible .entry alpha() { ret; }\n";
    CUcontext ctx; CUmodule m; CUlibrary lib;
    if (cuInit(0) || cuDevicePrimaryCtxRetain(&ctx, 0) || cuCtxSetCurrent(ctx) || cuModuleLoadData(&m, image)
        || cuLibraryLoadData(&lib, image, 0, 0, 0, 0, 0, 0)) { printf("error=init\n"); return 1; }
    unsigned count = 0, kernels = 0;
    CUfunction f[4] = {0};
    const char *first = "", *second = "", *kernel_name = "";
    printf("count=%d ", cuModuleGetFunctionCount(&count, m));
    printf("functions=%u ", count);
    printf("enumerate=%d ", cuModuleEnumerateFunctions(f, 4, m));
    cuFuncGetName(&first, f[0]);
    cuFuncGetName(&second, f[1]);
    printf("names=%s,%s rest_null=%d ", first, second, f[2] == 0);
    int loaded = -1;
    printf("is_loaded=%d ", cuFuncIsLoaded(&loaded, f[0]));
    printf("loaded=%d load=%d ", loaded, cuFuncLoad(f[1]));
    printf("name_bogus=%d ", cuFuncGetName(&first, (CUfunction)&count));
    CUkernel k = 0;
    cuLibraryGetKernel(&k, lib, "beta");
    cuLibraryGetKernelCount(&kernels, lib);
    printf("kernel_name=%d ", cuKernelGetName(&kernel_name, k));
    printf("kernel=%s kernels=%u ", kernel_name, kernels);
    CUasyncCallbackHandle h = 0;
    printf("register=%d ", cuDeviceRegisterAsyncNotification(0, never, 0, &h));
    printf("unregister=%d ", cuDeviceUnregisterAsyncNotification(0, h));
    printf("unregister_again=%d ", cuDeviceUnregisterAsyncNotification(0, h));
    /* Parameter layouts: a pointer, a 32-bit integer, a 12-byte array aligned to 8. */
    static const char params[] = ".version 7.8\n.target sm_86\n.address_size 64\n"
                                 ".visible .entry gamma(.param .u64 g0, .param .u32 g1,\n"
                                 "    .param .align 8 .b8 g2[12]) { ret; }\n";
    CUmodule pm; CUfunction g = 0; CUlibrary plib; CUkernel gk = 0;
    size_t off[3] = {0}, size[3] = {0}, past = 7;
    if (cuModuleLoadData(&pm, params) || cuModuleGetFunction(&g, pm, "gamma")
        || cuLibraryLoadData(&plib, params, 0, 0, 0, 0, 0, 0) || cuLibraryGetKernel(&gk, plib, "gamma")) {
        printf("error=params\n"); return 1;
    }
    for (int i = 0; i < 3; i++) cuFuncGetParamInfo(g, i, &off[i], &size[i]);
    printf("params=%zu:%zu,%zu:%zu,%zu:%zu ", off[0], size[0], off[1], size[1], off[2], size[2]);
    printf("past_last=%d ", cuFuncGetParamInfo(g, 3, &past, &past));
    printf("untouched=%zu ", past);
    printf("no_size=%d ", cuFuncGetParamInfo(g, 1, &past, NULL));
    printf("offset=%zu ", past);
    printf("no_offset=%d ", cuFuncGetParamInfo(g, 0, NULL, &past));
    printf("kernel=%d ", cuKernelGetParamInfo(gk, 2, &past, NULL));
    printf("kernel_offset=%zu ", past);
    printf("param_bogus=%d ", cuFuncGetParamInfo((CUfunction)&count, 0, &past, NULL));
    void *fn = 0;
    int found = -1;
    cuGetProcAddress_v2("cuFuncGetName", &fn, 12030, 0, &found);
    printf("proc_found=%d\n", found == 0 && fn != 0);
    return 0;
}
