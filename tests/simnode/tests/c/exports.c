/* Checks the simulated driver libraries against the real ones' reference tables.
 * Usage: exports LIBRARY SYMBOLS [PROC_ADDRESS_TSV]
 * Resolves every name of SYMBOLS in LIBRARY with dlsym; with PROC_ADDRESS_TSV, asks
 * cuGetProcAddress_v2 for each (name, version, stream) row and compares the answer with
 * dlsym of the row's symbol. Prints "missing=NAME" or "wrong=NAME@VERSION" per failure, then
 * "symbols=N rows=N failures=N". */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

typedef int (*get_proc_address_v2)(const char *, void **, int, unsigned long long, int *);

int main(int argc, char **argv) {
    if (argc < 3) { fprintf(stderr, "usage: exports LIBRARY SYMBOLS [PROC_ADDRESS_TSV]\n"); return 2; }
    void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!h) { printf("error=dlopen %s\n", dlerror()); return 1; }
    char line[512], name[256], stream[16], symbol[256];
    int symbols = 0, rows = 0, failures = 0, version;
    FILE *f = fopen(argv[2], "r");
    if (!f) { perror(argv[2]); return 1; }
    while (fgets(line, sizeof line, f)) {
        if (sscanf(line, "%255s", name) != 1) continue;
        symbols++;
        if (!dlsym(h, name)) { printf("missing=%s\n", name); failures++; }
    }
    fclose(f);
    if (argc > 3) {
        get_proc_address_v2 gpa = (get_proc_address_v2)dlsym(h, "cuGetProcAddress_v2");
        if (!gpa) { printf("error=no cuGetProcAddress_v2\n"); return 1; }
        f = fopen(argv[3], "r");
        if (!f) { perror(argv[3]); return 1; }
        while (fgets(line, sizeof line, f)) {
            if (line[0] == '#') continue;
            if (sscanf(line, "%255s %d %15s %255s", name, &version, stream, symbol) != 4) continue;
            rows++;
            void *want = dlsym(h, symbol), *got = 0;
            int status = -1;
            unsigned long long flags = strcmp(stream, "default") ? 2ull : 1ull;
            int r = gpa(name, &got, version, flags, &status);
            if (r || status || !want || got != want) {
                printf("wrong=%s@%d/%s r=%d status=%d\n", name, version, stream, r, status);
                failures++;
            }
        }
        fclose(f);
    }
    printf("symbols=%d rows=%d failures=%d\n", symbols, rows, failures);
    return failures != 0;
}
