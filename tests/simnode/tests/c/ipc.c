/* Device memory and an event shared between processes by interprocess handles. Run without
 * arguments it exports an allocation and an event and runs itself again as the opener ("open
 * HEX EVENT_HEX"), which prints what it found; then it prints its own findings. Prints
 * key=value pairs. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

typedef void *CUcontext;
typedef unsigned long long CUdeviceptr;
typedef struct { char reserved[64]; } CUipcMemHandle;
typedef struct { char reserved[64]; } CUipcEventHandle;
typedef void *CUevent;
int cuEventCreate(CUevent *, unsigned);
int cuEventRecord(CUevent, void *);
int cuEventQuery(CUevent);
int cuIpcGetEventHandle(CUipcEventHandle *, CUevent);
int cuIpcOpenEventHandle(CUevent *, CUipcEventHandle);
int cuInit(unsigned);
int cuDevicePrimaryCtxRetain(CUcontext *, int);
int cuCtxSetCurrent(CUcontext);
int cuMemAlloc_v2(CUdeviceptr *, size_t);
int cuMemFree_v2(CUdeviceptr);
int cuMemcpyHtoD_v2(CUdeviceptr, const void *, size_t);
int cuMemcpyDtoH_v2(void *, CUdeviceptr, size_t);
int cuMemGetInfo_v2(size_t *, size_t *);
int cuIpcGetMemHandle(CUipcMemHandle *, CUdeviceptr);
int cuIpcOpenMemHandle_v2(CUdeviceptr *, CUipcMemHandle, unsigned);
int cuIpcCloseMemHandle(CUdeviceptr);

enum { N = 1 << 20 };

static void unhex(const char *hex, char *out) {
    for (int i = 0; i < 64; i++) sscanf(hex + 2 * i, "%2hhx", (unsigned char *)&out[i]);
}

static int opener(const char *hex, const char *event_hex) {
    CUipcMemHandle h;
    unhex(hex, h.reserved);
    CUipcEventHandle eh;
    unhex(event_hex, eh.reserved);
    CUevent ev = 0;
    printf("open_event=%d ", cuIpcOpenEventHandle(&ev, eh));
    printf("query_event=%d ", cuEventQuery(ev));
    size_t before = 0, after = 0, total = 0;
    cuMemGetInfo_v2(&before, &total);
    CUdeviceptr p = 0, again = 0;
    printf("open=%d ", cuIpcOpenMemHandle_v2(&p, h, 1));
    cuMemGetInfo_v2(&after, &total);
    printf("opener_taken=%zu ", before - after);
    int r = cuIpcOpenMemHandle_v2(&again, h, 1);
    printf("open_again=%d same=%d ", r, again == p);
    static unsigned char buf[N];
    cuMemcpyDtoH_v2(buf, p, N);
    printf("seen=%d ", buf[0] == 0x5a && buf[N - 1] == 0x5a);
    memset(buf, 0x33, N);
    cuMemcpyHtoD_v2(p, buf, N);
    printf("free_imported=%d ", cuMemFree_v2(p));
    printf("close=%d ", cuIpcCloseMemHandle(p));
    printf("close_last=%d ", cuIpcCloseMemHandle(p));
    printf("close_again=%d ", cuIpcCloseMemHandle(p));
    CUipcMemHandle bad;
    memset(&bad, 0, sizeof bad);
    printf("bad_handle=%d\n", cuIpcOpenMemHandle_v2(&p, bad, 1));
    return 0;
}

int main(int argc, char **argv) {
    CUcontext ctx;
    if (cuInit(0) || cuDevicePrimaryCtxRetain(&ctx, 0) || cuCtxSetCurrent(ctx)) { printf("error=init\n"); return 1; }
    if (argc == 4 && !strcmp(argv[1], "open")) return opener(argv[2], argv[3]);
    CUdeviceptr p = 0;
    static unsigned char buf[N];
    memset(buf, 0x5a, N);
    cuMemAlloc_v2(&p, N);
    cuMemcpyHtoD_v2(p, buf, N);
    CUipcMemHandle h;
    printf("export=%d ", cuIpcGetMemHandle(&h, p));
    printf("export_inside=%d ", cuIpcGetMemHandle(&h, p + 16));
    CUdeviceptr own = 0;
    printf("open_own=%d ", cuIpcOpenMemHandle_v2(&own, h, 1));
    CUevent plain = 0, shared = 0, own_event = 0;
    CUipcEventHandle eh;
    cuEventCreate(&plain, 0);
    printf("interprocess_timed=%d ", cuEventCreate(&own_event, 0x4));
    printf("event_plain=%d ", cuIpcGetEventHandle(&eh, plain));
    printf("create_shared=%d ", cuEventCreate(&shared, 0x6 /* interprocess, no timing */));
    printf("event_export=%d ", cuIpcGetEventHandle(&eh, shared));
    printf("event_record=%d ", cuEventRecord(shared, 0));
    printf("open_own_event=%d ", cuIpcOpenEventHandle(&own_event, eh));
    char hex[129], event_hex[129];
    for (int i = 0; i < 64; i++) sprintf(hex + 2 * i, "%02x", (unsigned char)h.reserved[i]);
    for (int i = 0; i < 64; i++) sprintf(event_hex + 2 * i, "%02x", (unsigned char)eh.reserved[i]);
    fflush(stdout);
    pid_t child = fork();
    if (child == 0) {
        execl(argv[0], argv[0], "open", hex, event_hex, (char *)0);
        _exit(127);
    }
    int status = 0;
    waitpid(child, &status, 0);
    cuMemcpyDtoH_v2(buf, p, N);
    printf("written_back=%d ", buf[0] == 0x33 && buf[N - 1] == 0x33);
    printf("free=%d\n", cuMemFree_v2(p));
    return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}
