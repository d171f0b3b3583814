/* A stream's launch attributes, as cudaStreamSetAttribute sets them: an access policy window
 * pinning a buffer in L2 (the CUDA sample simpleAttributes), the synchronization policy, the
 * priority, and those not valid for streams. Prints key=value pairs on one line. */
#include <stdio.h>
#include <string.h>

typedef int CUresult;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef unsigned long long CUdeviceptr;
typedef struct {
    void *base_ptr;
    size_t num_bytes;
    float hitRatio;
    int hitProp, missProp;
} CUaccessPolicyWindow;
typedef union {
    char pad[64];
    CUaccessPolicyWindow accessPolicyWindow;
    int syncPolicy;
    int priority;
    struct { unsigned char default_, remote; } memSyncDomainMap;
} CUlaunchAttributeValue;

CUresult cuInit(unsigned);
CUresult cuCtxCreate_v2(CUcontext *, unsigned, int);
CUresult cuStreamCreateWithPriority(CUstream *, unsigned, int);
CUresult cuStreamDestroy_v2(CUstream);
CUresult cuStreamGetPriority(CUstream, int *);
CUresult cuStreamSetAttribute(CUstream, int, const CUlaunchAttributeValue *);
CUresult cuStreamGetAttribute(CUstream, int, CUlaunchAttributeValue *);
CUresult cuStreamCopyAttributes(CUstream, CUstream);
CUresult cuCtxResetPersistingL2Cache(void);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);

enum { WINDOW = 1, COOPERATIVE = 2, SYNC_POLICY = 3, CLUSTER = 4, PRIORITY = 8, DOMAIN_MAP = 9, DOMAIN = 10 };

static CUlaunchAttributeValue window(CUdeviceptr p, size_t bytes, float ratio, int hit, int miss) {
    CUlaunchAttributeValue v;
    memset(&v, 0, sizeof v);
    v.accessPolicyWindow.base_ptr = (void *)p;
    v.accessPolicyWindow.num_bytes = bytes;
    v.accessPolicyWindow.hitRatio = ratio;
    v.accessPolicyWindow.hitProp = hit;
    v.accessPolicyWindow.missProp = miss;
    return v;
}

int main(void) {
    CUcontext ctx;
    CUstream s, t;
    CUdeviceptr p = 0;
    if (cuInit(0) || cuCtxCreate_v2(&ctx, 0, 0) || cuStreamCreateWithPriority(&s, 1, -2)
        || cuStreamCreateWithPriority(&t, 1, 0) || cuMemAlloc_v2(&p, 1 << 20)) {
        printf("error=setup\n");
        return 1;
    }
    CUlaunchAttributeValue v = window(p, 1 << 20, 0.6f, 2, 1), back;
    printf("window=%d ", cuStreamSetAttribute(s, WINDOW, &v));
    memset(&back, 0, sizeof back);
    int r = cuStreamGetAttribute(s, WINDOW, &back);
    printf("window_back=%d,%d ", r, back.accessPolicyWindow.num_bytes == 1 << 20
           && back.accessPolicyWindow.base_ptr == (void *)p && back.accessPolicyWindow.hitProp == 2);
    v = window(p, (size_t)1 << 40, 0.6f, 2, 1);
    printf("window_too_large=%d ", cuStreamSetAttribute(s, WINDOW, &v));
    v = window(p, 1 << 20, 1.5f, 2, 1);
    printf("ratio_above_one=%d ", cuStreamSetAttribute(s, WINDOW, &v));
    v = window(p, 1 << 20, 0.6f, 2, 2);
    printf("miss_persisting=%d ", cuStreamSetAttribute(s, WINDOW, &v));
    printf("reset_l2=%d ", cuCtxResetPersistingL2Cache());

    memset(&back, 0, sizeof back);
    cuStreamGetAttribute(s, SYNC_POLICY, &back);
    printf("sync_default=%d ", back.syncPolicy);
    v.syncPolicy = 4;
    printf("sync=%d ", cuStreamSetAttribute(s, SYNC_POLICY, &v));
    cuStreamGetAttribute(s, SYNC_POLICY, &back);
    printf("sync_back=%d ", back.syncPolicy);
    v.syncPolicy = 9;
    printf("sync_unknown=%d ", cuStreamSetAttribute(s, SYNC_POLICY, &v));

    cuStreamGetAttribute(s, PRIORITY, &back);
    printf("priority_made=%d ", back.priority);
    v.priority = -40;
    printf("priority=%d ", cuStreamSetAttribute(s, PRIORITY, &v));
    int priority = 9;
    cuStreamGetPriority(s, &priority);
    printf("priority_clamped=%d ", priority);

    cuStreamGetAttribute(s, DOMAIN_MAP, &back);
    printf("domain_map=%d,%d ", back.memSyncDomainMap.default_, back.memSyncDomainMap.remote);
    v.priority = 2;
    printf("domain_unknown=%d ", cuStreamSetAttribute(s, DOMAIN, &v));

    /* Valid for launches and graph nodes only. */
    v.priority = 1;
    printf("cooperative=%d cluster=%d ", cuStreamSetAttribute(s, COOPERATIVE, &v),
           cuStreamSetAttribute(s, CLUSTER, &v));
    printf("get_cluster=%d ", cuStreamGetAttribute(s, CLUSTER, &back));

    r = cuStreamCopyAttributes(t, s);
    memset(&back, 0, sizeof back);
    cuStreamGetAttribute(t, SYNC_POLICY, &back);
    printf("copy=%d copied_sync=%d ", r, back.syncPolicy);
    v.syncPolicy = 2;
    printf("null_stream=%d ", cuStreamSetAttribute(0, SYNC_POLICY, &v));
    cuStreamGetAttribute(0, SYNC_POLICY, &back);
    printf("null_stream_back=%d ", back.syncPolicy);
    cuStreamDestroy_v2(t);
    printf("destroyed=%d\n", cuStreamGetAttribute(t, SYNC_POLICY, &back));
    return 0;
}
