/* A tenant flooding the agent's socket for sample requests.
 * Usage: flood PATH SECONDS
 * Sends datagrams to the socket at PATH without pause for SECONDS seconds, from several
 * sockets so that a full queue on one never slows it, and prints "sent=N refused=M". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>

int main(int argc, char **argv) {
    if (argc < 3) { fprintf(stderr, "usage: flood PATH SECONDS\n"); return 2; }
    struct sockaddr_un to;
    memset(&to, 0, sizeof to);
    to.sun_family = AF_UNIX;
    strncpy(to.sun_path, argv[1], sizeof to.sun_path - 1);
    int fds[8];
    for (int i = 0; i < 8; i++) fds[i] = socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK, 0);
    time_t end = time(0) + atoi(argv[2]);
    unsigned long sent = 0, refused = 0, n = 0;
    char junk[512];
    memset(junk, 0xff, sizeof junk);
    while (time(0) < end) {
        if (sendto(fds[n++ % 8], junk, sizeof junk, 0, (struct sockaddr *)&to, sizeof to) >= 0)
            sent++;
        else
            refused++;
    }
    printf("sent=%lu refused=%lu\n", sent, refused);
    return 0;
}
