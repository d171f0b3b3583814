/* What a CUDA 13 runtime needs of the driver, reached as it reaches it: the driver's version
 * before cuInit, cuGetProcAddress_v2 at version 13000, the device attributes of CUDA 12.5-13.0,
 * the answer to an export table the driver does not have, and the CUDA 13 variants that name
 * a context, a stream's device or a pool's location. Prints key=value pairs on one line; a
 * call not found through cuGetProcAddress prints its status (1: symbol not found, 2: version
 * not sufficient) and is not made. */
#include <stdio.h>

typedef int CUresult;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef void *CUmemoryPool;
typedef struct { unsigned char bytes[16]; } CUuuid;
typedef struct { int type, id; } CUmemLocation;

CUresult cuDriverGetVersion(int *);
CUresult cuInit(unsigned);
CUresult cuGetProcAddress_v2(const char *, void **, int, unsigned long long, int *);
CUresult cuDeviceGetAttribute(int *, int, int);
CUresult cuGetExportTable(const void **, const CUuuid *);
CUresult cuCtxCreate_v2(CUcontext *, unsigned, int);
CUresult cuCtxSetCurrent(CUcontext);
CUresult cuStreamCreate(CUstream *, unsigned);
CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *, int);
CUresult cuMemPoolCreate(CUmemoryPool *, const void *);

static void *get(const char *name) {
    void *f = 0;
    int status = -1;
    CUresult r = cuGetProcAddress_v2(name, &f, 13000, 0, &status);
    if (r || status) {
        printf("%s=missing:%d ", name, status);
        return 0;
    }
    return f;
}

int main(void) {
    int version = 0;
    printf("version_before_init=%d ", cuDriverGetVersion(&version) ? -1 : version);
    cuInit(0);
    int value = 0;
    CUresult r = cuDeviceGetAttribute(&value, 139, 0);
    printf("pci_device_id=%s%x ", r ? "error:" : "", r ? (unsigned)r : (unsigned)value);
    r = cuDeviceGetAttribute(&value, 147, 0);
    printf("partial_atomics=%d ", r ? -(int)r : value);
    r = cuDeviceGetAttribute(&value, 148, 0);
    printf("attribute_148=%d ", r ? -(int)r : value);
    const CUuuid absent = {{0xf8, 0xcf, 0xf9, 0x51, 0x21, 0x46, 0x8b, 0x4e,
                            0xb9, 0xe2, 0xfb, 0x46, 0x9e, 0x7c, 0x0d, 0xd9}};
    const void *table = (void *)1;
    r = cuGetExportTable(&table, &absent);
    printf("absent_table=%d ", r);

    CUcontext a, b;
    cuCtxCreate_v2(&a, 0, 0);
    cuCtxCreate_v2(&b, 0, 1); /* current: b, on device 1 */
    CUresult (*ctx_get_device)(int *, CUcontext) = get("cuCtxGetDevice");
    if (ctx_get_device) {
        int of_a = -1, current = -1;
        r = ctx_get_device(&of_a, a);
        CUresult r2 = ctx_get_device(&current, 0);
        printf("device_of_a=%d:%d device_current=%d:%d ", r, of_a, r2, current);
    }
    CUresult (*ctx_synchronize)(CUcontext) = get("cuCtxSynchronize");
    if (ctx_synchronize) {
        r = ctx_synchronize(a);
        CUresult r2 = ctx_synchronize((CUcontext)&value);
        printf("synchronize_a=%d synchronize_bogus=%d ", r, r2);
    }
    CUstream s;
    cuStreamCreate(&s, 0); /* in b */
    CUresult (*stream_get_device)(CUstream, int *) = get("cuStreamGetDevice");
    if (stream_get_device) {
        int dev = -1;
        r = stream_get_device(s, &dev);
        printf("stream_device=%d:%d ", r, dev);
    }
    CUresult (*stream_get_ctx)(CUstream, CUcontext *, void **) = get("cuStreamGetCtx");
    if (stream_get_ctx) {
        CUcontext c = 0;
        void *green = (void *)1;
        r = stream_get_ctx(s, &c, &green);
        printf("stream_ctx_is_b=%d:%d green_null=%d ", r, c == b, green == 0);
    }

    CUresult (*get_default)(CUmemoryPool *, const CUmemLocation *, int) =
        get("cuMemGetDefaultMemPool");
    CUresult (*get_pool)(CUmemoryPool *, const CUmemLocation *, int) = get("cuMemGetMemPool");
    CUresult (*set_pool)(const CUmemLocation *, int, CUmemoryPool) = get("cuMemSetMemPool");
    if (get_default && get_pool && set_pool) {
        CUmemoryPool by_device = 0, by_location = 0, mine = 0, now = 0;
        CUresult r2;
        const CUmemLocation dev1 = {1, 1}, host = {2, 0}, bad = {7, 0};
        cuDeviceGetDefaultMemPool(&by_device, 1);
        r = get_default(&by_location, &dev1, 1);
        printf("default_pool=%d:%d ", r, by_location == by_device);
        CUmemoryPool host_default = 0, host_current = 0;
        r = get_default(&host_default, &host, 1);
        r2 = get_pool(&host_current, &host, 1);
        printf("host_pool=%d:%d:%d managed_pool=%d bad_location=%d ", r, r2,
               host_default != 0 && host_current == host_default,
               get_default(&by_location, &dev1, 2), get_default(&by_location, &bad, 1));
        /* The host's default pool named a device's, and a device's named the host's. */
        printf("host_pool_for_device=%d device_pool_for_host=%d ",
               set_pool(&dev1, 1, host_default), set_pool(&host, 1, by_device));
        struct { int alloc, handles; CUmemLocation location; char rest[64]; } props = {1, 0, {1, 1}};
        cuMemPoolCreate(&mine, &props);
        r = set_pool(&dev1, 1, mine);
        r2 = get_pool(&now, &dev1, 1);
        printf("set_pool=%d current_is_mine=%d:%d ", r, r2, now == mine);
    }

    CUresult (*logs_register)(void *, void *, void **) = get("cuLogsRegisterCallback");
    CUresult (*logs_unregister)(void *) = get("cuLogsUnregisterCallback");
    CUresult (*logs_current)(unsigned *, unsigned) = get("cuLogsCurrent");
    CUresult (*logs_dump)(unsigned *, char *, size_t *, unsigned) = get("cuLogsDumpToMemory");
    if (logs_register && logs_unregister && logs_current && logs_dump) {
        void *handle = 0;
        r = logs_register((void *)&main, 0, &handle);
        printf("logs_register=%d:%d ", r, handle != 0);
        void *unused = 0;
        printf("logs_register_null=%d ", logs_register(0, 0, &unused));
        unsigned it = 7;
        r = logs_current(&it, 0);
        printf("logs_current=%d:%u ", r, it);
        char buffer[16] = "x";
        size_t size = sizeof buffer;
        r = logs_dump(&it, buffer, &size, 0);
        printf("logs_dump=%d:%zu:%d ", r, size, buffer[0]);
        size_t none = 0;
        printf("logs_dump_no_room=%d ", logs_dump(&it, buffer, &none, 0));
        r = logs_unregister(handle);
        CUresult r2 = logs_unregister(handle);
        printf("logs_unregister=%d,%d ", r, r2);
    }
    printf("\n");
    return 0;
}
