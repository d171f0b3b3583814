/* Links the CUDA driver and never calls it (unless given an argument): what a process of a GPU
 * container that does not use the GPU costs. Sleeps 30 s. */
#include <unistd.h>

int cuInit(unsigned flags);

int main(int argc, char **argv) {
    (void)argv;
    if (argc > 1) return cuInit(0);
    sleep(30);
    return 0;
}
