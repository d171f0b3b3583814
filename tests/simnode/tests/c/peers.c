/* Peer access between two GPUs of the node, as a multi-GPU program asks for it. Prints
 * key=value pairs. */
#include <stdio.h>
#include <string.h>

typedef void *CUcontext;
typedef unsigned long long CUdeviceptr;
int cuInit(unsigned);
int cuDevicePrimaryCtxRetain(CUcontext *, int);
int cuDevicePrimaryCtxRelease_v2(int);
int cuCtxCreate_v2(CUcontext *, unsigned, int);
int cuCtxDestroy_v2(CUcontext);
int cuCtxSetCurrent(CUcontext);
int cuDeviceCanAccessPeer(int *, int, int);
int cuDeviceGetP2PAttribute(int *, int, int, int);
int cuCtxEnablePeerAccess(CUcontext, unsigned);
int cuCtxDisablePeerAccess(CUcontext);
int cuMemAlloc_v2(CUdeviceptr *, size_t);
int cuMemcpyHtoD_v2(CUdeviceptr, const void *, size_t);
int cuMemcpyDtoH_v2(void *, CUdeviceptr, size_t);
int cuMemcpyPeer(CUdeviceptr, CUcontext, CUdeviceptr, CUcontext, size_t);
int cuMemcpy(CUdeviceptr, CUdeviceptr, size_t);
int cuGetErrorName(int, const char **);

int main(void) {
    CUcontext c0 = 0, c1 = 0, other0 = 0;
    int v = -1;
    if (cuInit(0) || cuDevicePrimaryCtxRetain(&c0, 0) || cuDevicePrimaryCtxRetain(&c1, 1)) {
        printf("error=init\n");
        return 1;
    }
    cuDeviceCanAccessPeer(&v, 0, 1);
    printf("can_0_1=%d ", v);
    cuDeviceCanAccessPeer(&v, 1, 0);
    printf("can_1_0=%d ", v);
    cuDeviceCanAccessPeer(&v, 0, 0);
    printf("can_0_0=%d ", v);
    printf("can_bad=%d ", cuDeviceCanAccessPeer(&v, 0, 7));
    cuDeviceGetP2PAttribute(&v, 2, 0, 1);
    printf("attr_access=%d ", v);
    cuDeviceGetP2PAttribute(&v, 1, 0, 1);
    printf("attr_rank=%d ", v);
    printf("attr_same=%d ", cuDeviceGetP2PAttribute(&v, 2, 1, 1));
    printf("attr_unknown=%d ", cuDeviceGetP2PAttribute(&v, 99, 0, 1));

    cuCtxSetCurrent(c0);
    printf("enable=%d ", cuCtxEnablePeerAccess(c1, 0));
    printf("enable_again=%d ", cuCtxEnablePeerAccess(c1, 0));
    printf("enable_self=%d ", cuCtxEnablePeerAccess(c0, 0));
    printf("enable_flags=%d ", cuCtxEnablePeerAccess(c1, 1));
    cuCtxCreate_v2(&other0, 0, 0);
    cuCtxSetCurrent(c0);
    printf("enable_same_device=%d ", cuCtxEnablePeerAccess(other0, 0));
    cuCtxDestroy_v2(other0);
    cuCtxSetCurrent(c0);
    printf("enable_destroyed=%d ", cuCtxEnablePeerAccess(other0, 0));

    /* A buffer on each GPU; GPU 0's copied to GPU 1's, by the peer call and by unified
     * addressing. */
    CUdeviceptr a = 0, b = 0;
    char in[64], back[64];
    memset(in, 0x5a, sizeof in);
    memset(back, 0, sizeof back);
    cuMemAlloc_v2(&a, sizeof in);
    cuMemcpyHtoD_v2(a, in, sizeof in);
    cuCtxSetCurrent(c1);
    cuMemAlloc_v2(&b, sizeof in);
    printf("copy_peer=%d ", cuMemcpyPeer(b, c1, a, c0, sizeof in));
    cuMemcpyDtoH_v2(back, b, sizeof back);
    printf("peer_same=%d ", memcmp(in, back, sizeof in) == 0);
    memset(in, 0x33, sizeof in);
    cuCtxSetCurrent(c0);
    cuMemcpyHtoD_v2(a, in, sizeof in);
    printf("copy_unified=%d ", cuMemcpy(b, a, sizeof in));
    cuMemcpyDtoH_v2(back, b, sizeof back);
    printf("unified_same=%d ", memcmp(in, back, sizeof in) == 0);

    cuCtxSetCurrent(c0);
    printf("disable=%d ", cuCtxDisablePeerAccess(c1));
    printf("disable_again=%d ", cuCtxDisablePeerAccess(c1));
    cuCtxSetCurrent(c1);
    printf("reverse_enable=%d ", cuCtxEnablePeerAccess(c0, 0));
    /* The peer released to zero: access to it goes with it. */
    cuDevicePrimaryCtxRelease_v2(0);
    cuDevicePrimaryCtxRetain(&c0, 0);
    printf("disable_after_reset=%d ", cuCtxDisablePeerAccess(c0));
    printf("enable_after_reset=%d ", cuCtxEnablePeerAccess(c0, 0));
    const char *name = "";
    cuGetErrorName(704, &name);
    printf("name_704=%s\n", name);
    return 0;
}
