/* The context stack of one thread, as the real driver keeps it. Prints key=value pairs. */
#include <stdio.h>
#include <stdlib.h>

typedef void *CUcontext;
int cuInit(unsigned);
int cuCtxCreate_v2(CUcontext *, unsigned, int);
int cuCtxDestroy_v2(CUcontext);
int cuDevicePrimaryCtxRetain(CUcontext *, int);
int cuDevicePrimaryCtxRelease_v2(int);
int cuDevicePrimaryCtxGetState(int, unsigned *, int *);
int cuCtxPushCurrent_v2(CUcontext);
int cuCtxPopCurrent_v2(CUcontext *);
int cuCtxSetCurrent(CUcontext);
int cuCtxGetCurrent(CUcontext *);
int cuCtxGetDevice(int *);
int cuCtxSetLimit(int, size_t);
int cuCtxGetLimit(size_t *, int);

static CUcontext current(void) { CUcontext c = (CUcontext)1; cuCtxGetCurrent(&c); return c; }

int cuProfilerStart(void);
int cuProfilerStop(void);

/* A library's exit handler asking for the current context, as cuSOLVER's does when PyTorch
 * drops its handles: it runs after the thread's own storage is gone. */
static void at_exit(void) {
    CUcontext c = (CUcontext)1;
    printf("at_exit=%d\n", cuCtxGetCurrent(&c));
}

int main(void) {
    atexit(at_exit);
    CUcontext a = 0, p = 0, popped = 0;
    unsigned flags = 9; int active = 9, dev = -1;
    if (cuInit(0) || cuCtxCreate_v2(&a, 0, 1)) { printf("error=init\n"); return 1; }
    printf("created_is_current=%d ", current() == a);
    cuDevicePrimaryCtxGetState(0, &flags, &active);
    printf("primary_active_before=%d ", active);
    cuDevicePrimaryCtxRetain(&p, 0);
    cuDevicePrimaryCtxGetState(0, &flags, &active);
    printf("primary_active=%d ", active);
    int r = cuCtxPushCurrent_v2(p);
    printf("push=%d pushed_is_current=%d ", r, current() == p);
    cuCtxGetDevice(&dev);
    printf("device=%d ", dev);
    size_t stack = 0;
    cuCtxSetLimit(0, 4096);
    cuCtxGetLimit(&stack, 0);
    printf("stack_limit=%zu ", stack);
    r = cuCtxPopCurrent_v2(&popped);
    printf("pop=%d popped_primary=%d back_to_created=%d ", r, popped == p, current() == a);
    cuCtxGetDevice(&dev);
    printf("device_after_pop=%d ", dev);
    printf("profile_start=%d ", cuProfilerStart());
    printf("profile_stop=%d ", cuProfilerStop());
    r = cuCtxSetCurrent(0);
    printf("set_null=%d empty=%d ", r, current() == 0);
    printf("pop_empty=%d ", cuCtxPopCurrent_v2(&popped));
    printf("profile_no_context=%d ", cuProfilerStart());
    printf("destroy=%d ", cuCtxDestroy_v2(a));
    r = cuCtxSetCurrent(a);
    printf("set_destroyed=%d ", r);
    printf("push_destroyed=%d ", cuCtxPushCurrent_v2(a));
    cuDevicePrimaryCtxRelease_v2(0);
    cuDevicePrimaryCtxGetState(0, &flags, &active);
    printf("primary_active_after=%d ", active);
    /* The CUDA 11 runtime's cudaSetDevice makes the primary context current before anything
     * retains it, and its cudaGetDevice asks that context's device; what needs the context
     * itself is CUDA_ERROR_CONTEXT_IS_DESTROYED until it is retained. */
    r = cuCtxSetCurrent(p);
    printf("set_unretained_primary=%d ", r);
    dev = -1;
    r = cuCtxGetDevice(&dev);
    printf("unretained_primary_device=%d/%d ", r, dev);
    printf("unretained_primary_limit=%d\n", cuCtxSetLimit(0, 4096));
    return 0;
}
