/* symver_demo_program.c - calls tdt_abi_demo() and checks which version the dynamic linker
 * bound: WANT 6 (linked without versions: the oldest) or 7 (linked with them: the default). */
#include <stdio.h>

int tdt_abi_demo(void);

int main(void) {
    const int got = tdt_abi_demo();
    if (got != WANT) {
        fprintf(stderr, "FAIL: tdt_abi_demo() is version 0.%d's, want 0.%d's\n", got, WANT);
        return 1;
    }
    printf("tdt_abi_demo() bound to its WARPTDT_0.%d version\n", got);
    return 0;
}
