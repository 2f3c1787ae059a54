/*
 * symver_demo.c - a function with two versions, as docs/abi.md's rule makes them when a struct
 * grows: tdt_abi_demo@WARPTDT_0.6 (the old struct's wrapper, returns 6) and the default
 * tdt_abi_demo@@WARPTDT_0.7 (returns 7). Built with TDT_ABI_DEMO_UNVERSIONED it is one plain
 * function: the library an old program was linked against, before versions existed.
 */
#ifdef TDT_ABI_DEMO_UNVERSIONED
int tdt_abi_demo(void) { return 0; }
#else
int tdt_abi_demo_0_6(void);
int tdt_abi_demo_0_7(void);
int tdt_abi_demo_0_6(void) { return 6; }
int tdt_abi_demo_0_7(void) { return 7; }
__asm__(".symver tdt_abi_demo_0_6, tdt_abi_demo@WARPTDT_0.6");
__asm__(".symver tdt_abi_demo_0_7, tdt_abi_demo@@WARPTDT_0.7");
#endif
