/* What the CUDA runtime inside cuBLAS and cuBLASLt asks of the driver's private interface
 * (cuGetExportTable) and of a context's limits at each call. Prints key=value pairs. */
#include <stdio.h>
#include <string.h>

typedef void *CUcontext;
typedef struct { char bytes[16]; } CUuuid;
int cuInit(unsigned);
int cuCtxCreate_v2(CUcontext *, unsigned, int);
int cuCtxDestroy_v2(CUcontext);
int cuDevicePrimaryCtxRetain(CUcontext *, int);
int cuCtxPushCurrent_v2(CUcontext);
int cuCtxPopCurrent_v2(CUcontext *);
int cuCtxGetId(CUcontext, unsigned long long *);
int cuCtxGetLimit(size_t *, int);
int cuCtxSetLimit(int, size_t);
int cuGetExportTable(const void **, const CUuuid *);

typedef int (*Current)(CUcontext *);
typedef int (*Identity)(CUcontext, unsigned long long *);
typedef int (*TwoOutputs)(void *, void *);

static const void *const *table(const char *hex) {
    CUuuid id;
    for (int i = 0; i < 16; i++) sscanf(hex + 2 * i, "%2hhx", (unsigned char *)&id.bytes[i]);
    const void *t = 0;
    return cuGetExportTable(&t, &id) ? 0 : (const void *const *)t;
}

int main(void) {
    CUcontext a = 0, p = 0, popped = 0, got = 0;
    if (cuInit(0) || cuCtxCreate_v2(&a, 0, 0) || cuDevicePrimaryCtxRetain(&p, 0) || cuCtxPushCurrent_v2(p)) {
        printf("error=init\n");
        return 1;
    }
    const void *const *tls = table("42d85a8123f6cb478298f6e78a3aecdc");
    const void *const *ctx = table("21318c60971432488ca641ff7324c8f2");
    if (!tls || !ctx) { printf("error=tables\n"); return 1; }
    printf("tls_size=%zu context_size=%zu ", (size_t)tls[0], (size_t)ctx[0]);
    Current current = (Current)tls[2];
    Identity identity = (Identity)ctx[4];
    int r = current(&got);
    printf("current=%d is_pushed=%d ", r, got == p);
    unsigned long long mine = 0, driver = 1, other = 0, none = 9;
    r = identity(got, &mine);
    cuCtxGetId(p, &driver);
    identity(a, &other);
    printf("identity=%d same_as_driver=%d other_differs=%d ", r, mine == driver && mine != 0, other != mine);
    r = identity(0, &none);
    printf("null_identity=%d null_id=%llu ", r, none);
    cuCtxPopCurrent_v2(&popped);
    current(&got);
    printf("after_pop_is_created=%d ", got == a);
    size_t cig = 9;
    r = cuCtxGetLimit(&cig, 8); /* CU_LIMIT_CIG_ENABLED */
    printf("cig=%d cig_enabled=%zu set_cig=%d ", r, cig, cuCtxSetLimit(8, 1));
    cuCtxDestroy_v2(a);
    printf("destroyed_identity=%d ", identity(a, &other));
    const void *const *undescribed = table("1734dc26800d47458726c0f1e7dd8bca");
    char out1[64], out2[64];
    printf("undescribed=%d undescribed_call=%d\n", undescribed != 0,
           undescribed ? ((TwoOutputs)undescribed[4])(out1, out2) : -1);
    return 0;
}
