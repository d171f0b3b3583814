/* What a thread may ask of an event while a capture in the global mode is open (here its
 * own): in the relaxed mode (cuThreadExchangeStreamCaptureMode) cuEventQuery and
 * cuEventSynchronize answer and the capture goes on; in the global mode, the default, they
 * are refused (900, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED) and the capture is invalidated, so
 * that ending it fails (901). Prints key=value pairs. */
#include <stdio.h>

typedef void *CUcontext, *CUstream, *CUgraph, *CUevent;
int cuInit(unsigned);
int cuDevicePrimaryCtxRetain(CUcontext *, int);
int cuCtxSetCurrent(CUcontext);
int cuStreamCreate(CUstream *, unsigned);
int cuStreamBeginCapture_v2(CUstream, int);
int cuStreamEndCapture(CUstream, CUgraph *);
int cuStreamIsCapturing(CUstream, int *);
int cuEventCreate(CUevent *, unsigned);
int cuEventRecord(CUevent, CUstream);
int cuEventQuery(CUevent);
int cuEventSynchronize(CUevent);
int cuThreadExchangeStreamCaptureMode(int *);

int main(void) {
    CUcontext ctx;
    CUstream s, t;
    CUevent e;
    CUgraph g = 0;
    if (cuInit(0) || cuDevicePrimaryCtxRetain(&ctx, 0) || cuCtxSetCurrent(ctx) ||
        cuStreamCreate(&s, 1) || cuStreamCreate(&t, 1) || cuEventCreate(&e, 2) ||
        cuEventRecord(e, t) || cuStreamBeginCapture_v2(s, 0 /* global */)) {
        printf("error=setup\n");
        return 1;
    }
    int mode = 2 /* relaxed */, relaxed_status = -1, global_status = -1;
    int exchanged = cuThreadExchangeStreamCaptureMode(&mode), was = mode;
    int relaxed_query = cuEventQuery(e), relaxed_sync = cuEventSynchronize(e);
    cuStreamIsCapturing(s, &relaxed_status);
    /* Back to the thread's own mode, the global one. */
    cuThreadExchangeStreamCaptureMode(&mode);
    int global_query = cuEventQuery(e);
    cuStreamIsCapturing(s, &global_status);
    int end = cuStreamEndCapture(s, &g);
    printf("exchanged=%d was=%d relaxed_query=%d relaxed_sync=%d relaxed_status=%d "
           "global_query=%d global_status=%d end=%d after=%d\n",
           exchanged, was, relaxed_query, relaxed_sync, relaxed_status, global_query,
           global_status, end, cuEventQuery(e));
    return 0;
}
