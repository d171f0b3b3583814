/* The driver's JIT linker, as the CUDA sample ptxjit and linkers without nvJitLink use it:
 * two PTX inputs (a kernel with a local array, and a global in the other) linked and loaded,
 * then what the loaded module holds; and the calls the linker refuses. Prints key=value
 * pairs on one line. */
#include <stdio.h>
#include <string.h>

typedef int CUresult;
typedef struct CUctx_st *CUcontext;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef void *CUlinkState;
typedef unsigned long long CUdeviceptr;

CUresult cuInit(unsigned);
CUresult cuCtxCreate_v2(CUcontext *, unsigned, int);
CUresult cuLinkCreate_v2(unsigned, int *, void **, CUlinkState *);
CUresult cuLinkAddData_v2(CUlinkState, int, void *, size_t, const char *, unsigned, int *, void **);
CUresult cuLinkAddFile_v2(CUlinkState, int, const char *, unsigned, int *, void **);
CUresult cuLinkComplete(CUlinkState, void **, size_t *);
CUresult cuLinkDestroy(CUlinkState);
CUresult cuModuleLoadData(CUmodule *, const void *);
CUresult cuModuleGetFunction(CUfunction *, CUmodule, const char *);
CUresult cuModuleGetGlobal_v2(CUdeviceptr *, size_t *, CUmodule, const char *);
CUresult cuFuncGetAttribute(int *, int, CUfunction);
CUresult cuFuncGetParamInfo(CUfunction, size_t, size_t *, size_t *);
CUresult cuMemGetInfo_v2(size_t *, size_t *);

static char kernel_ptx[] =
    ".version 7.8\n.target sm_86\n.address_size 64\n"
    ".extern .global .align 4 .b8 table[4096];\n"
    ".visible .entry scale(\n"
    "\t.param .u64 scale_param_0,\n"
    "\t.param .u32 scale_param_1,\n"
    "\t.param .f64 scale_param_2\n"
    ")\n{\n"
    "\t.local .align 16 .b8 __local_depot0[3000];\n"
    "\tret;\n}\n";
static char table_ptx[] =
    ".version 7.8\n.target sm_86\n.address_size 64\n"
    ".visible .global .align 4 .b8 table[4096];\n";

enum { CUBIN = 0, PTX = 1, OBJECT = 3 };
enum { INFO_LOG = 3, INFO_LOG_SIZE = 4 };

static size_t free_now(void) { size_t f = 0, t = 0; cuMemGetInfo_v2(&f, &t); return f; }

int main(void) {
    CUcontext ctx;
    if (cuInit(0) || cuCtxCreate_v2(&ctx, 0, 0)) { printf("error=init\n"); return 1; }
    char log[256];
    memset(log, 'x', sizeof log);
    int options[] = { INFO_LOG, INFO_LOG_SIZE };
    void *values[] = { log, (void *)sizeof log };
    CUlinkState link = 0;
    int r = cuLinkCreate_v2(2, options, values, &link);
    printf("create=%d log_empty=%d ", r, log[0] == 0);
    printf("add_kernel=%d ", cuLinkAddData_v2(link, PTX, kernel_ptx, sizeof kernel_ptx, "k", 0, 0, 0));
    printf("add_table=%d ", cuLinkAddData_v2(link, PTX, table_ptx, sizeof table_ptx, "t", 0, 0, 0));
    printf("not_ptx=%d ", cuLinkAddData_v2(link, PTX, "garbage", 8, "g", 0, 0, 0));
    printf("not_cubin=%d ", cuLinkAddData_v2(link, CUBIN, table_ptx, sizeof table_ptx, "c", 0, 0, 0));
    printf("no_file=%d ", cuLinkAddFile_v2(link, PTX, "/nonexistent.ptx", 0, 0, 0));
    printf("object=%d ", cuLinkAddData_v2(link, OBJECT, table_ptx, sizeof table_ptx, "o", 0, 0, 0));
    void *image = 0, *again = 0;
    size_t size = 0, size_again = 0;
    printf("complete=%d ", cuLinkComplete(link, &image, &size));
    cuLinkComplete(link, &again, &size_again);
    printf("same_image=%d ", image == again && size == size_again && size > 0);
    printf("add_after=%d ", cuLinkAddData_v2(link, PTX, table_ptx, sizeof table_ptx, "t", 0, 0, 0));

    size_t before = free_now();
    CUmodule m;
    CUfunction f;
    printf("load=%d ", cuModuleLoadData(&m, image));
    printf("globals_taken=%d ", before - free_now() >= 4096);
    CUdeviceptr table = 0;
    size_t table_bytes = 0;
    r = cuModuleGetGlobal_v2(&table, &table_bytes, m, "table");
    printf("global=%d,%zu ", r, table_bytes);
    cuModuleGetFunction(&f, m, "scale");
    int local = -1;
    cuFuncGetAttribute(&local, 3, f); /* CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES */
    printf("local=%d params=", local);
    for (size_t i = 0; i < 4; i++) {
        size_t offset = 0, bytes = 0;
        if (cuFuncGetParamInfo(f, i, &offset, &bytes)) break;
        printf("%s%zu+%zu", i ? "," : "", offset, bytes);
    }
    printf(" destroy=%d ", cuLinkDestroy(link));
    printf("destroy_again=%d ", cuLinkDestroy(link));
    CUlinkState empty = 0;
    cuLinkCreate_v2(0, 0, 0, &empty);
    printf("empty=%d\n", cuLinkComplete(empty, &image, &size));
    cuLinkDestroy(empty);
    return 0;
}
